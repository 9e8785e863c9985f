"""How ``--compile`` compiles: torch.compile's mode and inductor's options, checked in one place.

torch.compile takes a mode or an options dict, never both; a mode is only a named set of
inductor options (``torch._inductor.list_mode_options``: reduce-overhead is CUDA graphs;
max-autotune adds template autotuning of matmuls and convolutions and coordinate-descent tuning
of every Triton kernel). So dlscale compiles with their union: the mode's options, then each
``--inductor-option KEY=VALUE`` over them, which is exactly what torch.compile does with a mode.
The record keeps both (``config.compile_mode``, ``config.inductor_options``).

Input never runs code: some settings name a program inductor runs (``cpp.cxx``, ``cuda.cuda_cxx``)
or a path it reads or writes. dlscale takes a setting only with a bool, int or float value of the
setting's own type (or for a setting whose default is None), and a string only for the few
settings in ``SAFE_STRING_OPTIONS`` (names of backends and heuristics, never paths), with a value
among the setting's declared choices or else a plain name (letters, digits, ``_``, comma lists);
a setting whose name says program, path or command is refused whatever its value, and so is an
unset setting (default None) whose declared type is not a plain bool, int or float (a callable, a
graph pass, a path). Inductor's trace (``trace.*``) is refused: it writes ``torch_compile_debug/``
into the working directory, outside the store.

CUDA graphs replay the recorded kernels of the forward and the backward with no launch between
them. dlscale allows them with the strategies whose compiled region holds no collective of its
own (``single``, ``ddp``: DDP's all-reduce runs in hooks outside the graphs); the others, whose
sharding or pipelining happens inside the model's forward, are refused before launch.
"""
from __future__ import annotations

import difflib
import re
import typing
from typing import Any

from dlscale import ConfigError

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_MODES_WITH_CUDAGRAPHS = ("reduce-overhead", "max-autotune")


# String settings whose values are names of backends, heuristics or policies (never a path, a
# program or a flag passed to a compiler); every other string setting is refused.
SAFE_STRING_OPTIONS = frozenset({
    "cpp.descriptive_names", "triton.descriptive_names", "cpp.enable_floating_point_contract_flag",
    "max_autotune_gemm_backends", "max_autotune_conv_backends", "max_autotune_gemm_search_space",
    "max_autotune_flex_search_space", "memory_pool", "estimate_op_runtime", "mixed_mm_choice",
    "layout_opt_default", "triton_kernel_default_layout_constraint", "cpu_backend", "cuda_backend",
})
# name parts of settings that hold a program, a path, a command or compiler flags
_UNSAFE_PARTS = frozenset({"cxx", "cc", "ld", "compiler", "cmd", "command", "path", "dir", "exe", "executable",
                           "binary", "bin", "script", "prog", "program", "home", "lib", "libs", "url", "file",
                           "flags", "opt", "march", "arch"})
_SCALARS = (bool, int, float)
_ALLOWED = ("allowed: bool, int and float settings, and string settings that name no path or program "
            "(dlscale.train.compiling.SAFE_STRING_OPTIONS, e.g. memory_pool)")


_NAME_VALUE = re.compile(r"[A-Za-z0-9_]+(,[A-Za-z0-9_]+)*")  # a backend, heuristic or policy name, or a list


def _unsafe_name(name: str) -> bool:
    return bool(_UNSAFE_PARTS & set(re.split(r"[._]+", name.lower())))


def _declared(config, name: str) -> Any:
    """The setting's declared type (torch's config entries carry it), or None where this torch has none."""
    entry = getattr(config, "_config", {}).get(name)
    return getattr(entry, "value_type", None)


def _check_string(key: str, name: str, value: str, declared: Any) -> None:
    """A safe string setting's value: one of its declared choices, else a plain name (never a path)."""
    choices = typing.get_args(declared) if typing.get_origin(declared) is typing.Literal else ()
    if choices and value not in choices:
        raise ConfigError(f"inductor-option {key} must be one of {', '.join(map(str, choices))}, got {value!r}")
    if not _NAME_VALUE.fullmatch(value):
        raise ConfigError(f"inductor-option {key} takes a name (letters, digits, _; comma-separated), got "
                          f"{value!r}: a value that could be a path or a program is refused")


def _plain_optional(declared: Any, value: Any) -> bool:
    """An unset setting that takes a plain bool, int or float (``int | None``), and a value of that kind;
    True where this torch declares no types (the value is a scalar, checked by the caller)."""
    if declared is None:
        return True
    args = set(typing.get_args(declared)) - {type(None)}
    return bool(args) and args <= set(_SCALARS) and any(_fits(value, t) for t in args)


