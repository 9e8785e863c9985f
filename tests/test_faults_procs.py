"""Every process a case starts ends with it, and a failure says what happened (procs.py, launch.py).

Real ``dlscale run`` cases on the CPU: tiny gpt2, two ranks. Each test points TMPDIR at its own
folder, so the case's temp directories and every process whose command line names them (the
torchrun agent, the workers, the hardware sampler) belong to that test alone. Where the fault is
dealt to dlscale itself (its signals, its memory limit) dlscale is a ``python -m dlscale``
process; where it is dealt to the agent or a rank, dlscale runs in this process (tests/helpers_cli.py,
~5 s of start-up less) while a thread waits for training and deals it. The out-of-memory case and the
hung-rank case (``python -m dlscale`` processes then) start while the stopped-rank case waits (idle) for
its time limit, each when its test is selected with it. The cases whose dlscale process is signalled
(SIGKILL, SIGTERM) run at once, each in its own folder, when the first of their tests asks.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Callable
from unittest import mock

import psutil
import pytest

import helpers_cli
from dlscale.case import launch, procs
from dlscale.case.procs import ProcResult
from dlscale.results.store import ResultStore

REPO = Path(__file__).resolve().parents[1]


def _case_args(store: Path, *extra: str, steps: int = 100000, time_limit: float = 60) -> list[str]:
    return [sys.executable, "-m", "dlscale", "run", "--model", "gpt2", "--flavor", "tiny", "--nproc-per-node", "2",
            "--device", "cpu", "--precision", "fp32", "--batch-size", "4", "--warmup", "1", "--steps", str(steps),
            "--repeats", "1", "--time-limit", str(time_limit), "--store", str(store), *extra]


def _start(tmp_path: Path, *extra: str, mem_limit: int | None = None, **kw) -> subprocess.Popen:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

    def limit() -> None:  # address space of dlscale and all it starts, as a memory limit would
        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))

    return subprocess.Popen(_case_args(tmp_path / "store", *extra, **kw), cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=limit if mem_limit else None)


def _run_here(tmp_path: Path, *extra: str, during: Callable[[], None] | None = None,
              **kw) -> tuple[int, str]:
    """The case run by dlscale in this process, its temp folders under tmp_path/tmp as _start's are;
    ``during`` runs in a thread meanwhile (it waits for training and deals the fault). (exit code, stderr)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    failed: list[BaseException] = []

    def act() -> None:
        try:
            during()
        except BaseException as e:  # noqa: BLE001 - raised in the test's thread below
            failed.append(e)

    thread = threading.Thread(target=act, daemon=True) if during else None
    with mock.patch.object(tempfile, "tempdir", str(tmp)):  # dlscale's own temp folders
        if thread:
            thread.start()
        p = helpers_cli.dlscale(*_case_args(tmp_path / "store", *extra, **kw)[3:],
                                env={"TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"})
    if thread:
        thread.join(timeout=30)
        if failed:
            raise failed[0]
    return p.returncode, p.stderr


def _ours(tmp_path: Path) -> list[psutil.Process]:
    """Live processes of this test's case: their command line names its temp folder."""
    key = str(tmp_path / "tmp")
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and any(key in a for a in p.info["cmdline"] or ()):
                out.append(p)
        except (psutil.Error, TypeError):
            continue
    return out


def _workers(tmp_path: Path) -> dict[int, psutil.Process]:
    """rank -> worker process."""
    out = {}
    for p in _ours(tmp_path):
        try:
            if "dlscale.train.worker" in p.cmdline() and "torch.distributed.run" not in " ".join(p.cmdline()):
                out[int(p.environ().get("RANK", "-1"))] = p
        except psutil.Error:
            continue
    return out


def _agent(tmp_path: Path) -> psutil.Process:
    return next(p for p in _ours(tmp_path) if "torch.distributed.run" in " ".join(p.cmdline()))


