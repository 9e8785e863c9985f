"""Training frameworks: which one runs a case, and what each needs.

``framework`` is a RunConfig field (``torch`` by default, or ``jax``). Everything framework
specific sits behind the functions here, so the launcher, the config checks and the report stay
framework-neutral: the worker module torchrun starts, whether the framework is installed, and
why a strategy cannot run under it. Nothing here imports JAX: dlscale works without it.
"""
from __future__ import annotations

import importlib.util
from typing import Any

from dlscale import ConfigError

FRAMEWORKS = ("torch", "jax")
WORKER_MODULES = {"torch": "dlscale.train.worker", "jax": "dlscale.frameworks.jax.worker"}
# what `pip install -e '.[jax]'` brings; the GPU machines have CUDA builds preinstalled
JAX_PACKAGES = ("jax", "jaxlib", "optax")
INSTALL_HINT = {"jax": "framework jax needs jax, jaxlib and optax: pip install -e '.[jax]' "
                       "(on a GPU machine, a CUDA build of jax, e.g. pip install 'jax[cuda12]' optax)"}


def check_framework(name: str) -> None:
    """ConfigError naming the choices for an unknown framework (static: no import)."""
    if name not in FRAMEWORKS:
        raise ConfigError(f"unknown framework {name!r}; choose one of: {', '.join(FRAMEWORKS)}")


def missing_packages(name: str) -> list[str]:
    """The packages a framework needs that this Python cannot import (torch: none)."""
    if name != "jax":
        return []
    return [p for p in JAX_PACKAGES if importlib.util.find_spec(p) is None]


def require(name: str) -> None:
    """ConfigError with the one-line install hint when the framework is not installed."""
    check_framework(name)
    if missing_packages(name):
        raise ConfigError(INSTALL_HINT[name])


def worker_module(name: str) -> str:
    """The module torchrun starts on every rank for this framework."""
    check_framework(name)
    return WORKER_MODULES[name]


def validate(cfg: Any) -> None:
    """Framework checks that need no machine: installed, and options the framework takes."""
    if cfg.framework == "torch":
        return
    require(cfg.framework)
    from dlscale.frameworks.jax.strategies import validate as jax_validate  # keeps the CLI start-up light

    jax_validate(cfg)


def unsupported_reason(cfg: Any, env: dict[str, Any], torch_check=None) -> str | None:
    """Why a case cannot run (recorded ``unsupported``), or None.

    torch: the strategy's own ``check(cfg, env)`` (passed in as ``torch_check``); jax:
    :func:`dlscale.frameworks.jax.strategies.jax_strategy_check`.
    """
    if cfg.framework == "torch":
        return torch_check(cfg, env) if torch_check else None
    from dlscale.frameworks.jax.strategies import jax_strategy_check  # keeps the CLI start-up light

    return jax_strategy_check(cfg)


def versions(name: str) -> dict[str, Any]:
    """Versions of a framework's packages and its backend, for the record's environment.

    torch's are already in every environment (``envinfo.capture``); jax adds jax, jaxlib, optax,
    flax (None when absent: dlscale does not use it, but a record says what was installed) and the
    default backend JAX sees in this process (``cpu``, ``gpu``).
    """
    if name != "jax":
        return {}
    from importlib import metadata  # importlib: keeps the CLI start-up light

    out: dict[str, Any] = {}
    for pkg in ("jax", "jaxlib", "optax", "flax"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    plugins = sorted(d.metadata["Name"] for d in metadata.distributions()
                     if (d.metadata["Name"] or "").startswith(("jax-cuda", "jax_cuda")))
    out["jax_plugins"] = plugins
    return out
