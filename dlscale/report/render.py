"""Text renderings of a Report: Markdown, CSV and DLPerf-shaped JSON (HTML lives in html.py)."""
from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter
from typing import Any, Callable, Sequence

from dlscale.results import validity
from dlscale.fmt import MISSING, fmt_stdev, md_code, md_generated, md_heading, md_safe, md_text
from dlscale.inputs.spec import BUFFER_MARGIN, INPUT_BOUND_SHARE
from dlscale.report import account, lostcols, parity, sidebyside, sources, table
from dlscale.report import frameworks, quality
from dlscale.report.cells import GIB, MB, MIB, fmt  # noqa: F401  (GIB, MB: part of render's names)
from dlscale.report.table import Cell, Column, Table
from dlscale.report.data import (SELECTION_RULE, STATUS_TEXT, Group, Report, Row, num, rec_config, rec_label,
                                 resolve_store_path, series_paths)

TRACE_HINT = "open in chrome://tracing or ui.perfetto.dev"
METHOD_TEXT = ("Speedup = median samples/s ÷ median of the 1-device ok record of the same workload "
               "(same model, flavor, precision, compile settings, per-device batch; any strategy); scaling "
               "efficiency = speedup ÷ devices. Both are computed from the stored records at report time.")
WARN_MARK, NOTE_MARK = "⚠", "?"
VALIDITY_TEXT = (f"validity: {WARN_MARK} marks a number that may be wrong, {NOTE_MARK} a weak claim (a spread "
                 "from too few repeats or steps) or a run that is not what it seems (a loss that rose far); the "
                 "reasons follow, thresholds in docs/metrics.md")


def md_title(group: Group) -> str:
    """A table's heading text: the title with its label escaped as Markdown text."""
    return md_heading(group.title, group.label)


def _fence(lines: Sequence[str]) -> str:
    """A code fence longer than any run of backticks in ``lines`` (a command cannot close it)."""
    longest = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    return "`" * max(3, longest + 1)


def mem_unit(group: Group) -> tuple[str, float]:
    peaks = [r.peak_mem for r in group.rows if r.peak_mem is not None]
    return ("GiB", GIB) if peaks and max(peaks) >= GIB else ("MiB", MIB)


def count_header(group: Group) -> str:
    return "gpu_num" if group.device_type == "cuda" else "proc_num"


def _scaled(v: float | None, scale: float) -> float | None:
    return None if v is None else v / scale


# Utilisation and breakdown columns: (header, the row's value(s)), the header a title shown to one
# decimal or a Column of its own. A column is shown only when some ok row of the table has a value
# for it; a pair ("a / b") when either half is known.
EXTRA_COLUMNS: tuple[tuple[str | Column, Callable[[Row], tuple[float | None, ...]]], ...] = (
    ("GPU util (%)", lambda r: (r.util("gpu_util_pct_mean"),)),
    ("CPU util (%)", lambda r: (r.util("cpu_util_pct_mean"),)),
    ("host mem (GiB)", lambda r: (_scaled(r.util("host_mem_used_bytes_mean"), GIB),)),
    ("disk r/w (MB/s)", lambda r: (_scaled(r.util("disk_read_bps_mean"), MB),
                                   _scaled(r.util("disk_write_bps_mean"), MB))),
    ("net tx/rx (MB/s)", lambda r: (_scaled(r.util("net_sent_bps_mean"), MB),
                                    _scaled(r.util("net_recv_bps_mean"), MB))),
    ("exposed comm (%)", lambda r: (r.exposed_comm_pct,)),
    ("overlap (%)", lambda r: (r.overlap_pct,)),
    ("data wait (%)", lambda r: (r.data_wait_pct,)),
    ("GPU idle for data (%)", lambda r: (r.data_gpu_idle_pct,)),
    ("loader CPU (cores)", lambda r: (r.loader_cores,)),
    # model-parallel workloads: DLPerf reports Wide & Deep (unit "sample") by latency per iteration;
    # sharding strategies record the bytes a rank sends per step (strategy_info.exchange_bytes_per_step)
    ("step p50 / p90 (ms)", lambda r: (r.summary("step_ms_p50"), r.summary("step_ms_p90")) if r.unit == "sample"
     else (None, None)),
    ("exchange (MB/step/rank)", lambda r: (_scaled(r.exchange_bytes, MB),)),
) + lostcols.COLUMNS  # slowest rank, wall outside the window, energy, checkpoints
DATA_NOTE = ("data wait = the share of the timed window the training steps waited at the data loader "
             "(host clock around each fetch; the slowest rank's); GPU idle for data = the share of it the GPU "
             "had no work while its batch was not there (CUDA events; a host ahead of the GPU waits without "
             f"costing any); input-bound when the GPU idle share (else the wait) is {INPUT_BOUND_SHARE:.0%} or "
             "more; loader CPU = cores the loader processes and threads of all ranks kept busy (docs/data.md)")
