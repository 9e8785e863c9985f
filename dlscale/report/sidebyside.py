"""Cases of one workload that differ only in how it is run: side by side, with compare's verdicts.

A report's DLPerf tables split by strategy, compile settings and label, so two one-device runs of
the same model (say ``single`` eager and ``single --compile``, or ``ddp`` and ``fsdp`` on 8 GPUs)
land in separate one-row tables. Here they meet: one table per workload (everything in the case
key except ``SIDE_EXCLUDE``, with the device counts and device type), one row per case, each
against a reference case with the ratio of medians, its bootstrap CI, the Mann-Whitney p-value
and the verdict of dlscale/report/compare.py. The reference: ``single`` eager without a label when
present, else the first case in name order.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dlscale.results import validity
from dlscale.case.config import workload_fields
from dlscale.fmt import MISSING
from dlscale.report import compare
from dlscale.report import table as table_model
from dlscale.report.cells import html_escape
from dlscale.report.data import STATUS_TEXT, Report, Row, rec_config, rec_device_type, rec_label, repeat_samples
from dlscale.report.table import Cell, Column, verdict_cell

# what may differ between the cases of one side-by-side table
SIDE_EXCLUDE = frozenset({"strategy", "strategy_options", "compile", "compile_mode", "inductor_options", "framework"})


def case_name(row: Row) -> str:
    cfg = rec_config(row.record)
    s = str(cfg.get("strategy"))
    opts = cfg.get("strategy_options") or {}
    if opts:
        s += " " + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
    if cfg.get("framework") not in (None, "torch"):
        s = f"{cfg.get('framework')} {s}"
    if cfg.get("compile"):
        mode = cfg.get("compile_mode") or "default"
        s += " · compiled" + ("" if mode == "default" else f" ({mode})")
        if cfg.get("inductor_options"):
            s += " +" + ",".join(f"{k}={v}" for k, v in sorted(cfg["inductor_options"].items()))
    else:
        s += " · eager"
    if rec_label(row.record) is not None:
        s += f" · label {rec_label(row.record)}"
    return s


def _key(row: Row) -> str:
    d = {k: v for k, v in workload_fields(rec_config(row.record)).items() if k not in SIDE_EXCLUDE}
    d["device_type"] = rec_device_type(row.record)
    return json.dumps(d, sort_keys=True, default=str)


@dataclass
class Table:
    rows: list[Row]
    reference: Row
    pairs: dict[int, compare.Pair] = field(default_factory=dict)  # id(row) -> pair against the reference

    @property
    def title(self) -> str:
        cfg = rec_config(self.reference.record)
        model = str(cfg.get("model")) + (f" ({cfg['flavor']})" if cfg.get("flavor") not in (None, "full") else "")
        bits = [model, str(cfg.get("precision")), f"batch {cfg.get('batch_size')}/device",
                f"{self.reference.nnodes} node(s) × {self.reference.nproc_per_node}",
                rec_device_type(self.reference.record)]
        if (cfg.get("grad_accum") or 1) != 1:
            bits.append(f"accum {cfg.get('grad_accum')}")
        return " · ".join(bits)

    def flags(self, r: Row) -> list[validity.Flag]:
        """The row's own flags, and (against the reference) another thread budget, window or sampling."""
        if r is self.reference or not r.ok:
            return list(r.flags)
        return list(r.flags) + [f for f in validity.compare_flags(r.record, self.reference.record, None,
                                                                   what="ratio to the reference")
                                if f.check != "baseline_flagged"]

    @property
    def unit(self) -> str:
        m = self.reference.record.get("model")
        return str(m.get("unit")) if isinstance(m, dict) and m.get("unit") else "sample"


def _reference(rows: list[Row]) -> Row:
    def rank(r: Row) -> tuple:
        cfg = rec_config(r.record)
        return (not r.ok, r.strategy != "single", bool(cfg.get("compile")), rec_label(r.record) is not None,
                case_name(r))

    return min(rows, key=rank)


