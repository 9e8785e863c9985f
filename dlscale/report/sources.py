"""Where a case's figures come from, in reports: native runs, external commands, imported results.

Three kinds of case records share the report's machinery (docs/records.md): ``run`` (dlscale
measured its own model), ``external`` (dlscale ran another program and parsed its log) and
``imported`` (made elsewhere; provenance attached). A table never mixes kinds or sources: the
table identity of an external record adds its kind (its stack and parser are in its config),
an imported record's adds its kind and its source, and neither ever borrows a baseline from
another kind. Titles and notes say which kind a table is.

The *stacks* section puts tables of one workload side by side: same model, precision and
per-device batch on the same device type, from different stacks (dlscale eager/compiled, an
external trainer, a published table), each row marked with its kind.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any


from dlscale import ConfigError
from dlscale.fmt import md_code
from dlscale.report import table as table_model
from dlscale.report.cells import html_escape as _e
from dlscale.report.fields import rec_config, rec_device_type
from dlscale.report.table import Cell, Column, Table

if TYPE_CHECKING:
    from dlscale.report.data import Group, Report, Row

CASE_KINDS = ("run", "external", "imported")
# an external config's fields that change with the process count (the command holds
# --nproc-per-node) or do not say what is measured
EXTERNAL_NOT_TABLE = ("command", "cwd", "global_batch")
# identity fields the title states in words (not as key=value extras)
TITLE_SKIP = ("kind", "source_id", "framework", "parser", "metric", "unit", "seq_len", "parser_options", "device")
KIND_WORD = {"run": "measured", "external": "external", "imported": "imported"}


def kind_of(rec: dict[str, Any]) -> str:
    return str(rec.get("kind") or "run")


def source_id(rec: dict[str, Any]) -> str:
    prov = rec.get("provenance") if isinstance(rec.get("provenance"), dict) else {}
    return hashlib.sha1(str(prov.get("source")).encode()).hexdigest()[:6]


def adjust_fields(rec: dict[str, Any], d: dict[str, Any]) -> dict[str, Any]:
    """Table/baseline identity of a record: the kind and source of non-native records added."""
    kind = kind_of(rec)
    if kind == "external":
        for k in EXTERNAL_NOT_TABLE:
            d.pop(k, None)
        d["kind"] = kind
    elif kind == "imported":
        d["kind"] = kind
        d["source_id"] = source_id(rec)
    return d


def run_mode(cfg: dict[str, Any]) -> str:
    """How a case's step ran: torch ``compiled`` or ``eager``; another framework by its name (a
    JAX step is always XLA-compiled, so "eager" would misname it)."""
    fw = str(cfg.get("framework") or "torch")
    return ("compiled" if cfg.get("compile") else "eager") if fw == "torch" else fw


def stack_name(fields: dict[str, Any]) -> str:
    """What a table's stack is called in the stacks section."""
    kind = fields.get("kind", "run")
    if kind == "run":
        return f"dlscale {fields.get('strategy')} {run_mode(fields)}"
    fw = fields.get("framework") or fields.get("parser") or "?"
    return f"{fw}{' compiled' if fields.get('compile') else ''}"


def title_prefix(group: "Group") -> str | None:
    """'external: hf-trainer (parser hf-trainer)' / 'imported: mxnet, Tesla V100 (source)'; None for native."""
    f = group.fields
    kind = f.get("kind")
    if kind == "external":
        return f"external: {f.get('framework')} (parser {f.get('parser')})"
    if kind == "imported":
        rec = group.rows[0].record if group.rows else {}
        prov = rec.get("provenance") or {}
        gpu = (prov.get("hardware") or {}).get("gpu")
        bits = [b for b in (f.get("framework"), gpu) if b]
        return f"imported: {', '.join(bits) or 'unknown stack'}"
    return None