EXTRA_NOTE = ("utilisation columns: timed-window means of the median repeat, sampled on local rank 0 of node 0 "
              "(GPU util: mean over that node's GPUs; disk and net: whole host, loopback included, "
              "MB/s = 10^6 B/s); exposed comm = exposed_comm_ms ÷ step_ms and overlap = share of the "
              "all-reduce hidden behind backward, from the step-time breakdown measured after the window; "
              "step p50 / p90: rank 0's step times in the window (CTR tables); exchange: bytes the busiest "
              "rank sends to the others per step, as the sharding strategy recorded them (MB = 10^6 B); "
              + lostcols.NOTE)


def extra_columns(group: Group) -> list[tuple[str, Callable[[Row], tuple[float | None, ...]]]]:
    """The utilisation/breakdown columns some ok row of this table has data for."""
    ok = [r for r in group.rows if r.ok]
    return [(h, f) for h, f in EXTRA_COLUMNS if any(v is not None for r in ok for v in f(r))]


def _mem_column(g: Group) -> Column:
    mu, _ = mem_unit(g)
    return Column("peak mem / device" if g.device_type == "cuda" else "peak RSS / process", mu, 2)


def _mem(g: Group, r: Row) -> float | None:
    _, scale = mem_unit(g)
    return None if r.peak_mem is None else r.peak_mem / scale


def _spread(g: Group, r: Row) -> Cell | None:
    lo, hi, n = r.stat("min"), r.stat("max"), r.stat("n")
    if lo is None or hi is None or n is None or n < 2:
        return None
    return Cell(f"{fmt(lo)}–{fmt(hi)}", [lo, hi])


def _flagged(v: float | None, nd: int, r: Row) -> Cell:
    """A number against the baseline: the warn mark, the HTML flag and the reasons where the comparison
    has a warning."""
    text = fmt(v, nd)
    if not any(f.severity == validity.WARN for f in r.speedup_flags):
        return Cell(text, v)
    return Cell(f"{text} {WARN_MARK}" if text != MISSING else text, v, "flag", validity.describe(r.speedup_flags))


def _pct(v: float | None) -> float | None:
    return None if v is None else v * 100


def _repeats(r: Row) -> int | None:
    n = r.stat("n")
    return None if n is None else int(n)


# A DLPerf column: its definition (of the table: the header names its unit) and its accessor.
Metric = tuple[Callable[[Group], Column], Callable[[Group, Row], Any]]
# COUNT_COLUMNS say which row it is; CORE_COLUMNS are measured: a non-ok row shows its status word in
# the first, MISSING in the rest.
COUNT_COLUMNS: tuple[Metric, ...] = (
    (lambda g: Column("node_num"), lambda g, r: r.nnodes),
    (lambda g: Column(count_header(g)), lambda g, r: r.devices),
)
CORE_COLUMNS: tuple[Metric, ...] = (
    (lambda g: Column("throughput median", f"{g.unit}/s", 2), lambda g, r: r.median),
    (lambda g: Column("speedup", "×", 2), lambda g, r: _flagged(r.speedup, 2, r)),
    (lambda g: Column("scaling efficiency", "%", 1), lambda g, r: _flagged(_pct(r.efficiency), 1, r)),
    (lambda g: Column("MFU", "%", 1), lambda g, r: _pct(r.mfu)),
    (_mem_column, _mem),
    (lambda g: Column("min–max", f"{g.unit}/s"), _spread),
    (lambda g: Column("stdev", f"{g.unit}/s"),
     lambda g, r: Cell(fmt_stdev(r.stat("stdev"), r.stat("n")), r.stat("stdev"))),
    (lambda g: Column("n", "repeats"), lambda g, r: _repeats(r)),
)
# shown, like EXTRA_COLUMNS, only when some ok row of the table has a value
LOSS_COLUMN: Metric = (lambda g: Column("loss after", decimals=4), lambda g, r: r.loss_after)


