"""Console output of a run: parameter header, one line per rank, result table (nccl-tests style),
then what else was measured (validity flags, breakdown, profiler trace) and long-phase progress."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from dlscale.case.config import RunConfig, resolve_device
from dlscale.case.progress import PhasePrinter
from dlscale.fmt import fmt_bytes, fmt_num, fmt_stdev
from dlscale.inputs.spec import BUFFER_MARGIN
from dlscale.quality.lines import repeat_line, summary_line
from dlscale.results import validity
from dlscale.train.checkpoint_timing import console_line

MISSING = "-"  # terminals: a plain dash keeps the columns aligned everywhere
WARN_MARK, NOTE_MARK = "!", "?"


def print_header(cfg: RunConfig) -> None:
    d = cfg.to_dict()
    device = resolve_device(cfg.device)
    print(f"# dlscale run: {cfg.model} ({cfg.flavor}) / {cfg.strategy} on {cfg.world_size} x {device}")
    keys = list(d)
    width = max(len(k) for k in keys)
    for k in keys:
        print(f"#   {k:<{width}} : {d[k]}")


def progress_printer(cfg: RunConfig) -> Callable[[str, Any], None]:
    def on_event(kind: str, payload: Any) -> None:
        if kind == "ranks":
            for r in payload:
                print(f"#   rank {r.get('rank')}/{cfg.world_size}  local {r.get('local_rank')}  host "
                      f"{r.get('host')}  device {r.get('device')} ({r.get('device_name') or '?'})  pid {r.get('pid')}")
        elif kind == "repeat":
            e = payload
            if e["status"] == "ok":
                ph = e.get("phases_s") or {}
                where = ", ".join(f"{k} {v:.1f}" for k, v in ph.items() if k != "window")
                print(f"#   repeat {e['repeat'] + 1}/{cfg.repeats}: {_num(e['samples_per_s'], 2)} samples/s "
                      f"(window {e['window_s']:.3f} s, warm-up {e.get('warmup_s') or 0:.1f} s, "
                      f"process {e['process_s']:.1f} s{': ' + where if where else ''})", flush=True)
                if e.get("data"):
                    print(f"#     {data_line(e['data'])}", flush=True)
                if e.get("quality"):  # --until (dlscale/quality)

                    print(f"#     {repeat_line(e['quality'])}", flush=True)
            else:
                print(f"#   repeat {e['repeat'] + 1}/{cfg.repeats}: {e['status'].upper()}: {e['error']}", flush=True)

    return on_event


def phase_printer(verbose: bool = False) -> PhasePrinter:
    """The spawn's ``on_line``: progress of long phases (rendezvous, build, compile, warm-up, breakdown,
    profile) with elapsed time; with ``verbose`` every other worker line goes to stderr. Call
    ``close()`` (or use it as a context manager) when the process has ended."""
    return PhasePrinter(out=sys.stdout, passthrough=(lambda line: print(line, file=sys.stderr)) if verbose else None)


def _num(x: Any, digits: int = 1) -> str:
    return fmt_num(x, digits, group=True, missing=MISSING)


def _median_repeat(rec: dict[str, Any]) -> dict[str, Any] | None:
    ok = sorted((r for r in rec.get("repeats") or [] if r.get("status") == "ok" and r.get("samples_per_s")),
                key=lambda r: r["samples_per_s"])
    return ok[(len(ok) - 1) // 2] if ok else None


def _loss(rec: dict[str, Any]) -> str:
    """The last timed step's loss, in training mode: ``loss_after`` is the eval-mode loss (BatchNorm on
    its running statistics: 5.6e10 for a few steps of full ResNet-50), for parity, not for a reader."""
    rep = _median_repeat(rec)
    return fmt_num(rep.get("loss_last") if rep else None, 4, missing=MISSING)


COLUMNS = [
    ("model", 12, lambda r, s: r["config"]["model"]),
    ("strategy", 9, lambda r, s: r["config"]["strategy"]),
    ("precision", 9, lambda r, s: r["config"]["precision"] + ("+c" if r["config"]["compile"] else "")),
    ("devices", 7, lambda r, s: str(r["world_size"])),
    ("batch/dev", 9, lambda r, s: str(r["config"]["batch_size"])),
    ("samples/s", 11, lambda r, s: _num(s["samples_per_s"]["median"])),
    ("stdev", 8, lambda r, s: fmt_stdev(s["samples_per_s"]["stdev"], s["samples_per_s"]["n"], 1, group=True,
                                        missing=MISSING)),
    ("n", 3, lambda r, s: str(s["samples_per_s"]["n"])),
    ("tokens/s", 11, lambda r, s: _num(s.get("tokens_per_s"), 0)),
    ("p50 ms", 8, lambda r, s: _num(s.get("step_ms_p50"), 2)),
    ("p90 ms", 8, lambda r, s: _num(s.get("step_ms_p90"), 2)),
    ("MFU %", 6, lambda r, s: _num(s["mfu"] * 100 if s.get("mfu") is not None else None)),
    ("mem/dev", 10, lambda r, s: fmt_bytes(s.get("peak_mem_allocated_bytes") or s.get("peak_rss_bytes"),
                                           missing=MISSING)),
    ("loss", 8, lambda r, s: _loss(r)),
]
IDENTITY_COLUMNS = 5  # model .. batch/dev: shown for every status


def record_validity(rec: dict[str, Any]) -> validity.Validity:
    """The record's stored validity, or computed now for a record written before it was stored."""
    stored = rec.get("validity")
    return validity.Validity.from_dict(stored) if isinstance(stored, dict) else validity.assess(rec)