def group_notes(group: "Group") -> list[str]:
    """Provenance of an imported table; the parser's method and warnings of an external one."""
    kind = group.fields.get("kind")
    rec = next((r.record for r in group.own_rows), None)
    if rec is None or kind not in ("external", "imported"):
        return []
    if kind == "imported":
        prov = rec.get("provenance") or {}
        hw = prov.get("hardware") or {}
        hw_text = ", ".join(f"{k} {v}" for k, v in hw.items() if v)
        out = [f"imported, not measured here: source {prov.get('source')}; tool {prov.get('tool') or 'not stated'}"
               f"{'; date ' + str(prov['date']) if prov.get('date') else ''}; hardware {hw_text or 'not stated'} "
               f"(read by {prov.get('format')} from {prov.get('file')})"]
        if any((r.stats or {}).get("n") is None for r in group.own_rows if r.ok):
            out.append("imported medians without their runs: n (repeats) and the spread are not known")
        if prov.get("method"):
            out.append(f"reduction: {prov['method']}")
        warns = sorted({w for r in group.own_rows for w in r.record.get("warnings") or []})
        out += [f"importer warning: {w}" for w in warns]
        notes = [f"{r.node_gpu}: {r.record['note']}" for r in group.own_rows if r.record.get("note")]
        return out + notes
    cfg = rec.get("config") or {}
    out = [f"external command run by dlscale ({cfg.get('repeats')} repeat(s), fresh processes); throughput read "
           f"from its output by the {cfg.get('parser')} parser with the warm-up rule (skip {cfg.get('warmup')} "
           f"step(s), then {cfg.get('steps') or 'all the remaining'}); the workload is as the user described it"]
    methods = sorted({(rep.get("parse") or {}).get("method") for r in group.own_rows
                      for rep in r.record.get("repeats") or [] if (rep.get("parse") or {}).get("method")})
    out += [f"method: {m}" for m in methods[:2]]
    warns = sorted({w for r in group.own_rows for rep in r.record.get("repeats") or []
                    for w in (rep.get("parse") or {}).get("warnings") or []})
    out += [f"parser warning: {w}" for w in warns]
    scopes = {(r.record.get("utilisation") or {}).get("scope") for r in group.own_rows} - {None}
    if scopes:
        out.append(f"utilisation: sampled by dlscale on this host over the {' / '.join(sorted(scopes))} "
                   f"(the whole run where the log gives no times)")
    return out


def case_extra(row: "Row") -> dict[str, Any]:
    """Columns of the CSV/JSON rows that say where the figure comes from."""
    rec = row.record
    prov = rec.get("provenance") if isinstance(rec.get("provenance"), dict) else {}
    cfg = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    return {"kind": kind_of(rec), "stack": cfg.get("framework") or (None if kind_of(rec) != "run" else "dlscale"),
            "source": prov.get("source")}


CSV_EXTRA = ["kind", "stack", "source"]


# ----------------------------------------------------------------------------- stacks side by side

@dataclass
class StackTable:
    """Tables of one workload from different stacks."""

    workload: dict[str, Any]
    groups: list["Group"] = field(default_factory=list)

    @property
    def title(self) -> str:
        w = self.workload
        return f"{w['model']} · {w['precision']} · batch {w['batch_size']}/device · {w['device_type']}"


def workload_of(group: "Group") -> dict[str, Any]:
    f = group.fields
    return {"model": f.get("model"), "precision": f.get("precision"), "batch_size": f.get("batch_size"),
            "device_type": f.get("device_type"), "label": f.get("label")}


def stack_tables(report: "Report") -> list[StackTable]:
    """Workloads that more than one stack (or kind) reports, with their tables."""
    by: dict[tuple, StackTable] = {}
    for g in report.groups:
        w = workload_of(g)
        key = tuple(sorted((k, str(v)) for k, v in w.items()))
        by.setdefault(key, StackTable(w)).groups.append(g)
    out = []
    for t in by.values():
        kinds = {g.fields.get("kind", "run") for g in t.groups}
        if len(t.groups) > 1 and (len(kinds) > 1 or len({stack_name(g.fields) for g in t.groups}) > 1):
            t.groups.sort(key=lambda g: (CASE_KINDS.index(g.fields.get("kind", "run")), stack_name(g.fields)))
            out.append(t)
    return out


def device_of(row: "Row") -> str:
    s = row.record.get("summary") if isinstance(row.record.get("summary"), dict) else {}
    name = s.get("device_name")
    if not name:
        gpus = (row.record.get("env") or {}).get("gpus") or []
        name = gpus[0].get("name") if gpus and isinstance(gpus[0], dict) else None
    return str(name or row.record.get("device_type") or "?")


STACK_COLUMNS = ["stack", "kind", "device", "node_num", "device_num", "throughput median", "speedup (×)",
                 "scaling efficiency (%)", "MFU (%)", "n (repeats)", "table"]


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100