def has_loss_column(group: Group) -> bool:
    return any(r.loss_after is not None for r in group.rows if r.ok)


def has_validity_column(group: Group) -> bool:
    return any(r.flags for r in group.rows if r.ok)


def flags_cell(flags: Sequence[validity.Flag]) -> str:
    return validity.names(list(flags), WARN_MARK, NOTE_MARK, MISSING)


def validity_cell(row: Row) -> str:
    return flags_cell(row.flags)


def _validity(g: Group, r: Row) -> Cell:
    """The record's own flags; HTML marks them bad where unsound or the comparison warns."""
    if not r.flags:
        return Cell(validity_cell(r), [])
    warn = not r.validity.sound or any(f.severity == validity.WARN for f in r.speedup_flags)
    return Cell(validity_cell(r), [f.check for f in r.flags], "l " + ("flag" if warn else "note"),
                validity.describe(r.flags))


def _metrics(group: Group) -> tuple[list[Metric], list[Metric]]:
    """(the columns that say which row, the measured ones) this table shows."""
    extras = [(lambda g, h=h: h if isinstance(h, Column) else Column(h, decimals=1), lambda g, r, f=f: f(r))
              for h, f in extra_columns(group)]
    tail = ([(lambda g: Column("validity"), _validity)] if has_validity_column(group) else []) \
        + ([LOSS_COLUMN] if has_loss_column(group) else [])
    return list(COUNT_COLUMNS), list(CORE_COLUMNS) + tail + extras


def _row_values(group: Group, row: Row, measured: list[Metric]) -> list[Any]:
    head = [value(group, row) for _, value in COUNT_COLUMNS]
    if not row.ok:
        word = STATUS_TEXT.get(row.status, row.status.upper()) if row.status != "ok" else "NO DATA"
        return head + [Cell(word, None, f"status status-{row.status}", row.error or "")] + [None] * (len(measured) - 1)
    return head + [value(group, row) for _, value in measured]


def dlperf_table(group: Group) -> Table:
    """The DLPerf table of a report group: status words replace the numbers of a non-ok case."""
    count, measured = _metrics(group)
    rows = [_row_values(group, r, measured) for r in group.rows]
    return Table(group.title, [c(group) for c, _ in count + measured], rows, group_notes(group),
                 title_md=md_title(group), anchor=_anchor(group.name), kind="dlperf",
                 row_classes=["borrowed" if r.borrowed else "" for r in group.rows], wide=bool(extra_columns(group)))


def _anchor(name: str) -> str:
    return "g-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in name)


def dlperf_columns(group: Group) -> list[Column]:
    count, measured = _metrics(group)
    return [c(group) for c, _ in count + measured]


def dlperf_values(group: Group, row: Row) -> list[Any]:
    """The DLPerf row's values under ``dlperf_columns``."""
    return _row_values(group, row, _metrics(group)[1])


def flag_notes(group: Group) -> list[str]:
    """One line per flag of the table's own ok rows: the reasons behind the marks."""
    out = []
    for r in group.rows:
        if not r.ok or r.borrowed:
            continue
        for f in sorted(r.flags, key=lambda f: f.severity != validity.WARN):
            mark = WARN_MARK if f.severity == validity.WARN else NOTE_MARK
            out.append(f"{r.node_gpu} {mark} {f.check}: {f.reason}")
    return out


def trace_path(group: Group, row: Row) -> str | None:
    """Where the row's profiler trace is (the store directory joined with the record's path)."""
    t = row.trace
    return None if t is None else str(resolve_store_path(group.store_dir, t))


def missing_series(group: Group, row: Row) -> list[str]:
    """Series files the row's median repeat lists that are not in the store (never raises)."""
    if group.store_dir is None:
        return []
    out = []
    for p in series_paths(row.record):
        try:
            if not resolve_store_path(group.store_dir, p).is_file():
                out.append(p)
        except OSError:
            out.append(p)
    return out


