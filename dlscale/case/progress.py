"""Progress of a case's long phases (rendezvous, build, compile, warm-up, after-window extras).

Worker side: rank 0 prints one machine-readable line when a phase starts and ends
(``phase(...)``), and now and then during warm-up; never inside the timed window. Launcher side:
``PhasePrinter`` is the ``on_line`` callback of the spawned torchrun: it reads those lines and
says what runs and for how long, only for phases that last (a phase done within ``quiet_s`` prints
nothing); other output lines pass to ``passthrough`` (``--verbose``) or are dropped.

Line format: ``@dlscale-phase {"phase": "compile", "event": "start", "t": 1795305645.49, ...}``
(event: start, progress, end). torchrun may prefix a worker's lines; the mark is searched anywhere.
"""
from __future__ import annotations

import json
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, TextIO

MARK = "@dlscale-phase "
EVENTS = ("start", "progress", "end")
PHASE_TEXT = {"rendezvous": "rendezvous and process-group start", "build": "model and strategy build",
              "compile": "torch.compile (first step)", "warmup": "warm-up", "breakdown": "step-time breakdown",
              "profile": "profiler trace", "window": "timed window",
              "until": "training to the quality target"}


def phase(name: str, event: str, rank: int = 0, **info: Any) -> None:
    """Worker side: announce a phase event on rank 0's stdout (one flushed line)."""
    if rank != 0:
        return
    print(MARK + json.dumps({"phase": name, "event": event, "t": time.time(), **info}), flush=True)


class WarmupTicker:
    """Worker side: ``tick(i)`` after warm-up step i; a progress line at most every ``every_s``."""

    def __init__(self, total: int, rank: int, every_s: float = 5.0):
        self.total, self.rank, self.every_s = total, rank, every_s
        self.last = time.monotonic()

    def tick(self, done: int) -> None:
        now = time.monotonic()
        if self.rank == 0 and now - self.last >= self.every_s and done < self.total:
            self.last = now
            phase("warmup", "progress", self.rank, step=done, of=self.total)


@dataclass
class PhaseEvent:
    phase: str
    event: str
    t: float
    info: dict[str, Any]


def parse(line: str) -> PhaseEvent | None:
    """The phase event in an output line, or None (any other line, or a damaged one)."""
    i = line.find(MARK)
    if i < 0:
        return None
    try:
        d = json.loads(line[i + len(MARK):])
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("event") not in EVENTS or not isinstance(d.get("phase"), str):
        return None
    t = d.get("t")
    t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else time.time()
    return PhaseEvent(d["phase"], d["event"], t, {k: v for k, v in d.items() if k not in ("phase", "event", "t")})


class PhasePrinter:
    """``on_line`` for the spawn: progress of long phases with elapsed time.

    A phase still running after ``quiet_s`` prints "... running (N s)", then again every
    ``every_s``; its end then prints "... done in N s". Phases that end sooner print nothing.
    """

    def __init__(self, out: TextIO | None = None, passthrough: Callable[[str], None] | None = None,
                 quiet_s: float = 3.0, every_s: float = 30.0, prefix: str = "#   "):
        self.out = out or sys.stdout
        self.passthrough = passthrough
        self.quiet_s, self.every_s, self.prefix = quiet_s, every_s, prefix
        self._lock = threading.Lock()
        # phase -> [start t (worker clock), monotonic start here, monotonic time last shown or None]
        self._running: dict[str, list] = {}
        self._timer: threading.Timer | None = None
        self._detail: dict[str, str] = {}

    def __call__(self, line: str) -> None:
        ev = parse(line)
        if ev is None:
            if self.passthrough is not None:
                self.passthrough(line)
            return
        with self._lock:
            if ev.event == "start":
                self._running[ev.phase] = [ev.t, time.monotonic(), None]
                self._detail.pop(ev.phase, None)
                self._arm()
            elif ev.event == "progress" and ev.phase in self._running:
                if "step" in ev.info and "of" in ev.info:
                    self._detail[ev.phase] = f"step {ev.info['step']}/{ev.info['of']}"
                self._show(ev.phase, force=True)
            elif ev.event == "end" and ev.phase in self._running:
                t0, _, shown = self._running.pop(ev.phase)
                if shown is not None:
                    self._print(f"{self._text(ev.phase)}: done in {max(ev.t - t0, 0.0):.1f} s")

    def close(self) -> None:
        """Stop the timer (call when the process ended)."""
        with self._lock:
            self._running.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

    def _text(self, name: str) -> str:
        return PHASE_TEXT.get(name, name)

    def _print(self, text: str) -> None:
        print(f"{self.prefix}{text}", file=self.out, flush=True)

    def _show(self, name: str, force: bool = False) -> None:
        entry = self._running[name]
        now = time.monotonic()
        elapsed = now - entry[1]
        if not force and elapsed < self.quiet_s:
            return
        detail = self._detail.get(name)
        self._print(f"{self._text(name)}: running ({elapsed:.0f} s{', ' + detail if detail else ''})")
        entry[2] = now

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.quiet_s, self._tick)
            self._timer.daemon = True
            self._timer.start()

    def _tick(self) -> None:
        with self._lock:
            self._timer = None
            if not self._running:
                return
            now = time.monotonic()
            for name, (_, m0, shown) in list(self._running.items()):
                # the first notice after quiet_s, then one every every_s
                if (shown is None and now - m0 >= self.quiet_s) or (shown is not None and now - shown >= self.every_s):
                    self._show(name)
            self._timer = threading.Timer(1.0, self._tick)
            self._timer.daemon = True
            self._timer.start()
