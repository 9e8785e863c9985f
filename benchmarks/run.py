#!/usr/bin/env python3
"""The benchmark driver: run a benchmark suite, its bare-loop yardstick and its tables, in one call.

    python benchmarks/run.py SUITE [--out DIR] [--filter KEY=VALUE[,VALUE]] [--dry-run] [--time-budget S] [--pack]

SUITE: a suite of benchmarks/suites/ by name (core, ddp-overlap, ...), a shipped dlscale suite
(dlperf-bert) or a .yaml path. In order, each step skipped when it has nothing to do:

1. the suite is validated whole (cases, ``bare``, ``compare`` and ``commands`` sections:
   dlscale/case/benchsuite.py); bad input is one line and exit 2, before anything runs or is written;
2. the environment every benchmark on the lent hosts needs is set once (NVLink multicast off,
   unbuffered output, this checkout on PYTHONPATH), and `dlscale env` is captured;
3. the suite's ``before`` commands (making a data set), each a bounded process, output in
   DIR/commands.log; its ``during`` commands start (a competing load, ended after step 5);
4. the bare runs (the yardstick scripts: benchmarks/bare_loop.py, bare_loop_jax.py, bare_mp.py;
   one fresh process set per repeat, bounded by the case's time limit, the whole tree killed past
   it) are measured and stored as records of their dlscale cases in DIR/bare (variants in
   DIR/variants);
5. the dlscale cases run through `dlscale sweep` into DIR/store, the suite's ``external`` cases
   (other stacks' commands, as `dlscale run --command` runs them) into the same store, then the
   ``after`` commands (micro-benchmarks into the store);
6. the tables: `dlscale report` (DLPerf tables, and --group-by label), `dlscale compare` of the bare
   runs against dlscale's, the suite's own comparisons and ``table`` commands, each as Markdown
   and JSON, listed with the command that made it in DIR/index.md.

Both stores resume: the same command again measures only what is not yet ok (--force: all again).
Exit: 0 done; 2 bad input; 5 a case or bare run failed or timed out, or a table failed (one with
nothing to show, say a comparison whose side a --filter left out, is listed as not made); 75
stopped by --time-budget (run it again to carry on); 130 interrupted.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SUITES_DIR = BENCH_DIR / "suites"
# The lent GPU hosts must never use NVLink multicast (it can put the host's shared GPUs out of
# service): every process a benchmark starts gets these unless the caller set them otherwise.
HOST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "PYTHONUNBUFFERED": "1"}
EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_BUDGET, EXIT_INTERRUPTED = 0, 2, 5, 75, 130
# a table command's exit 1 is its verdict (dlscale parity: a case outside its tolerance; compare
# --fail-on-regression): the table is made and kept, the verdict shown in the index
EXIT_VERDICT = 1
RESULT_STATUSES = ("ok", "oom", "unsupported")
TABLE_SCRIPT_LIMIT_S = 300


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Each default said once: not for on/off flags, not where the help already says it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n\n")[0],
                                formatter_class=_Help)
    p.add_argument("suite", metavar="SUITE", nargs="?",
                   help="benchmark suite: a name in benchmarks/suites/, a shipped dlscale suite, or a .yaml path")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output directory (default: $OUT/SUITE when OUT is set, else bench-out/SUITE)")
    p.add_argument("--filter", action="append", metavar="KEY=VALUE[,VALUE]",
                   help="only cases (and bare runs) matching, as `dlscale sweep --filter` (repeatable; "
                        "default: all)")
    p.add_argument("--only", choices=("all", "dlscale", "bare"), default="all",
                   help="run everything, only the dlscale cases (with the suite's external cases and commands), or "
                        "only the bare-loop runs (the tables are made either way)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default=None,
                   help="override the suite's device (default: the suite's)")
    for name, what in (("warmup", "warm-up steps"), ("steps", "timed steps"), ("repeats", "repeats")):
        p.add_argument(f"--{name}", type=int, default=None, metavar="N",
                       help=f"override the suite's {what} per case, for dlscale and bare runs alike "
                            f"(default: the suite's)")
    p.add_argument("--force", action="store_true",
                   help="measure again what the stores already hold ok (appends new records)")
    p.add_argument("--dry-run", action="store_true", help="show what would run and which tables; run nothing")
    p.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="end within S seconds: measuring stops early enough for the tables (and --pack); "
                        "run the same command again to carry on (default: no limit)")
    p.add_argument("--pack", action="store_true",
                   help="at the end, pack DIR into DIR.tgz and remove DIR (a device machine returns few files)")
    p.add_argument("--wheels", metavar="DIR", default=None,
                   help="install these .whl files (no index, no dependencies) into a private directory on the "
                        "path of every process first (default: none)")
    p.add_argument("--list", action="store_true", help="list the benchmark suites and exit")
    p.add_argument("--verbose", "-v", action="store_true", help="stream the workers' output")
    return p


# ----------------------------------------------------------------------------- environment

def install_wheels(wheel_dir: str) -> str:
    """pip-install the wheels of ``wheel_dir`` into a fresh directory; returns it (for sys.path)."""
    wheels = sorted(str(p) for p in Path(wheel_dir).glob("*.whl"))
    if not wheels:
        raise SystemExit(f"benchmarks/run.py: error: --wheels {wheel_dir}: no .whl files there")
    target = tempfile.mkdtemp(prefix="dlscale-wheels-")
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--target", target, *wheels]
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"benchmarks/run.py: error: installing the wheels of {wheel_dir} failed")
    return target


def set_host_env(extra_path: list[str]) -> None:
    """What every process of a benchmark gets: HOST_ENV (unless set), this checkout importable."""
    for k, v in HOST_ENV.items():
        os.environ.setdefault(k, v)
    path = [*extra_path, str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(path))
    for p in reversed([*extra_path, str(REPO)]):
        if p not in sys.path:
            sys.path.insert(0, p)


# ----------------------------------------------------------------------------- the plan

@dataclass
class Plan:
    suite: Any  # dlscale.case.suite.Suite, with the command line's overrides
    path: Path
    out: Path
    case_idx: list[int]
    bare: list[Any]  # BareRun
    filters: list[str]
    external: list[Any] = field(default_factory=list)  # ExternalRun (dlscale/external/suite.py)
    missing: str | None = None  # why the bare runs cannot start here (a dry run goes on)

    @property
    def dlscale_half(self) -> bool:
        """Cases or external cases are selected: the suite's commands run with them."""
        return bool(self.case_idx or self.external)

    @property
    def stores(self) -> dict[str, str]:
        return {"dlscale": str(self.out / "store"), "bare": str(self.out / "bare"),
                "variants": str(self.out / "variants")}


