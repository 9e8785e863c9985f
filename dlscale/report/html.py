"""One self-contained HTML file: inline CSS, plots as base64 PNG, no scripts, no network fetches."""
from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Sequence

import dlscale
from dlscale.report import account, frameworks, parity, quality, sidebyside, sources, table
from dlscale.report.cells import html_escape as _e
from dlscale.report.data import SELECTION_RULE, Report
from dlscale.report.plots import Plot
from dlscale.report.render import (
    ENV_KEYS, METHOD_TEXT, STATUS_TEXT, TRACE_HINT, WARN_MARK, _anchor, commands, dlperf_table,
    env_value, environments, group_notes, micro_table, micro_title, parity_view, quality_view,
    trace_path,
)
from dlscale.report.table import Column, Table
from dlscale.tune.report import html_section as tune_section

CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dee7; --head:#eef1f6; --accent:#2457a6; }
* { box-sizing: border-box; }
body { margin:0; background:#f4f5f7; color:var(--fg);
       font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif; }
main { max-width:1200px; margin:0 auto; padding:24px 36px 48px; background:#fff; min-height:100vh; }
h1 { font-size:26px; margin:0 0 4px; }
h2 { font-size:20px; margin:36px 0 8px; padding-bottom:4px; border-bottom:2px solid var(--line); }
h3 { font-size:15px; margin:26px 0 4px; }
a { color:var(--accent); }
.meta, .sub { color:var(--muted); }
.sub { margin:0 0 6px; font-size:13px; }
.method { font-size:13px; color:var(--muted); max-width:900px; }
.warn { background:#fff4e5; border:1px solid #f0c36d; border-radius:4px; padding:8px 12px; margin:12px 0; }
table { border-collapse:collapse; margin:6px 0 4px; font-size:13px; font-variant-numeric:tabular-nums; }
th, td { border:1px solid var(--line); padding:4px 9px; text-align:right; vertical-align:top; }
table.dlperf td { white-space:nowrap; }
.tablewrap { max-width:100%; overflow-x:auto; }
.wide table { font-size:12px; }
.wide th, .wide td { padding:3px 5px; }
th { background:var(--head); font-weight:600; }
th.l, td.l { text-align:left; }
tbody tr:nth-child(even) { background:#fafbfc; }
tr.borrowed td { color:var(--muted); font-style:italic; }
td.status { font-weight:700; color:#b00020; text-align:center; }
td.status-oom { color:#b35c00; }
td.status-unsupported { color:#6b6b6b; }
td.flag { background:#fff1de; color:#8a3b00; font-weight:600; }
table.dlperf td.l.flag, table.dlperf td.l.note { white-space:normal; min-width:190px; }
td.note { color:var(--muted); }
td.good { color:#1b6e2a; font-weight:600; }
li.flag { color:#8a3b00; }
ul.notes { color:var(--muted); font-size:12.5px; margin:4px 0 10px; padding-left:20px; }
.plots { display:flex; flex-wrap:wrap; gap:12px; margin:8px 0; }
figure { margin:0; padding:4px; border:1px solid var(--line); border-radius:4px; background:#fff; }
figure img { display:block; width:520px; max-width:100%; height:auto; }
figcaption { font-size:12px; color:var(--muted); text-align:center; }
pre, code { font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,"Liberation Mono",monospace; }
pre { background:#f3f4f6; border-radius:4px; padding:8px 10px; overflow-x:auto; font-size:12px; }
td code { font-size:12px; white-space:pre-wrap; overflow-wrap:anywhere; }
nav ol { margin:4px 0; padding-left:22px; font-size:13px; columns:2; }
details > summary { cursor:pointer; color:var(--accent); }
footer { margin-top:40px; font-size:12px; color:var(--muted); }
"""


def _figures(plots: Sequence[Plot]) -> str:
    if not plots:
        return ""
    out = ['<div class="plots">']
    for p in plots:
        b64 = base64.b64encode(p.data["png"]).decode("ascii")
        out.append(f'<figure><img alt="{_e(p.title)}" src="data:image/png;base64,{b64}">'
                   f"<figcaption>{_e(p.title)}</figcaption></figure>")
    out.append("</div>")
    return "".join(out)


def _trace_href(path: str, output: str | None) -> str:
    """A link to a trace file: relative to the HTML file when its location is known, else file://."""
    absolute = Path(os.path.abspath(path))
    if output and output != "-":
        try:
            return Path(os.path.relpath(absolute, os.path.dirname(os.path.abspath(output)))).as_posix()
        except ValueError:
            pass
    return absolute.as_uri()


def _trace_items(g, output: str | None) -> list[str]:
    out = []
    for r in g.own_rows:
        tp = trace_path(g, r) if r.ok else None
        if not tp:
            continue
        gone = "" if os.path.isfile(tp) else "; the file is missing"
        out.append(f'<li class="trace">{_e(r.node_gpu)}: profiler trace <a href="{_e(_trace_href(tp, output))}">'
                   f"<code>{_e(tp)}</code></a> ({_e(TRACE_HINT)}{_e(gone)})</li>")
    return out


def to_html(report: Report, plots: Sequence[Plot] = (), output: str | None = None) -> str:
    """The page; ``output`` (where it will be written) makes the links to profiler traces relative."""
    by_key: dict[str, list[Plot]] = {}
    for p in plots:
        if "png" in p.data:
            by_key.setdefault(p.key, []).append(p)
    n_runs = sum(1 for r in report.records if r.get("kind") == "run")
    n_cases = sum(len(g.own_rows) for g in report.groups)
    body: list[str] = ["<h1>dlscale report</h1>"]
    meta = (f"Store <code>{_e(report.store)}</code> · generated {_e(report.generated)} · {n_runs} run "
            f"record(s), {n_cases} case(s) in {len(report.groups)} table(s), {len(report.micro)} micro record(s)")
    if report.filters.describe():
        meta += f" · filters <code>{_e(report.filters.describe())}</code>"
    body.append(f'<p class="meta">{meta}</p>')
    body.append(f'<p class="method">{_e(SELECTION_RULE[0].upper() + SELECTION_RULE[1:])}. {_e(METHOD_TEXT)}</p>')
    for w in report.warnings():
        body.append(f'<div class="warn"><strong>Warning:</strong> {_e(w)}</div>')

    side, par = sidebyside.tables(report), parity_view(report)
    body.append(_toc(report, bool(side), par is not None, bool(quality_view(report))))
    if report.groups:
        body.append("<h2>Scaling (DLPerf tables)</h2>")
    for g in report.groups:
        body += _group_section(g, by_key.get(g.name, []), output)

    body += frameworks.html(report)
    body.append(sources.html_section(report))
    body += sidebyside.to_html(side)
    body += _quality(report, by_key)

    body += tune_section(report.records)
    body += _parity(par)
    body += _micro_sections(report, by_key)
    body += _environment_section(report)
    body.append('<h2 id="commands">Commands</h2>')
    cmds = commands(report)
    body.append(_commands_table(cmds) if cmds else "<p>No commands recorded.</p>")
    body.append(f"<footer>dlscale {_e(dlscale.__version__)} · self-contained report (no external resources)</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>dlscale report · {_e(report.store)}</title><style>{CSS}</style></head>"
            f"<body><main>{''.join(body)}</main></body></html>\n")


def _toc(report: Report, side: bool, parity: bool, quality: bool = False) -> str:
    toc = [f'<li><a href="#{_anchor(g.name)}">{_e(g.title)}</a></li>' for g in report.groups]
    if side:
        toc.append('<li><a href="#side-by-side">Side by side</a></li>')
    if quality:
        toc.append('<li><a href="#quality">Time to quality</a></li>')
    if parity:
        toc.append('<li><a href="#parity">Loss parity</a></li>')
    if report.micro:
        toc.append('<li><a href="#micro">Micro-benchmarks</a></li>')
    toc += ['<li><a href="#environment">Environment</a></li>', '<li><a href="#commands">Commands</a></li>']
    return f"<nav><ol>{''.join(toc)}</ol></nav>"


def _group_section(g, plots: list[Plot], output: str | None) -> list[str]:
    """One DLPerf table with its flagged cells, notes, trace links and plots."""
    t = dlperf_table(g)
    out = [f'<section id="{_e(t.anchor)}"><h3>{_e(g.title)}</h3>',
           f'<p class="sub">DLPerf key <code>{_e(g.name)}</code> · per-device batch {_e(g.batch_size)}'
           f" · device {_e(g.device_type)} · unit {_e(g.unit)}</p>", table.html_table(t)]
    notes = [f'<li class="{"flag" if WARN_MARK in n.split(":")[0] else ""}">{_e(n)}</li>'
             for n in group_notes(g, traces=False) + t.all_notes()[len(t.notes):]] + _trace_items(g, output)
    out.append('<ul class="notes">' + "".join(notes) + "</ul>")
    growth = account.table(g)
    if growth is not None:
        out.append(table.html(growth, heading=""))
    out.append(_figures(plots))
    out.append("</section>")
    return out


def _micro_sections(report: Report, by_key: dict[str, list[Plot]]) -> list[str]:
    out = ['<h2 id="micro">Micro-benchmarks</h2>'] if report.micro else []
    for m in report.micro:
        out.append(f"<section><h3>{_e(micro_title(m))}</h3>")
        if m.get("status", "ok") != "ok":
            out.append(f'<p><strong>{_e(STATUS_TEXT.get(str(m.get("status")), m.get("status")))}</strong> '
                       f'{_e(m.get("error") or "")}</p>')
        out.append(_figures(by_key.get(f"micro:{m.get('id')}", [])))
        t = micro_table(m)
        if t is not None:
            out.append(f"<details><summary>{len(t.rows)} result row(s)</summary>{table.html_table(t)}</details>")
        flags = [f for f in (m.get("validity") or {}).get("flags") or [] if isinstance(f, dict)]
        if flags:  # as run's: spread, competing processes, oversubscribed threads
            out.append('<ul class="notes">' + "".join(
                f"<li>{'⚠' if f.get('severity') == 'warn' else '?'} {_e(str(f.get('check')))}: "
                f"{_e(str(f.get('reason')))}</li>" for f in flags) + "</ul>")
        out.append("</section>")
    return out


def _environment_section(report: Report) -> list[str]:
    out = ['<h2 id="environment">Environment</h2>']
    prov = sources.provenance_lines(report)
    if prov:
        out.append('<h2 id="imported">Imported results</h2><ul class="notes">'
                   + "".join(f"<li>{_e(line[2:])}</li>" for line in prov if line.startswith("- ")) + "</ul>")
    envs = environments([r for r in report.selected_records() if r.get("kind") != "imported"])
    if not envs:
        out.append("<p>No environment recorded.</p>")
    for e in envs:
        out.append(f"<h3>host {_e(e['host'])} <span class=\"meta\">({e['records']} record(s))</span></h3>")
        rows = [[k, env_value(k, e["env"].get(k))] for k in ENV_KEYS if k != "topology"]
        extra = sorted(k for k in e["env"] if k not in ENV_KEYS and k != "host")
        rows += [[k, env_value(k, e["env"].get(k))] for k in extra]
        others = sorted(set(e["rank_hosts"]) - {e["host"]})
        if others:
            rows.append(["other hosts in these runs", ", ".join(others)])
        out.append(table.html_table(Table("", [Column("field", left=True), Column("value", left=True)], rows,
                                          kind="env")))
        if e["env"].get("topology"):
            out.append(f"<details><summary>GPU topology</summary><pre>{_e(e['env']['topology'])}</pre></details>")
    return out


def _quality(report: Report, by_key: dict[str, list[Plot]]) -> list[str]:
    """The time-to-quality tables and their plots (dlscale/report/quality.py)."""
    groups = quality_view(report)
    if not groups:
        return []
    out = [f'<h2 id="quality">{_e(quality.TITLE)}</h2>', f'<p class="method">{_e(quality.METHOD)}</p>']
    out += [table.html(quality.table(g), after=_figures(by_key.get(f"quality:{g.slug}", []))) for g in groups]
    return out


def _parity(rep) -> list[str]:
    if rep is None:
        return []
    out = ['<h2 id="parity">Loss parity</h2>', f'<p class="method">{_e(parity.METHOD)}</p>']
    out += [table.html(parity.table(g)) for g in rep.groups]
    counts = ", ".join(f"{n} {v}" for v, n in sorted(rep.counts().items())) or "nothing compared"
    out.append(f"<p><strong>Summary:</strong> {_e(counts)}</p>")
    return out


def _commands_table(cmds: Sequence[tuple[str, str, str]]) -> str:
    out = ['<table class="commands"><thead><tr><th class="l">case</th><th class="l">status</th>'
           '<th class="l">command</th></tr></thead><tbody>']
    for what, status, cmd in cmds:
        out.append(f'<tr><td class="l">{_e(what)}</td><td class="l">{_e(status)}</td>'
                   f'<td class="l"><code>{_e(cmd)}</code></td></tr>')
    out.append("</tbody></table>")
    return "".join(out)
