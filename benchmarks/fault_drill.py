"""The fault drill: dlscale under killed, stopped, hung and starved processes, broken stores and hostile
or absurd input, tried the way a demanding user would. CPU only, tiny models, gloo.

    python benchmarks/fault_drill.py                 # every scenario, ~5 minutes on 2 cores
    python benchmarks/fault_drill.py --only input    # groups: procs, records, input, values, hostile
    python benchmarks/fault_drill.py --list

Each scenario runs real ``python -m dlscale ...`` processes with a tag in their environment, so every
process it started, however far down the tree and whatever its parent now is, can be found afterwards.
Each is scored on:

* orphaned processes: tagged processes alive 20 s after dlscale ended (they are then killed);
* finished measurements lost: records the scenario finished that are neither in the store nor in the
  recovery file the error names;
* tracebacks: "Traceback (most recent call last)" in anything dlscale printed;
* wrong exit codes: not the documented one (2 bad input, 3 oom, 4 time limit, 5 failed, 7 not
  stored, 130 interrupted; a SIGKILLed dlscale is -9);
* wrong failure messages: a bad-input error that is not one line naming the option, or a failure
  that does not name the rank and what happened to it;
* ways to run code from input: a payload (``touch PWNED``) in a suite, option or label that ran.

The ``hostile`` group holds hostile input: FIFOs, devices, raw bytes, deep
nesting and implausible numbers to import, absurd sizes, names that would add sbatch options,
inductor settings taking callables or paths, a backtracking --metric regex, Markdown with raw
HTML, two sweeps into one store and a burst of signals (each counted in the same six counts).

The last line is the summary; exit 0 when every count is 0, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

REPO = Path(__file__).resolve().parent.parent
TAG = "DLSCALE_DRILL_TAG"
COUNTS = ("orphaned processes", "finished measurements lost", "tracebacks", "wrong exit codes",
          "wrong failure messages", "ways to run code from input")
CASE = ["--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--precision", "fp32", "--batch-size", "4",
        "--warmup", "1", "--repeats", "1", "--no-monitor"]
LONG = ["--steps", "100000", "--time-limit", "120"]  # a case that is still running when the fault comes
ORPHAN_GRACE_S = 20.0


@dataclass
class Outcome:
    rc: int | None
    out: str
    err: str
    seconds: float
    pid: int | None = None


@dataclass
class Scenario:
    name: str
    group: str
    argv: list[str]  # after `python -m dlscale`; {d} is the scenario's directory
    expect_rc: int
    prepare: Callable[[Path], None] | None = None
    during: Callable[[subprocess.Popen, str, Path], None] | None = None  # (dlscale's process, tag, directory)
    check: Callable[[Path, Outcome], dict[str, str]] | None = None  # count name -> what was wrong
    env: dict[str, str] = field(default_factory=dict)
    prelude: str = ""  # python run in dlscale's process before its main (a simulated disk fault)
    rlimit_as: int | None = None
    timeout: float = 180.0


# ----------------------------------------------------------------------------- process helpers

def tagged(tag: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get(TAG) == tag:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _cmd(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def workers(tag: str) -> dict[int, psutil.Process]:
    """Rank -> worker process of the scenario's running case."""
    out = {}
    for p in tagged(tag):
        c = _cmd(p)
        if "dlscale.train.worker" in c or ("dlscale.micro" in c and "worker" in c):
            try:
                out[int(p.environ().get("RANK", "-1"))] = p
            except (psutil.NoSuchProcess, ValueError):
                continue
    return out


def wait_for(what: str, fn: Callable[[], object], timeout: float = 90.0) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.2)
    raise TimeoutError(f"drill: {what} did not happen within {timeout:.0f} s")


def running_workers(tag: str, n: int = 2, settle: float = 2.0) -> dict[int, psutil.Process]:
    ws = wait_for(f"{n} running workers", lambda: (w := workers(tag)) and len(w) >= n and w)
    time.sleep(settle)  # past the rendezvous: the ranks are training
    return ws  # type: ignore[return-value]


def signal_worker(rank: int, sig: int) -> Callable[[subprocess.Popen, str, Path], None]:
    def during(proc: subprocess.Popen, tag: str, d: Path) -> None:
        running_workers(tag)[rank].send_signal(sig)
    return during


def signal_dlscale(sig: int, in_second_case: bool = False) -> Callable[[subprocess.Popen, str, Path], None]:
    """Signal dlscale itself once its case runs (a sweep: once its first case is stored and the second runs)."""
    def during(proc: subprocess.Popen, tag: str, d: Path) -> None:
        if in_second_case:
            wait_for("the first case's record", lambda: _records(d / "st"), timeout=150)
        running_workers(tag)
        proc.send_signal(sig)
    return during


