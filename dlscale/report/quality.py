"""Time to quality: one table per workload, samples and seconds to the target beside throughput.

A *workload* here is what fixes the target a run trains to: model, flavor, training data, the
target (``--until``), the validation split and the samples an evaluation averages (evaluation
batches x global batch), device type and label. Its rows are the
cases that trained to it (devices, global batch, strategy, precision, learning-rate rule), the
newest ok record of each. The *baseline* is the row with the fewest devices and, among those, the
smallest global batch. Throughput speedup = the row's median samples/s ÷ the baseline's; TTQ
speedup = the baseline's median time to target ÷ the row's (medians over the repeats that
reached the target; a row reached by fewer than all its repeats is flagged). The two differ
where a larger global batch needs more samples to reach the same quality.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dlscale.fmt import MISSING, fmt_num
from dlscale.report.table import Cell, Column, Table, markdown as md_lines
from dlscale.report.data import Filters, Loaded, Row, freeze, num, rec_config, rec_device_type, rec_label, select_cases

TITLE = "Time to quality"
METHOD = ("Per workload (model, data, target, validation split and samples evaluated): samples, steps and training seconds to the target "
          "(evaluations excluded; median over the repeats, each a different seed, that reached it, with its range); "
          "throughput speedup = samples/s ÷ the baseline's; TTQ speedup = the baseline's time to target ÷ the row's. "
          "Baseline: fewest devices, then smallest global batch. TTQ rank: 1 reaches the target soonest.")
WORKLOAD_KEYS = ("model", "flavor", "data", "until")
HEADERS = ("devices", "global batch", "strategy", "precision", "lr", "reached", "samples to target",
           "steps to target", "time to target (s)", "final val", "samples/s", "throughput speedup", "TTQ speedup",
           "TTQ rank")


@dataclass
class QRow:
    row: Row
    quality: dict[str, Any]
    throughput_speedup: float | None = None
    ttq_speedup: float | None = None
    rank: int | None = None  # by median time to target, 1 the soonest (rows that reached it)

    @property
    def global_batch(self) -> int | None:
        gb = self.row.record.get("global_batch")
        return int(gb) if isinstance(gb, (int, float)) else None

    def median(self, key: str) -> float | None:
        stat = self.quality.get(key)
        return num(stat.get("median")) if isinstance(stat, dict) else None

    @property
    def flag(self) -> str | None:
        return self.quality.get("flag")


@dataclass
class QGroup:
    key: tuple
    title: str
    rows: list[QRow] = field(default_factory=list)
    baseline: QRow | None = None

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.title)[:80].strip("-")


def _eval_set(rec: dict[str, Any]) -> dict[str, Any]:
    """The validation split and the samples each evaluation averages (the first ok repeat's)."""
    for rep in rec.get("repeats") or []:
        if isinstance(rep, dict) and isinstance(rep.get("quality"), dict):
            ev = rep["quality"].get("eval")
            return ev if isinstance(ev, dict) else {}
    return {}


def workload(rec: dict[str, Any]) -> tuple:
    """Cases trained to the same target on the same data, evaluated on the same samples: one table
    (--eval-batches differs between global batches that evaluate the same samples)."""
    cfg, ev = rec_config(rec), _eval_set(rec)
    return (tuple(freeze(cfg.get(k)) for k in WORKLOAD_KEYS) + (freeze(ev.get("data")), freeze(ev.get("samples")))
            + (rec_device_type(rec), freeze(rec_label(rec))))


def _title(rec: dict[str, Any]) -> str:
    cfg = rec_config(rec)
    label = f" [{rec_label(rec)}]" if rec_label(rec) else ""
    return (f"{cfg.get('model')} {cfg.get('flavor')} to {(rec.get('quality') or {}).get('target')} on "
            f"{cfg.get('data')} ({rec_device_type(rec)}){label}")


def speedups(rows: list[QRow]) -> QRow | None:
    """Set every row's speedups against the baseline; returns the baseline."""
    if not rows:
        return None
    base = min(rows, key=lambda r: (r.row.devices, r.global_batch or 0))
    b_tput, b_ttq = base.row.median, base.median("time_to_target_s")
    for r in rows:
        r.throughput_speedup = r.row.median / b_tput if (r.row.median and b_tput) else None
        ttq = r.median("time_to_target_s")
        r.ttq_speedup = b_ttq / ttq if (b_ttq and ttq) else None
    timed = sorted((r for r in rows if r.median("time_to_target_s") is not None),
                   key=lambda r: r.median("time_to_target_s"))
    for i, r in enumerate(timed):
        r.rank = i + 1
    return base


def build(loaded: Loaded, filters: Filters | None = None) -> list[QGroup]:
    filters = filters or Filters()
    runs = [r for r in loaded.records if r.get("kind", "run") == "run" and isinstance(r.get("quality"), dict)
            and filters.match_run(r)]
    by_key: dict[tuple, list[QRow]] = defaultdict(list)
    for row in select_cases(runs):
        if row.ok:
            by_key[workload(row.record)].append(QRow(row, row.record["quality"]))
    groups = []
    for key, rows in by_key.items():
        rows.sort(key=lambda r: (r.row.devices, r.global_batch or 0, r.row.strategy,
                                 str(rec_config(r.row.record).get("precision"))))
        g = QGroup(key, _title(rows[0].row.record), rows)
        g.baseline = speedups(rows)
        groups.append(g)
    groups.sort(key=lambda g: g.title)
    return groups


def _range(stat: Any, nd: int) -> str:
    if not isinstance(stat, dict) or stat.get("median") is None:
        return MISSING
    text = fmt_num(stat["median"], nd)
    if (stat.get("n") or 0) > 1:
        text += f" ({fmt_num(stat.get('min'), nd)}–{fmt_num(stat.get('max'), nd)})"
    return text


def _lr(rec: dict[str, Any]) -> str:
    reps = [r.get("quality") for r in rec.get("repeats") or [] if isinstance(r, dict) and r.get("quality")]
    lr = (reps[0] or {}).get("lr") if reps else None
    if not isinstance(lr, dict):
        return MISSING
    rule = "" if lr.get("scale") in (None, "none") else f" {lr['scale']}"
    return f"{fmt_num(lr.get('peak'), 3)} {lr.get('schedule')}{rule}"


def _stat(stat: Any, nd: int) -> Cell | None:
    """A median over the repeats with its range (more than one repeat)."""
    if not isinstance(stat, dict) or stat.get("median") is None:
        return None
    return Cell(_range(stat, nd), stat["median"])


# (column, the row's value): devices to lr say which case, the rest what it reached
COLUMNS: tuple[tuple[Column, Callable[[QRow], Any]], ...] = (
    (Column("devices", left=True), lambda r: r.row.devices),
    (Column("global batch", left=True), lambda r: r.global_batch),
    (Column("strategy", left=True), lambda r: str(rec_config(r.row.record).get("strategy"))),
    (Column("precision", left=True), lambda r: str(rec_config(r.row.record).get("precision"))),
    (Column("lr", left=True), lambda r: _lr(r.row.record)),
    (Column("reached"), lambda r: f"{r.quality.get('reached')}/{r.quality.get('repeats')}" + (" ⚠" if r.flag else "")),
    (Column("samples to target"), lambda r: _stat(r.quality.get("samples_to_target"), 0)),
    (Column("steps to target"), lambda r: _stat(r.quality.get("steps_to_target"), 0)),
    (Column("time to target", "s"), lambda r: _stat(r.quality.get("time_to_target_s"), 2)),
    (Column("final val"), lambda r: _stat(r.quality.get("final_val"), 4)),
    (Column("samples/s", decimals=2), lambda r: r.row.median),
    (Column("throughput speedup", decimals=2), lambda r: r.throughput_speedup),
    (Column("TTQ speedup", decimals=2), lambda r: r.ttq_speedup),
    (Column("TTQ rank"), lambda r: r.rank),
)
HEADERS = tuple(c.title for c, _ in COLUMNS)


def table(g: QGroup) -> Table:
    return Table(g.title, [c for c, _ in COLUMNS], [[f(r) for _, f in COLUMNS] for r in g.rows], notes(g), wide=True)


def cells(r: QRow) -> list[str]:
    return [c.text(f(r)) for c, f in COLUMNS]


def notes(g: QGroup) -> list[str]:
    out = []
    if g.baseline is not None:
        out.append(f"baseline: {g.baseline.row.devices} device(s), global batch {g.baseline.global_batch}, "
                   f"{g.baseline.row.strategy}")
        if g.baseline.median("time_to_target_s") is None:
            out.append("the baseline never reached the target: no TTQ speedup")
    for r in g.rows:
        if r.flag:
            why = "; ".join(r.quality.get("reasons") or [])
            out.append(f"⚠ {r.row.devices} device(s), global batch {r.global_batch}, {r.row.strategy}: "
                       f"{r.flag}" + (f" ({why})" if why else ""))
    return out


def markdown(groups: Sequence[QGroup], plot_links: dict[str, list[tuple[str, str]]] | None = None) -> list[str]:
    if not groups:
        return []
    out = [f"## {TITLE}", "", METHOD, ""]
    for g in groups:
        out += md_lines(table(g))
        for title, path in (plot_links or {}).get(f"quality:{g.slug}", []):
            out += [f"![{title}]({path})", ""]
    return out


def json_obj(groups: Sequence[QGroup]) -> list[dict[str, Any]] | None:
    if not groups:
        return None
    return [{"title": g.title, "workload": dict(zip(WORKLOAD_KEYS + ("eval_data", "eval_samples", "device_type", "label"), g.key)),
             "baseline_record_id": g.baseline.row.record.get("id") if g.baseline else None,
             "rows": [{"record_id": r.row.record.get("id"), "devices": r.row.devices, "global_batch": r.global_batch,
                       "strategy": r.row.strategy, "precision": rec_config(r.row.record).get("precision"),
                       "samples_per_s": r.row.median, "quality": {k: v for k, v in r.quality.items()},
                       "throughput_speedup": r.throughput_speedup, "ttq_speedup": r.ttq_speedup,
                       "ttq_rank": r.rank}
                      for r in g.rows]} for g in groups]


def curves(r: QRow) -> list[list[dict[str, Any]]]:
    """Every ok repeat's evaluation curve (one per seed)."""
    return [rep["quality"].get("curve") or [] for rep in r.row.record.get("repeats") or []
            if isinstance(rep, dict) and rep.get("status") == "ok" and isinstance(rep.get("quality"), dict)]