def group_notes(group: Group, traces: bool = True) -> list[str]:
    """Notes under a table; ``traces=False`` leaves the profiler-trace lines out (HTML links them)."""
    notes = [group.baseline_note()] + sources.group_notes(group)
    if extra_columns(group):
        notes.append(EXTRA_NOTE)
    if any(r.data_wait_pct is not None for r in group.rows if r.ok):
        notes.append(DATA_NOTE)
    flags = flag_notes(group)
    if flags:
        notes.append(VALIDITY_TEXT)
        notes += flags
    for r in group.rows:
        if r.borrowed:
            notes.append(f"{r.node_gpu} row: the {r.strategy} baseline run, shown for reference")
        sn = r.supersede_note()
        if sn and not r.borrowed:
            notes.append(f"{r.node_gpu}: {sn}")
        if r.status != "ok" and r.error:
            notes.append(f"{r.node_gpu} {r.status}: {_one_line(r.error, 200)}")
        elif r.status == "ok" and not r.ok:
            notes.append(f"{r.node_gpu}: status ok but no samples/s recorded")
        if r.borrowed or not r.ok:
            continue
        d = r.data or {}
        if d.get("input_bound"):
            idle = "" if r.data_gpu_idle_pct is None else f", the GPU idled for it {fmt(r.data_gpu_idle_pct, 1)} %"
            notes.append(f"{r.node_gpu}: input-bound: the steps waited for data {fmt(r.data_wait_pct, 1)} %{idle} "
                         f"of the window (loader: {_one_line(str((d.get('loader') or {}).get('decoder')), 60)}, "
                         f"{(d.get('loader') or {}).get('workers')} worker(s) per rank)")
        if d.get("wait_may_be_understated"):
            notes.append(f"{r.node_gpu}: the window took {d.get('window_batches')} batches, under {BUFFER_MARGIN}x the "
                         f"{d.get('prefetch_buffer_batches')} the loader held ready at its start: the data wait "
                         "may be understated (run more steps)")
        if d.get("bad_files_total"):
            notes.append(f"{r.node_gpu}: {d['bad_files_total']} unreadable image(s) skipped, e.g. "
                         f"{_one_line('; '.join(d.get('bad_names') or []), 160)}")
        b = r.record.get("breakdown")
        if isinstance(b, dict) and b.get("supported") is False:
            notes.append(f"{r.node_gpu}: no step-time breakdown ({_one_line(b.get('reason') or 'unsupported', 120)})")
        missing = missing_series(group, r)
        if missing:
            notes.append(f"{r.node_gpu}: utilisation series file(s) missing from the store: {', '.join(missing)}")
        tp = trace_path(group, r)
        if traces and tp:
            gone = "" if os.path.isfile(tp) else "; the file is missing"
            notes.append(f"{r.node_gpu}: profiler trace {tp} ({TRACE_HINT}{gone})")
    return notes


def _one_line(s: str, limit: int) -> str:
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit - 1] + "…"


# ----------------------------------------------------------------------------- environment

ENV_KEYS = ("dlscale", "git_sha", "python", "torch", "cuda", "cudnn", "nccl", "driver", "os", "cpu",
            "cpu_count", "memory_total_bytes", "gpus", "env_vars", "topology")


def gpu_summary(gpus: Any) -> str:
    if not gpus:
        return "none"
    c = Counter()
    for g in gpus:
        if isinstance(g, dict):
            mem = num(g.get("memory_total_bytes"))
            c[(str(g.get("name")), f" ({mem / GIB:.1f} GiB)" if mem else "")] += 1
    return ", ".join(f"{n} × {name}{mem}" for (name, mem), n in c.items()) or "none"


def env_value(key: str, v: Any) -> str:
    if key == "gpus":
        return gpu_summary(v)
    if key == "env_vars" and isinstance(v, dict):
        return " ".join(f"{n}={x}" for n, x in v.items()) or "none set"
    if key == "memory_total_bytes" and num(v) is not None:
        return f"{v / GIB:.1f} GiB"
    return MISSING if v is None or v == "" else str(v)


