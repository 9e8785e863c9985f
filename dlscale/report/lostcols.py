"""Report columns of what a run loses besides the step: the slowest rank, the wall time outside the
window, energy and checkpoints. Each is shown only where some ok row of a table has a value (as the
utilisation columns); ``fields`` gives the raw values for CSV and JSON."""
from __future__ import annotations

from typing import Any, Callable

from dlscale import goodput, ranktimes

# (header, the row's value(s)): appended to render.EXTRA_COLUMNS
COLUMNS: tuple[tuple[str, Callable[[Any], tuple[float | None, ...]]], ...] = (
    ("slowest rank vs rest (%)", lambda r: (ranktimes.gap_pct(r.record),)),
    ("wall in window / +warm-up (%)", lambda r: goodput.pct_pair(r.record)),
)

NOTE = ("slowest rank vs rest: its median step over the other ranks' median, from their solo steps after the "
        "window where the strategy has them (docs/metrics.md, Slow ranks); wall in window / +warm-up: the share "
        "of the median repeat's wall time (phases_s) in the timed window, and with the warm-up")

CSV_COLUMNS = ["slowest_rank", "slowest_rank_host", "slowest_rank_gap", "wall_share_window", "wall_share_with_warmup"]


def fields(row) -> dict[str, Any]:
    """Raw values for CSV and JSON: the slowest rank (number, host, gap) and the training shares."""
    s = ranktimes.record_slowest(row.record) or {}
    g = goodput.record_shares(row.record) or {}
    return {"slowest_rank": s.get("rank"), "slowest_rank_host": s.get("host"), "slowest_rank_gap": s.get("gap"),
            "wall_share_window": g.get("window"), "wall_share_with_warmup": g.get("with_warmup")}
