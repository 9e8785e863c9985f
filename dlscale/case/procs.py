"""Starting process trees with a wall-clock limit that always ends them.

Every process dlscale starts for a measurement goes through ``spawn`` (``spawn_torchrun`` for
torchrun). What ends them, in each way a case can end:

* the case ends (exit, time limit, Ctrl-C, SIGTERM, SIGHUP): ``kill_tree`` SIGKILLs every
  descendant. torchrun starts each worker in a session of its own, so killing the agent's process
  group does not reach them; ``spawn`` therefore keeps a list of the tree's processes (psutil,
  refreshed while it waits, collected again before any kill) and signals each one, SIGCONT first
  so that a stopped process ends too.
* dlscale is SIGKILLed (nothing of it runs any more): a parent-death signal. The agent is started
  with ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and every worker sets it on itself as its first act
  (``die_with_parent``), so the kernel kills each level when the level above it dies: dlscale ->
  agent -> workers; the hardware sampler watches its stdin pipe from the worker and leaves at EOF.
  We chose the kernel's signal over a watched pipe or a pid file: it needs no thread or poll in
  the worker (nothing extra near the timed window) and fires even when the parent is SIGKILLed.
* temp folders a SIGKILL left behind carry the dead owner's pid in their name
  (``dlscale-case-<pid>-...``); the next start removes them (``clean_stale_tempdirs``).

``interrupts()`` turns SIGTERM and SIGHUP into KeyboardInterrupt, so every command that starts
processes ends them and its temp folders on those signals as on Ctrl-C (exit 130).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

PR_SET_PDEATHSIG = 1
LAUNCHER_PID_ENV = "DLSCALE_LAUNCHER_PID"  # the dlscale process that owns a case's processes
TEMP_PREFIXES = ("dlscale-case-", "dlscale-traces-", "dlscale-node-", "dlscale-task-")
POLL_S = 1.0  # how often the tree's process list is refreshed while waiting
EXIT_INTERRUPTED = 130  # what a command interrupted by Ctrl-C, SIGTERM or SIGHUP exits with (128 + SIGINT)


@dataclass
class ProcResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    output_tail: str = ""
    command: list[str] = field(default_factory=list)
    started: float | None = None  # wall clock (epoch s) when the process was spawned
    stopped_pids: list[int] = field(default_factory=list)  # processes found stopped (SIGSTOP) at the time limit


@dataclass
class Rendezvous:
    """How ranks find each other. ``standalone`` for one machine (torchrun --standalone)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    max_restarts: int = 0
    # seconds to wait for every node to join; a peer that never joins ends the case then, not at its time limit
    join_timeout: float | None = None

    def torchrun_args(self) -> list[str]:
        if self.nnodes == 1 and not self.rdzv_endpoint and not self.master_addr:
            return ["--standalone", "--nnodes", "1"] + (
                ["--max-restarts", str(self.max_restarts)] if self.max_restarts else [])
        args = ["--nnodes", str(self.nnodes)]
        if self.rdzv_endpoint:
            args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", self.rdzv_endpoint]
        else:
            args += ["--node-rank", str(self.node_rank), "--master-addr", str(self.master_addr),
                     "--master-port", str(self.master_port or 29500)]
        if self.max_restarts:
            args += ["--max-restarts", str(self.max_restarts)]
        if self.join_timeout is not None:  # torchrun's rendezvous settings: c10d's join_timeout, static's timeout
            key = "join_timeout" if self.rdzv_endpoint else "timeout"
            args += ["--rdzv-conf", f"{key}={max(1, int(self.join_timeout))}"]
        return args


def torchrun_command(module: str, module_args: Sequence[str], nproc_per_node: int,
                     rdzv: Rendezvous | None = None) -> list[str]:
    """The torchrun command line that runs ``python -m module module_args`` on every rank."""
    rdzv = rdzv or Rendezvous()
    return [sys.executable, "-m", "torch.distributed.run", *rdzv.torchrun_args(),
            "--nproc-per-node", str(nproc_per_node), "-m", module, *module_args]


# ----------------------------------------------------------------------------- parent death

def _prctl():
    """libc's prctl, or None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes  # ctypes: keeps the CLI start-up light

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``sig`` to this process when its parent dies (Linux; else a no-op).

    Called first thing by the workers, only when run as a program (never on import). A parent
    that died before this call is caught by the checks after it: we were re-parented already
    (to init, when dlscale started us), or the dlscale that started the case is gone; then we
    leave. Returns whether it is armed.
    """
    parent = os.getppid()
    prctl = _prctl()
    if prctl is None or prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        return False
    launcher = int(os.environ.get(LAUNCHER_PID_ENV) or 0)
    orphaned = launcher > 1 and (parent == 1 or not _alive(launcher))
    if os.getppid() != parent or orphaned:
        os._exit(1)
    return True


