"""Report columns of what a run loses besides the step: the slowest rank, the wall time outside the
window, energy and checkpoints. Each is shown only where some ok row of a table has a value (as the
utilisation columns); ``fields`` gives the raw values for CSV and JSON."""
from __future__ import annotations

from typing import Any, Callable

from dlscale.results import goodput
from dlscale.train import checkpoint_timing, ranktimes
from dlscale.report.table import Column

def _summary(row, key: str) -> float | None:
    summ = row.record.get("summary")
    v = summ.get(key) if isinstance(summ, dict) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _milli(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _giga(v: float | None) -> float | None:
    return None if v is None else v / 1e9


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100.0


def _slowest_ms(row) -> float | None:
    return (ranktimes.record_slowest(row.record) or {}).get("median_ms")


def _ckpt(row, key: str) -> float | None:
    return checkpoint_timing.report_values(row.record)[key]


# (header or Column, the row's value(s)): appended to render.EXTRA_COLUMNS
COLUMNS: tuple[tuple[str | Column, Callable[[Any], tuple[float | None, ...]]], ...] = (
    ("slowest rank vs rest (%)", lambda r: (ranktimes.gap_pct(r.record),)),
    (Column("slowest rank step", "ms", 1, note="the slowest rank's median step (its solo steps where the "
            "strategy has them, else its window median; docs/metrics.md, Slow ranks)"), lambda r: (_slowest_ms(r),)),
    ("wall in window / +warm-up (%)", lambda r: goodput.pct_pair(r.record)),
    ("energy (J/sample)", lambda r: (_summary(r, "joules_per_sample"),)),
    ("energy (mJ/token)", lambda r: (_milli(_summary(r, "joules_per_token")),)),
    ("checkpoint block / durable (s)", lambda r: (_ckpt(r, "blocking_s"), _ckpt(r, "durable_s"))),
    ("checkpoint write (GB/s)", lambda r: (_giga(_ckpt(r, "write_bytes_per_s")),)),
    ("steps after checkpoint (%)", lambda r: (_pct(_ckpt(r, "step_effect")),)),
)

NOTE = ("slowest rank vs rest: its median step over the other ranks' median, from their solo steps after the "
        "window where the strategy has them (docs/metrics.md, Slow ranks); wall in window / +warm-up: the share "
        "of the median repeat's wall time (phases_s) in the timed window, and with the warm-up; energy: the "
        "window's joules from the energy counters (NVML on GPUs, RAPL packages on CPUs), median over the repeats "
        "that read one, per sample and per token (docs/utilisation.md, Energy); checkpoint: the median repeat's "
        "saves (--checkpoint-every; medians over them): seconds training was blocked and to durable completion, "
        "bytes ÷ durable seconds (GB = 10^9 B), the steps after the saves against those before, % "
        "(docs/metrics.md, Checkpoints)")

CSV_COLUMNS = ["slowest_rank", "slowest_rank_host", "slowest_rank_device", "slowest_rank_gap", "slowest_rank_step_ms",
               "wall_share_window",
               "wall_share_with_warmup",
               "joules_per_sample", "joules_per_token", "checkpoint_blocking_s", "checkpoint_durable_s",
               "checkpoint_write_bytes_per_s", "checkpoint_step_effect"]


def fields(row) -> dict[str, Any]:
    """Raw values for CSV and JSON: the slowest rank (number, host, gap) and the training shares."""
    s = ranktimes.record_slowest(row.record) or {}
    g = goodput.record_shares(row.record) or {}
    return {"slowest_rank": s.get("rank"), "slowest_rank_host": s.get("host"), "slowest_rank_device": s.get("device"),
            "slowest_rank_gap": s.get("gap"), "slowest_rank_step_ms": s.get("median_ms"),
            "wall_share_window": g.get("window"), "wall_share_with_warmup": g.get("with_warmup"),
            "joules_per_sample": _summary(row, "joules_per_sample"),
            "joules_per_token": _summary(row, "joules_per_token"),
            **{f"checkpoint_{k}": v for k, v in checkpoint_timing.report_values(row.record).items()}}