def unmade_compares(plan: Plan) -> list[str]:
    """The suite's comparisons that this run cannot make: a side that none of the selected cases
    and bare runs, nor a record already in its store, matches (a --filter that left it out)."""
    from dlscale.results.store import ResultStore
    from dlscale.case.suite import case_fields, matches, parse_filters

    fields = {"dlscale": [case_fields(plan.suite.cases[i]) for i in plan.case_idx],
              "bare": [case_fields(b.cfg) for b in plan.bare if b.store == "bare"],
              "variants": [case_fields(b.cfg) for b in plan.bare if b.store == "variants"]}
    stored: dict[str, list[dict]] = {}  # each store read once, where a comparison needs it
    out = []
    for spec in plan.suite.bench.compare:
        for name, side in (("A", spec.a), ("B", spec.b)):
            want = parse_filters(list(side.filters))
            if side.store not in stored:
                records = ResultStore(plan.stores[side.store]).load().records
                stored[side.store] = [r.get("config") or {} for r in records]
            if not any(matches(f, want) and (side.label is None or f.get("label") == side.label)
                       for f in fields[side.store] + stored[side.store]):
                asked = ", ".join(([f"label {side.label}"] if side.label else []) + list(side.filters))
                where = Path(plan.stores[side.store]).name
                out.append(f"compare {spec.name}: no case of this run, nor a record in {where}/, is side "
                           f"{name}'s ({asked or 'any case'}): compare-{spec.name}.md will not be made")
                break
    return out


def resolve_suite(name: str) -> Path:
    from dlscale.case.suite import resolve_suite_path

    mine = SUITES_DIR / f"{name}.yaml"
    return mine if ("/" not in name and not name.endswith((".yaml", ".yml")) and mine.is_file()) \
        else resolve_suite_path(name)


def make_plan(args: argparse.Namespace) -> Plan:
    """Everything validated before anything runs: suite, overrides, filters, output directory."""
    from dlscale import ConfigError
    from dlscale.case import benchsuite
    from dlscale.case.suite import load_bench_suite
    from dlscale.case.suite import case_fields, filter_suite, matches, parse_filters

    if not args.suite:
        raise ConfigError("a SUITE is needed: a name of benchmarks/suites/ (see --list), a shipped suite or a "
                          ".yaml path")
    if args.time_budget is not None and args.time_budget < 60:
        raise ConfigError(f"--time-budget must be at least 60 seconds, got {args.time_budget:g}")
    path = resolve_suite(args.suite)
    suite = load_bench_suite(path)
    for cmd in suite.bench.commands:
        if cmd.script and not (BENCH_DIR / cmd.argv[0]).is_file():
            raise ConfigError(f"suite {suite.name}: command {cmd.name}: no script benchmarks/{cmd.argv[0]}")
    if args.device:
        suite = suite.with_device(args.device)
    suite = suite.with_overrides(warmup=args.warmup, steps=args.steps, repeats=args.repeats)
    filters = parse_filters(args.filter)
    try:
        idx = filter_suite(suite, filters) if args.only != "bare" else []
    except ConfigError:
        idx = []  # the filter may select bare runs only
    bare = [b for b in suite.bench.bare if matches(case_fields(b.cfg), filters)] if args.only != "dlscale" else []
    external = [e for e in suite.bench.external if matches(e.case.to_dict(), filters)] if args.only != "bare" else []
    if not idx and not bare and not external:
        filter_suite(suite, filters)  # raises, naming what the suite has
        what = {"bare": "bare-loop run", "dlscale": "dlscale case"}.get(args.only, "case or bare-loop run")
        raise ConfigError(f"nothing to run: no {what} of suite {suite.name}"
                          + (" matches the filters" if filters else ""))
    out = Path(args.out) if args.out else Path(os.environ["OUT"]) / suite.name if os.environ.get("OUT") \
        else Path("bench-out") / suite.name
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    why = benchsuite.missing_packages(bare)
    if why and not args.dry_run:  # a dry run shows it (the GPU machine may have what this one lacks)
        raise ConfigError(why)
    plan = Plan(suite, path, out, idx, bare, list(args.filter or []), external, missing=why)
    for run in external:  # the program is on this machine, its directory exists
        try:
            external_case(plan, run).check_launchable()
        except ConfigError as e:
            raise ConfigError(f"suite {suite.name}: {run.describe()}: {e}") from None
    return plan


