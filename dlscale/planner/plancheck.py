"""`dlscale plan --check STORE`: the memory plan of each stored case beside its measured peak.

For every ok run record whose model has a transformer architecture (the newest of each case and
label), the plan's predicted peak per device (dlscale/planner/memplan.py: the record's model, flavour,
precision, checkpointing, compile flag, strategy, degrees and per-device batch, on its device
type) beside the measured peak (``summary.peak_mem_allocated_bytes``: torch's
``max_memory_allocated`` over the training steps, the largest rank and repeat), the relative error
(predicted - measured) / measured and whether it is within the tolerance. Where nothing was
measured (the CPU: the worker records the process's RSS, not an allocator peak) the row says so
and has no error. Reads the store only.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from dlscale import ConfigError
from dlscale.planner.memplan import GiB, Workload, layout_for_run, plan_memory, planned_as

TOLERANCE = 0.10  # the target: the plan within 10 % of the measured peak


@dataclass
class CheckRow:
    record_id: str
    label: str | None
    case: str  # model flavour strategy x devices, batch, precision, checkpointing, compiled
    device_type: str
    device_name: str | None
    predicted_bytes: float
    peak_at: str  # the instant of the predicted peak (memplan)
    measured_bytes: float | None
    error: float | None  # (predicted - measured) / measured
    within: bool | None
    note: str = ""


@dataclass
class CheckReport:
    store: str
    tolerance: float
    rows: list[CheckRow]
    skipped: list[dict[str, str]]  # records with no plan: {record_id, reason}

    @property
    def outside(self) -> list[CheckRow]:
        return [r for r in self.rows if r.within is False]


def _describe(cfg: dict[str, Any], world: int) -> str:
    ac = cfg.get("activation_checkpointing") or "none"
    opts = " ".join(f"{k}={v}" for k, v in sorted((cfg.get("strategy_options") or {}).items()))
    return (f"{cfg['model']} {cfg.get('flavor', 'full')} {cfg['strategy']}{' ' + opts if opts else ''} x{world} "
            f"b{cfg['batch_size']} {cfg['precision']}{' ckpt ' + ac if ac != 'none' else ''}"
            f"{' compiled' if cfg.get('compile') else ''}")


def plan_record(rec: dict[str, Any]) -> tuple[float, str, str]:
    """(predicted peak bytes, its instant, a note) of a stored run's case; ConfigError when it has no plan."""
    from dlscale.models import get_model  # torch: keeps start-up light

    cfg = rec["config"]
    if cfg.get("grad_accum", 1) != 1:
        raise ConfigError("gradient accumulation is not planned")
    spec = get_model(cfg["model"], cfg.get("flavor", "full"))
    work = Workload(spec, cfg["precision"], cfg.get("activation_checkpointing") or "none",
                    compiled=bool(cfg.get("compile")), device_type=rec.get("device_type") or "cuda")
    layout = layout_for_run(spec, cfg["strategy"], int(rec.get("world_size") or 1), int(cfg.get("nnodes", 1)),
                            cfg.get("strategy_options") or {})
    plan = plan_memory(work, layout, int(cfg["batch_size"]))
    return plan.peak, plan.peak_at, planned_as(spec.arch, work.regime, work.checkpointing)


def check(records: list[dict[str, Any]], store: str, tolerance: float = TOLERANCE) -> CheckReport:
    """The plan against the measured peak for the newest ok run record of each case and label."""
    newest: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        if rec.get("kind") == "run" and rec.get("status") == "ok" and isinstance(rec.get("config"), dict):
            newest[(rec.get("case_key"), rec.get("label"))] = rec
    rows, skipped = [], []
    for rec in newest.values():
        rid = str(rec.get("id"))
        try:
            predicted, at, note = plan_record(rec)
        except (ConfigError, KeyError, ValueError, TypeError) as e:
            skipped.append({"record_id": rid, "reason": str(e) if isinstance(e, ConfigError) else f"bad config: {e}"})
            continue
        summary = rec.get("summary") or {}
        measured = summary.get("peak_mem_allocated_bytes")
        error = (predicted - measured) / measured if measured else None
        if not measured:
            note = "; ".join(x for x in (note, f"no allocator peak measured on the {rec.get('device_type')}") if x)
        rows.append(CheckRow(rid, rec.get("label"), _describe(rec["config"], int(rec.get("world_size") or 1)),
                             rec.get("device_type") or "?", summary.get("device_name"), predicted, at, measured,
                             error, None if error is None else abs(error) <= tolerance, note))
    if not rows:
        why = "; ".join(sorted({s["reason"] for s in skipped})) or "no ok run records"
        raise ConfigError(f"nothing to check in {store}: {why}")
    return CheckReport(store, tolerance, rows, skipped)


def to_json(rep: CheckReport) -> str:
    return json.dumps({"store": rep.store, "tolerance": rep.tolerance, "rows": [asdict(r) for r in rep.rows],
                       "within": sum(r.within is True for r in rep.rows), "outside": len(rep.outside),
                       "not_measured": sum(r.within is None for r in rep.rows), "skipped": rep.skipped},
                      indent=1, default=str)


def to_markdown(rep: CheckReport) -> str:
    head = (f"# Memory plan against the measured peak: {rep.store}\n\n"
            f"Predicted: dlscale/planner/memplan.py for each case; measured: the peak allocated over training "
            f"(torch.cuda.max_memory_allocated, largest rank and repeat). Error = (predicted - measured) / measured; "
            f"tolerance {rep.tolerance:.0%}.\n")
    cols = ("case", "label", "device", "predicted GiB", "at", "measured GiB", "plan / measured", "error %", "within",
            "note")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rep.rows:
        lines.append("| " + " | ".join([
            r.case, r.label or "-", r.device_name or r.device_type, f"{r.predicted_bytes / GiB:.2f}", r.peak_at,
            "-" if r.measured_bytes is None else f"{r.measured_bytes / GiB:.2f}",
            "-" if r.error is None else f"{1 + r.error:.3f}",
            "-" if r.error is None else f"{100 * r.error:+.1f}",
            "-" if r.within is None else ("yes" if r.within else "**no**"), r.note or ""]) + " |")
    tail = f"\n\n{len(rep.skipped)} record(s) with no plan: " + "; ".join(
        f"{s['record_id'][:12]} ({s['reason']})" for s in rep.skipped) if rep.skipped else ""
    return head + "\n" + "\n".join(lines) + tail
