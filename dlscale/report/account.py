"""Where a data-parallel step grows from one device to N: each multi-device row's step breakdown
set against its table's 1-device baseline's (both measured after their windows, ``--breakdown``;
docs/metrics.md, "Step breakdown").

The window's step grows by ``grows`` ms. The breakdowns split their own growth into the forward's,
the backward's computation (the backward again under ``no_sync``, against the 1-device backward),
the exposed communication (the backward with DDP's all-reduce minus the one without), the
optimizer's and the data fetch's; what the phases do not hold of the window's growth is
``unplaced``. ``comm_alone`` is the all-reduce of the gradients' size timed by itself: an exposed
time under it means part of the all-reduce was hidden behind the backward, net of what it cost the
computation beside it (``hidden_share``, negative when more is exposed than the collective costs
alone). A breakdown more than ``Thresholds.max_breakdown_gap`` off its window (validity's
``breakdown_gap``) is named in ``off_window``: its parts are off by as much.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Callable

from dlscale.results import validity
from dlscale.report.data import num, rec_counts
from dlscale.report.table import Column, Table


@dataclass(frozen=True)
class StepAccount:
    devices: int
    window_1_ms: float
    window_n_ms: float
    grows_ms: float
    forward_ms: float
    backward_compute_ms: float
    exposed_comm_ms: float
    comm_alone_ms: float | None
    hidden_share: float | None
    optimizer_ms: float
    data_ms: float
    unplaced_ms: float
    efficiency: float | None
    off_window: list[str]  # "1 device" / "N devices": a breakdown with validity's breakdown_gap

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def account(base: dict[str, Any], rec: dict[str, Any], efficiency: float | None = None) -> StepAccount | None:
    """The account of ``rec`` (N devices, a breakdown with its backward under no_sync) against
    ``base`` (1 device, a breakdown); None where either lacks what it needs."""
    g1, gn = validity.breakdown_gap(base), validity.breakdown_gap(rec)
    if g1 is None or gn is None:
        return None
    b1, bn = base["breakdown"], rec["breakdown"]
    need = [num(b1.get("forward_ms")), num(b1.get("backward_ms")), num(bn.get("forward_ms")),
            num(bn.get("backward_compute_ms")), num(bn.get("exposed_comm_ms"))]
    if any(v is None for v in need):
        return None
    f1, bw1, fn, bcn, exposed = need
    (s1, w1, _), (sn, wn, _) = g1, gn
    opt = (num(bn.get("optimizer_ms")) or 0.0) - (num(b1.get("optimizer_ms")) or 0.0)
    data = (num(bn.get("data_ms")) or 0.0) - (num(b1.get("data_ms")) or 0.0)
    alone = num(bn.get("comm_ms"))
    devices = math.prod(rec_counts(rec))
    limit = validity.THRESHOLDS.max_breakdown_gap
    off = [name for name, g in (("1 device", g1), (f"{devices} devices", gn)) if abs(g[2]) > limit]
    return StepAccount(
        devices=devices, window_1_ms=w1, window_n_ms=wn, grows_ms=wn - w1, forward_ms=fn - f1,
        backward_compute_ms=bcn - bw1, exposed_comm_ms=exposed, comm_alone_ms=alone,
        hidden_share=(1 - exposed / alone) if alone else None, optimizer_ms=opt, data_ms=data,
        unplaced_ms=(wn - w1) - (sn - s1), efficiency=efficiency, off_window=off)


def group_accounts(group) -> list[tuple[Any, StepAccount]]:
    """(row, account) of each multi-device ok row of a report table that has one."""
    base = group.baseline
    if base is None or not base.ok:
        return []
    out = []
    for r in group.rows:
        if r.borrowed or not r.ok or r.devices <= 1:
            continue
        a = account(base.record, r.record, r.efficiency)
        if a is not None:
            out.append((r, a))
    return out


NOTE = ("step growth: how the window's step grows from the 1-device baseline's, split by the two step "
        "breakdowns (after the windows): the forward's and the optimizer's growth, the backward's "
        "computation (its run under no_sync against the 1-device backward), the exposed communication "
        "(the backward with the all-reduce minus without), and unplaced (the window's growth the phases do "
        "not hold); hidden net = 1 − exposed ÷ the all-reduce timed alone (negative: more exposed than "
        "the collective costs alone; docs/reports.md)")


def _ms(v: float) -> str:
    """A growth in ms to 0.01 ms (the breakdown's resolution; no -0.00)."""
    return f"{v:.2f}".replace("-0.00", "0.00")


def _ms_col(header: str) -> Column:
    return Column(header, "ms", 2, format=_ms)


# (column, the value of a (row, account) pair); "data (ms)" is shown only where a fetch grew
COLUMNS: tuple[tuple[Column, Callable[[Any, StepAccount], Any]], ...] = (
    (Column("node_num"), lambda r, a: r.nnodes),
    (Column("gpu_num"), lambda r, a: r.devices),
    (Column("scaling efficiency", "%", 1), lambda r, a: None if a.efficiency is None else a.efficiency * 100),
    (_ms_col("window step, 1 device"), lambda r, a: a.window_1_ms),
    (_ms_col("window step"), lambda r, a: a.window_n_ms),
    (_ms_col("grows"), lambda r, a: a.grows_ms),
    (_ms_col("forward"), lambda r, a: a.forward_ms),
    (_ms_col("backward computation"), lambda r, a: a.backward_compute_ms),
    (_ms_col("exposed comm"), lambda r, a: a.exposed_comm_ms),
    (_ms_col("all-reduce alone"), lambda r, a: a.comm_alone_ms),
    (Column("hidden net", "%", 0, format=lambda v: f"{v:.0f}"),
     lambda r, a: None if a.hidden_share is None else a.hidden_share * 100),
    (_ms_col("optimizer"), lambda r, a: a.optimizer_ms),
    (_ms_col("data"), lambda r, a: a.data_ms),
    (_ms_col("unplaced"), lambda r, a: a.unplaced_ms),
)
TITLE = "Step growth from the 1-device step (ms):"


def table(group) -> Table | None:
    """The step-growth table of a report table; None without accounts. The data column only where a
    fetch grew by 0.01 ms or more (real data)."""
    rows = group_accounts(group)
    if not rows:
        return None
    data = any(abs(a.data_ms) >= 0.005 for _, a in rows)
    cols = [(c, f) for c, f in COLUMNS if data or c.header != "data"]
    notes = [NOTE] + [f"{r.node_gpu}: the breakdown of {', '.join(a.off_window)} is more than "
                      f"{validity.THRESHOLDS.max_breakdown_gap * 100:g} % off its window (breakdown_gap): "
                      "its parts are off by as much" for r, a in rows if a.off_window]
    return Table(TITLE, [c for c, _ in cols], [[f(r, a) for _, f in cols] for r, a in rows], notes,
                 kind="dlperf growth", wide=True)
