"""``python tests/tools/driver_here.py ARGS``: ``benchmarks/run.py ARGS`` in this process, its
one-process torch CPU cases trained here (conftest.py ``one_process_here``: the same `dlscale run`,
record and store, without a torchrun and a worker to start for each); everything else it runs
(its cases of several processes, bare loops, commands, table scripts) as the driver always does.

tests/test_bench.py starts the tiny suites it runs beside its own work this way.
"""
from __future__ import annotations

import runpy
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DRIVER = TESTS.parent / "benchmarks" / "run.py"

if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    from conftest import one_process_here  # noqa: E402

    sys.argv = [str(DRIVER), *sys.argv[1:]]
    with one_process_here():
        runpy.run_path(str(DRIVER), run_name="__main__")
