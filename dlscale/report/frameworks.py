"""The framework comparison: the same workload under torch eager, torch compiled and JAX (XLA).

DLPerf's shape (model x framework x precision x devices -> throughput, speedup, efficiency): one
table per workload (model, flavour, precision, per-device batch, device type, label and the other
workload fields), whose rows are the report's cases of that workload under each framework, by
strategy and device count. Throughput, speedup and efficiency are the row's own (speedup against
its own framework's 1-device record, as in its scaling table); ``× torch eager`` divides by the
torch eager case of the same strategy and device count (any 1-device torch eager case for a
1-device row). The section appears when the report holds cases of more than one framework.

``framework_label``: ``torch``, ``torch-compiled`` (``torch-compiled-<mode>`` for a non-default
compile mode, ``+inductor`` with inductor settings), ``jax``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dlscale.case.config import workload_fields
from dlscale.fmt import fmt_num, md_heading
from dlscale.report import table as table_model
from dlscale.report.cells import html_escape
from dlscale.report.table import Cell, Column, Table
from dlscale.report.data import Group, Report, Row, freeze, num, rec_config, rec_device_type, rec_label

# what tells one framework's case of a workload from another's
IDENTITY_FIELDS = ("framework", "compile", "compile_mode", "inductor_options")
# left out of the workload a comparison table stands for (counts, and the per-row strategy)
ROW_FIELDS = ("nnodes", "nproc_per_node", "strategy", "strategy_options")
ORDER = ("torch", "torch-compiled", "jax")
CSV_COLUMNS = ["framework", "vs_torch_eager"]


def framework_label(rec: dict[str, Any]) -> str:
    cfg = rec_config(rec)
    fw = str(cfg.get("framework") or "torch")
    if fw != "torch" or not cfg.get("compile"):
        return fw
    label = "torch-compiled"
    if cfg.get("compile_mode") not in (None, "default"):
        label += f"-{cfg['compile_mode']}"
    return label + ("+inductor" if cfg.get("inductor_options") else "")


def neutral_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's workload without its framework identity (what cases must share to compare)."""
    d = {k: v for k, v in workload_fields(rec_config(rec)).items() if k not in IDENTITY_FIELDS}
    d["device_type"] = rec_device_type(rec)
    d["label"] = rec_label(rec)
    return d


def match_key(rec: dict[str, Any]) -> str:
    """What `compare --framework-a/--framework-b` pairs cases on: the workload (counts and strategy
    included, label and procedure left out) without the framework identity."""
    d = {k: v for k, v in workload_fields(rec_config(rec)).items() if k not in IDENTITY_FIELDS + ("label",)}
    return freeze(d)


@dataclass
class FrameworkRow:
    group: Group
    row: Row
    framework: str
    vs_torch: float | None = None

    def sort_key(self) -> tuple:
        base = self.framework.split("-compiled")[0]
        rank = ORDER.index("torch-compiled") if "compiled" in self.framework else (
            ORDER.index(base) if base in ORDER else len(ORDER))
        return (rank, self.framework, self.row.strategy, self.row.devices, self.row.nnodes)


@dataclass
class FrameworkTable:
    fields: dict[str, Any]
    rows: list[FrameworkRow] = field(default_factory=list)
    unit: str = "sample"

    @property
    def title(self) -> str:
        f = self.fields
        parts = [str(f.get("model")) + ("" if f.get("flavor") in (None, "full") else f" ({f.get('flavor')})"),
                 str(f.get("precision")), f"batch {f.get('batch_size')}/device"]
        if f.get("label") is not None:
            parts.append(f"label {f['label']}")
        if f.get("device_type") != "cuda":
            parts.append(str(f.get("device_type")))
        if (f.get("grad_accum") or 1) != 1:
            parts.append(f"accum {f.get('grad_accum')}")
        return " · ".join(parts)

    @property
    def frameworks(self) -> list[str]:
        return sorted({r.framework for r in self.rows}, key=lambda fw: [r.sort_key() for r in self.rows
                                                                          if r.framework == fw][0])


def build(report: Report) -> list[FrameworkTable]:
    """The comparison tables; empty unless the report has cases of more than one framework."""
    rows = [FrameworkRow(g, r, framework_label(r.record)) for g in report.groups for r in g.own_rows]
    if len({str(rec_config(r.row.record).get("framework") or "torch") for r in rows}) < 2:
        return []
    tables: dict[str, FrameworkTable] = {}
    for fr in rows:
        fields = {k: v for k, v in neutral_fields(fr.row.record).items() if k not in ROW_FIELDS}
        t = tables.setdefault(freeze(fields), FrameworkTable(fields, unit=fr.group.unit))
        t.rows.append(fr)
    out = []
    for t in tables.values():
        if len({r.framework for r in t.rows}) < 2:
            continue  # one framework only: its scaling table says it all
        eager = [r for r in t.rows if r.framework == "torch" and r.row.ok]
        for fr in t.rows:
            ref = next((e for e in eager if e.row.strategy == fr.row.strategy and e.row.devices == fr.row.devices
                        and e.row.nnodes == fr.row.nnodes), None)
            if ref is None and fr.row.devices == 1:
                ref = next((e for e in eager if e.row.devices == 1), None)
            if ref is not None and fr.row.ok and ref.row.median:
                fr.vs_torch = fr.row.median / ref.row.median
        t.rows.sort(key=FrameworkRow.sort_key)
        out.append(t)
    out.sort(key=lambda t: (str(t.fields.get("model")), str(t.fields.get("flavor")),
                            str(t.fields.get("precision")), t.fields.get("batch_size") or 0, freeze(t.fields)))
    return out


