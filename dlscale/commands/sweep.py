"""`dlscale sweep SUITE`: run every case of a suite, resumably, then print the DLPerf tables.

* Resume: a case whose sweep key (its case_key; for a "max" batch case the key of the batch
  search) already has an ``ok`` record in the store is skipped; ``--force`` measures it again
  (a new record is appended; nothing is ever rewritten). Cases whose last record is oom, failed,
  timeout or unsupported run again.
* Records are appended only when a case finishes (one atomic line each, with SIGINT/SIGTERM/SIGHUP held
  off while it is written), so a sweep killed at any moment leaves a consistent store and the
  next run carries on with the case that was interrupted.
* A case that needs more GPUs than are visible, or more than one node, is skipped with a note.
* Exit codes: 0 when every case has a result (ok, oom or unsupported: DLPerf lists OOM as a
  result), 5 when a case failed or timed out, 2 for bad input (before anything runs), 130 when
  interrupted (Ctrl-C, SIGTERM or SIGHUP: the running case's processes are killed; the repeats of it that
  had finished are stored as a record of status ``interrupted``, which a resumed sweep measures again),
  7 when a finished case's record could not be stored (the sweep stops; the one line names the
  recovery file that keeps the record).
* An unreadable entry of the store is skipped with a warning naming it; a store that cannot be
  read at all is bad input (2), never planned as empty.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError, DlscaleError, inputs
from dlscale.case.caseargs import command_line
from dlscale.case.config import RunConfig, check_cpu_processes, resolve_device
from dlscale.case.suite import (
    MATCH_KEYS, add_max_cases_option, display_path, filter_suite, load_suite, parse_filters,
    shipped_suites,
)
from dlscale.fmt import fmt_hms
from dlscale.report.data import Loaded, baseline_fields, build_report, freeze, load_records
from dlscale.results.record import newest_per_key

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILED = 0, 2, 5
from dlscale.case.procs import EXIT_INTERRUPTED  # noqa: E402
from dlscale.results.store import EXIT_NOT_STORED, LoadResult, ResultStore, StoreError
RESULT_STATUSES = ("ok", "oom", "unsupported")  # statuses that count as a result for the exit code


@dataclass
class Planned:
    index: int  # position in the suite
    cfg: RunConfig
    key: str  # the case key (what resume matches on; a batch-search case's is its search's)
    action: str  # "run", "done" (an ok record exists) or "skip" (cannot run here)
    reason: str = ""


# ----------------------------------------------------------------------------- parser

def register(sub) -> None:
    p = sub.add_parser(
        "sweep", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="run every case of a suite (YAML matrix), resumably, and print the DLPerf tables",
        description="Run a benchmark suite: a shipped one by name (see --list) or a suite file. Cases "
                    "already ok in the store are skipped (--force re-measures); a killed sweep carries on "
                    "where it stopped when run again. Failed, oom and timeout cases are recorded and the "
                    "sweep goes on. Exit 0 when every case has a result (ok, oom, unsupported), 5 when a "
                    "case failed or timed out, 2 for bad input, 130 when interrupted.")
    p.add_argument("suite", nargs="?", metavar="SUITE", help="shipped suite name or path of a suite .yaml file")
    p.add_argument("--store", default="results", help="result store directory (JSONL files)")
    p.add_argument("--force", action="store_true", help="measure cases again even if the store has an ok record "
                                                        "(appends new records)")
    p.add_argument("--dry-run", action="store_true", help="list the cases and what the sweep would do; run nothing")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None,
                   help="override the suite's device (default: the suite's; it is part of each case's identity)")
    p.add_argument("--filter", action="append", metavar="KEY=VALUE[,VALUE]",
                   help="only cases matching (repeatable; different keys must all match, values of one key "
                        f"any): {', '.join(MATCH_KEYS)}, strategy_options.NAME (an option as the case sets it)")
    p.add_argument("--max-batch-cap", type=int, default=None,
                   help="override the suite's cap of the largest-batch search (batch_sizes: [max])")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="override the suite's warm-up steps per repeat (part of a case's identity: resume with the same value)")
    p.add_argument("--steps", type=int, default=None, metavar="N",
                   help="override the suite's timed steps per repeat (part of a case's identity: resume with the same value)")
    p.add_argument("--repeats", type=int, default=None, metavar="N",
                   help="override the suite's repeats per case (not part of a case's identity)")
    add_max_cases_option(p)
    p.add_argument("--list", action="store_true", help="list the shipped suites and exit")
    p.add_argument("--verbose", "-v", action="store_true", help="stream the workers' output to stderr")
    p.set_defaults(func=cmd_sweep)


# ----------------------------------------------------------------------------- planning

def describe(cfg: RunConfig, found: str = "") -> str:
    name = cfg.model + (f" ({cfg.flavor})" if cfg.flavor != "full" else "")
    devices = f"x{cfg.world_size}" if cfg.nnodes == 1 else f"{cfg.nnodes}x{cfg.nproc_per_node}"
    parts = [name, cfg.strategy, devices, f"batch {cfg.batch_size}{found if cfg.batch_search else ''}", cfg.precision,
             "compiled" if cfg.compile else "eager"]
    if cfg.framework != "torch":
        # JAX is always XLA-compiled; the compile flag names torch.compile (recorded unsupported)
        parts[-1] = cfg.framework + (" compiled" if cfg.compile else "")
    if cfg.grad_accum > 1:
        parts.append(f"accum {cfg.grad_accum}")
    if cfg.optimizer_graph:
        parts.append("optimizer graph")
    if cfg.strategy_options:
        parts.append(",".join(f"{k}={v}" for k, v in sorted(cfg.strategy_options.items())))
    if cfg.env:
        parts.append(" ".join(f"{k}={v}" for k, v in sorted(cfg.env.items())))
    if cfg.data != "synthetic":
        parts.append(inputs.config_words(cfg.to_dict()))
    if cfg.until is not None:  # time to quality (docs/quality.md)
        parts.append(f"until {cfg.until}")
    if cfg.label:
        parts.append(f"[{cfg.label}]")
    return " ".join(parts)


def done_keys(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Sweep key -> newest ok record: case_key of ok runs, and the batch-search key of "max" runs."""
    def keys(r: dict[str, Any]) -> list[Any]:
        if r.get("kind") != "run" or r.get("status") != "ok":
            return []
        search = r.get("batch_search")
        return [r.get("case_key"), search.get("case_key") if isinstance(search, dict) else None]

    return newest_per_key(records, keys)


