"""``python tests/tools/dlscale_here.py [--here KEY=VALUE] ARGS``: ``python -m dlscale ARGS``, its
one-process torch CPU cases whose configuration has KEY=VALUE (every one without ``--here``) trained
in this process (conftest.py ``one_process_here``: the same record and store, without a torchrun and a
worker to start); every other case starts its processes as always. For tests of the dlscale process
itself (its signals, its exit code) that need only some of its cases as real processes.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    from conftest import one_process_here  # noqa: E402

    args = sys.argv[1:]
    when = lambda cfg: True  # noqa: E731
    if args[:1] == ["--here"]:
        key, value = args[1].split("=", 1)
        when = lambda cfg: str(getattr(cfg, key)) == value  # noqa: E731
        args = args[2:]
    sys.argv = ["dlscale", *args]
    with one_process_here(when):
        runpy.run_module("dlscale", run_name="__main__", alter_sys=True)