def environments(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Distinct environments, per host: [{host, env, records: n, hosts_in_runs: [...]}]."""
    seen: dict[str, dict[str, Any]] = {}
    for rec in records:
        env = rec.get("env")
        if not isinstance(env, dict):
            continue
        key = json.dumps(env, sort_keys=True, default=str)
        item = seen.setdefault(key, {"host": str(env.get("host") or "unknown host"), "env": env,
                                     "records": 0, "rank_hosts": set()})
        item["records"] += 1
        for r in rec.get("ranks") or []:
            if isinstance(r, dict) and r.get("host"):
                item["rank_hosts"].add(str(r["host"]))
    return sorted(seen.values(), key=lambda e: (e["host"], -e["records"]))


def commands(report: Report) -> list[tuple[str, str, str]]:
    """(what, status, command line) per reported case, in table order, then micro records."""
    out = []
    for g in report.groups:
        for r in g.own_rows:
            if r.record.get("kind") == "imported":  # no command: the provenance section says where from
                continue
            out.append((f"{g.name} {r.node_gpu}", r.status, str(r.record.get("command") or MISSING)))
    for m in report.micro:
        out.append((f"micro {m.get('micro')} {str(m.get('id'))[:8]}", str(m.get("status")),
                    str(m.get("command") or MISSING)))
    return out


# ----------------------------------------------------------------------------- micro tables

def micro_columns(rec: dict[str, Any]) -> list[str]:
    """Result-row fields, the plot's x, series and y first."""
    spec = rec.get("plot") if isinstance(rec.get("plot"), dict) else {}
    present = {k for row in rec.get("results") or [] if isinstance(row, dict) for k in row}
    cols: list[str] = [k for k in (spec.get("x"), spec.get("series"), spec.get("y")) if k in present]
    for row in rec.get("results") or []:
        if isinstance(row, dict):
            cols += [k for k in row if k not in cols]
    return cols


def micro_cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.4e}"
    return MISSING if v is None else str(v)


def micro_table(rec: dict[str, Any]) -> Table | None:
    """A micro-benchmark record's result rows, one column per field; None without any."""
    cols = micro_columns(rec)
    if not cols:
        return None
    rows = [[r.get(c) for c in cols] for r in rec.get("results") or [] if isinstance(r, dict)]
    return Table(micro_title(rec), [Column(c, format=micro_cell) for c in cols], rows)


def micro_title(rec: dict[str, Any]) -> str:
    env = rec.get("env") if isinstance(rec.get("env"), dict) else {}
    bits = [f"micro {rec.get('micro')}", f"record {str(rec.get('id'))[:8]}"]
    if env.get("host"):
        bits.append(str(env["host"]))
    if rec.get("created"):
        bits.append(str(rec["created"]))
    if rec_label(rec):
        bits.append(f"label {rec_label(rec)}")
    return " · ".join(bits)


def micro_md_title(rec: dict[str, Any]) -> str:
    """micro_title as Markdown heading text: host, time and label escaped."""
    title = md_generated(micro_title(rec))
    for raw in {str(rec_label(rec) or ""), str((rec.get("env") or {}).get("host") or "")
                if isinstance(rec.get("env"), dict) else ""} - {""}:
        title = title.replace(md_generated(raw), md_text(raw))
    return title


# ----------------------------------------------------------------------------- markdown

def parity_view(report: Report):
    """The loss-parity view of the report's records, or None when no case has losses to set beside single's."""
    rep = parity.build(report.loaded, report.filters)
    return rep if any(e.max_rel_diff is not None for g in rep.groups for e in g.entries) else None


def quality_view(report: Report) -> list:
    """The time-to-quality tables (dlscale/report/quality.py): one per workload trained with --until."""
    return quality.build(report.loaded, report.filters)


def header_lines(report: Report) -> list[str]:
    n_runs = sum(1 for r in report.records if r.get("kind") == "run")
    n_cases = sum(len(g.own_rows) for g in report.groups)
    others = ", ".join(f"{n} {k}" for k in ("external", "imported")
                       if (n := sum(1 for r in report.records if r.get("kind") == k)))
    line = (f"Store {md_code(report.store)} · generated {report.generated} · {n_runs} run record(s)"
            f"{' (+ ' + others + ')' if others else ''}, {n_cases} "
            f"case(s) in {len(report.groups)} table(s), {len(report.micro)} micro record(s)")
    if report.filters.describe():
        line += f" · filters: {md_code(report.filters.describe())}"
    return [line, "", SELECTION_RULE[0].upper() + SELECTION_RULE[1:] + ". " + METHOD_TEXT]


