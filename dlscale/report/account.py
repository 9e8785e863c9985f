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

from dataclasses import asdict, dataclass
from typing import Any

from dlscale import validity
from dlscale.fmt import MISSING, fmt_num, md_table


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


def _f(b: dict, key: str) -> float | None:
    v = b.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _breakdown(rec: dict[str, Any]) -> dict | None:
    b = rec.get("breakdown")
    return b if isinstance(b, dict) and b.get("supported") and _f(b, "step_ms") is not None else None


def account(base: dict[str, Any], rec: dict[str, Any], efficiency: float | None = None) -> StepAccount | None:
    """The account of ``rec`` (N devices, a breakdown with its backward under no_sync) against
    ``base`` (1 device, a breakdown); None where either lacks what it needs."""
    b1, bn = _breakdown(base), _breakdown(rec)
    w1, wn = validity.window_step_ms(base), validity.window_step_ms(rec)
    if b1 is None or bn is None or w1 is None or wn is None:
        return None
    need = [_f(b1, "forward_ms"), _f(b1, "backward_ms"), _f(bn, "forward_ms"), _f(bn, "backward_ms"),
            _f(bn, "backward_compute_ms"), _f(bn, "exposed_comm_ms")]
    if any(v is None for v in need):
        return None
    f1, bw1, fn, bwn, bcn, exposed = need
    opt = (_f(bn, "optimizer_ms") or 0.0) - (_f(b1, "optimizer_ms") or 0.0)
    data = (_f(bn, "data_ms") or 0.0) - (_f(b1, "data_ms") or 0.0)
    alone = _f(bn, "comm_ms")
    phases = _f(bn, "step_ms") - _f(b1, "step_ms")
    gap = validity.THRESHOLDS.max_breakdown_gap
    off = [name for name, b, w in (("1 device", b1, w1), (f"{_devices(rec)} devices", bn, wn))
           if abs(_f(b, "step_ms") / w - 1) > gap]
    return StepAccount(
        devices=_devices(rec), window_1_ms=w1, window_n_ms=wn, grows_ms=wn - w1, forward_ms=fn - f1,
        backward_compute_ms=bcn - bw1, exposed_comm_ms=exposed, comm_alone_ms=alone,
        hidden_share=(1 - exposed / alone) if alone else None, optimizer_ms=opt, data_ms=data,
        unplaced_ms=(wn - w1) - phases, efficiency=efficiency, off_window=off)


def _devices(rec: dict[str, Any]) -> int:
    c = rec.get("config") or {}
    return int(c.get("nnodes") or 1) * int(c.get("nproc_per_node") or 1)


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


COLUMNS = ["node_num", "gpu_num", "scaling efficiency (%)", "window step, 1 device (ms)", "window step (ms)",
           "grows (ms)", "forward (ms)", "backward computation (ms)", "exposed comm (ms)", "all-reduce alone (ms)",
           "hidden net (%)", "optimizer (ms)", "data (ms)", "unplaced (ms)"]

NOTE = ("step growth: how the window's step grows from the 1-device baseline's, split by the two step "
        "breakdowns (after the windows): the forward's and the optimizer's growth, the backward's "
        "computation (its run under no_sync against the 1-device backward), the exposed communication "
        "(the backward with the all-reduce minus without), and unplaced (the window's growth the phases do "
        "not hold); hidden net = 1 − exposed ÷ the all-reduce timed alone (negative: more exposed than "
        "the collective costs alone; docs/reports.md)")


def _ms(v: float | None) -> str:
    """A growth in ms to 0.01 ms (the breakdown's resolution; no -0.00)."""
    return MISSING if v is None else f"{v:.2f}".replace("-0.00", "0.00")


def table(group) -> tuple[list[str], list[list[str]], list[str]] | None:
    """The step-growth table of a report table: (columns, rows of cells, notes); None without accounts.
    The data column only where a fetch grew by 0.01 ms or more (real data)."""
    rows = group_accounts(group)
    if not rows:
        return None
    data = any(abs(a.data_ms) >= 0.005 for _, a in rows)
    cols = [c for c in COLUMNS if data or c != "data (ms)"]
    body = []
    for r, a in rows:
        eff = None if a.efficiency is None else a.efficiency * 100
        hidden = None if a.hidden_share is None else f"{a.hidden_share * 100:.0f}"
        cells = [str(r.nnodes), str(r.devices), fmt_num(eff, 1), _ms(a.window_1_ms), _ms(a.window_n_ms),
                 _ms(a.grows_ms), _ms(a.forward_ms), _ms(a.backward_compute_ms), _ms(a.exposed_comm_ms),
                 _ms(a.comm_alone_ms), hidden or MISSING, _ms(a.optimizer_ms)] + ([_ms(a.data_ms)] if data else [])
        body.append(cells + [_ms(a.unplaced_ms)])
    notes = [NOTE] + [f"{r.node_gpu}: the breakdown of {', '.join(a.off_window)} is more than "
                      f"{validity.THRESHOLDS.max_breakdown_gap * 100:g} % off its window (breakdown_gap): "
                      "its parts are off by as much" for r, a in rows if a.off_window]
    return cols, body, notes


TITLE = "Step growth from the 1-device step (ms):"


def markdown(group) -> list[str]:
    """``table`` as Markdown lines (none without accounts)."""
    t = table(group)
    if t is None:
        return []
    cols, body, notes = t
    return [TITLE, "", md_table(cols, body), ""] + [f"- {n}" for n in notes] + [""]