def _wait_training(tmp_path: Path, timeout: float = 90, ranks: int = 2) -> dict[int, psutil.Process]:
    """Every rank started and past its warm-up's start (the sampler's series exists)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if list((tmp_path / "tmp").glob("dlscale-case-*/series-rank0.jsonl")):
            w = _workers(tmp_path)
            if len(w) == ranks:
                time.sleep(1.0)
                return w
        time.sleep(0.2)
    raise AssertionError("the case's workers did not start training in time")


def _assert_none_left(tmp_path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = _ours(tmp_path)
        if not left:
            return
        time.sleep(0.3)
    desc = [(p.pid, p.status(), " ".join(p.cmdline())[:120]) for p in left]
    for p in left:  # never leak into the next test
        try:
            p.kill()
        except psutil.Error:
            pass
    raise AssertionError(f"processes left after the case: {desc}")


def _finish(dl: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = dl.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        dl.kill()
        _, err = dl.communicate()
        raise AssertionError(f"dlscale did not end; stderr: {err[-2000:]}")
    return dl.returncode, err


@pytest.fixture
def reaper(tmp_path):
    """Kill whatever a failing test left behind."""
    yield
    for p in _ours(tmp_path):
        try:
            p.kill()
        except psutil.Error:
            pass


OOM_TEST = "test_a_cpu_allocation_failure_is_oom"
# a fault that needs no peer (a signal to dlscale or the agent, an allocation failure) is dealt to a
# case of one rank: its processes end (or fail) as each of several do; a peer's view of a stopped or
# hung rank: the two-rank cases below
ONE_RANK = ("--nproc-per-node", "1")
HUNG_TEST = "test_a_hung_rank_is_a_timeout_naming_it_not_a_failure_of_its_peer"


def _start_oom(folder: Path) -> subprocess.Popen:
    """The out-of-memory case: under a 3 GiB address-space limit, the activations of 256 Ki sequences
    cannot be allocated."""
    return _start(folder, "--batch-size", str(2 ** 18), "--no-monitor", *ONE_RANK, mem_limit=3 << 30, steps=2)


def _start_hung(folder: Path) -> subprocess.Popen:
    """The hung-rank case: rank 1 stops answering at step 3; the peer's collective times out after 8 s."""
    return _start(folder, "--inject-failure", "hang@3:1", "--collective-timeout", "8", "--no-monitor", steps=10)


class _Ahead(SimpleNamespace):
    """One case's folder and process, started early by ``start()`` (only when its test is selected,
    once): the stopped-rank test starts it when its own wait for the time limit begins."""

    def start(self) -> None:
        if self.wanted and self.proc is None:
            self.proc = self.starter(self.folder)


def _ahead(request, tmp_path_factory, test: str, name: str, starter):
    state = _Ahead(folder=tmp_path_factory.mktemp(name), proc=None, starter=starter,
                   wanted=any(getattr(i, "module", None) is request.module and i.name == test
                              for i in request.session.items))
    yield state
    for p in _ours(state.folder):
        try:
            p.kill()
        except psutil.Error:
            pass


@pytest.fixture(scope="module")
def oom_ahead(request, tmp_path_factory):
    """The out-of-memory case (_Ahead)."""
    yield from _ahead(request, tmp_path_factory, OOM_TEST, "oom", _start_oom)


@pytest.fixture(scope="module")
def hung_ahead(request, tmp_path_factory):
    """The hung-rank case (_Ahead)."""
    yield from _ahead(request, tmp_path_factory, HUNG_TEST, "hung", _start_hung)


# ----------------------------------------------------------------------------- no process outlives its case

SIGNAL_TESTS = {"test_sigkill_of_dlscale_ends_its_workers_and_the_next_start_cleans_up": signal.SIGKILL,
                "test_sigterm_interrupts_like_ctrl_c": signal.SIGTERM}


def _deal(folder: Path, sig: signal.Signals) -> SimpleNamespace:
    """``python -m dlscale`` in ``folder``, ``sig`` dealt to it once both ranks train; then what
    followed: its exit code and stderr (none for SIGKILL), and the AssertionError of the processes
    still alive after the usual wait (10 s after a SIGKILL, 15 s after dlscale ended), or None."""
    case = SimpleNamespace(folder=folder, rc=None, err="", left=None)
    dl = _start(folder, *ONE_RANK)
    try:
        _wait_training(folder, ranks=1)
        if sig == signal.SIGKILL:
            dl.kill()
            dl.wait()
        else:
            dl.send_signal(sig)
            case.rc, case.err = _finish(dl)
        try:
            _assert_none_left(folder, timeout=10 if sig == signal.SIGKILL else 15)
        except AssertionError as e:
            case.left = e
    finally:
        if dl.poll() is None:
            dl.kill()
            dl.wait()
    return case


