"""The candidates of a tune: every combination of the axes that can run on the devices at hand.

An axis is a RunConfig field (``AXIS_FIELDS``) given with `dlscale run`'s option name, each value
checked by ``config.check_value`` (one line, exit 2). Layouts come from the memory planner's
``candidate_layouts`` (every strategy and degree combination a transformer allows) and, for a
strategy it does not list, the strategy at its defaults; each candidate is then checked by
``validate_case`` and the strategy's own ``unsupported``: what cannot run is kept with the reason
(``Candidate.pruned``), never run.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError, frameworks
from dlscale.case.config import (
    AUTO_STRATEGY, FIELDS, RunConfig, check_value, choices_of, validate_case, workload_fields,
)

AXIS_FIELDS = ("strategy", "batch_size", "grad_accum", "activation_checkpointing", "compile", "compile_mode",
               "precision")
ACCUM_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # gradient accumulation tried to keep a global batch
LABEL_PREFIX = "tune:"
# strategies that generalise others: at degrees another strategy already runs, they are that strategy
MESH_STRATEGIES = ("hybrid", "hsdp")
# the strategies the memory planner enumerates with their degrees (memplan.candidate_layouts)
PLANNED_STRATEGIES = ("single", "ddp", "zero1", "fsdp", "hsdp", "tensor", "pipeline", "hybrid")
_BOOL = {"on": True, "true": True, "yes": True, "1": True, "off": False, "false": False, "no": False, "0": False}


@dataclass(frozen=True)
class Axes:
    """The values each axis may take; an empty tuple: the machine's default (``default_axes``)."""

    strategy: tuple = ()
    batch_size: tuple = ()
    grad_accum: tuple = ()
    activation_checkpointing: tuple = ()
    compile: tuple = ()
    compile_mode: tuple = ()
    precision: tuple = ()
    global_batch: int | None = None

    def given(self) -> set[str]:
        return {n for n in AXIS_FIELDS if getattr(self, n)}


@dataclass
class Candidate:
    """One configuration: the case it runs, how it holds the model, and why it is not run (if so)."""

    cfg: RunConfig
    layout: Any = None  # memplan.Layout, None where the strategy declares no memory layout
    planned_peak: float | None = None  # bytes per device, the plan's (None: not planned)
    pruned: str | None = None  # why it is not run
    pruned_by: str | None = None  # "invalid", "memory", "oom", "global batch"
    whole: bool = False  # stands for the strategy (and its options) as a whole, not one case

    @property
    def key(self) -> str:
        return self.cfg.case_key()

    def describe(self) -> str:
        c = self.cfg
        parts = [c.strategy]
        if c.strategy_options:
            parts.append(",".join(f"{k}={v}" for k, v in sorted(c.strategy_options.items())))
        if self.whole:
            return " ".join(parts)
        parts.append(f"b{c.batch_size}")
        if c.grad_accum > 1:
            parts.append(f"accum {c.grad_accum}")
        if c.activation_checkpointing != "none":
            parts.append(f"ckpt {c.activation_checkpointing}")
        parts.append(c.precision)
        parts.append(("compiled" + (f" {c.compile_mode}" if c.compile_mode != "default" else "")) if c.compile
                     else "eager")
        return " ".join(parts)


def parse_axis(name: str, items: list[str] | None) -> tuple:
    """`--strategy ddp,fsdp --strategy zero1` -> ("ddp", "fsdp", "zero1"), each value checked as
    `dlscale run` checks it; duplicates dropped, order kept."""
    out: list[Any] = []
    for item in items or []:
        for text in str(item).split(","):
            text = text.strip()
            if not text:
                continue
            value = _convert(name, text)
            check_value(name, value)
            if value == AUTO_STRATEGY and name == "strategy":
                raise ConfigError(f"tune --strategy takes registered strategies, not {AUTO_STRATEGY}; "
                                  f"choose from: {', '.join(choices_of('strategy')[1:])}")
            if value not in out:
                out.append(value)
    return tuple(out)


def _convert(name: str, text: str) -> Any:
    o = FIELDS[name]
    opt = o.option(name)
    if o.type is bool:
        if text.lower() not in _BOOL:
            raise ConfigError(f"{opt} takes on/off (true/false), got {text!r}")
        return _BOOL[text.lower()]
    if o.type is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{opt} takes integers, got {text!r}") from None
    return text