def _cpu_processes_refused(nproc_per_node: int) -> str:
    """Why `run` would refuse this many CPU processes on this machine ("" when it would not): the
    sweep skips such a case at planning, as it skips one that needs more GPUs than are here."""
    try:
        check_cpu_processes(nproc_per_node)
    except ConfigError as e:
        return str(e)
    return ""


def plan(suite, indices: list[int], records: list[dict[str, Any]], force: bool,
         gpus: int | None) -> list[Planned]:
    """What the sweep does with each selected case. ``gpus``: visible GPUs (None: CPU run)."""
    done = done_keys(records)
    out = []
    for i in indices:
        cfg = suite.cases[i]
        p = Planned(i, cfg, cfg.case_key(), "run")
        if cfg.nnodes > 1:
            p.action, p.reason = "skip", (f"needs {cfg.nnodes} nodes; a sweep runs on one node "
                                          f"(use dlscale slurm, or dlscale run --nnodes on each node)")
        elif gpus is not None and cfg.nproc_per_node > gpus:
            p.action, p.reason = "skip", f"needs {cfg.nproc_per_node} GPUs, this machine has {gpus}"
        elif gpus is None and (too_many := _cpu_processes_refused(cfg.nproc_per_node)):
            p.action, p.reason = "skip", too_many
        elif p.key in done and not force:
            p.action, p.reason = "done", f"ok record {str(done[p.key].get('id'))[:12]} in the store"
        out.append(p)
    return out


# ----------------------------------------------------------------------------- running

def case_line(n: int, total: int, p: Planned, rec: dict[str, Any] | None, seconds: float,
              error: str | None = None) -> str:
    width = len(str(total))
    head = f"[{n:>{width}}/{total}]"
    found = ""
    if rec is not None and p.cfg.batch_search and isinstance(rec.get("batch_search"), dict):
        s = rec["batch_search"]
        best = s.get("max")
        found = (f"={best}" + (" (the cap)" if s.get("capped") else "") if best else "=none") + \
            f" after {len(s.get('probes') or [])} probes"
    what = describe(p.cfg, found)
    if rec is None:
        return f"{head} {'ERROR':<8} {what}: not run: {error}"
    status = rec["status"]
    if status == "ok":
        tput = (rec.get("summary") or {}).get("samples_per_s") or {}
        unit = (rec.get("model") or {}).get("unit") or "sample"
        median = tput.get("median")
        result = f"{median:,.1f} {unit}/s (n={tput.get('n')})" if median else "no samples/s"
    else:
        err = " ".join(str(rec.get("error") or "").split())
        result = err[:140] + ("…" if len(err) > 140 else "")
    from dlscale.console import validity_suffix  # keeps the CLI start-up light

    return (f"{head} {status.upper() if status != 'ok' else 'ok':<8} {what}: {result}{validity_suffix(rec)} "
            f"[{seconds:.1f} s]")