def _num(nd: int) -> Callable[[Any], str]:
    return lambda v: fmt_num(num(v), nd, sig=nd)


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100


def columns(t: FrameworkTable) -> list[Column]:
    return [Column("framework", left=True), Column("strategy", left=True), Column("node_num"), Column("devices"),
            Column("throughput median", f"{t.unit}/s", 2, format=_num(2)),
            Column("speedup", "×", 2, format=_num(2)), Column("scaling efficiency", "%", 1, format=_num(1)),
            Column("MFU", "%", 1, format=_num(1)), Column("× torch eager", decimals=3, format=_num(3))]


def values(fr: FrameworkRow) -> list[Any]:
    r = fr.row
    head = [fr.framework, r.strategy, r.nnodes, r.devices]
    if not r.ok:
        return head + [Cell(r.status.upper() if r.status != "ok" else "NO DATA")] + [None] * 4
    return head + [r.median, r.speedup, _pct(r.efficiency), _pct(r.mfu), fr.vs_torch]


def headers(t: FrameworkTable) -> list[str]:
    return [c.title for c in columns(t)]


def cells(fr: FrameworkRow) -> list[str]:
    return [c.text(v) for c, v in zip(columns(FrameworkTable({}, unit=fr.group.unit)), values(fr))]


def table(t: FrameworkTable) -> Table:
    return Table(t.title, columns(t), [values(r) for r in t.rows], notes(t),
                 title_md=md_heading(t.title, t.fields.get("label")), kind="dlperf")


def notes(t: FrameworkTable) -> list[str]:
    out = ["speedup and efficiency: against the same framework's 1-device record (its scaling table); "
           "× torch eager: throughput ÷ the torch eager case of the same strategy and device count"]
    versions = set()
    for fr in t.rows:
        env = fr.row.record.get("env") if isinstance(fr.row.record.get("env"), dict) else {}
        jx = env.get("jax") if isinstance(env.get("jax"), dict) else None
        if jx:
            versions.add(f"jax {jx.get('jax')}, jaxlib {jx.get('jaxlib')}, optax {jx.get('optax')}, "
                         f"backend {jx.get('backend')}")
        elif env.get("torch"):
            versions.add(f"torch {env.get('torch')}")
    if versions:
        out.append("versions: " + "; ".join(sorted(versions)))
    for fr in t.rows:
        if not fr.row.ok and fr.row.error:
            out.append(f"{fr.framework} {fr.row.strategy} {fr.row.node_gpu} {fr.row.status}: "
                       f"{' '.join(fr.row.error.split())[:200]}")
    return out


TITLE = "Frameworks (DLPerf comparison)"


def markdown(report: Report) -> list[str]:
    """The section's Markdown lines (none without a comparison)."""
    tables = build(report)
    if not tables:
        return []
    out = [f"## {TITLE}", ""]
    for t in tables:
        out += table_model.markdown(table(t))
    return out


def html(report: Report) -> list[str]:
    """The section's HTML fragments (none without a comparison)."""
    tables = build(report)
    if not tables:
        return []
    return [f'<h2 id="frameworks">{html_escape(TITLE)}</h2>'] + [table_model.html(table(t)) for t in tables]


def json_obj(report: Report) -> list[dict[str, Any]]:
    """[{workload fields, unit, rows: [{framework, strategy, nnodes, devices, median, speedup, ...}]}]."""
    out = []
    for t in build(report):
        out.append({"title": t.title, "workload": t.fields, "unit": f"{t.unit}/s", "rows": [{
            "framework": fr.framework, "strategy": fr.row.strategy, "nnodes": fr.row.nnodes,
            "devices": fr.row.devices, "status": fr.row.status, "median_speed": fr.row.median,
            "speedup": fr.row.speedup, "scaling_efficiency": fr.row.efficiency, "mfu": fr.row.mfu,
            "vs_torch_eager": fr.vs_torch, "record_id": fr.row.record.get("id"), "table": fr.group.name,
        } for fr in t.rows]})
    return out


def csv_fields(report: Report) -> dict[int, dict[str, Any]]:
    """Per row (keyed by id(record)): the framework label and × torch eager, for the case CSV."""
    ratios = {id(fr.row.record): fr.vs_torch for t in build(report) for fr in t.rows}
    return {id(r.record): {"framework": framework_label(r.record), "vs_torch_eager": ratios.get(id(r.record))}
            for g in report.groups for r in g.own_rows}