def result_table(records: list[dict[str, Any]]) -> str:
    head = "  ".join(f"{name:>{w}}" for name, w, _ in COLUMNS) + "  status"
    lines = [head, "-" * len(head)]
    for r in records:
        s = r.get("summary")
        if s:
            cells = "  ".join(f"{fn(r, s):>{w}}" for _, w, fn in COLUMNS)
        else:
            cells = "  ".join(f"{(fn(r, None) if i < IDENTITY_COLUMNS else MISSING):>{w}}"
                              for i, (_, w, fn) in enumerate(COLUMNS))
        status = r["status"]
        if r.get("status") == "ok" and not record_validity(r).sound:
            status += f" {WARN_MARK} flagged"
        lines.append(f"{cells}  {status}")
    return "\n".join(lines)


def data_line(d: dict[str, Any]) -> str:
    """One line on a repeat's real-data loading (dlscale/inputs)."""
    share = d.get("data_wait_share_max")
    wait = "-" if share is None else f"{share * 100:.1f} %"
    idle = d.get("data_gpu_idle_share_max")
    if idle is not None:  # the GPU's own idle time for data decides (a host ahead of it waits for free)
        wait += f", the GPU idled for data {idle * 100:.1f} %"
    verdict = {True: "input-bound", False: "not input-bound", None: "no verdict"}[d.get("input_bound")]
    cores = d.get("loader_cpu_cores_total")
    mbs = d.get("read_mb_s_total")
    loader = d.get("loader") or {}
    bad = f", {d['bad_files_total']} unreadable file(s) skipped" if d.get("bad_files_total") else ""
    if d.get("wait_may_be_understated"):
        bad += (f"; the window took {d.get('window_batches')} batches, under {BUFFER_MARGIN}x the "
                f"{d.get('prefetch_buffer_batches')} the loader held ready: the wait may be understated (more --steps)")
    return (f"data: waited {wait} of the window ({verdict}); loader {loader.get('workers')} worker(s)/rank, "
            f"{'-' if cores is None else f'{cores:.2f}'} cores, {'-' if mbs is None else f'{mbs:.1f}'} MB/s read, "
            f"{loader.get('decoder')}{bad}")


def validity_suffix(rec: dict[str, Any]) -> str:
    """For one-line summaries (a sweep's per-case line): " ! short_window, high_cv", or ""."""
    if rec.get("status") != "ok":
        return ""
    warn = [f.check for f in record_validity(rec).warnings]
    return f" {WARN_MARK} {', '.join(warn)}" if warn else ""