def visible_gpus(plan: Plan, dry_run: bool) -> int | None:
    """GPUs here when a bare run needs CUDA (None: none does, or a dry run without GPUs)."""
    from dlscale import ConfigError
    from dlscale.case.config import resolve_device

    if not any(resolve_device(b.cfg.device) == "cuda" for b in plan.bare):
        return None
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if dry_run:
        return None
    raise ConfigError(f"suite {plan.suite.name} has bare runs on device cuda but no CUDA GPU is visible "
                      f"(--device cpu runs them on the CPU)")


# ----------------------------------------------------------------------------- bare runs

@dataclass
class BareSpawner:
    """A bare run's yardstick script (dlscale.case.benchsuite.LOOPS) as a dlscale Spawner: alone on one
    device, under torchrun on more; each rank writes rank<R>.json into the repeat's directory,
    which ``measure`` merges."""

    run: Any  # BareRun
    device_type: str
    on_line: Callable[[str], None] | None = None

    def command(self, out: str | None = None) -> list[str]:
        from dlscale.case.benchsuite import bare_args
        from dlscale.case.procs import Rendezvous

        script = str(REPO / self.run.script)
        args = bare_args(self.run, self.device_type) + (["--out", out] if out else [])
        n = self.run.cfg.world_size
        if n == 1:
            return [sys.executable, script, *args]
        return [sys.executable, "-m", "torch.distributed.run", *Rendezvous().torchrun_args(),
                "--nproc-per-node", str(n), script, *args]

    def local_world(self, cfg) -> int:
        return cfg.world_size

    def start(self, cfg, workdir: Path, env: dict[str, str]):
        from dlscale.case.procs import spawn

        return spawn(self.command(str(workdir)), cfg.time_limit, env=env, on_line=self.on_line)


def describe_bare(run) -> str:
    from dlscale.commands.sweep import describe

    extra = "".join(f" {k}={v}" for k, v in {**run.variant, **run.cfg.env}.items())
    loop = "" if run.loop == "torch" else f" (loop {run.loop})"
    return f"bare {describe(run.cfg)}{extra}{loop}"  # describe ends with the label


def shown_command(cmd: list[str]) -> str:
    """A command as a person would type it here: python, paths inside this checkout relative."""
    parts = ["python"] + [os.path.relpath(a, REPO) if a.startswith(str(REPO) + os.sep) else a for a in cmd[1:]]
    return shlex.join(parts)