def tables(report: Report, opts: compare.Options | None = None) -> list[Table]:
    """Workloads with at least two cases that differ in strategy, compile settings, framework or label."""
    opts = opts or compare.Options()
    by_key: dict[str, list[Row]] = {}
    for g in report.groups:
        for r in g.own_rows:
            by_key.setdefault(_key(r), []).append(r)
    out = []
    for rows in by_key.values():
        if len(rows) < 2:
            continue
        ref = _reference(rows)
        rows = [ref] + sorted((r for r in rows if r is not ref), key=case_name)
        t = Table(rows, ref)
        for r in rows[1:]:
            t.pairs[id(r)] = compare.judge(compare.Pair(ref, r, repeat_samples(ref.record),
                                                        repeat_samples(r.record)), opts)
        out.append(t)
    out.sort(key=lambda t: t.title)
    return out


METHOD = ("Cases of one workload that differ in strategy, compile settings, framework or label, against the first "
          "row (the reference): ratio = median ÷ reference median of samples/s; the verdict, CI and p-value as "
          "`dlscale compare` computes them (faster/slower only when the 95 % bootstrap CI excludes 1 and p < 0.05).")
TITLE = "Side by side (same workload, different settings)"


def columns(t: Table) -> list[Column]:
    return [Column("case", left=True), Column("throughput median", f"{t.unit}/s", 2),
            Column("ratio to reference", decimals=3), Column("95 % CI of ratio"),
            Column("p (Mann-Whitney)", format=lambda v: f"{v:.3g}"), Column("n"), Column("verdict", left=True),
            Column("validity", left=True)]


def row_values(t: Table, r: Row) -> list[Any]:
    """A case's cells: a non-ok case shows its status word; the reference its ratio 1."""
    fl = t.flags(r)
    warned = any(f.severity == validity.WARN for f in fl)
    flags = Cell(validity.names(fl, missing=MISSING), [f.check for f in fl], cls="flag" if warned else "",
                 tip=validity.describe(fl))
    if not r.ok:
        return [case_name(r), Cell(STATUS_TEXT.get(r.status, r.status.upper()))] + [None] * 5 + [flags]
    n = len(repeat_samples(r.record))
    if r is t.reference:
        return [case_name(r) + " (reference)", r.median, 1.0, None, None, n, "reference", flags]
    p = t.pairs[id(r)]
    ci = None if p.ci is None else Cell(f"{p.ci[0]:.3f}–{p.ci[1]:.3f}", list(p.ci))
    return [case_name(r), r.median, p.ratio, ci, p.p, n, verdict_cell(p.verdict), flags]


def table(t: Table) -> table_model.Table:
    return table_model.Table(t.title, columns(t), [row_values(t, r) for r in t.rows], kind="side")


def to_markdown(ts: list[Table]) -> list[str]:
    if not ts:
        return []
    out = [f"## {TITLE}", "", METHOD, ""]
    for t in ts:
        out += table_model.markdown(table(t))
    return out


def to_html(ts: list[Table]) -> list[str]:
    if not ts:
        return []
    return [f'<h2 id="side-by-side">{html_escape(TITLE)}</h2>', f'<p class="method">{html_escape(METHOD)}</p>'] \
        + [table_model.html(table(t)) for t in ts]


def to_json_obj(ts: list[Table]) -> list[dict[str, Any]]:
    out = []
    for t in ts:
        cases = []
        for r in t.rows:
            p = t.pairs.get(id(r))
            cases.append({"case": case_name(r), "record_id": r.record.get("id"), "status": r.status,
                          "median": r.median, "reference": r is t.reference,
                          "ratio": p.ratio if p else (1.0 if r is t.reference else None),
                          "ci_low": p.ci[0] if p and p.ci else None, "ci_high": p.ci[1] if p and p.ci else None,
                          "p_value": p.p if p else None, "verdict": p.verdict if p else None,
                          "flags": [f.to_dict() for f in t.flags(r)]})
        out.append({"title": t.title, "cases": cases})
    return out