def kill_agent(proc: subprocess.Popen, tag: str, d: Path) -> None:
    running_workers(tag)
    for p in tagged(tag):
        if "torch.distributed.run" in _cmd(p):
            p.kill()


# ----------------------------------------------------------------------------- checks

def _records(store: Path) -> list[dict]:
    f = store / "results.jsonl"
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def one_line_error(fragment: str) -> Callable[[Path, Outcome], dict[str, str]]:
    """Bad input: one line naming it, and nothing written where the store would be."""
    def check(d: Path, o: Outcome) -> dict[str, str]:
        lines = [ln for ln in o.err.splitlines() if ln.strip()]
        bad = {}
        if len(lines) != 1 or not lines[0].startswith("dlscale: error:") or fragment not in lines[0]:
            bad["wrong failure messages"] = f"expected one 'dlscale: error:' line naming {fragment!r}: {o.err[-300:]!r}"
        if (d / "st").exists():
            bad["finished measurements lost"] = "the store was created for bad input"  # written before refusing
        return bad
    return check


def error_names(*fragments: str, records: int | None = None) -> Callable[[Path, Outcome], dict[str, str]]:
    """A failure: the record's error (or dlscale's output) names what happened; ``records`` finished
    cases are in the store."""
    def check(d: Path, o: Outcome) -> dict[str, str]:
        recs = _records(d / "st")
        text = o.out + o.err + " ".join(str(r.get("error")) for r in recs)
        bad = {}
        missing = [f for f in fragments if f not in text]
        if missing:
            bad["wrong failure messages"] = f"no {missing} in what dlscale said: {o.err[-300:]!r}"
        if records is not None and sum(r.get("status") == "ok" for r in recs) < records:
            bad["finished measurements lost"] = f"{records} finished case(s) expected in the store, found " \
                                                f"{sum(r.get('status') == 'ok' for r in recs)}"
        return bad
    return check


def kept_in_recovery(d: Path, o: Outcome) -> dict[str, str]:
    kept = list((d / "recovery").glob("dlscale-unstored-*.jsonl"))
    if len(kept) != 1 or str(kept[0]) not in o.err:
        return {"finished measurements lost": f"no recovery file named in the error: {o.err[-300:]!r}"}
    rec = json.loads(kept[0].read_text())
    return {} if rec.get("status") == "ok" else {"finished measurements lost": "the kept record is not ok"}


def skips_and_names(*names: str) -> Callable[[Path, Outcome], dict[str, str]]:
    def check(d: Path, o: Outcome) -> dict[str, str]:
        missing = [n for n in names if n not in o.err]
        bad = {} if not missing else {"wrong failure messages": f"bad entries not named: {missing}"}
        if "gpt2" not in o.out:
            bad["finished measurements lost"] = "the readable records are not in the report"
        return bad
    return check


# ----------------------------------------------------------------------------- preparing inputs

def _good_record(d: Path) -> None:
    """One finished record in d/st (a real tiny run, made once per drill and copied)."""
    shutil.copytree(GOOD_STORE, d / "st")


def _broken_store(d: Path) -> None:
    _good_record(d)
    st = d / "st"
    (st / "x.jsonl").mkdir()
    (st / "loop.jsonl").symlink_to(st / "loop.jsonl")
    (st / "latin1.jsonl").write_bytes(b'{"label": "caf\xe9"}\n')


def _two_stores(d: Path) -> None:
    for name in ("a", "b"):
        shutil.copytree(GOOD_STORE, d / name)


def _file_at(rel: str, content: str = "x") -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
    return prepare


def _program(d: Path) -> str:
    """An executable that leaves d/PWNED behind if anything runs it."""
    prog = d / "prog"
    prog.write_text(f"#!/bin/sh\ntouch {d / 'PWNED'}\n")
    prog.chmod(0o755)
    return str(prog)


def _suite(text: str, name: str = "s.yaml") -> Callable[[Path], None]:
    def prepare(d: Path) -> None:
        (d / name).write_text(text.replace("{d}", str(d)).replace("{prog}", _program(d)))
    return prepare


SUITE_CASE = "{model: gpt2, flavor: tiny, batch_size: %d, precision: fp32, strategy: ddp, devices: 2, steps: %d}"
# a short first case, then two that are still running when the fault comes
SWEEP3 = ("device: cpu\nwarmup: 1\nrepeats: 1\nmonitor: false\ntime_limit: 120\ncases:\n"
          + "".join(f"  - {SUITE_CASE % (b, n)}\n" for b, n in ((2, 2), (4, 100000), (6, 100000))))