def default_axes(axes: Axes, device_type: str, world: int) -> Axes:
    """The axes with the machine's defaults filled in: every registered strategy (single on one
    device), all checkpointing modes; eager fp32 on the CPU, eager and compiled amp-bf16 and fp8
    on GPUs (fp8 is then dropped where the GPU or torchao cannot)."""
    cpu = device_type == "cpu"
    # a compile mode asked for means compiled candidates (a mode needs --compile)
    compiled = (True,) if any(m != "default" for m in axes.compile_mode) else ((False,) if cpu else (False, True))
    strategies = axes.strategy or (("single",) if world == 1 else tuple(choices_of("strategy")[1:]))
    return dataclasses.replace(
        axes, strategy=strategies,
        activation_checkpointing=axes.activation_checkpointing or tuple(choices_of("activation_checkpointing")),
        compile=axes.compile or compiled,
        compile_mode=axes.compile_mode or ("default",),
        precision=axes.precision or (("fp32",) if cpu else ("amp-bf16", "fp8")))


def tune_id(base: RunConfig, axes: Axes) -> str:
    """What names a tune: its inputs (the case fields it does not vary, the axes as given, the
    global batch, the repeats), not the budget or the output; the same command resumes."""
    fixed = {k: v for k, v in workload_fields(base.to_dict()).items() if k not in AXIS_FIELDS}
    blob = json.dumps({"fixed": fixed, "axes": dataclasses.asdict(axes), "repeats": base.repeats},
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


def layouts_for(spec, strategy: str, cfg: RunConfig) -> list[tuple[Any, dict]]:
    """(Layout or None, strategy options) of each way ``strategy`` can spread the model here."""
    from dlscale.planner.memplan import candidate_layouts  # keeps the CLI start-up light
    from dlscale.models import TransformerArch  # torch: keeps start-up light
    from dlscale.strategies import get_strategy  # torch: keeps start-up light

    world, nodes = cfg.world_size, cfg.nnodes
    if isinstance(spec.arch, TransformerArch):
        listed = candidate_layouts(spec, world, cfg.nproc_per_node, nodes)
        found = [(lay, dict(lay.options)) for lay in listed if lay.name == strategy]
        if found or strategy in PLANNED_STRATEGIES:
            return found  # none: at these degrees it would be another listed strategy (hybrid dp only is ddp)
    hook = get_strategy(strategy).memory_layout
    layout = None
    if hook is not None:
        try:
            layout = hook(world, nodes, {})
        except (ConfigError, ValueError, KeyError):
            layout = None
    return [(layout, {})]


def batch_choices(axes: Axes, layout, world: int, default_batches: tuple) -> tuple[list[tuple[int, int]], str]:
    """(per-device batch, gradient accumulation) pairs for one layout, and why there are none."""
    m = layout.microbatches if layout is not None and layout.pp > 1 else 1
    if axes.global_batch is not None:
        dp = layout.dp if layout is not None else world
        if axes.global_batch % dp:
            return [], f"global batch {axes.global_batch} is not a multiple of its data-parallel degree {dp}"
        per = axes.global_batch // dp
        pairs = [(per // a, a) for a in (axes.grad_accum or ACCUM_CHOICES) if per % a == 0]
        pairs = [(b, a) for b, a in pairs if not axes.batch_size or b in axes.batch_size]
    else:
        pairs = [(b, a) for b in (axes.batch_size or default_batches) for a in (axes.grad_accum or (1,))]
    kept = [(b, a) for b, a in pairs if b % m == 0]
    if not kept:
        why = (f"no per-device batch {'x accumulation ' if axes.global_batch else ''}"
               f"{'makes global batch ' + str(axes.global_batch) if axes.global_batch else 'given'}"
               + (f" in multiples of its {m} micro-batches" if m > 1 else "")
               + (f" within --batch-size {','.join(map(str, axes.batch_size))}" if axes.batch_size else "")
               + (f" and --grad-accum {','.join(map(str, axes.grad_accum))}" if axes.grad_accum else ""))
        return [], why
    return kept, ""


def runnable_reason(cfg: RunConfig, device_type: str, memo: dict | None = None) -> str | None:
    """Why this case cannot run here (as `dlscale run` would refuse or record it unsupported), or None.
    ``memo``: the checkpointing check by (strategy, mode), made once: it builds the model on the meta
    device (seconds for an 8B model), and nothing else of the case changes its answer."""
    from dlscale.train import checkpointing, fp8  # keeps the CLI start-up light
    from dlscale.models import get_model  # torch: keeps start-up light
    from dlscale.strategies import get_strategy  # torch: keeps start-up light

    memo = {} if memo is None else memo
    key = (cfg.strategy, cfg.activation_checkpointing)
    try:
        validate_case(dataclasses.replace(cfg, activation_checkpointing="none"))
        if key not in memo:
            try:
                checkpointing.check_case(cfg, get_model(cfg.model, cfg.flavor))
                memo[key] = None
            except ConfigError as e:
                memo[key] = str(e)
        if memo[key]:
            return memo[key]
    except ConfigError as e:
        return str(e)
    env = {"device_type": device_type}
    return fp8.check(cfg, env) or frameworks.unsupported_reason(cfg, env, get_strategy(cfg.strategy).unsupported)


def _variants(axes: Axes) -> list[dict[str, Any]]:
    """Precision x compile (and its modes) x checkpointing, as field values."""
    out = []
    for precision in axes.precision:
        for comp in axes.compile:
            for mode in (axes.compile_mode if comp else ("default",)):
                for ckpt in axes.activation_checkpointing:
                    out.append({"precision": precision, "compile": comp, "compile_mode": mode,
                                "activation_checkpointing": ckpt})
    return out


def generate(base: RunConfig, axes: Axes, device_type: str, default_batches: tuple, label: str) -> list[Candidate]:
    """Every candidate of the (defaulted) axes, labelled ``label``, the ones that cannot run marked with why."""
    from dlscale.models import get_model  # torch: keeps start-up light

    spec = get_model(base.model, base.flavor)
    out: list[Candidate] = []
    seen: set[str] = set()
    placed: dict[Any, str] = {}  # how a layout holds the model -> the first strategy that does it so
    memo: dict = {}
    for strategy in axes.strategy:
        probe = dataclasses.replace(base, strategy=strategy, strategy_options={}, label=label)
        ways = _new_ways(layouts_for(spec, strategy, probe), strategy, placed)
        if isinstance(ways, str):  # the strategy spreads the model here exactly as another one does
            out.append(Candidate(probe, None, pruned=ways, pruned_by="invalid", whole=True))
            continue
        if not ways:
            why = runnable_reason(probe, device_type) or (
                f"{strategy} has no layout on {base.nnodes} node(s) x {base.nproc_per_node} that another "
                f"strategy does not already run")
            out.append(Candidate(probe, None, pruned=why, pruned_by="invalid", whole=True))
        for layout, options in ways:
            pairs, why = batch_choices(axes, layout, base.world_size, default_batches)
            opts = {**options, **base.strategy_options}
            if not pairs:
                out.append(Candidate(dataclasses.replace(probe, strategy_options=opts), layout, pruned=why,
                                     pruned_by="global batch", whole=True))
                continue
            for var in _variants(axes):
                for b, accum in pairs:
                    try:
                        cfg = dataclasses.replace(probe, strategy_options=opts, batch_size=b, grad_accum=accum, **var)
                    except ConfigError as e:  # a combination RunConfig refuses (cannot happen from the axes alone)
                        out.append(Candidate(probe, layout, pruned=str(e), pruned_by="invalid"))
                        continue
                    if cfg.case_key() in seen:
                        continue
                    seen.add(cfg.case_key())
                    why_not = runnable_reason(cfg, device_type, memo)
                    out.append(Candidate(cfg, layout, pruned=why_not, pruned_by="invalid" if why_not else None))
    return out


def _new_ways(ways: list, strategy: str, placed: dict) -> list | str:
    """The ways not already taken by another strategy, or why none is left (a hybrid at its default
    degrees on a non-transformer model is ddp; hsdp on one node is fsdp)."""
    fresh = []
    for layout, options in ways:
        key = dataclasses.replace(layout, name="") if layout is not None else None
        other = placed.get(key) if key is not None else None
        if other is not None and other != strategy and strategy in MESH_STRATEGIES:
            continue
        if key is not None:
            placed[key] = strategy
        fresh.append((layout, options))
    if ways and not fresh:
        return f"{strategy} holds the model here as {placed[dataclasses.replace(ways[0][0], name='')]} does"
    return fresh


def check_given(cands: list[Candidate], axes: Axes) -> None:
    """Bad input, before anything runs: a value the user gave that no candidate can run with
    (an axis value the model or the devices cannot take), or a global batch nothing divides."""
    runnable = [c for c in cands if c.pruned is None]
    if axes.global_batch is not None and not any(c.pruned_by != "global batch" for c in cands):
        first = next((c.pruned for c in cands if c.pruned), "")
        raise ConfigError(f"--global-batch {axes.global_batch}: no configuration keeps it ({first})")
    for name in AXIS_FIELDS:
        for value in getattr(axes, name):
            if not any(getattr(c.cfg, name) == value for c in runnable):
                why = next((c.pruned for c in cands if getattr(c.cfg, name) == value and c.pruned), None)
                why = why or next((c.pruned for c in cands if c.pruned), "nothing else of the search allows it")
                raise ConfigError(f"{FIELDS[name].option(name)} {_show(value)}: no candidate can run with it ({why})")
    if not runnable:
        first = next((c.pruned for c in cands if c.pruned), "no candidates")
        raise ConfigError(f"no configuration can run here: {first}")


def _show(value: Any) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else str(value)
