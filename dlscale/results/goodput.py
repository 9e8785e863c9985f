"""Goodput: the share of a repeat's wall time that was training, from its ``phases_s``.

``phases_s`` (dlscale/case/launch.py ``process_phases``) splits a repeat's process time into launch, import,
init, build, warmup, window, after and exit; they sum to the repeat's wall time. The timed window is
the steady training; the warm-up trains too, but holds the first step's compilation, autotuning and
allocator growth. Both shares are given: the window's, and the window's with the warm-up.
"""
from __future__ import annotations

import math
from typing import Any
from dlscale.results.record import median_repeat_with
from dlscale.train.checkpoint_timing import report_values

TRAINING = ("window",)
WITH_WARMUP = ("warmup", "window")


def shares(phases: dict[str, Any] | None) -> dict[str, float] | None:
    """{"window": share, "with_warmup": share} of the phases' total; None without phases or a window."""
    if not isinstance(phases, dict):
        return None
    vals = {k: float(v) for k, v in phases.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0}
    total = sum(vals.values())
    if total <= 0 or "window" not in vals:
        return None
    return {"window": sum(vals.get(k, 0.0) for k in TRAINING) / total,
            "with_warmup": sum(vals.get(k, 0.0) for k in WITH_WARMUP) / total}


def record_shares(rec: dict[str, Any]) -> dict[str, float] | None:
    """``shares`` of the record's median repeat (else its first ok repeat with phases)."""
    rep = median_repeat_with(rec, "phases_s", ok_only=True)
    return shares(rep.get("phases_s")) if rep else None


def pct_pair(rec: dict[str, Any]) -> tuple[float | None, float | None]:
    """(window %, window + warm-up %) of the wall time, for the report's column."""
    s = record_shares(rec)
    return (None, None) if s is None else (s["window"] * 100.0, s["with_warmup"] * 100.0)


STARTUP = ("launch", "import", "init", "build", "warmup")  # the phases before the window: paid once per start


def long_run(hours: float, rec: dict[str, Any] | None, interval_min: float | None) -> dict[str, Any] | None:
    """A long run's wall time with its overheads, from a record: its start-up once (the median repeat's phases
    before the window) and, with ``interval_min``, one checkpoint per that many minutes of training, each
    blocking the median seconds the record's checkpoint phase measured (``--checkpoint-every``). ``goodput``:
    the training hours' share of the total. None without a record with phases."""
    rep = median_repeat_with(rec, "phases_s")
    if rep is None:
        return None
    startup = sum(float(rep["phases_s"].get(k) or 0.0) for k in STARTUP)
    out: dict[str, Any] = {"startup_s": startup, "checkpoints": 0, "checkpoint_blocking_s": None}
    if interval_min:
        out["checkpoints"] = math.floor(hours * 60.0 / interval_min)
        out["checkpoint_blocking_s"] = report_values(rec)["blocking_s"]
        if out["checkpoint_blocking_s"] is None:
            out["reason"] = "the record has no checkpoint timed (run it with --checkpoint-every)"
            return out
    total = hours + (startup + out["checkpoints"] * (out["checkpoint_blocking_s"] or 0.0)) / 3600.0
    out.update(hours_with_overheads=total, goodput=hours / total if total > 0 else None)
    return out


def long_run_line(o: dict[str, Any] | None) -> str:
    """``long_run`` in one line for ``cost``'s table."""
    if o is None:
        return "- (no measured record with its phases)"
    if o.get("reason"):
        return f"- ({o['reason']})"
    ck = (f", {o['checkpoints']} checkpoint(s) x {o['checkpoint_blocking_s']:.3g} s blocking"
          if o["checkpoints"] else "")
    return (f"{o['hours_with_overheads']:,.2f} h (goodput {o['goodput'] * 100:.1f} %: start-up "
            f"{o['startup_s']:.0f} s{ck})")