def _run_one(p: Planned, suite, root, verbose: bool, on_probe) -> Any:
    """Measure one planned case; the Record carries where it came from (``sweep``)."""
    from dlscale.case import batchsearch, launch  # torch: keeps start-up light

    spawner = launch.TorchrunSpawner(on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None)
    if p.cfg.batch_search:
        rec = batchsearch.measure_max_batch(p.cfg, spawner, files_root=root, command=command_line(p.cfg),
                                            on_probe=on_probe)
    else:
        rec = launch.measure(p.cfg, spawner, files_root=root, command=command_line(p.cfg))
    rec.sweep = {"suite": suite.name, "file": str(suite.path)}
    return rec


def summary_tables(store_root, keys: set[str]) -> str:
    """The report's DLPerf tables (Markdown) for the records of these case keys."""
    from dlscale.report import render, table  # numpy: keeps start-up light

    try:
        loaded = load_records(store_root)
    except ConfigError:
        return ""
    mine = [r for r in loaded.records if r.get("case_key") in keys
            or (isinstance(r.get("batch_search"), dict) and r["batch_search"].get("case_key") in keys)]
    if not mine:
        return ""
    # the 1-device baselines may come from another sweep of the same store (a suite run in parts)
    workloads = {freeze(baseline_fields(r)) for r in mine}
    chosen = {id(r) for r in mine}
    mine += [r for r in loaded.records if id(r) not in chosen and r.get("kind", "run") == "run"
             and r.get("status") == "ok" and r.get("world_size") == 1
             and freeze(baseline_fields(r)) in workloads]
    try:
        report = build_report(Loaded(loaded.store, mine, LoadResult()))
    except ConfigError:
        return ""
    out = []
    # a table holding only a baseline that another table shows as its 1-device row adds nothing here
    borrowed = {id(r.record) for g in report.groups for r in g.rows if r.borrowed}
    for g in report.groups:
        if g.own_rows and all(id(r.record) in borrowed for r in g.own_rows):
            continue
        out += [f"### {g.title}", "", table.md_table(render.dlperf_table(g)), ""]
        out += [f"- {n}" for n in render.group_notes(g)] + [""]
    return "\n".join(out).rstrip() + "\n"


def _selected(args):
    """The suite (with the command line's overrides) and the indices of the cases to consider."""
    if not args.suite:
        raise ConfigError(f"sweep needs a SUITE: a shipped name ({', '.join(shipped_suites())}) or a .yaml path")
    suite = load_suite(args.suite, max_cases=args.max_cases)
    if args.device:
        suite = suite.with_device(args.device)
    suite = suite.with_overrides(warmup=args.warmup, steps=args.steps, repeats=args.repeats,
                                 max_batch_cap=args.max_batch_cap)
    return suite, filter_suite(suite, parse_filters(args.filter))


def _visible_gpus(suite, indices: list[int], dry_run: bool) -> int | None:
    """GPUs on this machine when a selected case runs on CUDA (None: a CPU sweep, or a dry run
    without GPUs, which lists every case as if they were there)."""
    if "cuda" not in {resolve_device(suite.cases[i].device) for i in indices}:
        return None
    import torch  # torch: keeps start-up light

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if dry_run:
        print("# no CUDA GPU visible here: the list assumes enough GPUs; a real run needs them")
        return None
    raise ConfigError(f"suite {suite.name} runs on device cuda but no CUDA GPU is visible "
                      f"(--device cpu runs it on the CPU)")


