"""Test-suite rules that apply to every test.

A test that starts a process (a worker, torchrun, a browser, the dlscale CLI in a subprocess) must
be marked ``slow``: ``pytest -m "not slow"`` is the quick tier a developer runs while editing, and
it must stay under a minute. An unmarked test that starts one fails here, naming the command.
Short-lived system tools (git, nvidia-smi, ip, ...) that the code under test asks for facts do
not count: they are part of reading the environment, not of running a benchmark.
"""
from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
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