def validity_lines(rec: dict[str, Any]) -> list[str]:
    """One line per flag, warnings first: what makes a number unsound, and why."""
    v = record_validity(rec)
    out = []
    for f in sorted(v.flags, key=lambda f: f.severity != validity.WARN):
        mark = WARN_MARK if f.severity == validity.WARN else NOTE_MARK
        out.append(f"# {mark} {f.check}: {f.reason}")
    return out


def breakdown_line(b: dict[str, Any] | None) -> str | None:
    """The step-time breakdown the run measured (rank 0, after the window), in one line."""
    if not isinstance(b, dict):
        return None
    if b.get("supported") is False:
        return f"# breakdown: not measured ({b.get('reason') or 'unsupported'})"

    def ms(k: str) -> str:
        return fmt_num(b.get(k), 2, missing=MISSING)

    parts = [f"data {ms('data_ms')}", f"forward {ms('forward_ms')}", f"backward {ms('backward_ms')}"]
    if b.get("exposed_comm_ms") is not None:
        overlap = b.get("overlap_ratio")
        parts[-1] += (f" (exposed comm {ms('exposed_comm_ms')} of all-reduce {ms('comm_ms')}"
                      + (f", {overlap * 100:.0f} % overlapped" if overlap is not None else "") + ")")
    parts.append(f"optimizer {ms('optimizer_ms')}")
    return f"# breakdown (ms per step, median of {b.get('steps')} steps after the window): " + ", ".join(
        parts) + f" = step {ms('step_ms')}"


def profile_lines(rec: dict[str, Any], store_root: str | Path | None, top: int = 5) -> list[str]:
    """Where the profiler trace went and the ops with the most self time."""
    out = []
    if rec.get("trace"):
        path = Path(store_root) / rec["trace"] if store_root is not None else Path(rec["trace"])
        out.append(f"# profiler trace: {path} (open in chrome://tracing or ui.perfetto.dev)")
    ops = rec.get("profile_top_ops") or []
    if ops:
        out.append("# top ops by self time (ms per step): " + ", ".join(
            f"{o.get('name')} {fmt_num(o.get('self_ms_per_step'), 2, missing=MISSING)}" for o in ops[:top]))
    elif rec.get("config", {}).get("profile") and not rec.get("trace"):
        out.append("# profiler: no trace kept (no ok repeat, or rank 0 wrote none)")
    return out


def batch_search_line(search: dict[str, Any] | None) -> str | None:
    """What --batch-size max found, and what stopped it: the cap (larger batches never tried), an
    out-of-memory probe, or a probe that failed otherwise."""
    if not isinstance(search, dict):
        return None
    n = len(search.get("probes") or [])
    if search.get("capped"):
        return (f"# batch search: stopped at the cap, batch {search.get('cap')} fitted ({n} probes); larger "
                "batches were not tried: raise --max-batch-cap to look further")
    if search.get("max"):
        ooms = [p["batch_size"] for p in search.get("probes") or [] if p.get("status") == "oom"]
        why = f"batch {min(ooms)} ran out of memory" if ooms else search.get("stopped") or "the search ended"
        return f"# batch search: largest batch that fits {search['max']} ({n} probes; {why})"
    return f"# batch search: no batch fitted ({n} probes; {search.get('stopped') or 'the first probe failed'})"


def print_result(rec: dict[str, Any], store_root: str | Path | None = None) -> None:
    print(result_table([rec]))
    s = rec.get("summary") or {}
    if s.get("mfu") is None and rec.get("status") == "ok":
        print("# MFU: no peak FLOP/s known for this device and dtype (CPUs have none in the table)")
    if s.get("peak_mem_allocated_bytes") is None and s.get("peak_rss_bytes"):
        print("# mem/dev on the CPU is the peak resident set of a worker process")
    if rec.get("status") == "ok":
        for line in validity_lines(rec):
            print(line)

    for line in (summary_line(rec.get("quality")), batch_search_line(rec.get("batch_search")),
                 breakdown_line(rec.get("breakdown")), console_line(rec)):
        if line:
            print(line)
    for line in profile_lines(rec, store_root):
        print(line)
