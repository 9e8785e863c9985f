"""Registries by name: models, strategies, importers and external-run parsers each keep one.

Entries register themselves when their module is imported (one file an entry). Asked for one entry, a
registry imports the module named after it; asked for the names, or for a name no such module
registers, it imports every module of its package.
"""
from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from typing import Generic, TypeVar

from dlscale import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries of one ``kind`` (used in messages) from the modules of ``package``, minus ``skip``."""

    def __init__(self, kind: str, package: str, skip: tuple[str, ...] = ()):
        self.kind, self.package, self.skip = kind, package, skip
        self._entries: dict[str, T] = {}
        self._loaded = False

    def add(self, name: str, entry: T) -> None:
        if name in self._entries:
            raise RuntimeError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = entry

    def replace(self, name: str, entry: T) -> None:
        """Swap a registered entry (a benchmark adding a flavour in its own process)."""
        self.get(name)
        self._entries[name] = entry

    def load(self) -> None:
        """Import every module of the package (modules named ``_...`` and ``skip`` are not entries)."""
        if self._loaded:
            return
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.name.startswith("_") and mod.name not in self.skip:
                importlib.import_module(f"{self.package}.{mod.name}")
        self._loaded = True

    def _load_one(self, name: str) -> None:
        """Import only the module named after ``name`` (one file each; ``-`` spelt ``_``): a process that
        uses one entry does not pay for importing every other (a worker starts faster by a second)."""
        mod = name.replace("-", "_")
        if not mod.isidentifier() or mod.startswith("_") or mod in self.skip:
            return
        if importlib.util.find_spec(f"{self.package}.{mod}") is not None:
            importlib.import_module(f"{self.package}.{mod}")

    def names(self) -> list[str]:
        self.load()
        return sorted(self._entries)

    def entries(self) -> dict[str, T]:
        self.load()
        return dict(self._entries)

    def has(self, name: str) -> bool:
        """Whether ``name`` is an entry, importing its own module first and every module only when that
        does not register it."""
        if name not in self._entries:
            self._load_one(name)
        if name not in self._entries:
            self.load()
        return name in self._entries

    def get(self, name: str) -> T:
        """The entry ``name``; an unknown name is a ConfigError listing the known ones."""
        if not self.has(name):
            raise ConfigError(f"unknown {self.kind} {name!r}; choose one of: {', '.join(sorted(self._entries))}")
        return self._entries[name]
