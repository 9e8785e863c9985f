"""Where each rank was when its case ran out of time: Python stacks dumped on request.

A rank that stalls outside any collective (a hung data loader, a deadlock in user code) holds
every peer in the next collective; after the time limit all of them are "not finished". To name
the one that stalled, the launcher asks every rank for its stack just before it kills them:

* worker side, ``arm(out_dir, rank)``: ``faulthandler`` writes every thread's Python stack to
  ``stack-rank<R>.txt`` on SIGUSR1 (C code, async-signal-safe: it works while the rank is blocked
  in a C call such as a collective's wait, where a Python handler would never run);
* launcher side, ``request(out_dir, pids)`` sends the signal and waits briefly for the files;
  ``read(out_dir)`` returns each rank's main-thread frames, innermost first; ``summary`` names, for
  each rank, where it was and whether that was inside torch.distributed or autograd (waiting for
  its peers) or outside them (the likely staller).
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import re
import signal
import time
from pathlib import Path

SIGNAL = signal.SIGUSR1
_FILE = "stack-rank{}.txt"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")
# frames of a rank that waits for its peers: a collective, DDP/FSDP's hooks, the backward that runs them
WAITING = ("torch/distributed/", "torch/autograd/", "torch/_tensor.py", "torch/nn/parallel/")
_armed: list = []  # the open dump files: faulthandler writes to their descriptors


def arm(out_dir: Path, rank: int) -> None:
    """Dump this process's Python stacks to ``stack-rank<R>.txt`` when SIGUSR1 arrives."""
    if not hasattr(faulthandler, "register"):  # not on Windows
        return
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        f = open(Path(out_dir) / _FILE.format(rank), "w", encoding="utf-8")  # noqa: SIM115 - kept open
        faulthandler.register(SIGNAL, file=f, all_threads=True, chain=False)
        _armed.append(f)


def request(out_dir: Path, pids: dict[int, int], skip: set[int] | frozenset = frozenset(),
            wait_s: float = 1.5) -> None:
    """Ask ranks (rank -> pid; ``skip``: stopped pids, which cannot answer) for their stacks and
    wait until every asked rank's file has content or ``wait_s`` passes."""
    asked = []
    for rank, pid in pids.items():
        if pid in skip:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, SIGNAL)
            asked.append(rank)
    deadline = time.monotonic() + wait_s
    while asked and time.monotonic() < deadline:
        if all(_size(Path(out_dir) / _FILE.format(r)) > 0 for r in asked):
            time.sleep(0.05)  # let the last lines of each dump land
            return
        time.sleep(0.02)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def parse(text: str) -> list[tuple[str, int, str]]:
    """The main thread's frames (file, line, function), innermost first, from a faulthandler dump.

    faulthandler lists the threads newest first, so the main thread, the oldest, comes last; where
    the last has no Python frame, the last one not started by ``threading`` (whose outermost frame
    is not ``threading.py``'s bootstrap)."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        m = _FRAME.match(line)
        if m and threads:
            threads[-1].append((m["file"], int(m["line"]), m["func"]))
    if threads and threads[-1]:
        return threads[-1]
    threads = [t for t in threads if t]
    main = [t for t in threads if not t[-1][0].endswith("threading.py")]
    return (main or threads or [[]])[-1]


def read(out_dir: Path) -> dict[int, list[tuple[str, int, str]]]:
    """rank -> main-thread frames of every rank that dumped its stack."""
    out = {}
    for p in Path(out_dir).glob("stack-rank*.txt"):
        m = re.match(r"stack-rank(\d+)\.txt$", p.name)
        frames = parse(p.read_text(errors="replace")) if m else []
        if frames:
            out[int(m.group(1))] = frames
    return out


def _short(path: str) -> str:
    """A frame's file from its package down (``dlscale/train/worker.py``, ``torch/autograd/graph.py``)."""
    parts = path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in ("dlscale", "torch", "jax", "site-packages"):
            return "/".join(parts[i + 1:] if parts[i] == "site-packages" else parts[i:])
    return parts[-1]


def waiting(frames: list[tuple[str, int, str]]) -> bool:
    """Whether the rank was inside torch.distributed, autograd or a DDP wrapper (waiting for peers)."""
    return any(any(w in f.replace("\\", "/") for w in WAITING) for f, _, _ in frames)


def where(frames: list[tuple[str, int, str]]) -> str:
    """``file:line in func`` of the innermost frame, and of the innermost dlscale frame when different."""
    if not frames:
        return "unknown"
    f, line, func = frames[0]
    text = f"{_short(f)}:{line} in {func}"
    own = next((fr for fr in frames if "/dlscale/" in fr[0].replace("\\", "/")), None)
    if own is not None and own is not frames[0]:
        text += f" (from {_short(own[0])}:{own[1]} in {own[2]})"
    return text


def summary(stacks: dict[int, list[tuple[str, int, str]]], ranks: list[int]) -> str | None:
    """One clause for the error line: the unfinished ranks that stalled outside a collective first
    (the likely cause), then those waiting in one; None when no listed rank dumped its stack."""
    known = [r for r in ranks if r in stacks]
    if not known:
        return None
    waits = [r for r in known if waiting(stacks[r])]
    stalled = [r for r in known if r not in waits]
    parts = []
    if stalled:
        parts.append("stalled outside any collective: " + "; ".join(f"rank {r} at {where(stacks[r])}" for r in stalled))
    if waits:
        parts.append("waiting in a collective or the backward: " + "; ".join(
            f"rank {r} at {where(stacks[r])}" for r in waits))
    return ". ".join(parts)
