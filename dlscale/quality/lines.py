"""What `dlscale run` prints about a time-to-quality case: one line per repeat, one for the case."""
from __future__ import annotations

from typing import Any

from dlscale.fmt import fmt_num


def _med(stat: dict[str, Any] | None, nd: int = 1) -> str:
    if not stat or stat.get("median") is None:
        return "-"
    spread = f" (min {fmt_num(stat['min'], nd)}, max {fmt_num(stat['max'], nd)})" if stat.get("n", 0) > 1 else ""
    return fmt_num(stat["median"], nd) + spread


def repeat_line(q: dict[str, Any]) -> str:
    """A repeat's outcome: reached with samples, steps and seconds to the target, or why not."""
    head = f"quality {q.get('target')} (seed {q.get('seed')}): "
    val = fmt_num(q.get("final_val"), 4)
    if q.get("reached"):
        return (head + f"reached at step {q['steps_to_target']}, {q['samples_to_target']} samples, "
                f"{q['time_to_target_s']:.2f} s of training ({q['wall_to_target_s']:.2f} s with evaluations); "
                f"val {val}")
    return head + f"NOT reached: {q.get('reason')}; last val {val} after {q.get('steps_trained')} steps"


def summary_line(s: dict[str, Any] | None) -> str | None:
    """The case over its repeats (seeds): median and range to the target, and how many reached it."""
    if not s:
        return None
    flag = f" ! {s['flag']}" if s.get("flag") else ""
    return (f"# time to quality {s.get('target')}: reached by {s.get('reached')}/{s.get('repeats')} repeats (seeds); "
            f"median samples {_med(s.get('samples_to_target'), 0)}, time {_med(s.get('time_to_target_s'), 2)} s, "
            f"final val {_med(s.get('final_val'), 4)}{flag}")
