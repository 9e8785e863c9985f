"""The benchmark sections of a suite file: yardstick runs, comparisons and the driver's commands.

A benchmark suite (benchmarks/suites/) is a dlscale suite with three more top-level sections. The
suite loader validates them as strictly as the rest (unknown keys, types, values); `dlscale sweep`
then leaves them alone, and the benchmark driver (benchmarks/run.py) runs them.

``bare``: runs of a yardstick, a hand-written training loop dlscale is measured against (``loop``:
``torch``, benchmarks/bare_loop.py, the default for a torch case; ``jax``, bare_loop_jax.py, the
default for a JAX case; ``mp``, bare_mp.py, the plain one-device loop of a model-parallel
workload). An entry is either an explicit case (the keys of a ``cases`` entry, the suite's
settings applying) or ``each: {KEY: VALUE, ...}``, one run per dlscale case of the suite matching
those filter keys (``each: {}``: every case). A run's config is its case's, so its record carries
the case's ``case_key`` and `dlscale compare BARE STORE` pairs the two. Two keys change the torch
loop itself and make a *variant* (stored apart, named by its label): ``torchvision: true``
(resnet50: torchvision's model definition) and ``sgd: foreach|fused`` (resnet50's optimizer
implementation; ``auto``, the default, is what dlscale uses). A loop does only what a user's few
lines do (``LOOPS`` says what each runs); breakdown and profile of an ``each`` case are dropped
(the loop measures the timed window only).

``compare``: `dlscale compare` tables beside the standard ones, each ``name``, sides ``a`` and ``b``
(``store``: dlscale, bare or variants; ``label``; any ``--filter`` key of `dlscale sweep`), and
``ignore``: case fields left out when pairing A's cases with B's (env, strategy_options, ...).

``commands``: dlscale commands (``dlscale: [ARG, ...]``) or benchmarks/ scripts (``script:
[NAME.py, ARG, ...]``), argument lists never passed to a shell, run ``before`` the measurements
(make a data set: ``creates: PATH`` skips the command where PATH exists), ``after`` them (a
micro-benchmark into the store; ``gpus: N`` skips it where fewer GPUs are visible), or as a
``table`` (the driver adds ``--format md|json`` and keeps the output as NAME.md and NAME.json).
``during`` commands run while the measurements do (a competing load), and are ended after them.
``{out}``, ``{store}``, ``{bare}``, ``{variants}`` in an argument are the driver's paths,
``{python}`` its Python interpreter.

``external``: other stacks' training commands measured as `dlscale run --command` measures them
(dlscale/external/suite.py), into the dlscale store beside the suite's cases.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from dlscale import ConfigError
from dlscale.case.caseargs import option_args
from dlscale.case.config import FIELDS, PROCEDURE_FIELDS, RunConfig, check_value
from dlscale.external.suite import _PLACE, PLACES, SETTINGS, parse_external, resolve_args

SECTIONS = ("bare", "compare", "commands", "external")
SGD_CHOICES = ("auto", "foreach", "fused")
BARE_PRECISIONS = ("amp-bf16", "fp32")
VARIANT_KEYS = ("torchvision", "sgd")  # the torch loop's variants
BARE_ONLY_KEYS = ("loop",) + VARIANT_KEYS
EACH_KEYS = ("each", "label", "repeats", "time_limit") + BARE_ONLY_KEYS
STORES = ("dlscale", "bare", "variants")  # the driver's stores: sweep records, bare runs, bare variants
SIDE_KEYS = ("store", "label")
COMPARE_KEYS = ("name", "a", "b", "ignore")
# compare may leave out of the pairing any field of the case identity
IGNORABLE = tuple(n for n in FIELDS if n not in PROCEDURE_FIELDS)
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")


@dataclass(frozen=True)
class BareRun:
    """One bare-loop run: the dlscale case it measures and the loop's own variant settings."""

    cfg: RunConfig
    torchvision: bool = False
    sgd: str = "auto"
    loop: str = "torch"  # the yardstick script (LOOPS)

    @property
    def variant(self) -> dict[str, Any]:
        """What differs from the plain loop ({} for the yardstick of ``cfg`` itself)."""
        out: dict[str, Any] = {}
        if self.torchvision:
            out["torchvision"] = True
        if self.sgd != "auto":
            out["sgd"] = self.sgd
        return out

    @property
    def store(self) -> str:
        return "variants" if self.variant else "bare"

    @property
    def script(self) -> str:
        return LOOPS[self.loop].script

    def identity(self) -> tuple:
        """What resume and duplicate checks match on: store, loop, case key, label, variant."""
        return self.store, self.loop, self.cfg.case_key(), self.cfg.label, tuple(sorted(self.variant.items()))


