"""A data set on disk: its files, checks, identity, and its state in the page cache.

Identity (recorded with every case that reads real data): absolute path, bytes, file count and a
content fingerprint. The fingerprint is SHA-256 over every file's relative path, size and
modification time (what a listing gives anyway, so it costs one ``stat`` per file) plus the bytes
of a deterministic sample of the contents: the first and last 4 KiB of 64 evenly spaced files of
an image folder, 64 evenly spaced 64 KiB chunks of a token file (the whole file up to 64 MiB).
A full content hash of ImageNet (about 140 GB) would take minutes at disk speed before every case;
the metadata part catches any added, removed, renamed, resized or rewritten file, the sample
catches a copy whose metadata was preserved but whose bytes differ. ``fingerprint_method`` says
which was done.

Page cache: ``resident_share`` asks the kernel (``mincore``) which pages of a sample of the files
are in memory; ``drop_from_cache`` writes back and evicts every file (``fsync`` +
``posix_fadvise(DONTNEED)``) so the next read comes from the device. Both are Linux calls: where
they are missing they return None / raise ConfigError, never pretend.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import mmap
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from dlscale import ConfigError
from dlscale.inputs.spec import IMAGE_EXTENSIONS, DataSpec

SAMPLE_FILES = 64  # image files whose head and tail enter the fingerprint
SAMPLE_EDGE = 4096
TOKEN_CHUNKS = 64
TOKEN_CHUNK = 64 * 2**10
TOKEN_FULL_HASH = 64 * 2**20  # token files up to this size are hashed whole
VOCAB_FULL_SCAN = 2**30  # token files up to this size have every id checked up front
RESIDENT_SAMPLE = 256  # files whose page-cache residency is asked


@dataclass
class ImageFolderListing:
    root: str
    classes: list[str]
    files: list[str]  # relative to root, sorted (class, then name)
    labels: list[int]


def list_imagefolder(root: str) -> ImageFolderListing:
    """Class folders (sorted, hidden skipped) and their image files; ConfigError naming the folder."""
    p = Path(root)
    if not p.exists():
        raise ConfigError(f"imagefolder {root}: no such folder")
    if not p.is_dir():
        raise ConfigError(f"imagefolder {root} is not a folder (ImageNet layout: {root}/CLASS/IMAGE.JPEG)")
    try:
        entries = sorted(os.scandir(p), key=lambda e: e.name)
    except OSError as e:
        raise ConfigError(f"imagefolder {root}: cannot list it ({e.strerror})") from None
    classes = [e.name for e in entries if e.is_dir() and not e.name.startswith(".")]
    if not classes:
        loose = sum(1 for e in entries if e.is_file())
        if loose:
            raise ConfigError(f"imagefolder {root} has no class folders, only {loose} file(s) at its top level "
                              f"(ImageNet layout: {root}/CLASS/IMAGE.JPEG)")
        raise ConfigError(f"imagefolder {root} is empty (ImageNet layout: {root}/CLASS/IMAGE.JPEG)")
    files: list[str] = []
    labels: list[int] = []
    for label, cls in enumerate(classes):
        names = sorted(e.name for e in os.scandir(p / cls)
                       if e.is_file() and e.name.lower().endswith(IMAGE_EXTENSIONS) and not e.name.startswith("."))
        if not names:
            raise ConfigError(f"imagefolder {root}: class folder {cls!r} holds no image files "
                              f"({', '.join(IMAGE_EXTENSIONS)})")
        files.extend(f"{cls}/{n}" for n in names)
        labels.extend([label] * len(names))
    return ImageFolderListing(str(p.resolve()), classes, files, labels)


def token_count(spec: DataSpec) -> int:
    """Tokens in the file; ConfigError for a missing file or a size not a multiple of the element."""
    p = Path(spec.path)
    if not p.exists():
        raise ConfigError(f"tokens {spec.path}: no such file")
    if not p.is_file():
        raise ConfigError(f"tokens {spec.path} is not a file (a flat binary of {spec.dtype} token ids)")
    size = p.stat().st_size
    if size == 0:
        raise ConfigError(f"tokens {spec.path} is empty")
    if size % spec.itemsize:
        raise ConfigError(f"tokens {spec.path}: size {size} bytes is not a multiple of {spec.itemsize} "
                          f"({spec.dtype}); wrong dtype or a truncated file")
    return size // spec.itemsize


@functools.lru_cache(maxsize=16)
def _max_token(path: str, dtype: str, size: int, mtime_ns: int) -> tuple[int, str]:
    """Largest id in the file: every id up to VOCAB_FULL_SCAN bytes, else evenly spaced chunks
    (the loader then checks every batch it reads). (max id, "full" | "sampled")."""
    import numpy as np  # numpy: keeps start-up light

    mm = np.memmap(path, dtype=dtype, mode="r")
    n = len(mm)
    if size <= VOCAB_FULL_SCAN:
        step = 32 * 2**20
        return int(max(int(mm[i:i + step].max()) for i in range(0, n, step))), "full"
    chunk = TOKEN_CHUNK // mm.itemsize
    starts = [int(x) for x in np.linspace(0, n - chunk, TOKEN_CHUNKS)]
    return int(max(int(mm[s:s + chunk].max()) for s in starts)), "sampled"


def check_tokens(spec: DataSpec, vocab: int, need_tokens: int) -> tuple[int, int, str]:
    """(tokens, max id, vocab check) of a token file that fits the model; ConfigError otherwise."""
    n = token_count(spec)
    if n < need_tokens:
        raise ConfigError(f"tokens {spec.path}: {n} tokens, fewer than the {need_tokens} one global batch needs")
    st = os.stat(spec.path)
    top, how = _max_token(str(Path(spec.path).resolve()), spec.dtype, st.st_size, st.st_mtime_ns)
    if top >= vocab:
        raise ConfigError(f"tokens {spec.path}: id {top} exceeds the model's vocabulary of {vocab} "
                          f"(ids 0..{vocab - 1}); wrong dtype, or a file for another tokenizer")
    return n, top, how


@dataclass
class DataIdentity:
    """What a record says about the data set it read."""

    kind: str
    path: str
    size_bytes: int
    n_files: int
    fingerprint: str
    fingerprint_method: str
    n_samples: int  # images, or token windows of the model's sequence length
    n_classes: int | None = None
    n_tokens: int | None = None
    dtype: str | None = None
    max_token_id: int | None = None
    vocab_check: str | None = None  # "full" (every id) or "sampled" (+ every batch read)
    host_mem_total_bytes: int | None = None
    host_mem_available_bytes: int | None = None
    fits_in_memory: bool | None = None  # size < total host memory: later epochs can come from the page cache

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _edges(path: str, h) -> None:
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE_EDGE))
        f.seek(0, os.SEEK_END)
        end = f.tell()
        f.seek(max(0, end - SAMPLE_EDGE))
        h.update(f.read(SAMPLE_EDGE))


@functools.lru_cache(maxsize=8)
def _folder_identity(root: str, stamps: tuple[int, ...]) -> tuple[int, str, str]:
    """(bytes, fingerprint, method) of an image folder; ``stamps`` (the class folders' mtimes,
    which change when a file is added, removed or renamed) only key the cache."""
    listing = list_imagefolder(root)
    h = hashlib.sha256()
    total = 0
    for rel in listing.files:
        st = os.stat(os.path.join(listing.root, rel))
        total += st.st_size
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    n = len(listing.files)
    picks = sorted({round(i * (n - 1) / max(1, SAMPLE_FILES - 1)) for i in range(min(n, SAMPLE_FILES))})
    for i in picks:
        _edges(os.path.join(listing.root, listing.files[i]), h)
    return total, "sha256:" + h.hexdigest(), (f"paths+sizes+mtimes of all {n} files, head+tail "
                                              f"{SAMPLE_EDGE} B of {len(picks)} sampled files")


@functools.lru_cache(maxsize=8)
def _token_fingerprint(path: str, size: int, mtime_ns: int) -> tuple[str, str]:
    h = hashlib.sha256(f"{size}\0{mtime_ns}\n".encode())
    with open(path, "rb") as f:
        if size <= TOKEN_FULL_HASH:
            for block in iter(lambda: f.read(2**20), b""):
                h.update(block)
            return "sha256:" + h.hexdigest(), "size+mtime+all bytes"
        for i in range(TOKEN_CHUNKS):
            f.seek(round(i * (size - TOKEN_CHUNK) / (TOKEN_CHUNKS - 1)))
            h.update(f.read(TOKEN_CHUNK))
    return "sha256:" + h.hexdigest(), f"size+mtime+{TOKEN_CHUNKS} evenly spaced {TOKEN_CHUNK // 1024} KiB chunks"


def _memory() -> tuple[int | None, int | None]:
    try:
        import psutil  # optional: psutil

        vm = psutil.virtual_memory()
        return int(vm.total), int(vm.available)
    except Exception:  # noqa: BLE001 - psutil missing or unreadable /proc: unknown, not zero
        return None, None


def identity(spec: DataSpec, seq_len: int | None = None) -> DataIdentity:
    """The identity of a real data set (call after the checks passed)."""
    total_mem, avail = _memory()
    if spec.kind == "imagefolder":
        root = str(Path(spec.path).resolve())
        listing = list_imagefolder(root)
        stamps = tuple(os.stat(os.path.join(root, c)).st_mtime_ns for c in listing.classes)
        size, fp, method = _folder_identity(root, stamps)
        ident = DataIdentity("imagefolder", root, size, len(listing.files), fp, method, len(listing.files),
                             n_classes=len(listing.classes))
    else:
        path = str(Path(spec.path).resolve())
        st = os.stat(path)
        fp, method = _token_fingerprint(path, st.st_size, st.st_mtime_ns)
        n = st.st_size // spec.itemsize
        top, how = _max_token(path, spec.dtype, st.st_size, st.st_mtime_ns)
        ident = DataIdentity("tokens", path, st.st_size, 1, fp, method, n // seq_len if seq_len else 0,
                             n_tokens=n, dtype=spec.dtype, max_token_id=top, vocab_check=how)
    ident.host_mem_total_bytes, ident.host_mem_available_bytes = total_mem, avail
    ident.fits_in_memory = None if total_mem is None else ident.size_bytes < total_mem
    return ident


# ---------------------------------------------------------------------------------------------
# page cache

def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    lib = ctypes.CDLL(name, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return lib


def sample_paths(paths: Sequence[str], k: int = RESIDENT_SAMPLE) -> list[str]:
    """At most ``k`` evenly spaced paths (all of them when there are no more)."""
    n = len(paths)
    if n <= k:
        return list(paths)
    return [paths[i] for i in sorted({round(j * (n - 1) / max(1, k - 1)) for j in range(min(n, k))})]


def resident_share(paths: Sequence[str]) -> float | None:
    """Share of the pages of ``paths`` held in the page cache (mincore), or None where the kernel
    does not say (no mincore, or a file system that does not support it)."""
    lib = _libc() if os.name == "posix" else None
    if lib is None or not hasattr(lib, "mincore"):
        return None
    page = mmap.PAGESIZE
    resident = pages_total = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                continue
            addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            try:
                n = (size + page - 1) // page
                vec = (ctypes.c_ubyte * n)()
                if lib.mincore(addr, size, vec) != 0:
                    return None
                resident += sum(b & 1 for b in vec)
                pages_total += n
            finally:
                lib.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / pages_total if pages_total else None


def drop_from_cache(paths: Sequence[str]) -> int:
    """Write back and evict every file from the page cache; returns the files done.

    ``posix_fadvise(POSIX_FADV_DONTNEED)`` evicts clean, unmapped pages (dirty pages are written
    back first by ``fsync``, so a freshly generated data set is evicted too). Pages another
    process maps stay; some file systems (network, FUSE, gVisor's) ignore the advice: the record's
    ``resident_share_at_start`` shows what was left.
    """
    if not hasattr(os, "posix_fadvise"):
        raise ConfigError("data-cold-read needs posix_fadvise (Linux and most Unix); this OS has none")
    done = 0
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                os.fsync(fd)
            except OSError:
                pass  # read-only file systems refuse fsync; nothing dirty there
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            done += 1
        finally:
            os.close(fd)
    return done
