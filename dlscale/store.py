"""Append-only result store: a directory of JSONL files, one record per line.

Every append is a single ``write`` of one line under an exclusive ``flock``, followed by
``fsync``, so concurrent writers (several Slurm jobs on a shared file system) never interleave
and a killed writer leaves at most one torn last line. Loading skips torn or foreign lines and
reports how many; nothing in dlscale ever rewrites a record.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import json
import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dlscale import ConfigError

SCHEMA = "dlscale.record/1"
DEFAULT_FILE = "results.jsonl"
STATUSES = ("ok", "oom", "timeout", "failed", "unsupported")


def new_record(kind: str, **fields: Any) -> dict[str, Any]:
    """A record skeleton with identity and creation time; ``kind`` is "run" or "micro"."""
    rec = {
        "schema": SCHEMA,
        "kind": kind,
        "id": uuid.uuid4().hex,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    rec.update(fields)
    return rec


@dataclass
class LoadResult:
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[tuple[str, int, str]] = field(default_factory=list)  # (file, line number, reason)

    def warning(self) -> str | None:
        if not self.skipped:
            return None
        files = sorted({f for f, _, _ in self.skipped})
        return (f"skipped {len(self.skipped)} unreadable line(s) in {', '.join(files)} "
                f"(first: line {self.skipped[0][1]}: {self.skipped[0][2]})")


class ResultStore:
    """A directory of JSONL files holding dlscale records."""

    def __init__(self, path: str | os.PathLike, filename: str = DEFAULT_FILE):
        self.root = Path(path)
        self.file = self.root / filename

    def check_writable(self) -> None:
        """Fail early (before any training) when records could not be appended."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.file, "a", encoding="utf-8"):
                pass
        except OSError as e:
            raise ConfigError(f"result store {self.root} is not writable: {e.strerror or e}") from None

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(_finite(record), sort_keys=True, default=_json_default, allow_nan=False) + "\n"
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            # A killed writer may have left a torn line without its newline; start ours on a
            # fresh line so the torn one stays the only casualty.
            size = os.fstat(fd).st_size
            if size:
                with open(self.file, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        line = "\n" + line
            data = line.encode("utf-8")
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def files(self) -> list[Path]:
        if not self.root.exists():
            return []
        if self.root.is_file():
            return [self.root]
        return sorted(self.root.glob("*.jsonl"))

    def load(self, kind: str | None = None) -> LoadResult:
        """Read every record; torn or foreign lines are skipped and listed, never fatal."""
        out = LoadResult()
        for path in self.files():
            with open(path, "r", encoding="utf-8", errors="replace") as f:
                for n, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        out.skipped.append((str(path), n, f"not JSON ({e.msg})"))
                        continue
                    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
                        out.skipped.append((str(path), n, "not a dlscale record"))
                        continue
                    if kind is None or rec.get("kind") == kind:
                        out.records.append(rec)
        return out


def _finite(o: Any) -> Any:
    """NaN and infinities are not JSON: store them as null (a diverged loss reads as missing)."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def _json_default(o: Any) -> Any:
    if hasattr(o, "to_dict"):
        return o.to_dict()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def ok_case_keys(records: Iterable[dict[str, Any]]) -> set[str]:
    """Case keys that already have an ``ok`` run record (what a resumed sweep skips)."""
    return {r.get("case_key") for r in records if r.get("kind") == "run" and r.get("status") == "ok"}