@pytest.fixture(scope="module")
def signalled(request, tmp_path_factory):
    """sig -> the case that signal was dealt to (``_deal``). The cases of the selected signal tests
    run at once, each in its own folder, when the first of those tests asks: each one's start and
    wait for training is mostly one core's work. A case that failed raises in its test."""
    wanted = []
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and item.originalname in SIGNAL_TESTS:
            sig = SIGNAL_TESTS[item.originalname]
            if sig not in wanted:
                wanted.append(sig)
    folders = {sig: tmp_path_factory.mktemp(f"sig{int(sig)}") for sig in wanted}
    done: dict = {}

    def get(sig: signal.Signals) -> SimpleNamespace:
        if not done:
            with ThreadPoolExecutor(max_workers=len(folders)) as pool:
                futures = {s: pool.submit(_deal, f, s) for s, f in folders.items()}
            for s, f in futures.items():
                done[s] = f.exception() or f.result()
        if isinstance(done[sig], BaseException):
            raise done[sig]
        return done[sig]

    yield get
    for folder in folders.values():
        for p in _ours(folder):
            try:
                p.kill()
            except psutil.Error:
                pass


@pytest.mark.slow
def test_sigkill_of_the_agent_ends_the_workers(tmp_path, reaper):
    def kill_agent() -> None:
        _wait_training(tmp_path, ranks=1)
        _agent(tmp_path).send_signal(signal.SIGKILL)

    rc, err = _run_here(tmp_path, *ONE_RANK, during=kill_agent)
    assert rc == 5, err
    _assert_none_left(tmp_path)
    # a rank killed by a signal is named from torchrun's report: test_classify_names_a_rank_killed_by_a_signal



@pytest.mark.slow
def test_sigkill_of_dlscale_ends_its_workers_and_the_next_start_cleans_up(signalled):
    case = signalled(signal.SIGKILL)
    if case.left is not None:  # processes still there 10 s after the kill
        raise case.left
    assert list((case.folder / "tmp").glob("dlscale-case-*"))  # left by the kill ...
    procs.clean_stale_tempdirs(str(case.folder / "tmp"))
    assert not list((case.folder / "tmp").glob("dlscale-*"))  # ... removed by the next start