def to_markdown(report: Report, plot_links: dict[str, list[tuple[str, str]]] | None = None) -> str:
    plot_links = plot_links or {}
    out = ["# dlscale report", ""] + header_lines(report) + [""]
    for w in report.warnings():
        out += [f"> **Warning:** {w}", ""]
    if report.groups:
        out += ["## Scaling (DLPerf tables)", ""]
    for g in report.groups:
        t = dlperf_table(g)
        t.intro = f"DLPerf key {md_code(g.name)} · per-device batch {g.batch_size} · device {g.device_type}"
        out += table.markdown(t)
        growth = account.table(g)
        out += table.markdown(growth, heading="") if growth else []
        for title, path in plot_links.get(g.name, []):
            out.append(f"![{title}]({path})")
        if plot_links.get(g.name):
            out.append("")
    out += frameworks.markdown(report)
    out += sources.markdown_section(report)
    out += sidebyside.to_markdown(sidebyside.tables(report))
    out += quality.markdown(quality_view(report), plot_links)
    par = parity_view(report)
    if par is not None:
        out += [parity.to_markdown(par, heading="##").replace("## dlscale parity", "## Loss parity", 1)]
    out += _micro_markdown(report, plot_links)
    out += sources.provenance_lines(report)
    out += _environment_markdown(report) + _commands_markdown(report)
    return md_safe("\n".join(out))


def _micro_markdown(report: Report, plot_links: dict[str, list[tuple[str, str]]]) -> list[str]:
    """A section per micro-benchmark record: its status, result rows, flags and plots."""
    out: list[str] = []
    if report.micro:
        out += ["## Micro-benchmarks", ""]
    for m in report.micro:
        out += [f"### {micro_md_title(m)}", ""]
        if m.get("status", "ok") != "ok":
            out += [f"Status **{m.get('status')}**: {_one_line(m.get('error') or '', 300)}", ""]
        t = micro_table(m)
        if t is not None:
            out += [table.md_table(t), ""]
        flags = (m.get("validity") or {}).get("flags") or []  # as run's: spread, competing processes, threads
        out += [f"- {'⚠' if f.get('severity') == 'warn' else '?'} `{f.get('check')}`: "
                f"{md_text(str(f.get('reason')))}" for f in flags if isinstance(f, dict)] + ([""] if flags else [])
        for title, path in plot_links.get(f"micro:{m.get('id')}", []):
            out += [f"![{title}]({path})", ""]
    return out


def _environment_markdown(report: Report) -> list[str]:
    out: list[str] = []
    envs = environments([r for r in report.selected_records() if r.get("kind") != "imported"])
    if envs:
        out += ["## Environment", ""]
    for e in envs:
        out += [f"### host {md_text(e['host'])} ({e['records']} record(s))", ""]
        for k in ENV_KEYS:
            if k == "topology":
                continue
            out.append(f"- {k}: {env_value(k, e['env'].get(k))}")
        others = sorted(set(e["rank_hosts"]) - {e["host"]})
        if others:
            out.append(f"- other hosts in these runs: {', '.join(others)}")
        if e["env"].get("topology"):
            out += ["", "```", str(e["env"]["topology"]), "```"]
        out.append("")
    return out


def _commands_markdown(report: Report) -> list[str]:
    out: list[str] = []
    cmds = commands(report)
    if cmds:
        body = []
        for what, status, cmd in cmds:
            body += [f"# {what} ({status})".replace("\n", " "), cmd]
        fence = _fence(body)
        out += ["## Commands", "", fence] + body + [fence, ""]
    return out


# ----------------------------------------------------------------------------- csv

CSV_COLUMNS = [
    "group", "model", "flavor", "precision", "compile", "strategy", "batch_size_per_device", "label",
    "device_type", "nnodes", "nproc_per_node", "devices", "global_batch", "status", "unit",
    "median_samples_per_s", "mean_samples_per_s", "min_samples_per_s", "max_samples_per_s",
    "stdev_samples_per_s", "n_repeats", "samples_per_s_per_device", "tokens_per_s", "speedup",
    "scaling_efficiency", "baseline_record_id", "baseline_strategy", "mfu", "peak_mem_allocated_bytes",
    "peak_mem_reserved_bytes", "peak_rss_bytes", "step_ms_p50", "step_ms_p90",
    "gpu_util_pct_mean", "cpu_util_pct_mean", "host_mem_used_bytes_mean", "disk_read_bps_mean",
    "disk_write_bps_mean", "net_sent_bps_mean", "net_recv_bps_mean", "exposed_comm_ms", "breakdown_step_ms",
    "exposed_comm_pct", "overlap_pct", "data", "data_wait_pct", "data_gpu_idle_pct", "loader_cpu_cores", "input_bound",
    "trace", "exchange_bytes_per_step", "grad_accum", "strategy_options",
    "superseded_records", "error", "case_key", "record_id", "created", "command",
    "framework", "vs_torch_eager",  # dlscale/report/frameworks.py
    "loss_after", "validity_sound", "validity_flags", "speedup_flags", "validity_reasons",
] + sources.CSV_EXTRA + lostcols.CSV_COLUMNS