@dataclass(frozen=True)
class Side:
    store: str = "dlscale"
    label: str | None = None
    filters: tuple[str, ...] = ()  # "KEY=V1,V2", as `dlscale sweep --filter` takes them


@dataclass(frozen=True)
class CompareSpec:
    name: str
    a: Side
    b: Side
    ignore: tuple[str, ...] = ()

    def argv(self, stores: dict[str, str]) -> list[str]:
        """`dlscale compare` arguments (no command word) for the driver's store paths."""
        out = [stores[self.a.store], stores[self.b.store]]
        for flag, side in (("a", self.a), ("b", self.b)):
            if side.label is not None:
                out += [f"--label-{flag}", side.label]
            for f in side.filters:
                out += [f"--filter-{flag}", f]
        if self.ignore:
            out += ["--ignore", ",".join(self.ignore)]
        return out


@dataclass(frozen=True)
class Command:
    """A command of the suite's ``commands`` section, as the driver runs it."""

    name: str
    when: str  # before | after | table | during
    argv: tuple[str, ...]  # dlscale's arguments, or the script's name and its arguments
    script: bool = False  # a benchmarks/ script, not a dlscale command
    creates: str | None = None  # skip where this path exists (a data set already made)
    gpus: int | None = None  # skip on CUDA where fewer GPUs are visible
    time_limit: float = 900.0  # seconds; the command's process tree is killed past it

    def resolved(self, places: dict[str, str]) -> list[str]:
        """The arguments with the placeholders (``{out}``, ``{store}``, ...) replaced."""
        return resolve_args(self.argv, places)


@dataclass
class BenchSections:
    bare: list[BareRun] = field(default_factory=list)
    compare: list[CompareSpec] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    external: list[Any] = field(default_factory=list)  # ExternalRun (dlscale/external/suite.py)

    def with_overrides(self, values: dict[str, Any]) -> "BenchSections":
        """The suite's command-line overrides (device, warmup, steps, repeats), applied to the bare
        runs as to the cases, so that both keep the same case keys."""
        given = {k: v for k, v in values.items() if k not in ("max_batch_start", "max_batch_cap")}
        bare = [dataclasses.replace(b, cfg=dataclasses.replace(b.cfg, **given)) for b in self.bare]
        return BenchSections(bare, list(self.compare), list(self.commands),
                             [e.with_overrides(given) for e in self.external])

    def when(self, phase: str) -> list[Command]:
        return [c for c in self.commands if c.when == phase]


@dataclass(frozen=True)
class Context:
    """What the suite loader lends to this module (it keeps the suite's own parsing)."""

    error: Callable[[str | None, str], ConfigError]  # (key, message) -> the error naming file and key
    unknown_keys: Callable[[str, Iterable[str], Sequence[str]], None]  # (prefix, keys, allowed): raises
    case: Callable[[str, dict[str, Any]], RunConfig]  # an explicit case entry -> its RunConfig
    case_keys: tuple[str, ...]  # keys an explicit case may set
    filters: Callable[[list[str]], list[dict[str, list[Any]]]]  # --filter strings -> filter entries
    matches: Callable[[RunConfig, list[dict[str, list[Any]]]], bool]
    cases: list[RunConfig]  # the suite's dlscale cases, expanded


def parse_sections(data: dict[str, Any], ctx: Context) -> BenchSections:
    bare = _bare_runs(data.get("bare"), ctx) if data.get("bare") is not None else []
    specs = _compare_specs(data.get("compare"), ctx) if data.get("compare") is not None else []
    commands = _commands(data.get("commands"), ctx) if data.get("commands") is not None else []
    external = _external(data, ctx) if data.get("external") is not None else []
    have = {"dlscale"} | {b.store for b in bare}
    for i, spec in enumerate(specs):
        for name, side in (("a", spec.a), ("b", spec.b)):
            if side.store not in have:
                raise ctx.error(f"compare[{i}].{name}.store", f"the suite has no {side.store} runs to compare "
                                                              f"(its bare section makes: {', '.join(sorted(have))})")
    return BenchSections(bare, specs, commands, external)


