"""The benchmark sections of a suite file: bare-loop yardstick runs and the comparisons to render.

A benchmark suite (benchmarks/suites/) is a dlscale suite with two more top-level sections. The
suite loader validates them as strictly as the rest (unknown keys, types, values); `dlscale sweep`
then leaves them alone, and the benchmark driver (benchmarks/run.py) runs them.

``bare``: runs of benchmarks/bare_loop.py, the plain PyTorch loop dlscale is measured against. An
entry is either an explicit case (the keys of a ``cases`` entry, the suite's settings applying) or
``each: {KEY: VALUE, ...}``, one run per dlscale case of the suite matching those filter keys
(``each: {}``: every case). A run's config is its case's, so its record carries the case's
``case_key`` and `dlscale compare BARE STORE` pairs the two. Two keys change the loop itself and
make a *variant* (stored apart, named by its label): ``torchvision: true`` (resnet50: torchvision's
model definition) and ``sgd: foreach|fused`` (resnet50's optimizer implementation; ``auto``, the
default, is what dlscale uses). The loop does only what a user's few lines do, so a bare run must
be ``single`` on one device or ``ddp`` on several of one node, without strategy options, gradient
accumulation, clipping, amp-fp16 or a batch search; breakdown and profile of an ``each`` case are
dropped (the loop measures the timed window only).

``compare``: `dlscale compare` tables beside the standard ones, each ``name``, sides ``a`` and ``b``
(``store``: dlscale, bare or variants; ``label``; any ``--filter`` key of `dlscale sweep`), and
``ignore``: case fields left out when pairing A's cases with B's (env, strategy_options, ...).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from dlscale import ConfigError
from dlscale.caseargs import option_args
from dlscale.config import FIELDS, PROCEDURE_FIELDS, RunConfig, check_value

SECTIONS = ("bare", "compare")
SGD_CHOICES = ("auto", "foreach", "fused")
BARE_PRECISIONS = ("amp-bf16", "fp32")
BARE_ONLY_KEYS = ("torchvision", "sgd")
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

    def identity(self) -> tuple:
        """What resume and duplicate checks match on: store, case key, label, variant."""
        return self.store, self.cfg.case_key(), self.cfg.label, tuple(sorted(self.variant.items()))


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


@dataclass
class BenchSections:
    bare: list[BareRun] = field(default_factory=list)
    compare: list[CompareSpec] = field(default_factory=list)

    def with_overrides(self, values: dict[str, Any]) -> "BenchSections":
        """The suite's command-line overrides (device, warmup, steps, repeats), applied to the bare
        runs as to the cases, so that both keep the same case keys."""
        given = {k: v for k, v in values.items() if k not in ("max_batch_start", "max_batch_cap")}
        bare = [dataclasses.replace(b, cfg=dataclasses.replace(b.cfg, **given)) for b in self.bare]
        return BenchSections(bare, list(self.compare))


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
    have = {"dlscale"} | {b.store for b in bare}
    for i, spec in enumerate(specs):
        for name, side in (("a", spec.a), ("b", spec.b)):
            if side.store not in have:
                raise ctx.error(f"compare[{i}].{name}.store", f"the suite has no {side.store} runs to compare "
                                                              f"(its bare section makes: {', '.join(sorted(have))})")
    return BenchSections(bare, specs)


# ----------------------------------------------------------------------------- bare

def check_bare_case(cfg: RunConfig, torchvision: bool = False, sgd: str = "auto") -> None:
    """What benchmarks/bare_loop.py can run: ConfigError naming the first thing it cannot."""
    from dlscale.models import get_model

    if cfg.nnodes != 1:
        raise ConfigError("the bare loop runs on one node")
    if cfg.strategy == "single" and cfg.world_size != 1:
        raise ConfigError("single runs on one device")
    if cfg.strategy not in ("single", "ddp") or (cfg.strategy == "ddp" and cfg.world_size < 2):
        raise ConfigError(f"the bare loop runs single on one device or ddp on 2 or more, not {cfg.strategy} on "
                          f"{cfg.world_size}")
    for name, bad in (("strategy_options", bool(cfg.strategy_options)), ("grad_accum", cfg.grad_accum != 1),
                      ("clip_grad_norm", cfg.clip_grad_norm is not None), ("batch_size", cfg.batch_search),
                      ("inject_failure", cfg.inject_failure is not None), ("breakdown", cfg.breakdown),
                      ("profile", cfg.profile)):
        if bad:
            raise ConfigError(f"the bare loop has no {name} {getattr(cfg, name)!r} (it trains plainly and times "
                              f"the window only)")
    if cfg.precision not in BARE_PRECISIONS:
        raise ConfigError(f"the bare loop runs precisions {', '.join(BARE_PRECISIONS)}, not {cfg.precision}")
    if torchvision and cfg.model != "resnet50":
        raise ConfigError(f"torchvision: true is for resnet50, not {cfg.model}")
    if sgd != "auto" and get_model(cfg.model, cfg.flavor).optimizer != "sgd":
        raise ConfigError(f"sgd: {sgd} is for a model trained with SGD (resnet50), not {cfg.model}")


def bare_args(run: BareRun, device_type: str) -> list[str]:
    """benchmarks/bare_loop.py's options for a run (its ``--out`` is the driver's to add)."""
    c = run.cfg
    args = ["--model", c.model, "--flavor", c.flavor, "--batch-size", str(c.batch_size), "--precision",
            c.precision, "--device", device_type, "--seed", str(c.seed), "--warmup", str(c.warmup),
            "--steps", str(c.steps), "--sgd", run.sgd]
    if c.compile:
        args += ["--compile", "--compile-mode", c.compile_mode]
        args += option_args("--inductor-option", dict(sorted(c.inductor_options.items())))
    if run.torchvision:
        args.append("--torchvision")
    return args


def _bare_options(ctx: Context, key: str, entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
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
        runs.append(_checked(ctx, key, BareRun(cfg, **opts)))
    return runs


def _checked(ctx: Context, key: str, run: BareRun) -> BareRun:
    try:
        check_bare_case(run.cfg, run.torchvision, run.sgd)
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
            new = [_checked(ctx, key, BareRun(dataclasses.replace(cfg, monitor=False), **opts))]
        for run in new:
            ident = run.identity()
            if ident in seen:
                raise ctx.error(key, f"the same bare run as {seen[ident]} (same case, label and variant; use "
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
