"""Test-suite rules that apply to every test.

A test that starts a process (a worker, torchrun, a browser, the dlscale CLI in a subprocess) must
be marked ``slow``: ``pytest -m "not slow"`` is the quick tier a developer runs while editing, and
it must stay under half a minute on two cores. An unmarked test that starts one fails here, naming the command.
Short-lived system tools (git, nvidia-smi, ip, ...) that the code under test asks for facts do
not count: they are part of reading the environment, not of running a benchmark.
"""
from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

# Bytecode caches are written whatever the environment says. The suite starts a few hundred Python
# processes that import torch; where PYTHONDONTWRITEBYTECODE is set and a package was installed
# without byte-compiling (pip --no-compile; this repo's own modules in the editable install), every
# one of them would compile it from source again: with torch so installed, a tiny 2-process run took
# 50 s instead of 16 s on 2 cores. Written once, read by every later process (this one and all it
# starts).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

_TOOLS = {"git", "nvidia-smi", "ldconfig", "ip", "uname", "lscpu", "hostname", "nproc", "which", "scontrol", "sinfo",
          "lsblk", "df", "free", "numactl", "sbatch", "squeue",
          "fc-list"}  # matplotlib's font manager, once per fresh environment, to build its font cache


def _is_tool(args) -> bool:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args or [])
    if not argv:
        return False
    first = str(argv[0]).split()[0] if isinstance(argv[0], str) else str(argv[0])
    if Path(first).name in ("bash", "sh") and len(argv) > 1 and argv[1] == "-n":
        return True  # a syntax check of a generated script runs nothing
    return Path(first).name in _TOOLS


@pytest.fixture(autouse=True)
def _process_starting_tests_are_slow(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    started: list[str] = []
    real_popen = subprocess.Popen.__init__
    real_start = multiprocessing.process.BaseProcess.start

    def popen(self, args, *a, **kw):
        if not _is_tool(args):
            started.append(str(args)[:120])
        return real_popen(self, args, *a, **kw)

    def start(self):
        started.append(f"multiprocessing {self.name}")
        return real_start(self)

    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    if started:
        pytest.fail(f"this test starts a process ({started[0]}) but is not marked slow", pytrace=False)


# ---------------------------------------------------------------- one-process runs (`single` references) trained in this process

_HERE_LOCK = threading.Lock()


def _train_here(cfg, workdir: Path, env: dict[str, str], on_line):
    """One repeat of a one-process case as dlscale/train/worker.py's ``main`` runs it, but in this process on a
    one-rank gloo group (no torchrun, no interpreter to start): the same ``train``, the same
    ``rank0.json`` for the launcher to merge, phase lines to the spawner's ``on_line``; no
    hardware sampler and no stack dump at the time limit (nothing here can stop a hung step)."""
    import dataclasses
    import datetime as dt
    import json
    import time

    import torch
    import torch.distributed as dist

    from dlscale.case import progress, rankfiles
    from dlscale.train import worker
    from dlscale.case.procs import ProcResult
    from dlscale.strategies import DistEnv

    t0, m0 = time.time(), time.monotonic()
    threads = torch.get_num_threads()
    # as the worker's OMP_NUM_THREADS; unset, one thread (as torchrun gives each of several workers):
    # this process shares the cores with the suite's other workers, and torch's default (a thread
    # per core) on busy cores makes a tiny step several times slower
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or 1))
    denv = DistEnv(0, 1, 0, 1, torch.device("cpu"), "gloo")
    result = worker.new_result(denv, t0)
    rankfiles.write_started(workdir, 0)
    lines: list[str] = []

    def phase(name, event, rank=0, **info):
        if rank == 0:
            lines.append(progress.MARK + json.dumps({"phase": name, "event": event, "t": time.time(), **info}))
            if on_line is not None:
                on_line(lines[-1])

    code = 0
    try:
        with pytest.MonkeyPatch.context() as mp, torch.random.fork_rng(devices=[]):
            mp.setattr(progress, "phase", phase)
            dist.init_process_group("gloo", init_method=(workdir / "pg-store").as_uri(), rank=0, world_size=1,
                                    timeout=dt.timedelta(seconds=cfg.collective_timeout))
            result["marks"]["process_group"] = time.time()
            # no hardware sampler: it would sample this process's parent (a worker's is torchrun's agent)
            worker.train(dataclasses.replace(cfg, monitor=False), denv, result, workdir)
    except Exception as e:  # noqa: BLE001 - recorded as the worker records it
        code = worker.record_failure(result, e)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        result["marks"]["finished"] = time.time()
        rankfiles.write_result(workdir, 0, result)
        if hasattr(on_line, "close"):
            on_line.close()
    return ProcResult(code, False, time.monotonic() - m0, "\n".join(lines[-20:]),
                      ["(in the test process)", "dlscale.train.worker"], t0)


@contextlib.contextmanager
def one_process_here(when=lambda cfg: True):
    """Inside, `dlscale run` (in this process) trains each one-process torch CPU case (`single`, or
    another strategy at one rank) that ``when(cfg)`` accepts here, on a one-rank gloo group,
    instead of starting torchrun and a worker (~16 CPU-s of imports on 2 cores for a tiny
    reference run); every other case starts torchrun as before. The record is made, checked and
    stored by the same code. (tests/tools/driver_here.py applies it to a benchmark driver process.)"""
    import torch.distributed as dist

    from dlscale.case import launch

    real = launch.TorchrunSpawner

    class Here(real):
        def start(self, cfg, workdir, env):
            if cfg.world_size == 1 and cfg.framework == "torch" and cfg.device == "cpu" and when(cfg):
                with _HERE_LOCK:  # one default process group per process: one such run at a time
                    if not dist.is_initialized():
                        return _train_here(cfg, workdir, env, self.on_line)
            return super().start(cfg, workdir, env)

    launch.TorchrunSpawner = Here
    try:
        yield
    finally:
        launch.TorchrunSpawner = real


@pytest.fixture(scope="module")
def single_in_process():
    """``with single_in_process(when):`` ``one_process_here(when)``: the one-process CPU cases that
    ``when(cfg)`` accepts train in this process."""
    return one_process_here