def _report_end(suite, store, planned: list[Planned], results: list, n_done: int, n_skipped: int,
                store_arg: str) -> int:
    """The DLPerf tables of the sweep's cases, the closing lines and the exit code."""
    tables = summary_tables(store.root, {p.key for p in planned if p.action != "skip"})
    if tables:
        print()
        print(tables, end="")
    statuses = [rec["status"] if rec else "error" for _, rec in results]
    counts = {s: statuses.count(s) for s in ("ok", "oom", "unsupported", "timeout", "failed", "error") if s in statuses}
    bad = [(p, rec) for p, rec in results if rec is None or rec["status"] not in RESULT_STATUSES]
    ran = ", ".join(f"{v} {k}" for k, v in counts.items()) or "none"
    print(f"# sweep {suite.name}: {len(planned)} case(s): {len(results)} ran ({ran}), {n_done} already ok, "
          f"{n_skipped} skipped (cannot run here)")
    if results:
        print(f"# records in {store.file}; full report: dlscale report {store_arg}")
    if bad:
        print(f"dlscale: {len(bad)} case(s) failed or timed out: "
              + "; ".join(describe(p.cfg) for p, _ in bad[:5]) + ("; ..." if len(bad) > 5 else ""),
              file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def cmd_sweep(args) -> int:
    if args.list:
        for name in shipped_suites():
            s = load_suite(name)
            print(f"{name:18s} {len(s.cases):3d} case(s)  {s.description}")
        return EXIT_OK
    suite, indices = _selected(args)
    gpus = _visible_gpus(suite, indices, args.dry_run)
    store = ResultStore(args.store)
    if args.dry_run:
        return _sweep(args, suite, indices, gpus, store)
    with store.claim("sweep"):  # before the store is read: what is done is decided by the one writer
        return _sweep(args, suite, indices, gpus, store)


def _sweep(args, suite, indices: list[int], gpus: int | None, store) -> int:
    loaded = store.load()
    if loaded.warning():
        print(f"dlscale: warning: {loaded.warning()}", file=sys.stderr)
    planned = plan(suite, indices, loaded.records, args.force, gpus)
    todo = [p for p in planned if p.action == "run"]
    done = [p for p in planned if p.action == "done"]
    skipped = [p for p in planned if p.action == "skip"]

    sel = f"{len(indices)} of {len(suite.cases)}" if len(indices) != len(suite.cases) else f"{len(indices)}"
    print(f"# sweep {suite.name} ({display_path(suite.path)}): {sel} case(s): {len(todo)} to run, {len(done)} "
          f"already ok in {args.store}{' (--force re-measures them)' if done else ''}, {len(skipped)} skipped")
    for p in skipped:
        print(f"#   skip {describe(p.cfg)}: {p.reason}")
    if args.dry_run:
        for n, p in enumerate(planned, 1):
            print(f"{n:>4}  {p.action:<4}  {describe(p.cfg)}" + (f"  ({p.reason})" if p.reason else ""))
        if suite.duplicates:
            print(f"# {suite.duplicates} duplicate case(s) of the suite were dropped")
        return EXIT_OK
    if todo:
        store.check_writable()

    results: list[tuple[Planned, dict[str, Any] | None]] = []
    from dlscale.case import launch  # torch: keeps start-up light

    try:  # SIGTERM and SIGHUP arrive as Ctrl-C (cli.main's signal guard): the running case's processes end
        _sweep_loop(todo, suite, store, args.verbose, results)
    except KeyboardInterrupt as e:
        n_done = len(results)
        what = describe(todo[n_done].cfg) if n_done < len(todo) else "-"
        kept = launch.keep_interrupted(e, store, {"suite": suite.name, "file": str(suite.path)})
        print(f"dlscale: sweep interrupted during case {n_done + 1}/{len(todo)} ({what}): {kept}; "
              f"{n_done} finished case(s) are in {store.file}; run the same command again to carry on",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except StoreError as e:  # the store stopped taking records: the next cases would be lost too
        print(f"dlscale: error: {e}; {len(results) - 1} earlier case(s) of this sweep are in the store",
              file=sys.stderr)
        return EXIT_NOT_STORED
    return _report_end(suite, store, planned, results, len(done), len(skipped), args.store)


def _sweep_loop(todo: list[Planned], suite, store, verbose: bool, results: list) -> None:
    from rich.console import Console  # rich: keeps start-up light
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn  # rich: keeps start-up light

    total = len(todo)
    if not total:
        return
    console = Console(stderr=True)
    progress = Progress(TextColumn("[bold]case {task.fields[i]}/{task.total:.0f}"), BarColumn(),
                        TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                        TextColumn("{task.description}"), console=console, transient=True)
    t_start = time.monotonic()
    with progress:
        task = progress.add_task("", total=total, i=1, eta="?")
        for n, p in enumerate(todo, 1):
            what = describe(p.cfg)
            progress.update(task, description=what, i=n)

            def on_probe(entry: dict[str, Any], _what=what) -> None:
                progress.update(task, description=f"{_what}: probe batch {entry['batch_size']} {entry['status']}")

            t = time.monotonic()
            rec, error = None, None
            try:
                record = _run_one(p, suite, store.root, verbose, on_probe)
                rec = record.to_dict()
                store.append_uninterrupted(rec)
            except StoreError:
                results.append((p, rec))
                print(case_line(n, total, p, rec, time.monotonic() - t), flush=True)
                raise
            except DlscaleError as e:  # cannot start here (bad input found at launch): next case
                error = str(e)
            results.append((p, rec))
            print(case_line(n, total, p, rec, time.monotonic() - t, error), flush=True)
            elapsed = time.monotonic() - t_start
            progress.update(task, completed=n, eta=fmt_hms(elapsed / n * (total - n)))
