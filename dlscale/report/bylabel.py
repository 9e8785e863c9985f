"""`dlscale report --group-by label`: one table per label, a row per case.

The DLPerf tables put each workload (everything in the case key but the device counts) in a table
of its own, so a benchmark's variants (batch sizes of a curve, strategy options, environment
variables) land in one-row tables. Here every case of a label is a row of one table; the case
fields that differ between its rows are its first columns, those shared by all are in its title.
Each row's speedup and efficiency are those of its DLPerf table (against the 1-device record of
its own workload), so nothing is computed differently from the default view.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from dlscale.case.config import DEFAULTS, FIELDS, workload_fields
from dlscale.fmt import md_code, md_safe
from dlscale.report.data import Group, Report, Row, freeze, num, rec_config, rec_device_type, rec_label
from dlscale.report.render import MISSING, GIB, case_dict, dlperf_columns, dlperf_values, header_lines
from dlscale.report.table import Column, Table, markdown

_COUNTS = ("nnodes", "nproc_per_node")  # shown as node_num / gpu_num


@dataclass
class LabelTable:
    label: str | None
    pairs: list[tuple[Group, Row]]  # each case with the DLPerf table it belongs to
    fixed: dict[str, Any]  # case fields every row shares
    varying: list[str]  # case fields that differ between rows, in RunConfig's order

    @property
    def rows(self) -> list[Row]:
        return [r for _, r in self.pairs]


def _fields(row: Row) -> dict[str, Any]:
    d = {k: v for k, v in workload_fields(rec_config(row.record)).items() if k not in _COUNTS}
    d["device_type"] = rec_device_type(row.record)
    return d


def label_tables(report: Report) -> list[LabelTable]:
    """The report's cases (not the borrowed baselines) by label, in the report's table order."""
    by_label: dict[str, list[tuple[Group, Row]]] = {}
    for g in report.groups:
        for r in g.own_rows:
            by_label.setdefault(freeze(rec_label(r.record)), []).append((g, r))
    out = []
    order = list(FIELDS) + ["device_type"]
    for pairs in by_label.values():
        fields = [_fields(r) for _, r in pairs]
        keys = sorted({k for f in fields for k in f}, key=lambda k: (order.index(k) if k in order else len(order), k))
        varying = [k for k in keys if len({freeze(f.get(k)) for f in fields}) > 1]
        fixed = {k: fields[0].get(k) for k in keys if k not in varying}
        out.append(LabelTable(rec_label(pairs[0][1].record), pairs, fixed, varying))
    return out


def _value(v: Any) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in sorted(v.items())) or "{}"
    return MISSING if v is None else str(v)


def _model_state(row: Row) -> float | None:
    return num(row.summary("model_state_mem_bytes"))


def _gib(v: float) -> str:
    return f"{v / GIB:.2f}"


def table(t: LabelTable) -> Table:
    """The label's cases: the fields that differ between them, then the DLPerf columns (read through a
    stand-in group of the label's rows), each row's step p50 and, where recorded, its model state."""
    shown = Group(dict(t.fixed), rows=t.rows)
    mixed = len({g.unit for g, _ in t.pairs}) > 1
    dl = dlperf_columns(shown)
    if mixed:  # mixed units: each row says its own
        dl = [replace(c, unit="per s") if c.unit == f"{shown.unit}/s" else c for c in dl] + [Column("unit")]
    cols = [Column(k, left=True, format=_value) for k in t.varying] + dl \
        + [Column("step p50", "ms", format=lambda v: f"{v:.2f}")]
    state = any(_model_state(r) is not None for r in t.rows)
    if state:
        cols.append(Column("model state / device", "GiB", format=_gib))
    rows = []
    for g, r in t.pairs:
        f = _fields(r)
        row = [f.get(k) for k in t.varying] + dlperf_values(shown, r) + ([f"{g.unit}/s"] if mixed else [])
        rows.append(row + [num(r.summary("step_ms_p50"))] + ([_model_state(r)] if state else []))
    notes = ["speedup and efficiency: each row against the 1-device record of its own workload (the DLPerf "
             "tables of `dlscale report` name it); missing where the label has none"]
    for g, r in t.pairs:
        if r.status != "ok" and r.error:
            what = ", ".join(f"{k}={_value(_fields(r).get(k))}" for k in t.varying) or r.node_gpu
            notes.append(f"{what} {r.node_gpu} {r.status}: {' '.join(r.error.split())[:200]}")
    return Table(_title(t), cols, rows, notes)


_ALWAYS = ("model", "precision", "batch_size", "strategy", "device_type")


def _title(t: LabelTable) -> str:
    """The label and the shared fields (those at their defaults left out, but the main ones)."""
    head = f"label {md_code(t.label)}" if t.label is not None else "no label"
    shown = {k: v for k, v in t.fixed.items() if k in _ALWAYS or k not in DEFAULTS or v != DEFAULTS[k]}
    return head + "".join(f" · {k}={_value(v)}" for k, v in shown.items())


def to_markdown(report: Report) -> str:
    out = ["# dlscale report, by label", ""] + header_lines(report) + [""]
    for w in report.warnings():
        out += [f"> **Warning:** {w}", ""]
    for t in label_tables(report):
        out += markdown(table(t), heading="##")
    return md_safe("\n".join(out))


def to_json_obj(report: Report) -> dict[str, Any]:
    tables = []
    for t in label_tables(report):
        tables.append({"label": t.label, "fixed": t.fixed, "varying": t.varying,
                       "rows": [{**{k: _fields(r).get(k) for k in t.varying}, **case_dict(g, r),
                                 "model_state_mem_bytes": _model_state(r)} for g, r in t.pairs]})
    return {"store": report.store, "generated": report.generated, "group_by": "label",
            "filters": report.filters.describe() or None, "tables": tables}


def to_json(report: Report) -> str:
    return json.dumps(to_json_obj(report), indent=2, default=str) + "\n"