ENOSPC = ("import errno, os\nimport dlscale.results.store as _s\n_w = os.write\n"
          "def _full(fd, b):\n"
          "    if '/st/' in os.readlink(f'/proc/self/fd/{fd}'):\n"
          "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))\n"
          "    return _w(fd, b)\n"
          "_s.os.write = _full\n")


def _slurm_script_runs_nothing(d: Path, o: Outcome) -> dict[str, str]:
    """Run the generated job script under stub srun/scontrol/sbatch: no payload may run."""
    if o.rc != 0 or "#SBATCH" not in o.out:
        return {"wrong exit codes": f"no script printed: {o.err[-200:]!r}"}
    script = d / "job.sbatch"
    script.write_text(o.out)
    bin_ = d / "bin"
    bin_.mkdir()
    for tool in ("srun", "scontrol", "sbatch"):
        (bin_ / tool).write_text("#!/bin/sh\necho \"$0 $*\" >> \"$(dirname \"$0\")/calls\"\n")
        (bin_ / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_ID": "1"}
    subprocess.run(["bash", str(script)], env=env, capture_output=True, timeout=60, cwd=d)
    return {}


# ----------------------------------------------------------------------------- the scenarios

def scenarios() -> list[Scenario]:
    run, st = ["run", *CASE], ["--store", "{d}/st"]
    out = [
        # processes: the whole tree always ends
        Scenario("agent SIGKILLed mid-run", "procs", [*run, "--nproc-per-node", "2", *LONG, *st], 5,
                 during=kill_agent),
        Scenario("rank 1 SIGSTOPped under --time-limit 20", "procs",
                 [*run, "--nproc-per-node", "2", "--steps", "100000", "--time-limit", "20", *st], 4,
                 during=signal_worker(1, signal.SIGSTOP), check=error_names("rank 1")),
        Scenario("dlscale run SIGKILLed mid-run", "procs", [*run, "--nproc-per-node", "2", *LONG, *st], -9,
                 during=signal_dlscale(signal.SIGKILL)),
        Scenario("dlscale run SIGTERMed mid-run", "procs", [*run, "--nproc-per-node", "2", *LONG, *st], 130,
                 during=signal_dlscale(signal.SIGTERM), check=error_names("interrupted")),
        Scenario("dlscale run SIGHUPed mid-run", "procs", [*run, "--nproc-per-node", "2", *LONG, *st], 130,
                 during=signal_dlscale(signal.SIGHUP), check=error_names("interrupted")),
        Scenario("rank 1 SIGKILLed mid-run", "procs", [*run, "--nproc-per-node", "2", *LONG, *st], 5,
                 during=signal_worker(1, signal.SIGKILL), check=error_names("rank 1", "SIGKILL")),
        Scenario("rank 1 hangs before a collective", "procs",
                 [*run, "--nproc-per-node", "2", "--steps", "10", "--inject-failure", "hang@3:1",
                  "--collective-timeout", "8", "--time-limit", "90", *st], 4, check=error_names("rank 1")),
        Scenario("CPU allocation fails (3 GiB address space)", "procs",
                 [*run, "--batch-size", str(2 ** 18), "--steps", "2", *st], 3, rlimit_as=3 << 30,
                 check=error_names("memory")),
        Scenario("sweep SIGTERMed in its second case", "procs", ["sweep", "{d}/s.yaml", *st], 130,
                 prepare=_suite(SWEEP3), during=signal_dlscale(signal.SIGTERM, in_second_case=True),
                 check=error_names("interrupted", records=1)),
        Scenario("sweep SIGKILLed in its second case", "procs", ["sweep", "{d}/s.yaml", *st], -9,
                 prepare=_suite(SWEEP3), during=signal_dlscale(signal.SIGKILL, in_second_case=True),
                 check=error_names(records=1)),
        Scenario("a peer node never joins (--collective-timeout 15, --time-limit 200)", "procs",
                 [*run, "--steps", "2", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29517", "--collective-timeout",
                  "15", "--time-limit", "200", *st], 4,
                 check=lambda d, o: {**error_names("never joined")(d, o), **(
                     {} if o.seconds < 100 else {"wrong exit codes": f"reported after {o.seconds:.0f} s"})}),
        Scenario("micro comm SIGTERMed", "procs",
                 ["micro", "comm", "--op", "all_reduce", "--nproc-per-node", "2", "--device", "cpu",
                  "--min-bytes", "1024", "--max-bytes", "1024", "--steps", "10000000", "--time-limit", "120",
                  "--store", "{d}/st"], 130, during=signal_dlscale(signal.SIGTERM), check=error_names("interrupted")),
        # records: a finished measurement is never lost
        Scenario("disk full when the record is written", "records", [*run, "--steps", "2", *st], 7,
                 prelude=ENOSPC, check=kept_in_recovery),
        Scenario("store is a file", "records", [*run, "--steps", "2", *st], 2, prepare=_file_at("st"),
                 check=lambda d, o: {} if o.err.count("\n") == 1 else {"wrong failure messages": o.err[-300:]}),
        Scenario("series/ of the store is a file", "records", [*run, "--steps", "2", *st], 2,
                 prepare=_file_at("st/series"),
                 check=lambda d, o: {} if "series" in o.err else {"wrong failure messages": o.err[-300:]}),
        Scenario("report over a store with unreadable entries", "records", ["report", "{d}/st"], 0,
                 prepare=_broken_store, check=skips_and_names("x.jsonl", "loop.jsonl", "latin1.jsonl")),
        Scenario("sweep dry run over a store with unreadable entries", "records",
                 ["sweep", "{d}/s.yaml", "--dry-run", *st], 0,
                 prepare=lambda d: (_broken_store(d), _suite(SWEEP3)(d)),
                 check=lambda d, o: {} if "x.jsonl" in o.err else {"wrong failure messages": o.err[-300:]}),
        Scenario("suite file not UTF-8", "records", ["sweep", "{d}/s.yaml", "--dry-run", *st], 2,
                 prepare=lambda d: (d / "s.yaml").write_bytes(b"description: caf\xe9\ncases: []\n"),
                 check=one_line_error("UTF-8")),
        # input never runs code
        Scenario("suite inductor_options cpp.cxx names a program", "input", ["sweep", "{d}/s.yaml", *st], 2,
                 prepare=_suite("device: cpu\nsteps: 2\ncases:\n  - {model: gpt2, flavor: tiny, batch_size: 2, "
                                "precision: fp32, compile: true, inductor_options: {cpp.cxx: [{prog}]}}\n"),
                 check=one_line_error("cpp.cxx")),
        Scenario("--inductor-option cpp.cxx=PROGRAM", "input",
                 [*run, "--steps", "2", "--compile", "--inductor-option", "cpp.cxx={d}/prog", *st], 2,
                 prepare=_program, check=one_line_error("cpp.cxx")),
        Scenario("slurm --job-name with a newline and a command", "input",
                 ["slurm", "--dry-run", *CASE, "--job-name", "x\ntouch {d}/PWNED", *st], 2,
                 check=one_line_error("job-name")),
        Scenario("slurm --label with a command substitution, script run", "input",
                 ["slurm", "--dry-run", *CASE, "--label", "$(touch {d}/PWNED)", *st],
                 0, check=_slurm_script_runs_nothing),
    ]
    bad = [  # bad values are refused before anything starts: (name, argv, the option the line names)
        ("--time-limit inf", [*run, "--time-limit", "inf"], "time-limit"),
        ("--time-limit 1e300", [*run, "--time-limit", "1e300"], "time-limit"),
        ("--seed -1", [*run, "--seed", "-1"], "seed"),
        ("--seed 2^32", [*run, "--seed", str(2 ** 32)], "seed"),
        ("--batch-size 10^9", [*run, "--batch-size", str(10 ** 9)], "batch"),
        ("--nproc-per-node 64 on a CPU", [*run, "--nproc-per-node", "64"], "nproc-per-node"),
        ("--inject-failure on a rank that does not exist", [*run, "--nproc-per-node", "2", "--inject-failure",
                                                            "crash@0:5"], "inject-failure"),
        ("--inject-failure on a step that does not exist", [*run, "--steps", "2", "--inject-failure", "crash@99"],
         "inject-failure"),
        ("--max-batch-cap without --batch-size max", [*run, "--max-batch-cap", "8"], "max-batch-cap"),
        ("slurm --cpus-per-task -1", ["slurm", "--dry-run", *CASE, "--cpus-per-task", "-1"], "cpus-per-task"),
        ("slurm --time bogus", ["slurm", "--dry-run", *CASE, "--time", "bogus"], "time"),
        ("compare --fail-on-regression nan", ["compare", "{d}/a", "{d}/b", "--fail-on-regression", "nan"],
         "fail-on-regression"),
        ("compare --min-change nan", ["compare", "{d}/a", "{d}/b", "--min-change", "nan"], "min-change"),
    ]
    out += [Scenario(name, "values", [*argv, *st] if argv[0] != "compare" else argv, 2, check=one_line_error(frag),
                     prepare=_two_stores if argv[0] == "compare" else None)
            for name, argv, frag in bad]
    out += [
        Scenario("--store ''", "values", [*run, "--store", ""], 2, check=one_line_error("store")),
        Scenario("suite with a duplicate key", "values", ["sweep", "{d}/s.yaml", "--dry-run", *st], 2,
                 prepare=_suite("device: cpu\nsteps: 2\nsteps: 3\ncases: []\n"), check=one_line_error("steps")),
        Scenario("suite of 10^6 cases", "values", ["sweep", "{d}/s.yaml", "--dry-run", *st], 2,
                 prepare=_suite("device: cpu\nmodels: [gpt2]\nbatch_sizes: [%s]\nseeds: [%s]\n"
                                % (", ".join(map(str, range(1, 1001))), ", ".join(map(str, range(1000))))),
                 check=one_line_error("cases"), timeout=60),
    ]
    return out + hostile_scenarios()


# ----------------------------------------------------------------------------- hostile input

HOSTILE_LABEL = "x`<img src=y onerror=alert(12)>"
TABLE = ("format: dlscale-table/1\nsource: s\ntool: t\nmodel: gpt2\nunit: seq\nhardware: {gpu: V100}\nrows:\n"
         "  - {batch_size: %s, nodes: 1, gpus_per_node: 1, precision: fp32, %s}\n")


def _fifo(name: str) -> Callable[[Path], None]:
    return lambda d: os.mkfifo(d / name)


def _deep(n: int = 1000) -> str:
    return "[" * n + "]" * n


def _random_bytes(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).write_bytes(os.urandom(5 << 20))


def _store_with(edit: Callable[[dict], None], *, keep_good: bool = True) -> Callable[[Path], None]:
    """The good store, plus (or with) its record edited: a hostile label, an implausible number."""
    def prepare(d: Path) -> None:
        _good_record(d)
        f = d / "st" / "results.jsonl"
        recs = _records(d / "st")
        for r in recs:
            edit(r)
        f.write_text((f.read_text() if keep_good else "") + "".join(json.dumps(r) + "\n" for r in recs))
    return prepare


def _label(r: dict) -> None:
    r["label"] = HOSTILE_LABEL
    r["config"]["label"] = HOSTILE_LABEL


def _huge(r: dict) -> None:
    r["summary"]["samples_per_s"]["median"] = 1.7e308
    r["config"]["batch_size"] = 10 ** 20


def no_live_html(d: Path, o: Outcome) -> dict[str, str]:
    """Markdown a renderer would pass raw HTML through from (markdown-it-py comes with rich)."""
    try:
        from markdown_it import MarkdownIt
    except ImportError:
        return {}

    def walk(tokens):
        for t in tokens:
            if t.type in ("html_inline", "html_block"):
                yield t.content
            yield from walk(t.children or [])
    live = list(walk(MarkdownIt("commonmark").enable("table").parse(o.out)))
    bad = {} if not live else {"ways to run code from input": f"raw HTML in the Markdown: {live[:3]}"}
    if "<img" not in o.out:
        bad["wrong failure messages"] = "the label is not in the report"
    return bad


def reported(path: str) -> Callable[[Path, Outcome], dict[str, str]]:
    def check(d: Path, o: Outcome) -> dict[str, str]:
        f = d / path
        return {} if f.is_file() and "gpt2" in f.read_text() else {"finished measurements lost": "no report"}
    return check


def second_sweep_refused(proc: subprocess.Popen, tag: str, d: Path) -> None:
    """While the first sweep holds the store, a second one into it: its exit and message kept for the check."""
    wait_for("the first sweep's claim", lambda: (d / "st" / ".dlscale-claim").is_file()
             and (d / "st" / ".dlscale-claim").read_text().strip())
    env = {**os.environ, TAG: tag, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "dlscale", "sweep", str(d / "s.yaml"), "--store", str(d / "st")],
                       capture_output=True, text=True, timeout=120, env=env, cwd=d)
    (d / "second.json").write_text(json.dumps({"rc": r.returncode, "err": r.stderr}))


