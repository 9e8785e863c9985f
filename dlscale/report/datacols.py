"""Columns of `dlscale compare` for a side B that reads real data (docs/data.md).

Paired with its synthetic twin (``--ignore data,data_decode,steps``), a real-data case's ratio B/A
is the share of the synthetic throughput it reaches; these columns add what its input pipeline
cost: the data wait and the input-bound verdict of B's record, the CPU cores its loader kept busy,
and the cores the loader would need to feed A's rate (A's median samples/s ÷ B's samples per
loader-core-second). Shown only when some B case has a data record.
"""
from __future__ import annotations

from typing import Any, Callable

from dlscale.fmt import MISSING
from dlscale.report.data import Row, num


def _data(row: Row | None) -> dict[str, Any]:
    return (row.data if row is not None and row.ok else None) or {}


def verdict(row: Row | None) -> str | None:
    d = _data(row)
    if d.get("input_bound") is None:
        return None
    text = "input-bound" if d["input_bound"] else "not input-bound"
    return text + (" (window short: wait may be understated)" if d.get("wait_may_be_understated") else "")


def cores_for(rate: float | None, row: Row | None) -> float | None:
    """Loader cores that would feed ``rate`` samples/s at B's samples per loader-core-second."""
    per_core = num(_data(row).get("samples_per_loader_core_s"))
    return rate / per_core if rate and per_core else None


# (header, JSON key, value of a pair (median A, row B), decimals)
COLUMNS: tuple[tuple[str, str, Callable[[float | None, Row | None], Any], int], ...] = (
    ("B data wait (%)", "b_data_wait_pct", lambda a, b: b.data_wait_pct if b is not None and b.ok else None, 2),
    ("B GPU idle for data (%)", "b_data_gpu_idle_pct",
     lambda a, b: b.data_gpu_idle_pct if b is not None and b.ok else None, 2),
    ("B verdict", "b_input_verdict", lambda a, b: verdict(b), 0),
    ("B loader CPU (cores)", "b_loader_cores", lambda a, b: b.loader_cores if b is not None and b.ok else None, 1),
    ("B loader cores for A's rate", "b_loader_cores_for_a", cores_for, 1),
)


def shown(pairs: list) -> bool:
    """Does any pair's B case read real data?"""
    return any(_data(p.b) for p in pairs)


def cells(p) -> list[str]:
    out = []
    for _, _, value, nd in COLUMNS:
        v = value(p.median_a, p.b)
        out.append(MISSING if v is None else (v if isinstance(v, str) else f"{v:.{nd}f}"))
    return out


def as_dict(p) -> dict[str, Any]:
    return {key: value(p.median_a, p.b) for _, key, value, _ in COLUMNS}


NOTE = ("B data wait: share of B's timed window its steps waited at the data loader (slowest rank); B GPU idle "
        "for data: the share of it the GPU had no work while the batch was not there (GPUs only); verdict: "
        "input-bound when the GPU idle share (else the wait) reaches the threshold (docs/data.md); B loader CPU: "
        "cores B's loader processes kept busy; cores for A's rate: A's median samples/s ÷ B's samples per "
        "loader-core-second, the cores B's loader would need to keep up with A (with A synthetic: to reach the "
        "synthetic rate)")
