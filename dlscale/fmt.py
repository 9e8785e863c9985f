"""Number and table formatting shared by the console, the reports, the micro tables and predict/cost.

One rule for every printed number: a fixed number of decimals, widened where needed so that a
small value still shows ``SIG`` significant digits (a slow run prints 0.012 samples/s, never
0.0). A missing value prints as ``MISSING``; a spread over fewer than two repeats is missing,
not zero.
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence

MISSING = "—"  # a value that is not there (None, NaN, or no spread from one repeat)
SIG = 2  # significant digits a small nonzero value keeps
MAX_DECIMALS = 9
GIB, MIB, KIB = 2.0 ** 30, 2.0 ** 20, 2.0 ** 10


def yaml_number_hint(v: Any) -> str:
    """For a string YAML 1.1 left as text although it reads as a number ('1e300': no dot, no exponent
    sign), how to write it so that it is one; else ''."""
    m = re.fullmatch(r"([-+]?(?:\d+\.?\d*|\.\d+))[eE]([-+]?)(\d+)", v.strip()) if isinstance(v, str) else None
    if not m:
        return ""
    mant = m.group(1) if "." in m.group(1) else m.group(1) + ".0"
    return f" (YAML reads {v.strip()} as text: write {mant}e{m.group(2) or '+'}{m.group(3)})"


def finite(v: Any) -> float | None:
    """A finite number or None (bools, strings, NaN and infinities are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def decimals_for(x: float, digits: int, sig: int = SIG) -> int:
    """``digits``, or more when that many would leave fewer than ``sig`` significant digits."""
    if x == 0:
        return digits
    lead = math.floor(math.log10(abs(x)))  # position of the first significant digit
    return min(MAX_DECIMALS, max(digits, sig - 1 - lead))


def fmt_num(v: Any, digits: int = 2, *, group: bool = False, missing: str = MISSING, sig: int = SIG) -> str:
    """``v`` with ``digits`` decimals (more for small values, see ``decimals_for``); ``group``
    adds thousands separators."""
    x = finite(v)
    if x is None:
        return missing
    d = decimals_for(x, digits, sig)
    return f"{x:,.{d}f}" if group else f"{x:.{d}f}"


def fmt_stdev(stdev: Any, n: Any, digits: int = 2, *, group: bool = False, missing: str = MISSING) -> str:
    """A standard deviation over ``n`` repeats: missing when n < 2 (one repeat has no spread)."""
    k = finite(n)
    if k is None or k < 2:
        return missing
    return fmt_num(stdev, digits, group=group, missing=missing)


def fmt_hms(seconds: float | None) -> str:
    """A duration as H:MM:SS (an ETA, a budget); "?" where it is not known yet."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_bytes(n: Any, *, missing: str = MISSING) -> str:
    """Bytes in binary units: "1.50 GiB", "2 MiB" (whole values without decimals), "512 B"."""
    x = finite(n)
    if x is None:
        return missing
    for unit, div in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(x) >= div:
            v = x / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{x:.0f} B"


def fmt_si(x: Any, unit: str = "B", *, missing: str = MISSING) -> str:
    """A value in decimal (SI) units: 1.5e6 -> "1.5MB" (rates of disks and networks)."""
    v = finite(x)
    if v is None:
        return missing
    for prefix in ("", "K", "M", "G", "T"):
        if abs(v) < 1000 or prefix == "T":
            return f"{v:.0f}{unit}" if prefix == "" else f"{v:.1f}{prefix}{unit}"
        v /= 1000.0
    return missing  # not reached


def fmt_cell(v: Any, digits: int = 2, *, missing: str = MISSING) -> str:
    """Any table value: numbers as fmt_num (very large or small ones in exponent form), bools as
    yes/NO, the rest as text."""
    if v is None:
        return missing
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if not math.isfinite(v):
            return missing
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 10.0 ** -(digits + SIG)):
            return f"{v:.{SIG}g}"
        return fmt_num(v, digits)
    return str(v)


_MD_SPECIAL = "\\`*_[]<>#|"  # backslash first: an escape the user wrote must not combine with ours


def md_text(v: Any) -> str:
    """A user string (a label, a host name) as literal Markdown text on one line: control
    characters become spaces and every character Markdown (or raw HTML) would read is escaped."""
    text = "".join(c if c.isprintable() else " " for c in str(v))
    return "".join("\\" + c if c in _MD_SPECIAL else c for c in text)


def md_code(v: Any) -> str:
    """A user string as one inline code span, whatever backticks it holds (CommonMark: a fence longer
    than any run of backticks inside; padded where the text starts or ends with one)."""
    text = "".join(c if c.isprintable() else " " for c in str(v))
    fence = "`" * (max((len(r) for r in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _md_safe_line(line: str) -> str:
    """One line with every ``<`` outside code spans escaped (never a raw HTML tag or autolink)."""
    out, i, n = [], 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":  # an escape pair is literal: an escaped backtick opens no span, an escaped < stays
            out.append(line[i:i + 2])
            i += 2
        elif c == "`":
            run = re.match(r"`+", line[i:]).group()
            close = next((m.start() for m in re.finditer(r"`+", line[i + len(run):]) if len(m.group()) == len(run)),
                         None)
            end = i + len(run) + close + len(run) if close is not None else i + len(run)
            out.append(line[i:end])  # a code span (literal), or backticks with no closing run
            i = end
        else:
            out.append("\\<" if c == "<" else c)
            i += 1
    return "".join(out)


def md_safe(doc: str) -> str:
    """Generated Markdown with no live raw HTML: every ``<`` outside code spans and fenced blocks is
    escaped, so a label, model name or imported source holding a tag (or a backtick that would close
    a code span early) renders as text. dlscale's Markdown never means HTML; idempotent."""
    out, fenced = [], False
    for line in doc.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:  # a table row's cells are split before code spans are read: each cell on its own

            parts = re.split(r"(?<!\\)(\|)", line) if line.lstrip().startswith("|") else [line]
            out.append("".join(p if p == "|" else _md_safe_line(p) for p in parts))
    return "\n".join(out)


def md_generated(text: str) -> str:
    """A generated line (a table title) holding user values: like md_text, but ``_`` and ``*``
    stay as written (setting names such as grad_accum=2); callers escape the label fully."""
    text = "".join(c if c.isprintable() else " " for c in str(text))
    return "".join("\\" + c if c in "\\`[]<>#|" else c for c in text)


def md_heading(title: str, label: Any = None) -> str:
    """A heading's text: the generated title escaped, its ``label X`` part escaped as user text."""
    out = md_generated(title)
    if label is not None:
        out = out.replace(f"label {md_generated(str(label))}", f"label {md_text(label)}", 1)
    return out


def md_cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], numeric_from: int = 0,
             numeric_to: int | None = None) -> str:
    """A Markdown table; columns numeric_from..numeric_to-1 are right-aligned."""
    end = len(headers) if numeric_to is None else numeric_to
    out = ["| " + " | ".join(md_cell(h) for h in headers) + " |",
           "|" + "|".join("---:" if numeric_from <= i < end else "---" for i in range(len(headers))) + "|"]
    out += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