def second_was_refused(d: Path, o: Outcome) -> dict[str, str]:
    second = json.loads((d / "second.json").read_text())
    bad = error_names(records=1)(d, o)
    lines = [ln for ln in second["err"].splitlines() if ln.strip()]
    if second["rc"] != 2:
        bad["wrong exit codes"] = f"the second sweep exited {second['rc']}: {second['err'][-200:]!r}"
    elif len(lines) != 1 or str(o.pid) not in lines[0]:
        bad["wrong failure messages"] = f"the second sweep did not name the first: {second['err'][-200:]!r}"
    if len(_records(d / "st")) != 1:
        bad["finished measurements lost"] = f"{len(_records(d / 'st'))} records for one case"
    return bad


def signal_burst(proc: subprocess.Popen, tag: str, d: Path) -> None:
    running_workers(tag)
    for _ in range(6):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)


def nothing_left_in_temp(d: Path, o: Outcome) -> dict[str, str]:
    left = [p.name for p in (d / "tmp").glob("dlscale-*")] if (d / "tmp").is_dir() else []
    bad = error_names("interrupted")(d, o)
    if left:
        bad["orphaned processes"] = f"left in the temp folder: {left[:3]}"
    return bad


def called_a_fifo(d: Path, o: Outcome) -> dict[str, str]:
    """A FIFO is named as what it is (it was once called a directory without trainer_state.json)."""
    return {} if "FIFO" in o.err and "in the directory" not in o.err else {"wrong failure messages": o.err[-200:]}


