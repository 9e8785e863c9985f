"""Append-only result store: a directory of JSONL files, one record per line.

Every append is a single ``write`` of one line under an exclusive ``flock``, followed by
``fsync``, so concurrent writers (several Slurm jobs on a shared file system) never interleave
and a killed writer leaves at most one torn last line. Loading skips torn or foreign lines and
reports how many; an unreadable entry of the store (a directory named ``x.jsonl``, a dangling or
looping symlink, a file that cannot be opened, a line that is not UTF-8) is skipped and named,
never fatal. Nothing in dlscale ever rewrites a record.

A finished measurement is never lost: ``check_writable`` checks before launch what can be checked
(the directory, its ``series/`` and ``traces/``, free space), and ``append_or_recover`` appends or,
when the write still fails, removes any partial line and keeps the record as one JSON line in a
recovery file it names (``StoreError``, exit code 7).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import math
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dlscale import MAX_BATCH, ConfigError, DlscaleError
from dlscale.case.procs import uninterrupted

SCHEMA = "dlscale.record/1"
DEFAULT_FILE = "results.jsonl"
# interrupted: a signal stopped the case after some repeats finished; the record keeps those (a sweep runs
# the case again in full)
STATUSES = ("ok", "oom", "timeout", "failed", "unsupported", "interrupted")
# statuses whose finished repeats are measurements: reports, compare and the model use their numbers (an
# interrupted record's with the validity flag ``interrupted``)
MEASURED_STATUSES = ("ok", "interrupted")
EXIT_NOT_STORED = 7  # the measurement could not be stored (kept in a recovery file)
ARTIFACT_DIRS = ("series", "traces", "logs")  # what measurements write below the store's directory
# free space a case needs in the store before it starts: its record and utilisation series (a record
# is tens of kB; a series a few hundred bytes a sample per node)
# no figure dlscale stores comes near this (bytes, FLOPs and timestamps included): a record holding a bigger
# number was edited or imported unchecked, and would overflow the reports' sums; it is skipped, named
MAX_MAGNITUDE = 1e30
EXPECTED_CASE_BYTES = 4 << 20
CLAIM_FILE = ".dlscale-claim"  # a sweep's claim on its store: its pid, held under flock while it runs
# every writing command holds this shared (flock) while it runs; one that gets it exclusively knows no
# other writer is alive, and removes what dead ones left (series files of records never appended)
WRITERS_FILE = ".dlscale-writers"
_WRITER_FDS: dict[str, int] = {}  # store (real path) -> the fd holding this process's shared lock
_MAX_WRITER_FDS = 16  # a process writing to many stores (a test session) keeps only its latest ones held
# a series file this recent may belong to a case running where flock does not reach (a file system
# whose locks are node-local): only older ones are removed
ORPHAN_AGE_S = 3600.0


class StoreError(DlscaleError):
    """A finished record could not be appended; ``recovery`` is where it was kept (None: nowhere,
    the message then holds the record). The CLI exits with ``EXIT_NOT_STORED``."""

    exit_code = EXIT_NOT_STORED

    def __init__(self, message: str, recovery: Path | None = None):
        super().__init__(message)
        self.recovery = recovery


def _shown(path: Any) -> str:
    """A path on one line: control characters (a newline in a file name) shown escaped."""
    text = str(path)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


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
        """One line naming what was skipped; line number 0 is a whole entry (file) of the store."""
        if not self.skipped:
            return None
        parts = []
        whole = [(f, why) for f, n, why in self.skipped if n == 0]
        lines = [s for s in self.skipped if s[1] != 0]
        if whole:
            parts.append(f"skipped {len(whole)} unreadable store entr{'y' if len(whole) == 1 else 'ies'}: "
                         + ", ".join(f"{_shown(f)} ({why})" for f, why in whole[:5])
                         + (", ..." if len(whole) > 5 else ""))
        if lines:
            files = sorted({_shown(f) for f, _, _ in lines})
            parts.append(f"skipped {len(lines)} unreadable line(s) in {', '.join(files)} "
                         f"(first: line {lines[0][1]}: {lines[0][2]})")
        return "; ".join(parts)


class ResultStore:
    """A directory of JSONL files holding dlscale records."""

    def __init__(self, path: str | os.PathLike, filename: str = DEFAULT_FILE):
        self.root = Path(path)
        self.file = self.root / filename

    def check_writable(self, expected_bytes: int = EXPECTED_CASE_BYTES) -> None:
        """Fail early (before any training) when records or their files could not be written:
        the directory and the records file, each of ``ARTIFACT_DIRS`` that exists (one that does
        not is made when needed, in the checked directory), and ``expected_bytes`` of free space."""
        where = _shown(self.root)
        self._check_is_dir()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with open(self.file, "a", encoding="utf-8"):
                pass
            for name in ARTIFACT_DIRS:
                sub = self.root / name
                if os.path.lexists(sub) and not sub.is_dir():
                    raise ConfigError(f"result store {where} cannot take {name}/: {_shown(sub)} is not a directory")
                if sub.is_dir():
                    with tempfile.TemporaryFile(dir=sub):
                        pass
            with tempfile.TemporaryFile(dir=self.root):
                pass
            free = shutil.disk_usage(self.root).free
        except OSError as e:
            raise ConfigError(f"result store {where} is not writable: {e.strerror or e}") from None
        if free < expected_bytes:
            raise ConfigError(f"result store {where} has {free / 2**20:.1f} MiB free; a case needs about "
                              f"{expected_bytes / 2**20:.0f} MiB for its record and series")
        self._join_writers()

    def _join_writers(self) -> None:
        """Hold the writers' lock shared for the rest of this process; when no other writer holds it, first
        remove the leftovers of dead ones (best effort: a lock that cannot be had skips the clean-up)."""
        key = os.path.realpath(self.root)
        if key in _WRITER_FDS:
            return
        try:
            fd = os.open(self.root / WRITERS_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self.remove_orphan_series()
        except OSError:  # another writer is running: its series are not orphans
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return
        if len(_WRITER_FDS) >= _MAX_WRITER_FDS:
            os.close(_WRITER_FDS.pop(next(iter(_WRITER_FDS))))
        _WRITER_FDS[key] = fd

    def remove_orphan_series(self) -> list[str]:
        """Remove series files no record will ever name: empty ones (a full disk), and those of a record id
        that is neither in the store nor in a recovery file (a SIGKILLed run or sweep), once ORPHAN_AGE_S
        old. Only while no other writer runs (``_join_writers``). Returns what was removed."""
        folder = self.root / "series"
        try:
            files = [p for p in folder.iterdir() if p.suffix == ".jsonl" and p.is_file()]
        except OSError:
            return []
        if not files:
            return []
        known = {str(r.get("id")) for r in self.load().records}
        kept = set()  # recovery files name a record by the first 12 characters of its id
        for d in recovery_dirs():
            try:
                kept |= {p.name.split("-")[2] for p in Path(d).glob("dlscale-unstored-*.jsonl")}
            except (OSError, IndexError):
                continue
        removed, now = [], _dt.datetime.now().timestamp()
        for p in files:
            rec_id = p.name.split("-r", 1)[0]
            try:
                st = p.stat()
                if now - st.st_mtime < ORPHAN_AGE_S:
                    continue
                if st.st_size == 0 or (rec_id not in known and rec_id[:12] not in kept):
                    p.unlink()
                    removed.append(p.name)
            except OSError:
                continue
        return removed

    def _check_is_dir(self) -> None:
        """A store to write is a directory: a file (or a FIFO) there is named as what it is, not as "File exists"."""
        if os.path.lexists(self.root) and not self.root.is_dir():
            what = "a file" if self.root.is_file() else "not a directory"
            raise ConfigError(f"result store {_shown(self.root)} is {what}: --store names a directory (give a new "
                              f"or an existing one)")

    @contextlib.contextmanager
    def claim(self, what: str = "sweep"):
        """Hold the store for one writer of many cases (a sweep): a second one is refused (ConfigError)
        naming the first's pid, since each would time its cases against the other's. The claim is a
        flock, released by the kernel when its holder dies: a claim left by a dead process is taken over."""
        where, path = _shown(self.root), self.root / CLAIM_FILE
        self._check_is_dir()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"result store {where} cannot be claimed for this {what}: {e.strerror or e}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
                raise ConfigError(f"result store {where} is in use by another {what} (pid {holder}): two at once "
                                  f"would time every case against the other; wait for it, or give another --store") \
                    from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield
        finally:
            os.close(fd)  # releases the flock

    def append(self, record: dict[str, Any]) -> None:
        """Append one line in one write; when the write fails no partial line is left (OSError)."""
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
            try:
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
            except OSError:
                # a full disk may take part of the line: cut it off (under the lock, nobody else
                # appended since), so the store never holds a partial record of ours
                try:
                    os.ftruncate(fd, size)
                except OSError:
                    pass
                raise
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def append_uninterrupted(self, record: dict[str, Any]) -> Path:
        """``append_or_recover`` with the interrupting signals held off (main thread only), so a
        signal never tears the record line."""
        with uninterrupted():
            return self.append_or_recover(record)

    def append_or_recover(self, record: dict[str, Any]) -> Path:
        """Append ``record``; returns the records file. When the store cannot take it, the record is
        kept as one JSON line in a recovery file (the temp directory, else the home directory) and
        StoreError names it; move that file into the store to keep the record there."""
        try:
            self.append(record)
            return self.file
        except OSError as e:
            why = e.strerror or str(e)
        line = json.dumps(_finite(record), sort_keys=True, default=_json_default, allow_nan=False) + "\n"
        rec_id = str(record.get("id") or uuid.uuid4().hex)[:12]
        last = ""
        for base in recovery_dirs():
            path = Path(base) / f"dlscale-unstored-{rec_id}-{uuid.uuid4().hex[:6]}.jsonl"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as e:
                last = e.strerror or str(e)
                continue
            try:
                data = line.encode("utf-8")
                written = 0
                while written < len(data):
                    written += os.write(fd, data[written:])
                os.fsync(fd)
            except OSError as e:
                last = e.strerror or str(e)
                os.close(fd)
                try:
                    os.unlink(path)
                except OSError:
                    pass
                continue
            os.close(fd)
            raise StoreError(f"the measurement could not be stored in {_shown(self.file)} ({why}); "
                             f"the record is kept in {_shown(path)} (move it into the store to keep it)", path)
        raise StoreError(f"the measurement could not be stored in {_shown(self.file)} ({why}) nor in a "
                         f"recovery file ({last}); the record: {line.strip()}")

    def files(self) -> list[Path]:
        """The store's .jsonl entries (a file given as the store is its only entry). A store that
        exists but cannot be listed is ConfigError, never read as empty."""
        if not os.path.lexists(self.root):
            return []
        try:
            if self.root.is_file():
                return [self.root]
            return sorted(p for p in self.root.iterdir() if p.name.endswith(".jsonl"))
        except OSError as e:
            raise ConfigError(f"cannot read result store {_shown(self.root)}: {e.strerror or e}") from None

    def load(self, kind: str | None = None) -> LoadResult:
        """Read every record; unreadable entries and torn, foreign or non-UTF-8 lines are skipped
        and listed (``LoadResult.skipped``, line 0 for a whole entry), never fatal."""
        out = LoadResult()
        for path in self.files():
            try:
                f = open(path, "rb")
            except OSError as e:
                out.skipped.append((str(path), 0, "a directory" if isinstance(e, IsADirectoryError) else
                                    "permission denied: its records are not read (give this user read access)"
                                    if isinstance(e, PermissionError) else e.strerror or str(e)))
                continue
            n = 0
            try:
                with f:
                    for n, raw in enumerate(f, 1):
                        self._parse_line(path, n, raw, kind, out)
            except OSError as e:  # a whole file unread is an entry; a read failing further in, from that line on
                why = "permission denied" if isinstance(e, PermissionError) else e.strerror or str(e)
                out.skipped.append((str(path), n + 1 if n else 0, f"read failed{' from here on' if n else ''}: {why}"))
        return out

    @staticmethod
    def _parse_line(path: Path, n: int, raw: bytes, kind: str | None, out: LoadResult) -> None:
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as e:
            out.skipped.append((str(path), n, f"not UTF-8 (byte {e.start + 1})"))
            return
        if not line:
            return
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            out.skipped.append((str(path), n, f"not JSON ({e.msg})"))
            return
        except (ValueError, RecursionError) as e:  # an integer of thousands of digits; nesting too deep
            out.skipped.append((str(path), n, "not readable JSON (" + (str(e).split(":")[0] if isinstance(
                e, ValueError) else "nested too deeply") + ")"))
            return
        if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
            out.skipped.append((str(path), n, "not a dlscale record"))
            return
        bad = implausible(rec)
        if bad:
            out.skipped.append((str(path), n, bad))
            return
        if kind is None or rec.get("kind") == kind:
            out.records.append(rec)


def implausible(rec: dict[str, Any]) -> str | None:
    """Why a stored record cannot be reported (a number no measurement gives), else None."""
    b = (rec.get("config") or {}).get("batch_size") if isinstance(rec.get("config"), dict) else None
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b > MAX_BATCH:
        return f"implausible batch size {b:.3g} (over {MAX_BATCH:,} per device)"
    todo: list[tuple[str, Any]] = [("", rec)]
    while todo:  # iterative: a deeply nested record must not exhaust the stack
        where, o = todo.pop()
        if isinstance(o, dict):
            todo += [(f"{where}.{k}" if where else str(k), v) for k, v in o.items()]
        elif isinstance(o, list):
            todo += [(f"{where}[{i}]", v) for i, v in enumerate(o)]
        elif isinstance(o, (int, float)) and not isinstance(o, bool) and abs(o) > MAX_MAGNITUDE:
            shown = f"{o:.3g}" if isinstance(o, float) else f"an integer of {int(o.bit_length() * 0.30103) + 1} digits"
            return f"implausible number at {where} ({shown}, over {MAX_MAGNITUDE:.0e})"
    return None


def recovery_dirs() -> list[str]:
    """Where a record the store could not take is kept: $DLSCALE_RECOVERY_DIR, the temp directory,
    the home directory."""
    out = [os.environ.get("DLSCALE_RECOVERY_DIR"), tempfile.gettempdir(), os.path.expanduser("~")]
    return [d for i, d in enumerate(out) if d and d not in out[:i]]


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
