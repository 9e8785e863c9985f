"""Starting torchrun process groups with a wall-clock limit that always ends them.

Every process dlscale starts for a measurement goes through ``spawn_torchrun``: one
``torchrun`` (``python -m torch.distributed.run``) in its own session, so that on a time-out
the whole tree (agent and workers) is killed, never left hanging.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class ProcResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    output_tail: str = ""
    command: list[str] = field(default_factory=list)
    started: float | None = None  # wall clock (epoch s) when the process was spawned


@dataclass
class Rendezvous:
    """How ranks find each other. ``standalone`` for one machine (torchrun --standalone)."""

    nnodes: int = 1
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | None = None
    rdzv_endpoint: str | None = None
    max_restarts: int = 0

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
        return args


def torchrun_command(module: str, module_args: Sequence[str], nproc_per_node: int,
                     rdzv: Rendezvous | None = None) -> list[str]:
    """The torchrun command line that runs ``python -m module module_args`` on every rank."""
    rdzv = rdzv or Rendezvous()
    return [sys.executable, "-m", "torch.distributed.run", *rdzv.torchrun_args(),
            "--nproc-per-node", str(nproc_per_node), "-m", module, *module_args]


def kill_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process session, then SIGKILL whatever is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            # the agent may be gone while workers linger in the group: make sure
            if sig == signal.SIGTERM:
                time.sleep(0.2)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            return
        except subprocess.TimeoutExpired:
            continue


def spawn(cmd: Sequence[str], time_limit: float, env: dict[str, str] | None = None,
          on_line: Callable[[str], None] | None = None, tail_lines: int = 200,
          cwd: str | None = None) -> ProcResult:
    """Run ``cmd`` in a new session; kill the whole tree once ``time_limit`` seconds pass.

    Output (stdout and stderr merged) is streamed line by line to ``on_line`` and its last
    ``tail_lines`` lines are kept for the error text of a failed case.
    """
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    started, start = time.time(), time.monotonic()
    proc = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=full_env, cwd=cwd, start_new_session=True, bufsize=1,
                            errors="replace")
    tail: deque[str] = deque(maxlen=tail_lines)
    timed_out = False

    import threading

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if on_line:
                on_line(line.rstrip("\n"))

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=time_limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_tree(proc)
    except BaseException:  # Ctrl-C: never leave workers behind
        kill_tree(proc)
        raise
    else:
        # the agent exited: make sure no orphaned worker survives in its session
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    reader.join(timeout=5)
    return ProcResult(proc.returncode, timed_out, time.monotonic() - start, "\n".join(tail), list(cmd), started)


def spawn_torchrun(module: str, module_args: Sequence[str], nproc_per_node: int, time_limit: float,
                   env: dict[str, str] | None = None, rdzv: Rendezvous | None = None,
                   on_line: Callable[[str], None] | None = None) -> ProcResult:
    """Start ``python -m module`` on ``nproc_per_node`` ranks through torchrun, bounded in time."""
    return spawn(torchrun_command(module, module_args, nproc_per_node, rdzv), time_limit, env=env,
                 on_line=on_line)
