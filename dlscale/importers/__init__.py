"""Importers: results made elsewhere -> records of kind ``imported``, one file per format.

An importer is a class in one file, registered by name::

    @register_importer("megatron-log")
    class MegatronLog(Importer):
        def records(self, path, opts) -> list[dict]: ...

It reads a file or a directory, validates everything, and returns the records it would store;
``dlscale import`` appends them only when every one of them is valid (nothing is stored
otherwise). Bad input raises ``ImportFailure``: one line naming the file and the importer
(exit 2). Records carry their provenance (source, tool, date, hardware as stated, the format
and the file) and are never confused with measured ones (kind ``imported``).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dlscale import ConfigError
from dlscale.registry import Registry


# the largest file an import reads (docs/external.md): published tables and logs are far smaller,
# and a bound keeps a wrong path (a device, a growing file) from filling memory
MAX_INPUT_BYTES = 256 << 20
READ_SUFFIXES = (".yaml", ".yml", ".csv", ".json", ".log", ".txt", ".out")  # what the formats read in a folder


class ImportFailure(ConfigError):
    """Input an importer cannot take: one line, naming the file and the importer."""

    def __init__(self, importer: str, path: str | Path, message: str):
        super().__init__(f"{path}: {importer} importer: {message}")


@dataclass
class ImportOptions:
    """What the command line adds to a file: provenance, and the workload where the file lacks it."""

    source: str | None = None
    tool: str | None = None
    date: str | None = None
    label: str | None = None
    model: str | None = None
    framework: str | None = None
    precision: str | None = None
    batch_size: int | None = None
    nnodes: int | None = None
    nproc_per_node: int | None = None
    strategy: str | None = None
    compile: bool | None = None
    gpu: str | None = None
    gpus_per_node: int | None = None
    interconnect: str | None = None
    unit: str | None = None
    seq_len: int | None = None
    params: int | None = None
    warmup: int = 20
    steps: int | None = 100
    options: dict[str, Any] = field(default_factory=dict)  # parser options (-o KEY=VALUE)


class Importer:
    """Base of the registered importers; subclasses set ``description`` and implement ``records``."""

    name = "?"
    description = ""

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        raise NotImplementedError

    def fail(self, path: str | Path, message: str) -> ImportFailure:
        return ImportFailure(self.name, path, message)


# cli and records are the package's own modules, not importers
_IMPORTERS: Registry[Callable[[], Importer]] = Registry("import format", __name__, skip=("cli", "records"))


def register_importer(name: str):
    """Class decorator: register an Importer subclass under ``name``."""

    def deco(cls):
        _IMPORTERS.add(name, cls)
        cls.name = name
        return cls

    return deco


def importer_names() -> list[str]:
    return _IMPORTERS.names()


def get_importer(name: str) -> Importer:
    return _IMPORTERS.get(name)()


def _check_file(imp: Importer, f: Path, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise imp.fail(f, "not a regular file or directory (a FIFO, device or socket is never read): give a file")
    if st.st_size > MAX_INPUT_BYTES:
        raise imp.fail(f, f"{st.st_size:,} bytes, over the {MAX_INPUT_BYTES >> 20} MiB an import reads")


def check_input(imp: Importer, p: Path) -> None:
    """Only a regular file, or a directory whose files (and case folders' files) are regular, each within
    MAX_INPUT_BYTES; checked before anything is opened, so a FIFO cannot block and /dev/zero cannot fill memory."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ImportFailure(imp.name, p, "no such file or directory") from None
    except OSError as e:
        raise ImportFailure(imp.name, p, f"cannot read: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        return _check_file(imp, p, st)
    try:
        entries = [e for d in [p, *(q for q in p.iterdir() if q.is_dir())] for e in d.iterdir()]
    except OSError as e:
        raise ImportFailure(imp.name, p, f"cannot list the directory: {e.strerror or e}") from None
    for e in entries:
        if e.suffix.lower() in READ_SUFFIXES and not e.is_dir():
            try:
                est = e.stat()
            except OSError:
                continue  # a dangling link: no format reads it
            if stat.S_ISREG(est.st_mode) and est.st_size > MAX_INPUT_BYTES:
                _check_file(imp, e, est)


def import_path(path: str | Path, fmt: str, opts: ImportOptions) -> list[dict[str, Any]]:
    """Every record ``path`` gives under importer ``fmt``, validated; nothing stored."""
    imp = get_importer(fmt)
    p = Path(path)
    check_input(imp, p)
    recs = imp.records(p, opts)
    if not recs:
        raise imp.fail(p, "no results found")
    from dlscale.schema import validate_record  # importlib: keeps the CLI start-up light

    for r in recs:
        problem = validate_record(r)
        if problem:
            raise imp.fail(p, f"would write an invalid record ({problem})")
    return recs