def check_options(options: dict[str, Any]) -> None:
    """Every option names a setting of ``torch._inductor.config``, has its type (torch.compile
    would raise the same, but only inside the workers) and can run no code (see the module's
    note). The mode is checked by RunConfig."""
    if not options:
        return
    from torch._inductor import config  # torch: keeps start-up light

    known = config.get_config_copy()
    for key, value in options.items():
        name = str(key).replace("-", "_")
        if name not in known:
            close = difflib.get_close_matches(name, list(known), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else " (see torch._inductor.config)"
            raise ConfigError(f"inductor-option {key!r} is not a setting of torch._inductor.config{hint}")
        if name.startswith("trace.") and value is not False:  # switching a part of the trace off writes nothing
            raise ConfigError(f"inductor-option {key} is refused: inductor's trace writes torch_compile_debug/ into "
                              f"the working directory, outside the store (dlscale's --profile traces go there)")
        default = known[name]
        want = type(default)
        if not isinstance(value, (*_SCALARS, str)):
            raise ConfigError(f"inductor-option {key} takes a bool, int, float or string value, "
                              f"got {type(value).__name__} {value!r}")
        if want in _SCALARS:  # a number or a switch of the setting's own type cannot name a program
            if not _fits(value, want):
                raise ConfigError(f"inductor-option {key} takes a value of type {want.__name__} "
                                  f"(default {default!r}), got {value!r}")
            continue
        if _unsafe_name(name):
            raise ConfigError(f"inductor-option {key} is refused: it names a program, path, command or compiler "
                              f"flags, which a suite or the command line must not set ({_ALLOWED})")
        if want is str:
            if name not in SAFE_STRING_OPTIONS:
                raise ConfigError(f"inductor-option {key} is refused: a string setting may name a path or a "
                                  f"program ({_ALLOWED})")
            if not isinstance(value, str):
                raise ConfigError(f"inductor-option {key} takes a value of type str (default {default!r}), "
                                  f"got {value!r}")
            _check_string(key, name, value, _declared(config, name))
            continue
        if default is None and isinstance(value, _SCALARS):  # an unset number or switch
            if not _plain_optional(_declared(config, name), value):
                raise ConfigError(f"inductor-option {key} is refused: it takes a callable, a graph pass or a "
                                  f"structured value, never a plain value from a suite or the command line ({_ALLOWED})")
            continue
        what = "a string" if isinstance(value, str) else f"the value {value!r}"
        raise ConfigError(f"inductor-option {key} is refused: {what} for a setting whose default is "
                          f"{default!r} may name a path or a program ({_ALLOWED})")


def _fits(value: Any, want: type) -> bool:
    if want is bool or isinstance(value, bool):  # True is an int to Python, not to inductor's settings
        return want is bool and isinstance(value, bool)
    if want is float:
        return isinstance(value, (int, float))
    return isinstance(value, want)


def uses_cudagraphs(cfg) -> bool:
    """Whether the compiled model runs as CUDA graphs (mode or explicit triton.cudagraphs)."""
    if not cfg.compile:
        return False
    opts = cfg.inductor_options
    return bool(opts.get("triton.cudagraphs", cfg.compile_mode in _MODES_WITH_CUDAGRAPHS))


def step_marker(cfg):
    """``torch.compiler.cudagraph_mark_step_begin`` where the model runs as CUDA graphs, else None:
    called as each training step begins, it declares a new iteration, so the graphs' memory of the
    last one may be reused (its loss was read, or dropped, before the call)."""
    if not uses_cudagraphs(cfg):
        return None
    import torch  # torch: keeps start-up light

    return torch.compiler.cudagraph_mark_step_begin


def check_strategy(cfg) -> None:
    """CUDA graphs only where the compiled region holds no collective (a strategy's
    ``cudagraph_safe``; see the module's note)."""
    from dlscale.strategies import get_strategy, strategy_names  # torch: keeps start-up light

    if uses_cudagraphs(cfg) and not get_strategy(cfg.strategy).cudagraph_safe:
        safe = [s for s in strategy_names() if get_strategy(s).cudagraph_safe]
        raise ConfigError(f"compile-mode {cfg.compile_mode} (CUDA graphs) runs with strategies "
                          f"{', '.join(safe)}, not {cfg.strategy}; use compile-mode default "
                          "or max-autotune-no-cudagraphs")


def inductor_options(cfg) -> dict[str, Any]:
    """The options torch.compile gets: the mode's, then the user's over them."""
    from torch._inductor import list_mode_options  # torch: keeps start-up light

    mode = {} if cfg.compile_mode == "default" else list_mode_options(cfg.compile_mode)
    return {**mode, **cfg.inductor_options}


def compile_module(module, cfg):
    """torch.compile ``module`` as the config says."""
    import torch  # torch: keeps start-up light

    return torch.compile(module, options=inductor_options(cfg) or None)
