"""``python tests/tools/driver_here.py ARGS``: ``benchmarks/run.py ARGS`` in this process, its
one-process torch CPU cases trained here (conftest.py ``one_process_here``: the same `dlscale run`,
record and store, without a torchrun and a worker to start for each); everything else it runs
(its cases of several processes, bare loops, commands, table scripts) as the driver always does.

``python tests/tools/driver_here.py --many PLAN.json``: several such driver runs, one after the other,
in this one process (one interpreter's imports for all of them): PLAN.json lists, for each run, its
``argv`` and the files for its ``stdout``, ``stderr`` and exit code (``rc``, written when it ends).
Each run sees the environment as the process started, and writes to its own files as a process of
its own would (file descriptors 1 and 2, which the processes it starts inherit).

tests/test_bench.py starts the tiny suites it runs beside its own work this way.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DRIVER = TESTS.parent / "benchmarks" / "run.py"


def one(argv: list[str]) -> int:
    """``benchmarks/run.py ARGV`` here; its exit code."""
    sys.argv = [str(DRIVER), *argv]
    try:
        runpy.run_path(str(DRIVER), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0


def many(plan: list[dict]) -> None:
    env = dict(os.environ)
    for run in plan:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(run["stdout"], "w") as out, open(run["stderr"], "w") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                code = one(run["argv"])
            except Exception:  # noqa: BLE001 - the traceback in its stderr, as a process would leave it
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        os.environ.clear()
        os.environ.update(env)  # the driver sets the hosts' variables: not for the next run
        Path(run["rc"] + ".tmp").write_text(str(code))
        os.replace(run["rc"] + ".tmp", run["rc"])


if __name__ == "__main__":
    sys.path.insert(0, str(TESTS))
    from conftest import one_process_here  # noqa: E402

    args = sys.argv[1:]
    with one_process_here():
        if args[:1] == ["--many"]:
            many(json.loads(Path(args[1]).read_text()))
        else:
            sys.exit(one(args))
