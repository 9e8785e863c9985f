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

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dlscale import ConfigError
from dlscale.registry import Registry


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


def import_path(path: str | Path, fmt: str, opts: ImportOptions) -> list[dict[str, Any]]:
    """Every record ``path`` gives under importer ``fmt``, validated; nothing stored."""
    imp = get_importer(fmt)
    p = Path(path)
    if not p.exists():
        raise ImportFailure(imp.name, p, "no such file or directory")
    recs = imp.records(p, opts)
    if not recs:
        raise imp.fail(p, "no results found")
    from dlscale.schema import validate_record

    for r in recs:
        problem = validate_record(r)
        if problem:
            raise imp.fail(p, f"would write an invalid record ({problem})")
    return recs
