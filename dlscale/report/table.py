"""The format-neutral table every report section returns, and one renderer per format.

A section builds a ``Table`` (title, columns, rows of values, notes) and never formats it; the
renderers below turn any table into Markdown, HTML, CSV, JSON or console text. A ``Column`` says
how its values read (header, unit, decimals, note, the key CSV and JSON name it by); a row holds
raw values, or a ``Cell`` where the text is not the value's plain formatting (a status word, a
flag mark) or where HTML marks it (a class, a tooltip). A leaf of report/: it imports no section.
"""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from dlscale.fmt import MISSING, fmt_num, md_cell
from dlscale.report.cells import html_escape as _e

__all__ = ["Cell", "Column", "Table", "verdict_cell", "markdown", "md_table", "html", "html_table", "csv_text", "json_obj",
           "console"]


@dataclass(frozen=True)
class Column:
    header: str
    unit: str = ""
    decimals: int | None = None  # a number column: fmt_num with these decimals; None: the value as text
    note: str = ""
    key: str = ""  # its name in CSV and JSON; default: the title
    left: bool = False  # text column: Markdown '---' and HTML class "l" (numbers align right)
    format: Callable[[Any], str] | None = None  # a number's text where decimals do not say it (not None)

    @property
    def title(self) -> str:
        return f"{self.header} ({self.unit})" if self.unit else self.header

    @property
    def name(self) -> str:
        return self.key or self.title

    def text(self, v: Any) -> str:
        """A cell's text: a Cell's own, '—' for None, numbers to ``decimals``, pairs joined by ' / '."""
        if isinstance(v, Cell):
            return v.text
        if isinstance(v, tuple):
            return MISSING if all(x is None for x in v) else " / ".join(self.text(x) for x in v)
        if v is None:
            return MISSING
        if self.format is not None:
            return self.format(v)
        if self.decimals is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
            return fmt_num(v, self.decimals)
        return str(v)


@dataclass(frozen=True)
class Cell:
    """A cell whose text is its own (a status word, a marked number); ``value`` is what CSV and JSON
    carry, ``cls`` and ``tip`` the HTML class and tooltip."""
    text: str
    value: Any = None
    cls: str = ""
    tip: str = ""


VERDICT_CLASS = {"faster": "good", "slower": "flag", "pass": "good", "FAIL": "flag"}


def verdict_cell(v: str | None) -> Cell | None:
    """A verdict (compare's, parity's) marked good or bad for HTML."""
    return None if v is None else Cell(v, v, cls=VERDICT_CLASS.get(v, ""))


def value_of(v: Any) -> Any:
    return v.value if isinstance(v, Cell) else v


@dataclass
class Table:
    title: str
    columns: list[Column]
    rows: list[list[Any]]
    notes: list[Any] = field(default_factory=list)  # str, or Cell where HTML marks the line
    intro: str = ""  # a line between the title and the table
    title_md: str = ""  # the title as Markdown text where it holds user text to escape
    anchor: str = ""  # HTML id of the section
    kind: str = ""  # HTML class of the table (dlperf, side, parity...)
    row_classes: list[str] = field(default_factory=list)
    wide: bool = False  # HTML: tighter cells for many columns

    def headers(self) -> list[str]:
        return [c.title for c in self.columns]

    def texts(self) -> list[list[str]]:
        return [[c.text(v) for c, v in zip(self.columns, row)] for row in self.rows]

    def records(self) -> list[dict[str, Any]]:
        """The rows as {column name: raw value} (CSV, JSON)."""
        return [{c.name: value_of(v) for c, v in zip(self.columns, row)} for row in self.rows]

    def all_notes(self) -> list[Any]:
        """The table's notes, then each shown column's own (``title: note``)."""
        return list(self.notes) + [f"{c.title}: {c.note}" for c in self.columns if c.note]

    def column(self, header: str) -> int | None:
        return next((i for i, c in enumerate(self.columns) if c.header == header or c.title == header), None)


def _note_text(n: Any) -> str:
    return n.text if isinstance(n, Cell) else str(n)


# ----------------------------------------------------------------------------- Markdown

def md_table(t: Table) -> str:
    out = ["| " + " | ".join(md_cell(h) for h in t.headers()) + " |",
           "|" + "|".join("---" if c.left else "---:" for c in t.columns) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in t.texts()]
    return "\n".join(out)