UTIL_FIELDS = ("gpu_util_pct_mean", "cpu_util_pct_mean", "host_mem_used_bytes_mean", "disk_read_bps_mean",
               "disk_write_bps_mean", "net_sent_bps_mean", "net_recv_bps_mean")


def utilisation_fields(row: Row) -> dict[str, Any]:
    """Raw utilisation/breakdown values of a row (bytes, bytes/s, ms, %) for CSV and JSON."""
    b = row.breakdown or {}
    out: dict[str, Any] = {k: row.util(k) for k in UTIL_FIELDS}
    out.update({"exposed_comm_ms": num(b.get("exposed_comm_ms")), "breakdown_step_ms": num(b.get("step_ms")),
                "exposed_comm_pct": row.exposed_comm_pct, "overlap_pct": row.overlap_pct,
                "data": rec_config(row.record).get("data", "synthetic"), "data_wait_pct": row.data_wait_pct,
                "data_gpu_idle_pct": row.data_gpu_idle_pct,
                "loader_cpu_cores": row.loader_cores, "input_bound": (row.data or {}).get("input_bound"),
                "trace": row.trace, "exchange_bytes_per_step": row.exchange_bytes, **lostcols.fields(row)})
    return out


def case_dict(group: Group, row: Row) -> dict[str, Any]:
    cfg = rec_config(row.record)
    base = group.baseline
    return {
        "group": group.name, "model": cfg.get("model"), "flavor": cfg.get("flavor"),
        "precision": cfg.get("precision"), "compile": cfg.get("compile"), "strategy": cfg.get("strategy"),
        "batch_size_per_device": cfg.get("batch_size"), "label": rec_label(row.record),
        "device_type": group.device_type, "nnodes": row.nnodes, "nproc_per_node": row.nproc_per_node,
        "devices": row.devices, "global_batch": row.record.get("global_batch"), "status": row.status,
        "unit": group.unit, "median_samples_per_s": row.stat("median"), "mean_samples_per_s": row.stat("mean"),
        "min_samples_per_s": row.stat("min"), "max_samples_per_s": row.stat("max"),
        "stdev_samples_per_s": row.stat("stdev"), "n_repeats": row.stat("n"),
        "samples_per_s_per_device": num(row.summary("samples_per_s_per_device")),
        "tokens_per_s": num(row.summary("tokens_per_s")), "speedup": row.speedup,
        "scaling_efficiency": row.efficiency,
        "baseline_record_id": base.record.get("id") if base else None,
        "baseline_strategy": base.strategy if base else None, "mfu": row.mfu,
        "peak_mem_allocated_bytes": num(row.summary("peak_mem_allocated_bytes")),
        "peak_mem_reserved_bytes": num(row.summary("peak_mem_reserved_bytes")),
        "peak_rss_bytes": num(row.summary("peak_rss_bytes")),
        "step_ms_p50": num(row.summary("step_ms_p50")), "step_ms_p90": num(row.summary("step_ms_p90")),
        **utilisation_fields(row),
        "grad_accum": cfg.get("grad_accum"),
        "strategy_options": json.dumps(cfg.get("strategy_options") or {}, sort_keys=True),
        "superseded_records": len(row.superseded), "error": row.error, "case_key": row.record.get("case_key"),
        "record_id": row.record.get("id"), "created": row.record.get("created"),
        "command": row.record.get("command"), **sources.case_extra(row),
        **validity_fields(row),
    }


def validity_fields(row: Row) -> dict[str, Any]:
    """The row's loss and validity for CSV: flag names joined by ';', reasons by ' | '."""
    own, sp = row.validity.flags, row.speedup_flags
    return {"loss_after": row.loss_after, "validity_sound": row.validity.sound if row.ok else None,
            "validity_flags": ";".join(f.check for f in own), "speedup_flags": ";".join(f.check for f in sp),
            "validity_reasons": " | ".join(f"{f.check}: {f.reason}" for f in own + sp)}


