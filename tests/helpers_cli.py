"""``dlscale ARGS`` run inside the test process, as ``python -m dlscale ARGS`` would run it.

A fresh ``python -m dlscale`` spends ~5 s of a 2-core machine importing torch and reading the
environment before it starts anything; the CLI's ``main`` in this process skips that and runs the
same code: the same checks, the same torchrun agent and gloo workers (real processes), the same
record. ``sys.argv`` is what ``python -m dlscale`` would see (the record keeps the command), and
``env`` is set for the call (the processes it starts inherit it). Tests of the process itself
(signals, exit codes of the interpreter, a SIGKILLed launcher) still start ``python -m dlscale``.

``dlscale_many`` runs several such calls at once (threads of this process; each call's torchrun
and workers are its own real processes). A case spends much of its time in one process on one
core (the agent starting, a 1-process run, the exit), so two at a time keep both cores of a
2-core machine busier; ``cases``/``selected_cases`` let a module name the cases its selected tests
need, so they can be run that way before the tests read them.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence
from unittest import mock

import pytest


def dlscale(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """(returncode, stdout, stderr) of ``dlscale ARGS``, run in this process; the call's wall-clock
    seconds as ``seconds``."""
    from dlscale.cli import main

    argv = [str(a) for a in args]
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(sys, "argv", ["dlscale", *argv]), mock.patch.dict(os.environ, env or {}):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse's own errors
            rc = e.code if isinstance(e.code, int) else 1
    done = subprocess.CompletedProcess(["dlscale", *argv], rc, out.getvalue(), err.getvalue())
    done.seconds = time.monotonic() - t0
    return done


class _ByThread(io.TextIOBase):
    """sys.stdout or sys.stderr while several calls run at once: a call's thread writes into that
    call's buffer, any other thread (a call's output pump, say) into the stream this replaced."""

    def __init__(self, fallback):
        super().__init__()
        self.fallback = fallback
        self.buffers: dict[int, io.StringIO] = {}

    def _target(self):
        return self.buffers.get(threading.get_ident(), self.fallback)

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        return self._target().write(s)

    def flush(self) -> None:
        self._target().flush()


class _ArgvByThread(list):
    """sys.argv while several calls run at once: each call's thread reads its own (the record
    keeps the command from it), any other thread the list this replaced."""

    def __init__(self, base: list[str]):
        super().__init__(base)
        self.by_thread: dict[int, list[str]] = {}

    def _cur(self) -> list[str]:
        return self.by_thread.get(threading.get_ident(), list(super().__iter__()))

    def __getitem__(self, i):
        return self._cur()[i]

    def __iter__(self):
        return iter(self._cur())

    def __len__(self) -> int:
        return len(self._cur())


def dlscale_many(calls: Sequence[Sequence[str]], workers: int = 2) -> list[subprocess.CompletedProcess | BaseException]:
    """``dlscale ARGS`` for each ARGS in ``calls``, ``workers`` at a time, in threads of this process.

    Returns, in the order of ``calls``, each call's (returncode, stdout, stderr), with the call's
    wall-clock seconds as ``seconds``, or the exception it raised. Each call sees its own
    ``sys.argv`` and output streams; the environment is this process's for all of them (it cannot
    differ per thread): set what the calls share before."""
    from dlscale.cli import main

    out, err, argvs = _ByThread(sys.stdout), _ByThread(sys.stderr), _ArgvByThread(sys.argv)
    results: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        argv = [str(a) for a in calls[i]]
        me, o, e = threading.get_ident(), io.StringIO(), io.StringIO()
        out.buffers[me], err.buffers[me], argvs.by_thread[me] = o, e, ["dlscale", *argv]
        t0 = time.monotonic()
        try:
            try:
                rc = main(argv)
            except SystemExit as ex:  # argparse's own errors
                rc = ex.code if isinstance(ex.code, int) else 1
            results[i] = subprocess.CompletedProcess(["dlscale", *argv], rc, o.getvalue(), e.getvalue())
            results[i].seconds = time.monotonic() - t0
        except BaseException as ex:  # noqa: BLE001 - handed to the test that needs this call
            results[i] = ex
        finally:
            del out.buffers[me], err.buffers[me], argvs.by_thread[me]

    with mock.patch.object(sys, "stdout", out), mock.patch.object(sys, "stderr", err), \
            mock.patch.object(sys, "argv", argvs):
        pool = ThreadPoolExecutor(max_workers=workers)
        try:
            for f in [pool.submit(one, i) for i in range(len(calls))]:
                f.result()
        finally:  # Ctrl-C: no call starts after it; those running end within their time limits
            pool.shutdown(wait=True, cancel_futures=True)
    return results


def names(*parts: str) -> str:
    """A ``pytest.raises(..., match=)`` pattern: a one-line message that names each of ``parts``
    (literally, in any order). What a refusal must say (the option, the value, what is allowed)
    without pinning the sentence around it."""
    return r"^(?![\s\S]*\n)" + "".join(f"(?=.*{re.escape(p)})" for p in parts)


def cases(*keys) -> pytest.MarkDecorator:

    """``@cases(KEY, ...)``: the cases (hashable keys, the module's own kind) a test reads."""
    return pytest.mark.cases(*keys)


def selected_cases(request: pytest.FixtureRequest) -> list:
    """The keys that the selected tests of the requesting module name with ``@cases``, in test
    order, each once: what a module-scoped fixture can run before those tests read them."""
    keys: list = []
    for item in request.session.items:
        if getattr(item, "module", None) is request.module and not _skipped(item):
            for mark in item.iter_markers("cases"):
                keys += [k for k in mark.args if k not in keys]
    return keys


def _skipped(item: pytest.Item) -> bool:
    """Marked skip, or skipif with a condition that is already True (strings are not evaluated)."""
    if any(True for _ in item.iter_markers("skip")):
        return True
    return any((m.args[0] if m.args else m.kwargs.get("condition")) is True for m in item.iter_markers("skipif"))


class RunsAhead:
    """A module's cases, run a few ahead of the tests that read them, two at a time.

    ``start(request)`` (from a module-scoped fixture) makes the cases the selected tests name with
    ``@cases`` pending, in test order. ``take(key)`` gives the result of ``key``'s run: when it has
    not run yet it runs now, with the next pending cases (``ahead`` in all; None: all of them), through
    ``dlscale_many``; None when it ran alone (the caller runs it as before). ``cost(key)``, when
    given, orders each such batch, the costliest first: the pool then ends on short cases and both
    workers stay busy to the end (a long case started last would run alone). ``finish(request)``
    fails when a named case was never taken (a test's ``@cases`` and its reads disagree)."""

    def __init__(self, args_of, ahead: int | None = 4, workers: int = 2, cost=None):
        self.args_of, self.ahead, self.workers, self.cost = args_of, ahead, workers, cost
        self.pending: list = []
        self.done: dict = {}

    def start(self, request: pytest.FixtureRequest) -> None:
        self.pending, self.done = selected_cases(request), {}

    def take(self, key) -> subprocess.CompletedProcess | None:
        if key not in self.done:
            others = [k for k in self.pending if k != key]
            keys = [key] + (others if self.ahead is None else others[:self.ahead - 1])
            self.pending = [k for k in self.pending if k not in keys]
            if len(keys) == 1:
                return None
            if self.cost is not None:
                keys.sort(key=self.cost, reverse=True)  # stable: equal costs keep the tests' order
            self.done.update(zip(keys, dlscale_many([self.args_of(k) for k in keys], self.workers)))
        got = self.done.pop(key)
        if isinstance(got, BaseException):
            raise got
        return got

    def finish(self, request: pytest.FixtureRequest) -> None:
        left = sorted(map(str, self.pending + list(self.done)))
        self.pending, self.done = [], {}
        if left and not request.session.testsfailed:
            pytest.fail(f"cases named by @cases that no test read (fix the tests' @cases): {left}")