def _external(data: dict[str, Any], ctx: Context) -> list[Any]:
    # the suite's settings were checked by its loader; an external case takes them as its defaults
    settings = {k: data[k] for k in SETTINGS if k in data}
    return parse_external(data["external"], ctx.error, ctx.unknown_keys, lambda key, v: _argv(ctx, key, v), settings)


# ----------------------------------------------------------------------------- bare

def _check_plain(cfg: RunConfig) -> None:
    """What no yardstick does: it trains plainly on synthetic batches and times the window only."""
    if cfg.nnodes != 1:
        raise ConfigError("the bare loop runs on one node")
    for name, bad in (("grad_accum", cfg.grad_accum != 1), ("clip_grad_norm", cfg.clip_grad_norm is not None),
                      ("batch_size", cfg.batch_search), ("inject_failure", cfg.inject_failure is not None),
                      ("breakdown", cfg.breakdown), ("profile", cfg.profile),
                      ("activation_checkpointing", cfg.activation_checkpointing != "none")):
        if bad:
            raise ConfigError(f"the bare loop has no {name} {getattr(cfg, name)!r} (it trains plainly and times "
                              f"the window only)")
    if cfg.precision not in BARE_PRECISIONS:
        raise ConfigError(f"the bare loop runs precisions {', '.join(BARE_PRECISIONS)}, not {cfg.precision}")
    if cfg.data != "synthetic":
        raise ConfigError(f"the bare loop trains on synthetic batches, not data {cfg.data}")


def _one_device(cfg: RunConfig, loop: str) -> None:
    if cfg.world_size != 1:
        raise ConfigError(f"loop {loop} runs one process on one device, not {cfg.world_size}")


def _check_torch(run: "BareRun") -> None:
    """benchmarks/bare_loop.py: single on one device or ddp on several, eager or compiled."""
    from dlscale.models import get_model  # torch: keeps start-up light

    cfg = run.cfg
    _check_plain(cfg)
    if cfg.framework != "torch":
        raise ConfigError(f"loop torch trains torch models; a {cfg.framework} case needs loop: {cfg.framework}")
    if cfg.strategy == "single" and cfg.world_size != 1:
        raise ConfigError("single runs on one device")
    if cfg.strategy not in ("single", "ddp") or (cfg.strategy == "ddp" and cfg.world_size < 2):
        raise ConfigError(f"the bare loop runs single on one device or ddp on 2 or more, not {cfg.strategy} on "
                          f"{cfg.world_size}")
    if cfg.strategy_options:
        raise ConfigError(f"the bare loop has no strategy_options {cfg.strategy_options!r} (it trains plainly)")
    if run.torchvision and cfg.model != "resnet50":
        raise ConfigError(f"torchvision: true is for resnet50, not {cfg.model}")
    if run.sgd != "auto" and get_model(cfg.model, cfg.flavor).optimizer != "sgd":
        raise ConfigError(f"sgd: {run.sgd} is for a model trained with SGD (resnet50), not {cfg.model}")


def _check_jax(run: "BareRun") -> None:
    """benchmarks/bare_loop_jax.py: one jitted step, on one device or data parallel over several
    (one process a device under torchrun, the batch split over a mesh)."""
    cfg = run.cfg
    _check_plain(cfg)
    if cfg.framework != "jax":
        raise ConfigError(f"loop jax trains JAX models; a {cfg.framework} case needs loop: torch")
    if cfg.strategy_options or not ((cfg.strategy == "single" and cfg.world_size == 1)
                                    or (cfg.strategy == "ddp" and cfg.world_size >= 2)):
        raise ConfigError(f"loop jax runs single on one device or ddp on 2 or more without options, not "
                          f"{cfg.strategy} on {cfg.world_size}")


