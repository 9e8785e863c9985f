"""``dlscale predict --strategy fsdp|hsdp|tensor|pipeline|hybrid``: a workload's predicted step over cluster
shapes from the strategy model (``strategies.predict``), with the measured records of the same
configuration beside it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from dlscale import ConfigError
from dlscale.micro.peaks import bandwidth_bps
from dlscale.perfmodel.core import Shape, error_pct
from dlscale.perfmodel.evidence import (
    StoreQuery, record_candidate, record_tokens_per_s, store_evidence, store_host_samples,
)
from dlscale.perfmodel.host import fit_host_costs
from dlscale.perfmodel.inputs import ModelOptions, Query, links_for, pick_workload
from dlscale.perfmodel.strategies import (
    FAMILIES, Candidate, Evidence, Machine, StepPrediction, predict,
)
from dlscale.results import metrics

SHARDED = ("fsdp", "hsdp", "tensor", "pipeline", "hybrid")


@dataclass
class StrategyRow:
    shape: Shape
    prediction: StepPrediction
    measured_tokens_per_s: float | None = None
    measured_record: str | None = None

    def to_dict(self) -> dict[str, Any]:
        m = self.measured_tokens_per_s
        return {"shape": self.shape.label, "devices": self.shape.devices, **self.prediction.to_dict(),
                "measured_tokens_per_s_per_gpu": m, "measured_record": self.measured_record,
                "error_pct": error_pct(self.prediction.tokens_per_s_per_device, m) if m else None}


@dataclass
class StrategyPrediction:
    model: str
    flavor: str
    strategy: str
    options: dict[str, Any]
    links: dict[str, str]
    rows: list[StrategyRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "flavor": self.flavor, "strategy": self.strategy, "options": self.options,
                "links": self.links, "rows": [r.to_dict() for r in self.rows], "notes": self.notes}


def shape_candidate(spec: Any, strategy: str, options: dict[str, Any], shape: Shape, base_cfg: dict[str, Any]
                    ) -> Candidate:
    """The Candidate of ``strategy -o options`` on ``shape``, the step settings of the base record."""
    from dlscale.planner.memplan import layout_for_run  # keeps the CLI start-up light

    if strategy not in FAMILIES:
        raise ConfigError(f"the performance model has no strategy {strategy!r}; it models {', '.join(FAMILIES)}")
    try:
        layout = layout_for_run(spec, strategy, shape.devices, shape.nodes, dict(options))
    except (TypeError, ValueError, ZeroDivisionError) as e:
        raise ConfigError(f"{strategy} options {options} on shape {shape.label}: {e}") from None
    if layout.world != shape.devices or min(layout.dp_replicate, layout.dp_shard, layout.tp, layout.pp) < 1:
        raise ConfigError(f"{strategy} degrees dp {layout.dp} x tp {layout.tp} x pp {layout.pp} do not divide the "
                          f"{shape.devices} GPUs of shape {shape.label}")
    return Candidate.from_layout(layout, int(base_cfg.get("batch_size") or 1),
                                 str(base_cfg.get("activation_checkpointing") or "none"),
                                 str(base_cfg.get("precision") or "fp32"), bool(base_cfg.get("compile")))


def _measured(records: list[dict[str, Any]], cand: Candidate, shape: Shape, seq_len: int) -> tuple[float, str] | None:
    best = None
    for rec in records:
        cfg = rec.get("config") or {}
        if rec.get("status") != "ok" or (int(cfg.get("nnodes") or 1), int(cfg.get("nproc_per_node") or 1)) != (
                shape.nodes, shape.gpus_per_node):
            continue
        rc = record_candidate(rec)
        tps = record_tokens_per_s(rec, seq_len)
        if rc == cand and tps and (best is None or str(rec.get("created")) > best[2]):
            best = (tps, str(rec.get("id"))[:8], str(rec.get("created")))
    return (best[0], best[1]) if best else None


def _others(points, cand: Candidate, gpus_per_node: int) -> list:
    """The references or host samples not of ``cand`` on nodes of ``gpus_per_node``."""
    return [p for p in points if not (p.candidate == cand and p.machine.gpus_per_node == gpus_per_node)]


def predict_strategy(records: list[dict[str, Any]], query: Query, opts: ModelOptions, options: dict[str, Any],
                     shapes: list[Shape], store: str = "the store") -> StrategyPrediction:
    """One row per shape for ``opts.strategy -o options``: the strategy model's prediction from the records of
    the workload (their measured points as the compute rate's evidence) and the measured point where one exists.
    A measured point of the same configuration and shape is not used as evidence for its own row."""
    from dlscale.models import get_model  # torch: keeps start-up light

    w = pick_workload(records, query, store, opts.strategy)
    base = w.baseline or max(w.rows, key=lambda r: r.devices)
    cfg = base.record.get("config") or {}
    spec = get_model(cfg.get("model"), cfg.get("flavor") or "full")
    if getattr(spec, "arch", None) is None or not hasattr(spec.arch, "attn_dim"):
        raise ConfigError(f"the strategy model needs a transformer architecture; {spec.name} has none")
    links, _ = links_for(base, records, opts)
    summ = base.record.get("summary") or {}
    peak = summ.get("peak_flops") or metrics.peak_flops(summ.get("device_name"), metrics.precision_dtype(
        str(cfg.get("precision") or "fp32"), "cuda"))[0]
    if not peak:
        raise ConfigError(f"no peak FLOP/s known for {summ.get('device_name')!r}: the strategy model needs it")
    mine = [r.record for r in w.rows]
    ev = store_evidence(mine, StoreQuery(spec.name, spec.flavor, float(peak), links, int(cfg.get("batch_size") or 1),
                                         device_type=str(cfg.get("device") or "cuda")), store=records)
    samples = store_host_samples(records, links, float(peak))
    out = StrategyPrediction(spec.name, spec.flavor, opts.strategy, dict(options), dict(links.sources))
    for sh in shapes:
        cand = shape_candidate(spec, opts.strategy, options, sh, cfg)
        machine = Machine(sh.devices, sh.gpus_per_node, float(peak), links,
                          mem_bw_bps=bandwidth_bps(summ.get("device_name")))
        # the row's own measured point informs neither its compute rate nor its host costs
        row_ev = replace(ev, references=tuple(_others(ev.references, cand, sh.gpus_per_node)),
                         host_costs=fit_host_costs(_others(samples, cand, sh.gpus_per_node)))
        pred = predict(cand, spec.arch, machine, row_ev)
        meas = _measured(mine, cand, sh, spec.arch.seq_len)
        out.rows.append(StrategyRow(sh, pred, meas[0] if meas else None, meas[1] if meas else None))
    out.notes.append("compute rate: inferred from the measured record named in each row's evidence (the model "
                     "inverted at that record's configuration), docs/perfmodel.md")
    return out


def render_strategy(p: StrategyPrediction) -> str:
    opts = " ".join(f"-o {k}={v}" for k, v in p.options.items())
    lines = [f"# predict: {p.model} {p.flavor}, strategy {p.strategy} {opts}".rstrip(),
             *(f"# {k} link: {v}" for k, v in p.links.items()),
             "| shape | config | tokens/s/GPU | band | MFU % | step ms | limited by | basis | measured | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in p.rows:
        q = r.prediction
        m = r.measured_tokens_per_s
        lines.append(f"| {r.shape.label} | {q.candidate.label} | {q.tokens_per_s_per_device:,.0f} | "
                     f"{q.low:,.0f}-{q.high:,.0f} | {100 * q.mfu:.1f} | {q.step_s * 1e3:.1f} | {q.limited_by} | "
                     f"{q.basis} | {f'{m:,.0f}' if m else '-'} | "
                     f"{f'{error_pct(q.tokens_per_s_per_device, m):+.1f} %' if m else '-'} |")
    lines += [f"- {r.shape.label}: {r.prediction.evidence}" for r in p.rows]
    lines += [f"- {r.shape.label}: {n}" for r in p.rows for n in r.prediction.notes]
    lines += [f"- {n}" for n in p.notes]
    return "\n".join(lines)