def to_csv(report: Report) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_COLUMNS, lineterminator="\n")
    w.writeheader()
    fw = frameworks.csv_fields(report)
    for g in report.groups:
        for r in g.own_rows:
            d = {**case_dict(g, r), **fw[id(r.record)]}
            if d["n_repeats"] is not None:
                d["n_repeats"] = int(d["n_repeats"])
            w.writerow({k: "" if v is None else v for k, v in d.items()})
    return buf.getvalue()


# ----------------------------------------------------------------------------- json

def dlperf_entry(group: Group, row: Row) -> dict[str, Any]:
    n = row.stat("n")
    return {
        "average_speed": row.stat("mean"), "median_speed": row.stat("median"), "speedup": row.speedup,
        "batch_size_per_device": group.batch_size,
        # extras beyond DLPerf's four keys
        "scaling_efficiency": row.efficiency, "status": row.status, "min_speed": row.stat("min"),
        "max_speed": row.stat("max"), "stdev_speed": row.stat("stdev"),
        "n_repeats": None if n is None else int(n), "unit": f"{group.unit}/s", "mfu": row.mfu,
        "peak_mem_bytes": row.peak_mem, "global_batch": row.record.get("global_batch"),
        "strategy": row.strategy, "baseline": row.borrowed, "record_id": row.record.get("id"),
        "case_key": row.record.get("case_key"), "superseded_records": len(row.superseded),
        "error": row.error, **utilisation_fields(row), **sources.case_extra(row), "loss_after": row.loss_after,
        "validity": row.validity.to_dict() if row.ok else None,
        "speedup_flags": [f.to_dict() for f in row.speedup_flags],
    }


def to_json_obj(report: Report) -> dict[str, Any]:
    dlperf: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for g in report.groups:
        entries: dict[str, Any] = {}
        for r in g.rows:
            key = r.node_gpu
            if key in entries:  # a borrowed baseline next to this table's own (non-ok) 1-device case
                key = f"{key}_{r.strategy}" if r.borrowed else key
                if key in entries:
                    continue
            entries[key] = dlperf_entry(g, r)
        dlperf[g.name] = entries
        groups[g.name] = {
            "title": g.title, "model": g.model, "flavor": g.get("flavor"), "precision": g.get("precision"),
            "compile": g.get("compile"), "strategy": g.strategy, "batch_size_per_device": g.batch_size,
            "label": g.label, "device_type": g.device_type, "unit": f"{g.unit}/s", "extras": g.extras,
            "baseline_record_id": g.baseline.record.get("id") if g.baseline else None,
            "baseline_strategy": g.baseline.strategy if g.baseline else None,
            "kind": g.fields.get("kind", "run"), "stack": sources.stack_name(g.fields),
            "step_growth": {r.node_gpu: a.to_dict() for r, a in account.group_accounts(g)},
        }
    return {
        "dlperf": dlperf,
        "groups": groups,
        "records": report.records,
        "skipped_lines": report.loaded.skipped_lines,
        "skipped": [{"file": f, "line": n, "reason": why} for f, n, why in report.loaded.load.skipped],
        "malformed_records": report.loaded.malformed,
        "store": report.store,
        "generated": report.generated,
        "filters": report.filters.describe() or None,
        "selection": SELECTION_RULE,
        "frameworks": frameworks.json_obj(report),
        "stacks": sources.json_section(report),
        "side_by_side": sidebyside.to_json_obj(sidebyside.tables(report)),
        "parity": _maybe(parity.to_json_obj, parity_view(report)),
        "time_to_quality": _quality_json(report),
    }


def _quality_json(report: Report):
    return quality.json_obj(quality_view(report))


def _maybe(fn, v):
    return None if v is None else fn(v)


def to_json(report: Report) -> str:
    return json.dumps(to_json_obj(report), indent=2, sort_keys=False, default=str) + "\n"


def relpath_for(path: str, output: str | None) -> str:
    """How a Markdown file at ``output`` links to ``path``."""
    if not output or output == "-":
        return path
    try:
        return os.path.relpath(path, os.path.dirname(os.path.abspath(output)))
    except ValueError:
        return path