def markdown(t: Table, heading: str = "###") -> list[str]:
    """Lines: the title (a heading of ``heading``, or a plain line with ``heading=""``), the intro,
    the table, its notes as a list, each block followed by a blank line."""
    title = t.title_md or t.title
    out = ([f"{heading} {title}", ""] if heading else [title, ""]) if title else []
    if t.intro:
        out += [t.intro, ""]
    out += [md_table(t), ""]
    if t.all_notes():
        out += [f"- {_note_text(n)}" for n in t.all_notes()] + [""]
    return out


# ----------------------------------------------------------------------------- HTML

def html_table(t: Table) -> str:
    """The ``<table>`` in its scrolling wrapper."""
    out = [f'<table class="{_e(t.kind)}"><thead><tr>']
    out += [f'<th class="{"l" if c.left else ""}">{_e(c.title)}</th>' for c in t.columns]
    out.append("</tr></thead><tbody>")
    for i, row in enumerate(t.rows):
        rc = t.row_classes[i] if t.row_classes else ""
        out.append(f'<tr class="{_e(rc)}">')
        for c, v in zip(t.columns, row):
            classes = (["l"] if c.left else []) + (v.cls.split() if isinstance(v, Cell) else [])
            classes = list(dict.fromkeys(classes))
            tip = v.tip if isinstance(v, Cell) else ""
            tattr = f' title="{_e(tip)}"' if tip else ""
            out.append(f'<td class="{" ".join(classes)}"{tattr}>{_e(c.text(v))}</td>')
        out.append("</tr>")
    out.append("</tbody></table>")
    wrap = "tablewrap wide" if t.wide else "tablewrap"
    return f'<div class="{wrap}">' + "".join(out) + "</div>"


def html_notes(notes: Sequence[Any]) -> str:
    if not notes:
        return ""
    items = [f'<li class="{_e(n.cls)}">{_e(n.text)}</li>' if isinstance(n, Cell) else f"<li>{_e(n)}</li>"
             for n in notes]
    return '<ul class="notes">' + "".join(items) + "</ul>"


def html(t: Table, heading: str = "h3", after: str = "") -> str:
    """A ``<section>`` of the title as ``heading``, the intro, the table, its notes and ``after`` (its
    plots); with ``heading=""`` the same without the section, the title a ``p.sub`` line."""
    intro = f'<p class="sub">{_e(t.intro)}</p>' if t.intro else ""
    if not heading:
        title = f'<p class="sub">{_e(t.title)}</p>' if t.title else ""
        return f"{title}{intro}{html_table(t)}{html_notes(t.all_notes())}{after}"
    anchor = f' id="{_e(t.anchor)}"' if t.anchor else ""
    title = f"<{heading}>{_e(t.title)}</{heading}>" if t.title else ""
    return f"<section{anchor}>{title}{intro}{html_table(t)}{html_notes(t.all_notes())}{after}</section>"


# ----------------------------------------------------------------------------- CSV, JSON, console

def csv_text(t: Table) -> str:
    """One line per row under the columns' names; raw values, empty for None."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([c.name for c in t.columns])
    for rec in t.records():
        w.writerow(["" if v is None else v for v in rec.values()])
    return buf.getvalue()


def json_obj(t: Table) -> dict[str, Any]:
    return {"title": t.title,
            "columns": [{"name": c.name, "header": c.header, "unit": c.unit or None, "decimals": c.decimals,
                         "note": c.note or None} for c in t.columns],
            "rows": t.records(), "notes": [_note_text(n) for n in t.notes]}  # column notes: in "columns"


def console(t: Table) -> str:
    """Aligned plain text for a terminal: the title, the columns padded to their widest cell, notes."""
    rows = [t.headers()] + t.texts()
    widths = [max(len(r[i]) for r in rows) for i in range(len(t.columns))]

    def line(r: list[str]) -> str:
        return "  ".join(s.ljust(w) if c.left else s.rjust(w) for s, w, c in zip(r, widths, t.columns)).rstrip()

    out = [t.title] if t.title else []
    out += [line(rows[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in rows[1:]]
    out += [f"  {_note_text(n)}" for n in t.all_notes()]
    return "\n".join(out) + "\n"
