"""``micro io --write-dir DIR``: how fast a folder takes a checkpoint-sized write, durably.

One file of ``--write-mb`` MB is written in 64 MiB chunks of random bytes (compression cannot shrink
them), fsynced, and removed: write MB/s = bytes ÷ seconds from the first byte to the fsync's return,
the figure a synchronous checkpoint's durable time is bounded by (``run --checkpoint-every`` records
the real one).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from dlscale import ConfigError

CHUNK = 64 << 20


def measure_write(folder: str, total_bytes: int, chunk: int = CHUNK) -> dict[str, Any]:
    """One row: ``total_bytes`` written into a new file in ``folder`` and fsynced; the file is removed."""
    row: dict[str, Any] = {"pipeline": "write", "workers": None, "batch": None, "status": "ok", "reason": None,
                           "bytes": total_bytes, "seconds": None, "write_mb_s": None}
    block = os.urandom(min(chunk, total_bytes))
    fd, path = tempfile.mkstemp(dir=folder, prefix=".dlscale-write-")
    try:
        t0 = time.perf_counter()
        left = total_bytes
        while left > 0:
            left -= os.write(fd, block[:left] if left < len(block) else block)
        os.fsync(fd)
        seconds = time.perf_counter() - t0
    except OSError as e:
        row.update(status="failed", reason=f"writing into {folder}: {e.strerror or e}")
        return row
    finally:
        os.close(fd)
        os.unlink(path)
    row.update(seconds=seconds, write_mb_s=total_bytes / seconds / 1e6 if seconds > 0 else None)
    return row


def check(folder: str | None, mb: float) -> None:
    """--write-dir and --write-mb before anything runs: one-line ConfigError."""
    if folder is None:
        return
    if not mb > 0:
        raise ConfigError(f"--write-mb must be > 0, got {mb:g}")
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ConfigError(f"--write-dir {folder} is not an existing folder this user can write")