def _hostile_refusals() -> list[tuple]:
    """(name, argv, prepare, the fragment the one line names) of hostile input refused before anything runs."""
    run, st, imp = ["run", *CASE], ["--store", "{d}/st"], ["import", "--store", "{d}/st"]
    return [
        ("import a FIFO as a table", [*imp, "{d}/f.yaml", "--format", "table"], _fifo("f.yaml"), "f.yaml"),
        ("import a FIFO as DLPerf JSON", [*imp, "{d}/f.json", "--format", "dlperf-json", "--precision", "fp32"],
         _fifo("f.json"), "f.json"),
        ("import /dev/zero", [*imp, "/dev/zero", "--format", "table"], None, "/dev/zero"),
        ("import 5 MB of random bytes as a table", [*imp, "{d}/r.yaml", "--format", "table"], _random_bytes("r.yaml"),
         "UTF-8"),
        ("import a table nested 1000 deep", [*imp, "{d}/t.yaml", "--format", "table"],
         _file_at("t.yaml", f"description: {_deep()}\n"), "nested"),
        ("import DLPerf JSON nested 1000 deep", [*imp, "{d}/d.json", "--format", "dlperf-json", "--precision", "fp32"],
         _file_at("d.json", f'{{"gpt2": {_deep()}}}'), "nested"),
        ("suite nested 1000 deep", ["sweep", "{d}/s.yaml", "--dry-run", *st],
         _file_at("s.yaml", f"description: {_deep()}\ncases: []\n"), "nested"),
        ("import throughput 1.7e+308", [*imp, "{d}/t.yaml", "--format", "table"],
         _file_at("t.yaml", TABLE % (4, "throughput: 1.7e+308")), "throughput"),
        ("import runs of 1e+308", [*imp, "{d}/t.yaml", "--format", "table"],
         _file_at("t.yaml", TABLE % (4, "runs: [1.0e+308, 2.0]")), "runs"),
        ("import a 5000-digit integer", [*imp, "{d}/t.yaml", "--format", "table"],
         _file_at("t.yaml", TABLE % (4, "throughput: 1" + "0" * 5000)), "digits"),
        ("import batch_size 10^20", [*imp, "{d}/t.yaml", "--format", "table"],
         _file_at("t.yaml", TABLE % (10 ** 20, "throughput: 5.0")), "batch_size"),
        ("suite time_limit: 1e300 (text in YAML 1.1)", ["sweep", "{d}/s.yaml", "--dry-run", *st],
         _file_at("s.yaml", "device: cpu\ntime_limit: 1e300\ncases: []\n"), "1.0e+300"),
        ("data make tokens --size 999999G", ["data", "make", "tokens", "--out", "{d}/st", "--size", "999999G"], None,
         "size"),
        ("data make tokens --out /proc/x", ["data", "make", "tokens", "--out", "/proc/x", "--size", "1k"], None,
         "/proc/x"),
        ("plan --peak-tflops inf", ["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "80GiB", "--peak-tflops",
                                    "inf"], None, "peak-tflops"),
        ("plan --gpu-memory 1e300", ["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "1e300"], None,
         "gpu-memory"),
        ("plan --gpu-memory 1", ["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "1"], None, "gpu-memory"),
        ("predict --shapes 1000000x8", ["predict", "{d}/st", "--shapes", "1000000x8"], None, "shapes"),
        ("cost --tokens 1e30", ["cost", "{d}/st", "--tokens", "1e30"], None, "tokens"),
        ("micro matmul --sizes 10000000", ["micro", "matmul", "--device", "cpu", "--sizes", "10000000", *st], None,
         "sizes"),
        ("micro bandwidth --size 1T", ["micro", "bandwidth", "--device", "cpu", "--size", "1T", *st], None, "size"),
        ("slurm --job-name ../../escaped", ["slurm", "--dry-run", *CASE, "--job-name", "../../escaped", *st], None,
         "job-name"),
        ("slurm --job-name ''", ["slurm", "--dry-run", *CASE, "--job-name", "", *st], None, "job-name"),
        ("slurm --partition with a space", ["slurm", "--dry-run", *CASE, "--partition", "gpu --wrap=id", *st], None,
         "partition"),
        ("--inductor-option memory_pool=/bin/sh", [*run, "--compile", "--inductor-option", "memory_pool=/bin/sh", *st],
         None, "memory_pool"),
        ("--inductor-option post_grad_custom_post_pass=1",
         [*run, "--compile", "--inductor-option", "post_grad_custom_post_pass=1", *st], None, "post_grad"),
        ("--inductor-option cpu_backend=../../bin/sh",
         [*run, "--compile", "--inductor-option", "cpu_backend=../../bin/sh", *st], None, "cpu_backend"),
        ("--inductor-option trace.enabled=true", [*run, "--compile", "--inductor-option", "trace.enabled=true", *st],
         None, "trace.enabled"),
    ]


def hostile_scenarios() -> list[Scenario]:
    run, st, imp = ["run", *CASE], ["--store", "{d}/st"], ["import", "--store", "{d}/st"]
    sweep1 = "device: cpu\nwarmup: 1\nrepeats: 1\nmonitor: false\ncases:\n  - " + SUITE_CASE % (2, 30) + "\n"
    out = [Scenario(name, "hostile", argv, 2, prepare=prep, check=one_line_error(frag), timeout=60)
           for name, argv, prep, frag in _hostile_refusals()]
    out += [
        Scenario("a --metric regex that backtracks for hours, --time-limit 20", "hostile",
                 ["run", "--command", "python3 -c \"print('a'*34)\"", "--parser", "regex", "--metric",
                  "(?P<value>(a+)+)b", "--unit", "seq", "--model", "gpt2", "--precision", "fp32", "--batch-size", "4",
                  "--warmup", "0", "--steps", "1", "--repeats", "1", "--time-limit", "20", "--no-monitor", *st], 4,
                 check=error_names("--metric"), timeout=90),
        Scenario("hf-trainer importer given a FIFO", "hostile",
                 [*imp, "{d}/state.json", "--format", "hf-trainer", "--model", "gpt2", "--precision", "fp32"], 2,
                 prepare=_fifo("state.json"), check=called_a_fifo, timeout=60),
        Scenario("report over a store with a 1.7e308 record", "hostile",
                 ["report", "{d}/st", "--format", "html", "--output", "{d}/r.html"], 0, prepare=_store_with(_huge),
                 check=reported("r.html"), timeout=90),
        Scenario("Markdown report by label with HTML in the label", "hostile",
                 ["report", "{d}/st", "--group-by", "label"], 0, prepare=_store_with(_label, keep_good=False),
                 check=no_live_html, timeout=60),
        Scenario("two sweeps into one store", "hostile", ["sweep", "{d}/s.yaml", *st], 0, prepare=_suite(sweep1),
                 during=second_sweep_refused, check=second_was_refused),
        Scenario("a burst of SIGTERMs mid-run", "hostile",
                 ["run", *[a for a in CASE if a != "--no-monitor"], "--nproc-per-node", "2", *LONG, *st],
                 130, env={"TMPDIR": "{d}/tmp"}, prepare=lambda d: (d / "tmp").mkdir(),
                 during=signal_burst, check=nothing_left_in_temp),
        Scenario("rank 1 SIGSTOPped, --collective-timeout 8 under --time-limit 90", "procs",
                 [*run, "--nproc-per-node", "2", "--steps", "100000", "--collective-timeout", "8", "--time-limit",
                  "90", *st], 4, during=signal_worker(1, signal.SIGSTOP), check=error_names("rank 1", "stalled"),
                 timeout=150),
    ]
    return out


# ----------------------------------------------------------------------------- running

GOOD_STORE = Path()


def run_scenario(s: Scenario, root: Path, verbose: bool) -> dict[str, str]:
    d = Path(tempfile.mkdtemp(prefix="drill-", dir=root))
    (d / "recovery").mkdir()
    if s.prepare:
        s.prepare(d)
    tag = uuid.uuid4().hex
    argv = [a.replace("{d}", str(d)) for a in s.argv]
    if s.prelude:
        cmd = [sys.executable, "-c", s.prelude + "import sys\nfrom dlscale.cli import main\n"
               "sys.exit(main(sys.argv[1:]))", *argv]
    else:
        cmd = [sys.executable, "-m", "dlscale", *argv]
    env = {**os.environ, TAG: tag, "DLSCALE_RECOVERY_DIR": str(d / "recovery"), "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           **{k: v.replace("{d}", str(d)) for k, v in s.env.items()}}
    limit = (lambda: __import__("resource").setrlimit(__import__("resource").RLIMIT_AS, (s.rlimit_as,) * 2)) \
        if s.rlimit_as else None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=d, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=limit, start_new_session=True)
    bad: dict[str, str] = {}
    try:
        if s.during:
            s.during(proc, tag, d)
        out, err = proc.communicate(timeout=s.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        bad["wrong exit codes"] = f"dlscale did not end within {s.timeout:.0f} s (a hang)"
    except TimeoutError as e:  # the fault could not be placed: the scenario says so, never silently passes
        proc.kill()
        out, err = proc.communicate()
        bad["wrong exit codes"] = str(e)
    o = Outcome(proc.returncode, out, err, time.monotonic() - t0, proc.pid)
    if proc.returncode != s.expect_rc and "wrong exit codes" not in bad:
        bad["wrong exit codes"] = f"exit {proc.returncode}, expected {s.expect_rc}: {err.strip()[-300:]!r}"
    if "Traceback (most recent call last)" in out + err:
        bad["tracebacks"] = (out + err).split("Traceback (most recent call last)", 1)[1][:300]
    if s.check:
        bad.update({k: v for k, v in s.check(d, o).items() if k not in bad})
    if (d / "PWNED").exists():
        bad["ways to run code from input"] = "the payload ran"
    left = _orphans(tag)
    if left:
        bad["orphaned processes"] = f"{len(left)} left: {left[:3]}"
    if verbose:
        print(f"    exit {proc.returncode} in {o.seconds:.1f} s; stderr: {err.strip()[-200:]!r}", flush=True)
    shutil.rmtree(d, ignore_errors=True)
    return bad


def _orphans(tag: str) -> list[str]:
    """Tagged processes still alive ORPHAN_GRACE_S after dlscale ended; killed, so the next scenario starts clean."""
    end = time.monotonic() + ORPHAN_GRACE_S
    alive = tagged(tag)
    while alive and time.monotonic() < end:
        time.sleep(0.5)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    names = [f"{p.pid} {_cmd(p)[:80]}" for p in alive]
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return names


def make_good_store(root: Path) -> Path:
    st = root / "good" / "st"
    subprocess.run([sys.executable, "-m", "dlscale", "run", *CASE, "--steps", "2", "--store", str(st)], check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    return st


def main() -> int:
    global GOOD_STORE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--only", default="all", help="comma-separated groups: procs, records, input, values, or all")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    ap.add_argument("--verbose", "-v", action="store_true", help="print each scenario's exit and stderr tail")
    args = ap.parse_args()
    every = scenarios()
    groups = {s.group for s in every}
    want = groups if args.only == "all" else set(args.only.split(","))
    if want - groups:
        print(f"--only: unknown group(s) {sorted(want - groups)}; allowed: {', '.join(sorted(groups))}, all",
              file=sys.stderr)
        return 2
    chosen = [s for s in every if s.group in want]
    if args.list:
        for s in chosen:
            print(f"{s.group:8} {s.name}")
        return 0
    counts = dict.fromkeys(COUNTS, 0)
    with tempfile.TemporaryDirectory(prefix="dlscale-drill-") as tmp:
        root = Path(tmp)
        GOOD_STORE = make_good_store(root)
        t0 = time.monotonic()
        for i, s in enumerate(chosen, 1):
            bad = run_scenario(s, root, args.verbose)
            for k in bad:
                counts[k] += 1
            verdict = "ok  " if not bad else "FAIL"
            print(f"[{i:2}/{len(chosen)}] {verdict} {s.group:8} {s.name}"
                  + "".join(f"\n        {k}: {v}" for k, v in bad.items()), flush=True)
        print(f"# {len(chosen)} scenarios in {time.monotonic() - t0:.0f} s")
    print(f"fault drill: {len(chosen)} scenarios: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return 0 if not any(counts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