def bare_done(run, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ok record of this bare run already in its store, if any."""
    for r in reversed(records):
        if (r.get("kind") == "run" and r.get("status") == "ok" and r.get("case_key") == run.cfg.case_key()
                and r.get("label") == run.cfg.label and (r.get("bare") or {}).get("variant", {}) == run.variant
                and (r.get("bare") or {}).get("script") == run.script):
            return r
    return None


def bare_record(run, spawner: BareSpawner) -> dict[str, Any]:
    """Measure one bare run through dlscale's repeat loop; the record, marked as its yardstick's."""
    from dlscale.case import launch

    rec = launch.measure(run.cfg, spawner, files_root=None, command=shown_command(spawner.command())).to_dict()
    rec["bare"] = {"script": run.script, "variant": run.variant}
    return rec


def run_bare(plan: Plan, gpus: int | None, force: bool, verbose: bool, log) -> list[tuple[str, str]]:
    """Measure the bare runs not yet ok in their stores; (description, status) of each that ran."""
    from dlscale.case.config import resolve_device
    from dlscale.results.store import ResultStore

    results = []
    for n, run in enumerate(plan.bare, 1):
        store = ResultStore(plan.stores[run.store])
        what = describe_bare(run)
        if not force and bare_done(run, store.load().records):
            print(f"[bare {n}/{len(plan.bare)}] done     {what}: ok record in {store.root}", flush=True)
            continue
        device = resolve_device(run.cfg.device)
        if device == "cuda" and gpus is not None and run.cfg.world_size > gpus:
            print(f"[bare {n}/{len(plan.bare)}] skip     {what}: needs {run.cfg.world_size} GPUs, this machine "
                  f"has {gpus}", flush=True)
            continue
        store.check_writable()

        def line(text: str) -> None:
            log.write(text + "\n")
            if verbose:
                print(text, file=sys.stderr)

        t = time.monotonic()
        log.write(f"== {what}\n")
        rec = bare_record(run, BareSpawner(run, device, on_line=line))
        store.append_uninterrupted(rec)
        tput = (rec.get("summary") or {}).get("samples_per_s") or {}
        result = f"{tput['median']:,.1f}/s (n={tput.get('n')})" if tput.get("median") else \
            " ".join(str(rec.get("error") or "").split())[:140]
        print(f"[bare {n}/{len(plan.bare)}] {rec['status']:<8} {what}: {result} [{time.monotonic() - t:.1f} s]",
              flush=True)
        results.append((what, rec["status"]))
    return results


# ----------------------------------------------------------------------------- dlscale cases

def sweep_argv(plan: Plan, args: argparse.Namespace, dry_run: bool = False) -> list[str]:
    argv = ["sweep", str(plan.path), "--store", plan.stores["dlscale"]]
    for f in plan.filters:
        argv += ["--filter", f]
    for name in ("device", "warmup", "steps", "repeats"):
        if getattr(args, name) is not None:
            argv += [f"--{name}", str(getattr(args, name))]
    argv += (["--force"] if args.force else []) + (["--verbose"] if args.verbose else [])
    return argv + (["--dry-run"] if dry_run else [])


class _Tee:
    """stdout, also written to a log file."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        self.log.write(s)
        return self.stream.write(s)

    def flush(self) -> None:
        self.log.flush()
        self.stream.flush()


def run_sweep(plan: Plan, args: argparse.Namespace) -> int:
    """`dlscale sweep` of the selected cases, in this process (its workers are this process's
    children, so an interrupt or the time budget ends them), its output also in DIR/sweep.log."""
    from dlscale.cli import main as dlscale_main

    with open(plan.out / "sweep.log", "a", encoding="utf-8") as log, \
            contextlib.redirect_stdout(_Tee(sys.stdout, log)):
        print(f"$ dlscale {shlex.join(sweep_argv(plan, args))}", flush=True)
        return dlscale_main(sweep_argv(plan, args))


# ----------------------------------------------------------------------------- external cases

def external_case(plan: Plan, run):
    """The ExternalCase of a suite entry as it runs here (placeholders and script path resolved)."""
    return run.resolved(places(plan), BENCH_DIR, sys.executable)


def external_done(case, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ok record of this external case already in the store, if any."""
    for r in reversed(records):
        if (r.get("kind") == "external" and r.get("status") == "ok" and r.get("case_key") == case.case_key()
                and r.get("label") == case.label):
            return r
    return None


def run_external(plan: Plan, force: bool, verbose: bool) -> list[tuple[str, str]]:
    """Measure the external cases not yet ok in the dlscale store (each as `dlscale run --command`
    measures it: fresh processes per repeat, bounded, logs in STORE/logs); (description, status)."""
    from dlscale.case import launch
    from dlscale.case.config import resolve_device
    from dlscale.external.measure import measure_external
    from dlscale.results.store import ResultStore

    store = ResultStore(plan.stores["dlscale"])
    gpus = None
    results = []
    for n, run in enumerate(plan.external, 1):
        case, what = external_case(plan, run), run.describe()
        head = f"[external {n}/{len(plan.external)}]"
        if not force and external_done(case, store.load().records):
            print(f"{head} done     {what}: ok record in {store.root}", flush=True)
            continue
        if resolve_device(case.device) == "cuda":
            import torch

            gpus = torch.cuda.device_count() if gpus is None else gpus
            if case.world_size > gpus:
                print(f"{head} skip     {what}: needs {case.world_size} GPUs, this machine has {gpus}", flush=True)
                continue
        t = time.monotonic()
        try:
            rec = measure_external(case, store, verbose=verbose)
        except KeyboardInterrupt as e:  # the time budget or a signal: the finished repeats are kept
            print(f"{head} interrupted {what}: {launch.keep_interrupted(e, store)}", flush=True)
            raise
        store.append_uninterrupted(rec)
        tput = (rec.get("summary") or {}).get("samples_per_s") or {}
        result = f"{tput['median']:,.1f}/s (n={tput.get('n')})" if tput.get("median") else \
            " ".join(str(rec.get("error") or "").split())[:140]
        print(f"{head} {rec['status']:<8} {what}: {result} [{time.monotonic() - t:.1f} s; output in "
              f"{store.root}/logs/{rec['id']}-r*.log]", flush=True)
        results.append((what, rec["status"]))
    return results


# ----------------------------------------------------------------------------- commands

def places(plan: Plan) -> dict[str, str]:
    """What a command's placeholders stand for."""
    return {"out": str(plan.out), "store": plan.stores["dlscale"], "bare": plan.stores["bare"],
            "variants": plan.stores["variants"], "python": sys.executable}


def command_line(cmd, plan: Plan) -> list[str]:
    """The process a suite command starts: python -m dlscale ARGS, or python benchmarks/NAME.py ARGS."""
    args = cmd.resolved(places(plan))
    if cmd.script:
        return [sys.executable, str(BENCH_DIR / args[0]), *args[1:]]
    return [sys.executable, "-m", "dlscale", *args]


def cuda_gpus(plan: Plan) -> int | None:
    """GPUs visible here when the suite's cases run on CUDA (None: on the CPU)."""
    from dlscale.case.config import resolve_device

    if not any(resolve_device(c.device) == "cuda" for c in plan.suite.cases):
        return None
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def command_state(plan: Plan) -> dict[str, Any]:
    try:
        return json.loads((plan.out / "commands.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def command_action(cmd, plan: Plan, gpus: int | None, state: dict[str, Any], force: bool) -> tuple[str, str]:
    """("run" | "done" | "skip", why) for a before or after command."""
    if cmd.creates and os.path.exists(cmd.creates):
        return "done", f"{cmd.creates} exists"
    if cmd.gpus and gpus is not None and gpus < cmd.gpus:
        return "skip", f"needs {cmd.gpus} GPUs, this machine has {gpus}"
    prev = state.get(cmd.name) or {}
    if not force and prev.get("status") == "ok" and prev.get("argv") == cmd.resolved(places(plan)):
        return "done", "ok in commands.json"
    return "run", ""


def run_commands(plan: Plan, phase: str, args: argparse.Namespace, log) -> list[tuple[str, str]]:
    """The suite's commands of a phase (before, after), each a bounded process; (name, status) of
    each that ran. A finished command is remembered in DIR/commands.json (resume)."""
    from dlscale.case.procs import spawn

    cmds = plan.suite.bench.when(phase)
    gpus = cuda_gpus(plan) if any(c.gpus for c in cmds) else None
    results = []
    for cmd in cmds:
        state = command_state(plan)
        action, why = command_action(cmd, plan, gpus, state, args.force)
        line = command_line(cmd, plan)
        if action != "run":
            print(f"[{phase} {cmd.name}] {action:<8} {why}", flush=True)
            continue

        def out(text: str) -> None:
            log.write(text + "\n")
            if args.verbose:
                print(text, file=sys.stderr)

        log.write(f"== {cmd.name}: {shown_command(line)}\n")
        log.flush()
        res = spawn(line, cmd.time_limit, on_line=out)
        status = "ok" if res.returncode == 0 and not res.timed_out else \
            "timeout" if res.timed_out else f"failed (exit {res.returncode})"
        state[cmd.name] = {"argv": cmd.resolved(places(plan)), "status": status, "seconds": round(res.seconds, 1)}
        (plan.out / "commands.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
        last = [ln for ln in res.output_tail.splitlines() if ln.strip()][-1:] or [""]
        print(f"[{phase} {cmd.name}] {status:<8} {shown_command(line)} [{res.seconds:.1f} s]"
              + ("" if status == "ok" else f": {last[0][:200]}"), flush=True)
        results.append((cmd.name, status))
    return results


@contextlib.contextmanager
def during_commands(plan: Plan, verbose: bool, lines: list[str], failed: list[str]):
    """The suite's during commands (a load while the measurements run): each started as the block
    begins, in its own session, its output in DIR/commands.log, and its whole tree ended when the
    block ends (or at its time limit). One that ended before the block did is named in ``failed``:
    the measurements after it ran without the load the suite asked for."""
    from dlscale.case.procs import kill_tree

    cmds = plan.suite.bench.when("during") if plan.dlscale_half else []
    gpus = cuda_gpus(plan) if any(c.gpus for c in cmds) else None
    running = []
    with open(plan.out / "commands.log", "a", encoding="utf-8") as log:
        try:
            for cmd in cmds:
                if cmd.gpus and gpus is not None and gpus < cmd.gpus:
                    print(f"[during {cmd.name}] skip     needs {cmd.gpus} GPUs, this machine has {gpus}", flush=True)
                    continue
                line = command_line(cmd, plan)
                log.write(f"== {cmd.name} (during the measurements): {shown_command(line)}\n")
                log.flush()
                proc = subprocess.Popen(line, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
                timer = threading.Timer(cmd.time_limit, kill_tree, args=(proc,))
                timer.daemon = True
                timer.start()
                running.append((cmd, proc, timer, time.monotonic()))
                print(f"[during {cmd.name}] started  {shown_command(line)} (pid {proc.pid})", flush=True)
            yield
        finally:
            for cmd, proc, timer, started in running:
                timer.cancel()
                early = proc.poll()
                kill_tree(proc)
                seconds = time.monotonic() - started
                status = "ok" if early is None else f"ended early (exit {early})"
                state = command_state(plan)
                state[cmd.name] = {"argv": cmd.resolved(places(plan)), "status": status, "seconds": round(seconds, 1),
                                   "pid": proc.pid}
                (plan.out / "commands.json").write_text(json.dumps(state, indent=1) + "\n", encoding="utf-8")
                shown = "stopped after the measurements" if early is None else \
                    f"ended by itself (exit {early}) before the measurements did: what ran after it ran without it"
                print(f"[during {cmd.name}] {status if early is not None else 'stopped':<8} {shown} "
                      f"[{seconds:.1f} s]", flush=True)
                lines.append(f"- during command {cmd.name}: {shown} after {seconds:.1f} s (commands.log)")
                if early is not None:
                    failed.append(cmd.name)


# ----------------------------------------------------------------------------- tables

@dataclass
class Table:
    file: str
    argv: list[str]  # `dlscale` arguments (a script's: its name first)
    what: str
    rc: int | None = None
    note: str = ""
    printed: bool = False  # a table command: its output is the table
    script: bool = False


def planned_tables(plan: Plan) -> list[Table]:
    from dlscale.results.store import ResultStore

    s = plan.stores
    have = {k: bool(ResultStore(v).load().records) for k, v in s.items()}
    out: list[Table] = []

    def both(stem: str, argv: list[str], what: str) -> None:
        for fmt in ("md", "json"):
            out.append(Table(f"{stem}.{fmt}", [*argv, "--format", fmt, "-o", str(plan.out / f"{stem}.{fmt}")], what))

    if have["dlscale"]:
        both("report", ["report", s["dlscale"]], "DLPerf tables of the dlscale cases")
        both("by-label", ["report", s["dlscale"], "--group-by", "label"], "the dlscale cases, one table per label")
    if have["bare"]:
        both("bare", ["report", s["bare"], "--group-by", "label"], "the bare-loop runs, one table per label")
    if have["variants"]:
        both("variants", ["report", s["variants"], "--group-by", "label"], "the bare-loop variants")
    if have["bare"] and have["dlscale"]:
        both("vs-bare", ["compare", s["bare"], s["dlscale"]], "dlscale / bare loop, per case (ratio B/A)")
    for spec in plan.suite.bench.compare:
        if have[spec.a.store] and have[spec.b.store]:
            both(f"compare-{spec.name}", ["compare", *spec.argv(s)], f"comparison {spec.name} (ratio B/A)")
    for cmd in plan.suite.bench.when("table"):
        for fmt in ("md", "json"):
            out.append(Table(f"{cmd.name}.{fmt}", [*cmd.resolved(places(plan)), "--format", fmt],
                             f"the suite's table command {cmd.name}", printed=True, script=cmd.script))
    return out


def make_tables(tables: list[Table], out_dir: Path) -> None:
    """Each table by `dlscale` in this process (a script's in its own); a table's error line is kept
    for the index. A printed table is written only when its command succeeded."""
    import io

    from dlscale.cli import main as dlscale_main

    for t in tables:
        err, printed = io.StringIO(), io.StringIO()
        if t.script:  # a reader of the stores: bounded, its one process killed past the limit
            try:
                p = subprocess.run([sys.executable, str(BENCH_DIR / t.argv[0]), *t.argv[1:]], capture_output=True,
                                   text=True, timeout=TABLE_SCRIPT_LIMIT_S)
                t.rc = p.returncode
                err.write(p.stderr)
                printed.write(p.stdout)
            except subprocess.TimeoutExpired:
                t.rc = 124
                err.write(f"benchmarks/run.py: error: {t.argv[0]} took more than {TABLE_SCRIPT_LIMIT_S} s\n")
        else:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(printed if t.printed else sys.stdout):
                t.rc = dlscale_main(t.argv)
        said = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        # each line under the table it is about: several comparisons can fail alike
        sys.stderr.write("".join(f"{t.file}: {ln}\n" for ln in said))
        t.note = next((ln for ln in said if "error:" in ln), said[-1] if t.rc == EXIT_VERDICT and said else "")
        if t.printed and t.rc in (0, EXIT_VERDICT) and printed.getvalue():
            (out_dir / t.file).write_text(printed.getvalue(), encoding="utf-8")


def write_index(plan: Plan, argv: list[str], tables: list[Table], lines: list[str]) -> None:
    out = [f"# Benchmark {plan.suite.name}", "", f"- suite: `{os.path.relpath(plan.path, REPO)}`"
           f"{' — ' + plan.suite.description if plan.suite.description else ''}",
           f"- command: `python benchmarks/run.py {shlex.join(argv)}`",
           "- stores: `store/` (dlscale sweep), `bare/` (bare runs, the cases' case keys), `variants/` "
           "(bare-loop variants); environment: `env.txt`, `env.json`; logs: `sweep.log`, `bare.log`, "
           "`commands.log`", ""]
    out += lines + ["", "## Tables", "", "| file | what | made by | result |", "|---|---|---|---|"]
    for t in tables:
        rel = [os.path.relpath(a, plan.out) if a.startswith(str(plan.out) + os.sep) else a for a in t.argv]
        shown = shlex.join(["python", f"benchmarks/{rel[0]}", *rel[1:]] if t.script else ["dlscale", *rel])
        shown += f" > {t.file}" if t.printed else ""
        why = t.note.split("error: ", 1)[-1].replace("|", "\\|")
        result = "ok" if t.rc == 0 else f"made; its verdict (exit 1): {why}" if t.rc == EXIT_VERDICT and t.printed \
            else f"not made (exit {t.rc}): {why}"
        out.append(f"| [{t.file}]({t.file}) | {t.what} | `{shown}` | {result} |")
    (plan.out / "index.md").write_text("\n".join(out) + "\n", encoding="utf-8")


def pack(out: Path) -> Path:
    archive = out.with_name(out.name + ".tgz")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    shutil.rmtree(out)
    return archive


# ----------------------------------------------------------------------------- main

@dataclass
class Budget:
    """--time-budget: at the deadline this process gets SIGTERM (an interrupt: the running case's
    processes are killed, nothing half-measured is stored), then the tables are made."""

    seconds: float | None
    expired: bool = False
    _timer: threading.Timer | None = field(default=None, repr=False)

    def start(self) -> None:
        if self.seconds is None:
            return
        reserve = min(60.0, max(20.0, self.seconds / 10))  # the tables, the index and the archive

        def fire() -> None:
            self.expired = True
            os.kill(os.getpid(), signal.SIGTERM)

        self._timer = threading.Timer(self.seconds - reserve, fire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt(f"signal {signum}")


def pending_data(plan: Plan) -> list[str]:
    """The data sets the suite's before commands are yet to make."""
    return [c.creates for c in plan.suite.bench.when("before") if c.creates and not os.path.exists(c.creates)]


def dry_run(plan: Plan, args: argparse.Namespace, gpus: int | None) -> int:
    from dlscale.cli import main as dlscale_main
    from dlscale.case.config import resolve_device
    from dlscale.inputs import files_pending
    from dlscale.results.store import ResultStore

    print(f"# benchmark {plan.suite.name} ({os.path.relpath(plan.path, REPO)}) -> {plan.out}")
    for line in unmade_compares(plan):
        print(f"# {line}")
    state = command_state(plan)
    for phase in ("before", "after"):
        cmds = plan.suite.bench.when(phase) if plan.case_idx else []
        cuda = cuda_gpus(plan) if any(c.gpus for c in cmds) else None
        for cmd in cmds:
            action, why = command_action(cmd, plan, cuda, state, args.force)
            print(f"{phase:>6}  {action:<4}  {cmd.name}: {shown_command(command_line(cmd, plan))}"
                  + (f" ({why})" if why else ""))
    if plan.case_idx:
        with files_pending(pending_data(plan)):
            dlscale_main(sweep_argv(plan, args, dry_run=True))
    for cmd in plan.suite.bench.when("during") if plan.dlscale_half else []:
        print(f"during        {cmd.name}: {shown_command(command_line(cmd, plan))} (while the measurements run)")
    records = ResultStore(plan.stores["dlscale"]).load().records
    for n, run in enumerate(plan.external, 1):
        case = external_case(plan, run)
        action = "done" if (external_done(case, records) and not args.force) else "run"
        print(f"{n:>4}  {action:<4}  {run.describe()}: {shown_command(case.command)}")
    for n, run in enumerate(plan.bare, 1):
        records = ResultStore(plan.stores[run.store]).load().records
        action = "done" if (bare_done(run, records) and not args.force) else "run"
        if resolve_device(run.cfg.device) == "cuda" and gpus is not None and run.cfg.world_size > gpus:
            action = "skip"
        cmd = BareSpawner(run, resolve_device(run.cfg.device)).command()
        print(f"{n:>4}  {action:<4}  {describe_bare(run)}  ({run.store}): {shown_command(cmd)}")
    if plan.missing:
        print(f"# not here: {plan.missing}")
    print("# tables (made from what the stores hold): report.md/json, by-label.md/json"
          + (", bare.md/json, vs-bare.md/json" if plan.bare else "")
          + "".join(f", compare-{c.name}.md/json" for c in plan.suite.bench.compare)
          + "".join(f", {c.name}.md/json" for c in plan.suite.bench.when("table")))
    return EXIT_OK


def list_suites() -> int:
    from dlscale import ConfigError
    from dlscale.case.suite import load_bench_suite

    for p in sorted(SUITES_DIR.glob("*.yaml")):
        try:
            s = load_bench_suite(p)
        except ConfigError as e:  # e.g. a JAX suite where JAX is not installed
            print(f"{p.stem:20s} cannot load here: {e}")
            continue
        print(f"{p.stem:20s} {len(s.cases):3d} case(s) {len(s.bench.bare):3d} bare  {s.description[:90]}")
    return EXIT_OK


def execute(plan: Plan, args: argparse.Namespace, argv: list[str], gpus: int | None) -> int:
    """Steps 2-6; returns the exit code."""
    from dlscale.results import envinfo

    for line in unmade_compares(plan):  # said first: a filter may have left a side out by mistake
        print(f"benchmarks/run.py: note: {line}", file=sys.stderr, flush=True)
    plan.out.mkdir(parents=True, exist_ok=True)
    env = envinfo.capture()
    (plan.out / "env.json").write_text(json.dumps(env, indent=2, default=str) + "\n", encoding="utf-8")
    (plan.out / "env.txt").write_text(envinfo.format_env(env) + "\n", encoding="utf-8")
    budget, lines, code = Budget(args.time_budget), [], EXIT_OK
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    budget.start()
    try:
        with open(plan.out / "commands.log", "a", encoding="utf-8") as log:
            bad = commands_phase(plan, "before", args, log, lines)
        if bad:  # the cases need what these make: measure nothing
            code = EXIT_FAILED
        else:
            early: list[str] = []
            with during_commands(plan, args.verbose, lines, early):
                code = measure_all(plan, args, gpus, budget, lines)
            code = EXIT_FAILED if early else code
            with open(plan.out / "commands.log", "a", encoding="utf-8") as log:
                code = EXIT_FAILED if commands_phase(plan, "after", args, log, lines) else code
    except KeyboardInterrupt:
        if not budget.expired:
            print("benchmarks/run.py: interrupted; what finished is stored; run the same command again to carry on",
                  file=sys.stderr)
            return EXIT_INTERRUPTED
    finally:
        budget.stop()
        signal.signal(signal.SIGTERM, old)
    if budget.expired:
        lines.append("- **stopped by --time-budget**: run the same command again to carry on")
        print("benchmarks/run.py: --time-budget reached; making the tables of what is stored", file=sys.stderr)
    tables = planned_tables(plan)
    make_tables(tables, plan.out)
    write_index(plan, argv, tables, lines)
    # 2: nothing to show (a filter left it out); 1 from a table command: its verdict, shown in the table
    if any(t.rc not in (0, EXIT_BAD_INPUT) and not (t.rc == EXIT_VERDICT and t.printed) for t in tables):
        code = EXIT_FAILED
    print(f"# tables and index in {plan.out}/index.md")
    if args.pack:
        print(f"# packed into {pack(plan.out)}")
    return EXIT_BUDGET if budget.expired else code


def commands_phase(plan: Plan, phase: str, args: argparse.Namespace, log, lines: list[str]) -> bool:
    """The phase's commands where the dlscale cases run; True when one did not end ok."""
    if not plan.dlscale_half or not plan.suite.bench.when(phase):
        return False
    ran = run_commands(plan, phase, args, log)
    bad = [f"{n}: {s}" for n, s in ran if s != "ok"]
    lines.append(f"- {phase} commands: {len(plan.suite.bench.when(phase))}, {len(ran)} ran (commands.log)"
                 + (f"; not ok: {'; '.join(bad)}" if bad else ""))
    return bool(bad)


def measure_all(plan: Plan, args: argparse.Namespace, gpus: int | None, budget: Budget, lines: list[str]) -> int:
    """The bare runs, the dlscale cases, the external cases; the exit code so far."""
    code = EXIT_OK
    if plan.bare:
        with open(plan.out / "bare.log", "a", encoding="utf-8") as log:
            ran = run_bare(plan, gpus, args.force, args.verbose, log)
        bad = [w for w, s in ran if s not in RESULT_STATUSES]
        lines.append(f"- bare runs: {len(plan.bare)} selected, {len(ran)} measured"
                     + (f"; not ok: {'; '.join(bad)}" if bad else ""))
        code = EXIT_FAILED if bad else code
    if plan.case_idx:
        rc = run_sweep(plan, args)
        lines.append(f"- dlscale cases: {len(plan.case_idx)} selected; `dlscale sweep` exit {rc} (sweep.log)")
        if rc == EXIT_INTERRUPTED and not budget.expired:
            raise KeyboardInterrupt
        code = EXIT_FAILED if rc not in (EXIT_OK, EXIT_INTERRUPTED) else code
    if plan.external and not budget.expired:
        ran = run_external(plan, args.force, args.verbose)
        bad = [w for w, s in ran if s not in RESULT_STATUSES]
        lines.append(f"- external cases: {len(plan.external)} selected, {len(ran)} measured (logs: store/logs)"
                     + (f"; not ok: {'; '.join(bad)}" if bad else ""))
        code = EXIT_FAILED if bad else code
    return code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    set_host_env([install_wheels(args.wheels)] if args.wheels else [])
    from dlscale import ConfigError, DlscaleError

    try:
        if args.list:
            return list_suites()
        plan = make_plan(args)
        gpus = visible_gpus(plan, args.dry_run)
        if args.dry_run:
            return dry_run(plan, args, gpus)
        return execute(plan, args, argv, gpus)
    except ConfigError as e:
        print(f"benchmarks/run.py: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except DlscaleError as e:
        print(f"benchmarks/run.py: error: {e}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