def mp_knobs(cfg: RunConfig) -> dict[str, Any]:
    """The model's size knobs a model-parallel case sets through its strategy's options (classes,
    vocab_scale, ...): what the plain loop resizes the model by. The other options choose how to
    shard, which at one device changes nothing the plain loop computes."""
    from dlscale.strategies import embedding_shard, partial_fc  # torch: keeps start-up light

    knobs = {"embedding-shard": embedding_shard.KNOBS, "partial-fc": tuple(partial_fc.OPTIONS)}.get(cfg.strategy, ())
    return {k: v for k, v in sorted(cfg.strategy_options.items()) if k in knobs and v is not None}


MP_STRATEGIES = ("single", "embedding-shard", "partial-fc")


def _check_mp(run: "BareRun") -> None:
    """benchmarks/bare_mp.py: the plain one-device loop of a model-parallel workload, the model
    sized as the case's strategy options size it."""
    cfg = run.cfg
    _check_plain(cfg)
    if cfg.framework != "torch":
        raise ConfigError(f"loop mp trains torch models, not {cfg.framework}")
    _one_device(cfg, "mp")
    if cfg.strategy not in MP_STRATEGIES:
        raise ConfigError(f"loop mp is the yardstick of {', '.join(MP_STRATEGIES)} at one device, not {cfg.strategy}")
    if cfg.compile:
        raise ConfigError("loop mp runs eager (the sharded strategies are not compiled)")


def _check_hf_llama(run: "BareRun") -> None:
    """benchmarks/bare_llama_hf.py: Hugging Face's LlamaForCausalLM at the case's llama shape, one
    device, eager or compiled with torch.compile's defaults."""
    cfg = run.cfg
    _check_plain(cfg)
    if cfg.framework != "torch" or cfg.model != "llama":
        raise ConfigError(f"loop hf-llama trains Hugging Face's Llama at a llama flavour's shape, not {cfg.framework} "
                          f"{cfg.model}")
    _one_device(cfg, "hf-llama")
    if cfg.strategy != "single" or cfg.strategy_options:
        raise ConfigError(f"loop hf-llama runs strategy single without options, not {cfg.strategy}")
    if cfg.compile and (cfg.compile_mode != "default" or cfg.inductor_options):
        raise ConfigError("loop hf-llama compiles with torch.compile's default mode and no inductor options")


def _torch_args(run: "BareRun", device_type: str) -> list[str]:
    c = run.cfg
    args = _common_args(c, device_type) + ["--sgd", run.sgd]
    if c.compile:
        args += ["--compile", "--compile-mode", c.compile_mode]
        args += option_args("--inductor-option", dict(sorted(c.inductor_options.items())))
    if run.torchvision:
        args.append("--torchvision")
    return args


def _common_args(c: RunConfig, device_type: str) -> list[str]:
    return ["--model", c.model, "--flavor", c.flavor, "--batch-size", str(c.batch_size), "--precision",
            c.precision, "--device", device_type, "--seed", str(c.seed), "--warmup", str(c.warmup),
            "--steps", str(c.steps)]


def _mp_args(run: "BareRun", device_type: str) -> list[str]:
    return _common_args(run.cfg, device_type) + option_args("--resize", mp_knobs(run.cfg))


@dataclass(frozen=True)
class Loop:
    """A yardstick script: it takes the options ``args`` gives and ``--out DIR``, and writes
    DIR/rank<R>.json per rank in the worker's shape; ``check`` raises for a case it cannot run."""

    script: str  # from the repository root
    multi_process: bool  # ddp under torchrun on 2 or more devices
    check: Callable[[BareRun], None]
    args: Callable[[BareRun, str], list[str]]
    packages: tuple[str, ...] = ()  # what the script imports beyond dlscale's dependencies


LOOPS: dict[str, Loop] = {
    "torch": Loop("benchmarks/bare_loop.py", True, _check_torch, _torch_args),
    "jax": Loop("benchmarks/bare_loop_jax.py", True, _check_jax, lambda run, dev: _common_args(run.cfg, dev)),
    "mp": Loop("benchmarks/bare_mp.py", False, _check_mp, _mp_args),
    "hf-llama": Loop("benchmarks/bare_llama_hf.py", False, _check_hf_llama,
                     lambda run, dev: _common_args(run.cfg, dev) + (["--compile"] if run.cfg.compile else []),
                     packages=("transformers",)),
}