def stack_table(t: StackTable) -> Table:
    unit = t.groups[0].unit
    cols = [Column("stack", left=True), Column("kind", left=True), Column("device", left=True), Column("node_num"),
            Column("device_num"), Column("throughput median", f"{unit}/s", 2), Column("speedup", "×", 2),
            Column("scaling efficiency", "%", 1), Column("MFU", "%", 1), Column("n", "repeats"),
            Column("table", left=True)]
    rows = []
    for g in t.groups:
        for r in g.own_rows:
            n = r.stat("n")
            rows.append([stack_name(g.fields), KIND_WORD[g.fields.get("kind", "run")], device_of(r), r.nnodes,
                         r.devices, r.median if r.ok else Cell(r.status.upper()), r.speedup, _pct(r.efficiency),
                         _pct(r.mfu), None if n is None else int(n), g.name])
    return Table(t.title, cols, rows)


def stack_rows(t: StackTable) -> list[list[str]]:
    return stack_table(t).texts()


STACK_NOTE = ("one workload (model, precision, per-device batch, device type) as reported by different stacks: "
              "measured = dlscale's own model; external = another program run by dlscale, its log parsed; "
              "imported = made elsewhere (provenance under its table). Speedups are within each stack's own table; "
              "devices of different types are not comparable figure for figure.")


def markdown_section(report: "Report") -> list[str]:
    tables = stack_tables(report)
    if not tables:
        return []
    out = ["## Stacks side by side", "", STACK_NOTE, ""]
    for t in tables:
        out += table_model.markdown(stack_table(t))
    return out


def html_section(report: "Report") -> str:
    tables = stack_tables(report)
    if not tables:
        return ""
    body = ['<h2 id="stacks">Stacks side by side</h2>', f'<p class="method">{_e(STACK_NOTE)}</p>']
    body += [table_model.html(stack_table(t)) for t in tables]
    return "".join(body)


def json_section(report: "Report") -> list[dict[str, Any]]:
    out = []
    for t in stack_tables(report):
        out.append({"workload": t.workload, "rows": [dict(zip(STACK_COLUMNS, r)) for r in stack_rows(t)]})
    return out


def provenance_lines(report: "Report") -> list[str]:
    """Markdown: one line per imported source used by the report."""
    seen: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = defaultdict(int)
    for g in report.groups:
        for r in g.own_rows:
            if kind_of(r.record) == "imported":
                prov = r.record.get("provenance") or {}
                key = str(prov.get("source"))
                seen.setdefault(key, prov)
                counts[key] += 1
    if not seen:
        return []

    out = ["## Imported results", "", "Figures made elsewhere, as their sources state them (never measured here):", ""]
    for key, prov in seen.items():
        hw = prov.get("hardware") or {}
        out.append(f"- {prov.get('source')} — tool {prov.get('tool') or 'not stated'}; date "
                   f"{prov.get('date') or 'not stated'}; GPU {hw.get('gpu') or 'not stated'}; "
                   f"{counts[key]} case(s) via {prov.get('format')} from {md_code(prov.get('file'))}")
    return out + [""]


# ----------------------------------------------------------------------------- compare --match workload

def describe(rec: dict[str, Any]) -> str:
    """measured / external (stack) / imported (stack): how compare names a side's kind."""
    kind = kind_of(rec)
    if kind == "run":
        return "measured"
    cfg = rec.get("config") if isinstance(rec.get("config"), dict) else {}
    return f"{kind} {cfg.get('framework') or ''}".strip()


def rows_by_workload(side: str, rows: list["Row"]) -> dict[tuple, "Row"]:
    """compare --match workload: one row per (model, precision, batch, nodes, devices, device type);
    two cases of one workload on a side (eager and compiled, two stacks) are ambiguous: ConfigError."""
    out: dict[tuple, "Row"] = {}
    for r in rows:
        c = rec_config(r.record)
        work = (c.get("model"), c.get("precision"), c.get("batch_size"), r.nnodes, r.nproc_per_node)
        key = (work, rec_device_type(r.record))  # (what pairs, device type), as compare's case keys
        if key in out:
            raise ConfigError(f"side {side}: two cases of workload {work[0]} {work[1]} b{work[2]} {r.node_gpu} "
                              f"({describe(out[key].record)}, {describe(r.record)}): with --match workload each side "
                              f"needs one case per workload; narrow with --label-a/--label-b, --strategy or two stores")
        out[key] = r
    return out
