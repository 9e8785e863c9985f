"""Formatting primitives every report renderer and section shares: number cells, byte units, HTML
escaping. A leaf of report/ (tables are built and rendered in table.py)."""
from __future__ import annotations

from html import escape
from typing import Any

from dlscale.fmt import MISSING, fmt_num

__all__ = ["GIB", "MIB", "MB", "MISSING", "fmt", "html_escape"]

GIB, MIB = 2.0 ** 30, 2.0 ** 20
MB = 1e6  # disk and network rates are in MB/s (10^6 bytes/s)


def fmt(v: Any, nd: int = 2) -> str:
    """A report number: ``nd`` decimals, more where a small value would lose its digits."""
    return fmt_num(v, nd)


def html_escape(v: Any) -> str:
    return escape(str(v), quote=True)