def _pdeathsig_preexec(parent: int, prctl) -> Callable[[], None]:
    """preexec_fn for a direct child: SIGKILL it when dlscale dies (``prctl`` looked up before fork)."""
    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # dlscale died between fork and prctl
            os.kill(os.getpid(), signal.SIGKILL)
    return arm


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ----------------------------------------------------------------------------- the process tree

class _Tree:
    """The processes below a root, remembered as they appear, so that orphans (re-parented to
    init when their parent died) are still ours to end."""

    def __init__(self, pid: int):
        self.pid = pid
        self.known: dict[int, object] = {}  # pid -> psutil.Process (identity survives pid reuse)
        self.leftovers: list[str] = []  # temp files a process would remove at its own orderly end

    def refresh(self) -> None:
        try:
            import psutil  # optional: psutil

            root = psutil.Process(self.pid)
            for p in [root] + root.children(recursive=True):
                if p.pid not in self.known:
                    self.known[p.pid] = p
                    self._note_leftovers(p)
        except Exception:  # noqa: BLE001 - the root is gone or psutil is missing: keep what we know
            pass

    def _note_leftovers(self, p) -> None:
        """The hardware sampler names its temp files (``--orphan-cleanup PATH``); one killed by a
        signal (torchrun signals a worker's whole process group) cannot remove them itself."""
        try:
            args = p.cmdline()
        except Exception:  # noqa: BLE001 - gone
            return
        self.leftovers += [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--orphan-cleanup"]

    def remove_leftovers(self) -> None:
        """Once the tree has ended: remove the temp files its processes could not."""
        if self.alive():
            return
        for path in self.leftovers:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def alive(self) -> list:
        out = []
        for p in self.known.values():
            try:
                if p.is_running() and p.status() != "zombie":
                    out.append(p)
            except Exception:  # noqa: BLE001 - gone
                continue
        return out

    def stopped(self) -> list[int]:
        out = []
        for p in self.alive():
            try:
                if p.status() in ("stopped", "tracing-stop"):
                    out.append(p.pid)
            except Exception:  # noqa: BLE001
                continue
        return out

    def signal_all(self, sig: int) -> None:
        for p in self.alive():
            try:
                p.send_signal(sig)
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue


def kill_tree(proc: subprocess.Popen, grace: float = 5.0, tree: _Tree | None = None) -> None:
    """End ``proc`` and every descendant: SIGCONT to all, SIGTERM to ``proc`` and its children,
    SIGKILL to whatever is left after ``grace`` seconds.

    Descendants are collected before any signal (afterwards an orphan is no longer below us)
    and signalled one by one as well as by process group: torchrun's workers live in sessions of
    their own, out of reach of the agent's group. Deeper processes (a worker's sampler) get no
    SIGTERM: they notice their parent's end and clean up after themselves, or get the SIGKILL.
    """
    tree = tree or _Tree(proc.pid)
    tree.refresh()
    tree.signal_all(signal.SIGCONT)  # a stopped process acts on nothing but SIGKILL otherwise
    top = [proc.pid]
    try:
        import psutil  # optional: psutil

        top += [c.pid for c in psutil.Process(proc.pid).children()]
    except Exception:  # noqa: BLE001 - the root is gone (or no psutil): SIGKILL does the rest
        pass
    for pid in top:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGKILL:
            tree.signal_all(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            tree.refresh()  # children the agent started while shutting down
            if proc.poll() is not None and not tree.alive():
                return
            time.sleep(0.1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=1.0)


# ----------------------------------------------------------------------------- signals and temp folders

# one interrupt per command: further signals let its clean-up finish
_ENDING: dict = {"interrupted": False, "depth": 0, "name": ""}


def _raise_interrupt(signum, frame):  # noqa: ARG001
    if _ENDING["interrupted"]:
        return  # a burst: a second KeyboardInterrupt would abort the finally blocks ending the first
    _ENDING.update(interrupted=True, name=signal.Signals(signum).name)
    raise KeyboardInterrupt(_ENDING["name"])


def raise_if_interrupted() -> None:
    """Raise the command's interrupt again where it was lost: Python drops an exception raised while
    it runs an at-fork or finaliser hook (a signal landing as a process forks), and a later signal is
    ignored as part of the burst, so the command would run on. Checked where a process starts."""
    if _ENDING["interrupted"] and _ENDING["depth"] > 0:
        raise KeyboardInterrupt(_ENDING["name"])


@contextlib.contextmanager
def interrupts(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP raise KeyboardInterrupt inside (once; see ``raise_if_interrupted``):
    the ``finally`` blocks that end processes and remove temp folders run, and the command exits 130.
    Main thread only (elsewhere signal handlers cannot be set); nests."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _ENDING["depth"] == 0:
        _ENDING["interrupted"] = False
    old = {}
    for s in signals:
        try:
            old[s] = signal.signal(s, _raise_interrupt)
        except (ValueError, OSError):
            continue
    _ENDING["depth"] += 1
    try:
        yield
    finally:
        _ENDING["depth"] -= 1
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def uninterrupted(signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)) -> Iterator[None]:
    """Hold the interrupting signals off inside (a record's append is never torn); main thread only."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(signals)) if main else None
    try:
        yield
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


def temp_prefix(kind: str) -> str:
    """A temp folder prefix that names its owner, so a later start can tell an abandoned one."""
    return f"dlscale-{kind}-{os.getpid()}-"


def clean_stale_tempdirs(root: str | None = None) -> list[str]:
    """Remove dlscale temp folders whose owner process is gone (a SIGKILLed dlscale's)."""
    root = root or tempfile.gettempdir()
    removed = []
    pat = re.compile(r"dlscale-(?:case|traces|node|task)-(\d+)-")
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        m = pat.match(name)
        if not m or int(m.group(1)) == os.getpid() or _alive(int(m.group(1))):
            continue
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# ----------------------------------------------------------------------------- spawning

def _settle(tree: _Tree, wait: float = 2.0) -> None:
    """Wait (briefly) until the SIGKILLed tree is gone, then remove its leftover temp files."""
    deadline = time.monotonic() + wait
    while tree.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    tree.remove_leftovers()


def _wait(proc: subprocess.Popen, tree: _Tree, deadline: float,
          on_deadline: Callable[[list[int]], None] | None) -> tuple[bool, list[int]]:
    """Wait for ``proc`` until the monotonic ``deadline``; past it, tell ``on_deadline`` which of the
    tree's processes are stopped and kill the tree. (timed out, the stopped pids)."""
    while True:
        tree.refresh()
        left = deadline - time.monotonic()
        if left <= 0:
            tree.refresh()
            stopped = tree.stopped()
            if on_deadline is not None:
                with contextlib.suppress(Exception):
                    on_deadline(list(stopped))
            kill_tree(proc, tree=tree)
            return True, stopped
        try:
            proc.wait(timeout=min(POLL_S, left))
            return False, []
        except subprocess.TimeoutExpired:
            continue


def spawn(cmd: Sequence[str], time_limit: float, env: dict[str, str] | None = None,
          on_line: Callable[[str], None] | None = None, tail_lines: int = 200,
          cwd: str | None = None, on_deadline: Callable[[list[int]], None] | None = None) -> ProcResult:
    """Run ``cmd`` in a new session; kill the whole tree once ``time_limit`` seconds pass.

    ``on_deadline(stopped_pids)`` runs when the time limit strikes, before the tree is killed
    (the launcher asks the ranks where they are: dlscale/case/stacks.py); its failures are ignored.

    Output (stdout and stderr merged) is streamed line by line to ``on_line`` and its last
    ``tail_lines`` lines are kept for the error text of a failed case. The tree ends with this
    call however it returns (see the module docstring).
    """
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    full_env[LAUNCHER_PID_ENV] = str(os.getpid())
    prctl = _prctl()
    preexec = _pdeathsig_preexec(os.getpid(), prctl) if prctl is not None else None
    tail: deque[str] = deque(maxlen=tail_lines)
    with interrupts():
        raise_if_interrupted()
        started, start = time.time(), time.monotonic()
        proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=full_env, cwd=cwd, start_new_session=True, bufsize=1,
                                errors="replace", preexec_fn=preexec)
        tree = _Tree(proc.pid)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
                if on_line:
                    on_line(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            raise_if_interrupted()  # a signal that landed while Popen forked
            timed_out, stopped = _wait(proc, tree, start + time_limit, on_deadline)
        except BaseException:  # Ctrl-C, SIGTERM, SIGHUP: never leave workers behind
            kill_tree(proc, grace=2.0, tree=tree)
            _settle(tree)
            raise
        # the agent exited: no orphaned worker (or its sampler) may survive it
        tree.signal_all(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        _settle(tree)
        reader.join(timeout=5)
    return ProcResult(proc.returncode, timed_out, time.monotonic() - start, "\n".join(tail), list(cmd), started,
                      stopped)


def spawn_torchrun(module: str, module_args: Sequence[str], nproc_per_node: int, time_limit: float,
                   rdzv: Rendezvous | None = None, **spawn_kw: Any) -> ProcResult:
    """Start ``python -m module`` on ``nproc_per_node`` ranks through torchrun, bounded in time;
    ``spawn_kw``: ``spawn``'s env, on_line and on_deadline."""
    return spawn(torchrun_command(module, module_args, nproc_per_node, rdzv), time_limit, **spawn_kw)
