"""Formatting primitives every report renderer and section shares: number cells, byte units, the
Markdown table and the escaped HTML table. A leaf of report/: sections format their cells here and
never import a renderer (render.py, html.py), which import the sections.
"""
from __future__ import annotations

from html import escape
from typing import Any, Sequence

from dlscale.fmt import MISSING, fmt_num, md_table

__all__ = ["GIB", "MIB", "MB", "MISSING", "fmt", "md_table", "html_escape", "html_table"]

GIB, MIB = 2.0 ** 30, 2.0 ** 20
MB = 1e6  # disk and network rates are in MB/s (10^6 bytes/s)


def fmt(v: Any, nd: int = 2) -> str:
    """A report number: ``nd`` decimals, more where a small value would lose its digits."""
    return fmt_num(v, nd)


def html_escape(v: Any) -> str:
    return escape(str(v), quote=True)


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left_cols: int = 0,
           row_classes: Sequence[str] | None = None, cell_classes: Sequence[Sequence[str]] | None = None,
           cell_titles: Sequence[Sequence[str]] | None = None, cls: str = "") -> str:
    out = [f'<table class="{html_escape(cls)}"><thead><tr>']
    out += [f'<th class="{"l" if i < left_cols else ""}">{html_escape(h)}</th>' for i, h in enumerate(headers)]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes else ""
        out.append(f'<tr class="{html_escape(rc)}">')
        for j, c in enumerate(row):
            classes = ["l"] if j < left_cols else []
            if cell_classes and cell_classes[i][j]:
                classes.append(cell_classes[i][j])
            title = cell_titles[i][j] if cell_titles else ""
            tattr = f' title="{html_escape(title)}"' if title else ""
            out.append(f'<td class="{" ".join(classes)}"{tattr}>{html_escape(c)}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    return "".join(out)
