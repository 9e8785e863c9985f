"""``dlscale ARGS`` run inside the test process, as ``python -m dlscale ARGS`` would run it.

A fresh ``python -m dlscale`` spends ~5 s of a 2-core machine importing torch and reading the
environment before it starts anything; the CLI's ``main`` in this process skips that and runs the
same code: the same checks, the same torchrun agent and gloo workers (real processes), the same
record. ``sys.argv`` is what ``python -m dlscale`` would see (the record keeps the command), and
``env`` is set for the call (the processes it starts inherit it). Tests of the process itself
(signals, exit codes of the interpreter, a SIGKILLed launcher) still start ``python -m dlscale``.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from unittest import mock


def dlscale(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """(returncode, stdout, stderr) of ``dlscale ARGS``, run in this process."""
    from dlscale.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "argv", ["dlscale", *argv]), mock.patch.dict(os.environ, env or {}):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own errors
            rc = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["dlscale", *argv], rc, out.getvalue(), err.getvalue())