@pytest.mark.slow
def test_sigterm_interrupts_like_ctrl_c(signalled):
    """SIGTERM dealt to a training `python -m dlscale`: exit 130, one line, its processes and temp
    folders gone, nothing stored. SIGHUP takes the same path (procs.interrupts installs one handler
    for both): the test below deals each of them to a command in this process."""
    case = signalled(signal.SIGTERM)
    assert case.rc == 130, case.err
    lines = [ln for ln in case.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "interrupted" in lines[0] and "no record" in lines[0], case.err
    if case.left is not None:  # processes still there 15 s after dlscale ended
        raise case.left
    assert not list((case.folder / "tmp").glob("dlscale-*"))
    assert not (case.folder / "store" / "results.jsonl").exists() or not (
        case.folder / "store" / "results.jsonl").read_text().strip()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_end_a_command_as_ctrl_c_does(monkeypatch, capsys, sig):
    """Either signal, arriving while a command runs, ends it as Ctrl-C does: exit 130 and one line
    naming the signal; the handler before the command is back after it."""
    from dlscale import cli
    from dlscale.commands import run as run_cmd

    before = signal.signal(sig, lambda *a: None)  # without dlscale's handler the signal is dropped here
    try:
        monkeypatch.setattr(run_cmd, "cmd_env", lambda args: signal.raise_signal(sig) or 0)
        assert cli.main(["env"]) == procs.EXIT_INTERRUPTED
        assert signal.getsignal(sig) is not procs._raise_interrupt  # the command's handler is gone again
    finally:
        signal.signal(sig, before)
    assert capsys.readouterr().err.strip() == f"dlscale: interrupted by {sig.name}"


# ----------------------------------------------------------------------------- failures say what happened

@pytest.mark.slow
def test_a_stopped_rank_times_out_named_and_is_not_left_stopped(tmp_path, reaper, oom_ahead, hung_ahead):
    def stop_rank_1() -> None:
        _wait_training(tmp_path)[1].send_signal(signal.SIGSTOP)
        oom_ahead.start()  # the wait for the time limit is idle: the out-of-memory and hung-rank cases
        hung_ahead.start()  # (below) run meanwhile

    # the time limit counts from torchrun's start; training starts ~6-10 s after it on 2 cores
    rc, err = _run_here(tmp_path, during=stop_rank_1, time_limit=25)
    assert rc == 4, err
    assert "rank 1" in err and "stopped" in err, err
    (rec,) = ResultStore(tmp_path / "store").load().records
    assert rec["status"] == "timeout" and rec["summary"] is None
    # the rank still answering said where it was when the limit struck (how the error line names
    # such stacks: tests/test_stacks.py)
    assert " in " in (rec["repeats"][0].get("rank_stacks") or {}).get("0", ""), rec["repeats"][0]
    _assert_none_left(tmp_path)


@pytest.mark.slow
def test_a_hung_rank_is_a_timeout_naming_it_not_a_failure_of_its_peer(hung_ahead):
    hung_ahead.start()  # unless the stopped-rank test has started it already
    rc, err = _finish(hung_ahead.proc, timeout=90)
    assert rc == 4, err
    assert "rank 1" in err and "did not reach" in err, err
    _assert_none_left(hung_ahead.folder)


@pytest.mark.slow
def test_a_cpu_allocation_failure_is_oom(oom_ahead):
    oom_ahead.start()  # unless the stopped-rank test has started it already
    rc, err = _finish(oom_ahead.proc, timeout=60)
    assert rc == 3, err
    assert "memory" in err, err
    _assert_none_left(oom_ahead.folder)


# ----------------------------------------------------------------------------- classify, without processes

def test_classify_names_a_rank_killed_by_a_signal():
    tail = """[rank0]: something
Root Cause (first observed failure):
[0]:
  time      : 2026-01-01_00:00:00
  host      : h
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 4242)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 4242
====="""
    status, error = launch.classify(ProcResult(1, False, 0.0, tail), [], 2)
    assert status == "failed" and error.startswith("rank 1 was killed by SIGKILL"), error


def test_classify_a_collective_timeout_blames_the_rank_that_never_arrived():
    ranks = [{"rank": 0, "status": "failed", "error": "RuntimeError: [../gloo/transport/tcp/pair.cc:534] "
              "Read error [127.0.0.1]:1234: Timed out waiting 4000ms for recv operation to complete"}]
    status, error = launch.classify(ProcResult(1, False, 0.0, ""), ranks, 2)
    assert status == "timeout" and "rank 1" in error and "did not reach" in error, error


def test_classify_a_time_limit_names_stopped_and_never_started_ranks():
    # rank 1 ran as pid 11 and was found stopped: named as the cause
    status, error = launch.classify(ProcResult(None, True, 0.0, "", stopped_pids=[11]), [], 2, started={0: 10, 1: 11})
    assert status == "timeout" and "rank 1 was stopped (SIGSTOP)" in error, error
    # rank 1 was stopped before it could say which pid it is: it never started, and a stopped process is reported
    status, error = launch.classify(ProcResult(None, True, 0.0, "", stopped_pids=[12]), [], 2, started={0: 10})
    assert status == "timeout" and "rank 1 never started" in error and "1 process(es)" in error, error


def test_classify_names_a_peer_node_that_never_joined():
    status, error = launch.classify(ProcResult(1, False, 0.0, "torch.distributed.DistStoreError: Timed out after 21 seconds "
                                    "waiting for clients. 1/2 clients joined."), [], 4)
    assert status == "timeout" and "never joined the rendezvous (1 of 2 nodes joined)" in error, error
    status, error = launch.classify(ProcResult(1, False, 0.0, "raise RendezvousTimeoutError\n"
                                    "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"), [], 4)
    assert status == "timeout" and "never joined" in error, error


def test_multinode_rendezvous_waits_for_peers_only_the_join_timeout():
    from dlscale.case.procs import Rendezvous

    assert Rendezvous(nnodes=2, rdzv_endpoint="h:1", join_timeout=20.0).torchrun_args()[-2:] == [
        "--rdzv-conf", "join_timeout=20"]
    assert Rendezvous(nnodes=2, master_addr="h", join_timeout=20.0).torchrun_args()[-2:] == [
        "--rdzv-conf", "timeout=20"]


def test_an_interrupt_lost_in_a_fork_hook_ends_the_command_at_the_next_start(tmp_path):
    """A KeyboardInterrupt that Python drops (raised inside an at-fork hook) is raised again where the
    next process would start, and none starts; the command ends as for any interrupt."""
    marker = tmp_path / "started"
    with procs.interrupts():
        try:
            procs._raise_interrupt(signal.SIGINT, None)  # the handler ran; its exception was swallowed
        except KeyboardInterrupt:
            pass
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            procs.spawn([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], time_limit=10)
    assert not marker.exists()
    with procs.interrupts():  # the next command starts afresh
        procs.raise_if_interrupted()