def missing_packages(runs: Iterable[BareRun]) -> str | None:
    """Why these bare runs cannot start here (a loop's package not importable), else None."""
    for run in runs:
        missing = [p for p in LOOPS[run.loop].packages if importlib.util.find_spec(p) is None]
        if missing:
            return (f"loop {run.loop} ({run.script}) needs {', '.join(missing)}: pip install {' '.join(missing)} "
                    f"(on a machine without an index: the driver's --wheels DIR)")
    return None


def check_bare_run(run: BareRun) -> None:
    """ConfigError naming the first thing the run's loop cannot do."""
    LOOPS[run.loop].check(run)


def bare_args(run: BareRun, device_type: str) -> list[str]:
    """The loop script's options for a run (its ``--out`` is the driver's to add)."""
    return LOOPS[run.loop].args(run, device_type)


def _bare_options(ctx: Context, key: str, entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "loop" in entry:
        if entry["loop"] not in LOOPS:
            raise ctx.error(f"{key}.loop", f"expected one of {', '.join(LOOPS)}, got {entry['loop']!r}")
        out["loop"] = entry["loop"]
        if out["loop"] != "torch" and any(k in entry for k in VARIANT_KEYS):
            raise ctx.error(key, f"{' and '.join(k for k in VARIANT_KEYS if k in entry)} are variants of loop torch, "
                                 f"not of loop {out['loop']}")
    if "torchvision" in entry:
        if not isinstance(entry["torchvision"], bool):
            raise ctx.error(f"{key}.torchvision", f"expected true or false, got {entry['torchvision']!r}")
        out["torchvision"] = entry["torchvision"]
    if "sgd" in entry:
        if entry["sgd"] not in SGD_CHOICES:
            raise ctx.error(f"{key}.sgd", f"expected one of {', '.join(SGD_CHOICES)}, got {entry['sgd']!r}")
        out["sgd"] = entry["sgd"]
    return out


def _filter_strings(ctx: Context, key: str, mapping: Any) -> list[str]:
    """A mapping of --filter keys to a value or a list of values -> "KEY=V1,V2" strings."""
    if not isinstance(mapping, dict):
        raise ctx.error(key, f"expected a mapping of filter keys to values (e.g. {{devices: 2}}), got {mapping!r}")
    out = []
    for k, v in mapping.items():
        values = v if isinstance(v, list) else [v]
        if not values or any(isinstance(x, (dict, list)) or x is None for x in values):
            raise ctx.error(f"{key}.{k}", f"expected a value or a list of values, got {v!r}")
        out.append(f"{k}=" + ",".join(str(x).lower() if isinstance(x, bool) else str(x) for x in values))
    try:
        ctx.filters(out)
    except ConfigError as e:
        raise ctx.error(key, str(e).replace("--filter ", "", 1)) from None
    return out


def _each(ctx: Context, key: str, entry: dict[str, Any]) -> list[BareRun]:
    ctx.unknown_keys(f"{key}.", entry, EACH_KEYS)
    filters = ctx.filters(_filter_strings(ctx, f"{key}.each", entry["each"]))
    over: dict[str, Any] = {}
    for name in ("label", "repeats", "time_limit"):
        if name in entry:
            try:
                over[name] = check_value(name, entry[name])
            except ConfigError as e:
                raise ctx.error(f"{key}.{name}", str(e)) from None
    opts = _bare_options(ctx, key, entry)
    chosen = [c for c in ctx.cases if ctx.matches(c, filters)]
    if not chosen:
        raise ctx.error(f"{key}.each", "matches no case of the suite")
    runs = []
    for c in chosen:
        cfg = dataclasses.replace(c, breakdown=False, profile=False, monitor=False, **over)
        runs.append(_checked(ctx, key, _run(cfg, opts)))
    return runs


def _run(cfg: RunConfig, opts: dict[str, Any]) -> BareRun:
    """A bare run; its loop by default the case's framework's (jax for a JAX case, else torch)."""
    return BareRun(cfg, **{"loop": "jax" if cfg.framework == "jax" else "torch", **opts})


def _checked(ctx: Context, key: str, run: BareRun) -> BareRun:
    try:
        check_bare_run(run)
    except ConfigError as e:
        c = run.cfg
        raise ctx.error(key, f"case {{model={c.model}, strategy={c.strategy}, devices={c.world_size}, "
                             f"batch_size={c.batch_size}}}: {e}") from None
    return run


def _bare_runs(value: Any, ctx: Context) -> list[BareRun]:
    if not isinstance(value, list):
        raise ctx.error("bare", f"expected a list of bare-loop runs (a case mapping, or each: {{...}}), got {value!r}")
    runs: list[BareRun] = []
    seen: dict[tuple, str] = {}
    for i, entry in enumerate(value):
        key = f"bare[{i}]"
        if not isinstance(entry, dict):
            raise ctx.error(key, f"expected a mapping (a case, or each: {{...}}), got {entry!r}")
        if "each" in entry:
            new = _each(ctx, key, entry)
        else:
            ctx.unknown_keys(f"{key}.", entry, ctx.case_keys + BARE_ONLY_KEYS)
            opts = _bare_options(ctx, key, entry)
            cfg = ctx.case(key, {k: v for k, v in entry.items() if k not in BARE_ONLY_KEYS})
            new = [_checked(ctx, key, _run(dataclasses.replace(cfg, monitor=False), opts))]
        for run in new:
            ident = run.identity()
            if ident in seen:
                raise ctx.error(key, f"the same bare run as {seen[ident]} (same loop, case, label and variant; use "
                                     f"repeats, or another label)")
            seen[ident] = key
        runs += new
    return runs


# ----------------------------------------------------------------------------- compare

def _side(ctx: Context, key: str, value: Any) -> Side:
    if value is None:
        return Side()
    if not isinstance(value, dict):
        raise ctx.error(key, f"expected a mapping (store, label, filter keys), got {value!r}")
    store = value.get("store", "dlscale")
    if store not in STORES:
        raise ctx.error(f"{key}.store", f"expected one of {', '.join(STORES)}, got {store!r}")
    label = value.get("label")
    if label is not None and (not isinstance(label, str) or not label.strip()):
        raise ctx.error(f"{key}.label", f"expected a label (a string), got {label!r}")
    rest = {k: v for k, v in value.items() if k not in SIDE_KEYS}
    return Side(store, label, tuple(_filter_strings(ctx, key, rest)) if rest else ())


def _compare_specs(value: Any, ctx: Context) -> list[CompareSpec]:
    if not isinstance(value, list):
        raise ctx.error("compare", f"expected a list of comparisons (name, a, b, ignore), got {value!r}")
    out: list[CompareSpec] = []
    for i, entry in enumerate(value):
        key = f"compare[{i}]"
        if not isinstance(entry, dict):
            raise ctx.error(key, f"expected a mapping (name, a, b, ignore), got {entry!r}")
        ctx.unknown_keys(f"{key}.", entry, COMPARE_KEYS)
        name = entry.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise ctx.error(f"{key}.name", f"expected a name of lowercase letters, digits and '-' (up to 40), "
                                           f"got {name!r}")
        if any(s.name == name for s in out):
            raise ctx.error(f"{key}.name", f"{name!r} is already the name of another comparison")
        ignore = entry.get("ignore", [])
        ignore = ignore if isinstance(ignore, list) else [ignore]
        for f in ignore:
            if f not in IGNORABLE:
                raise ctx.error(f"{key}.ignore", f"{f!r} is not a field of the case identity; allowed: "
                                                 f"{', '.join(IGNORABLE)}")
        a, b = _side(ctx, f"{key}.a", entry.get("a")), _side(ctx, f"{key}.b", entry.get("b"))
        if a == b:
            raise ctx.error(key, "sides a and b select the same records; give them different stores, labels or "
                                 "filters")
        out.append(CompareSpec(name, a, b, tuple(ignore)))
    return out


# ----------------------------------------------------------------------------- commands

WHEN = ("before", "after", "table", "during")
COMMAND_KEYS = ("name", "when", "dlscale", "script", "creates", "gpus", "time_limit")
# the dlscale commands each phase may run: make data sets and micro-benchmarks around the cases
# (or as a load while they run), read-only views of the stores as tables
DLSCALE_COMMANDS = {"before": ("data", "micro"), "after": ("data", "micro"), "during": ("micro",),
                    "table": ("report", "compare", "predict", "parity", "plan")}
_SCRIPT = re.compile(r"^[a-z0-9_]+\.py$")
# file stems the driver writes itself (a table command writes NAME.md and NAME.json)
RESERVED = ("report", "by-label", "bare", "variants", "vs-bare", "index", "env", "commands", "sweep", "store")


def _argv(ctx: Context, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ctx.error(key, f"expected a non-empty list of arguments (never a shell string), got {value!r}")
    out = []
    for i, a in enumerate(value):
        if isinstance(a, bool) or not isinstance(a, (str, int, float)) or a == "":
            raise ctx.error(f"{key}[{i}]", f"expected a string or a number, got {a!r}")
        text = str(a)
        if "{" in _PLACE.sub("", text) or "}" in _PLACE.sub("", text):
            raise ctx.error(f"{key}[{i}]", f"{text!r}: the only placeholders are "
                                           f"{', '.join('{' + p + '}' for p in PLACES)}")
        out.append(text)
    return tuple(out)


def _command(ctx: Context, key: str, entry: Any, taken: set[str]) -> Command:
    if not isinstance(entry, dict):
        raise ctx.error(key, f"expected a mapping (name, when, dlscale or script, ...), got {entry!r}")
    ctx.unknown_keys(f"{key}.", entry, COMMAND_KEYS)
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name) or name in RESERVED or name.startswith("compare-"):
        raise ctx.error(f"{key}.name", f"expected a name of lowercase letters, digits and '-' (up to 40; not "
                                       f"{', '.join(RESERVED)}, nor compare-*), got {name!r}")
    if name in taken:
        raise ctx.error(f"{key}.name", f"{name!r} is already the name of another command")
    when = entry.get("when")
    if when not in WHEN:
        raise ctx.error(f"{key}.when", f"expected one of {', '.join(WHEN)}, got {when!r}")
    if ("dlscale" in entry) == ("script" in entry):
        raise ctx.error(key, "give one of dlscale: [ARG, ...] or script: [NAME.py, ARG, ...]")
    script = "script" in entry
    argv = _argv(ctx, f"{key}.{'script' if script else 'dlscale'}", entry["script" if script else "dlscale"])
    if script and not _SCRIPT.match(argv[0]):
        raise ctx.error(f"{key}.script[0]", f"expected the file name of a benchmarks/ script (NAME.py), got {argv[0]!r}")
    if not script and argv[0] not in DLSCALE_COMMANDS[when]:
        raise ctx.error(f"{key}.dlscale[0]", f"a {when} command runs dlscale {' or '.join(DLSCALE_COMMANDS[when])}, "
                                             f"not {argv[0]!r}")
    if when == "table":
        bad = [a for a in argv if a in ("--format", "-o", "--output") or a.startswith(("--format=", "--output="))]
        if bad or any(k in entry for k in ("creates", "gpus")):
            raise ctx.error(key, "a table command prints its table: the driver adds --format md|json and keeps the "
                                 "output (no --format, -o, creates or gpus)")
    if when == "during" and "creates" in entry:
        raise ctx.error(f"{key}.creates", "a during command is a load while the measurements run: it makes nothing "
                                          "to skip it by (no creates)")
    creates = entry.get("creates")
    if creates is not None and (not isinstance(creates, str) or not creates.strip() or "{" in creates):
        raise ctx.error(f"{key}.creates", f"expected a literal path (no placeholders), got {creates!r}")
    gpus = entry.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ctx.error(f"{key}.gpus", f"expected a GPU count >= 1, got {gpus!r}")
    try:
        limit = check_value("time_limit", entry.get("time_limit", Command.time_limit))
    except ConfigError as e:
        raise ctx.error(f"{key}.time_limit", str(e)) from None
    taken.add(name)
    return Command(name, when, argv, script, creates, gpus, float(limit))


def _commands(value: Any, ctx: Context) -> list[Command]:
    if not isinstance(value, list):
        raise ctx.error("commands", f"expected a list of commands (name, when, dlscale or script), got {value!r}")
    taken: set[str] = set()
    return [_command(ctx, f"commands[{i}]", entry, taken) for i, entry in enumerate(value)]
