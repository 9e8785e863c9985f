"""The tunes of a store in the HTML report: one table per ``tune:<id>`` label, read from the
stored records alone (what was pruned is only in the tune's own output)."""
from __future__ import annotations

from html import escape
from typing import Any

from dlscale.report.data import Row, rec_label
from dlscale.report.table import Cell, Column, Table, html
from dlscale.results.record import newest_per_key
from dlscale.tune.result import _verdict
from dlscale.tune.search import Measurement
from dlscale.tune.space import LABEL_PREFIX


def stored_tunes(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """label -> the newest run record of each case of that tune."""
    def key(r: dict[str, Any]) -> list[tuple[str, str]]:
        label = str(rec_label(r) or "")
        return [(label, str(r.get("case_key")))] if r.get("kind") == "run" and label.startswith(LABEL_PREFIX) else []

    out: dict[str, list[dict[str, Any]]] = {}
    for (label, _), r in newest_per_key(records, key).items():
        out.setdefault(label, []).append(r)
    return out


def tune_rows(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The measured cases of one tune, the fastest valid first, each with compare's verdict against it."""
    from dlscale.report.compare import Pair  # numpy: keeps start-up light

    meas = [(Row(r), Measurement(None, r).invalid) for r in recs]
    meas.sort(key=lambda x: (x[1] is not None, -(x[0].median or 0.0)))
    best = meas[0][0] if meas and meas[0][1] is None else None
    out = []
    for row, invalid in meas:
        d = {"case": Pair(row, None, [], []).case, "median": row.median, "n": (row.stats or {}).get("n"),
             "status": row.status, "invalid": invalid, "command": row.record.get("command"), "best": row is best}
        if best is not None and row is not best and invalid is None:
            d.update(_verdict(best, row))
        out.append(d)
    return out


COLUMNS = (Column("case", left=True), Column("samples/s", format=lambda v: f"{v:,.1f}"), Column("n"),
           Column("gap", "%", format=lambda v: f"{v:+.1f}"), Column("verdict", left=True))


def table(label: str, rows: list[dict[str, Any]]) -> Table:
    """One tune's rows: the best marked in the gap column, an invalid case's reason as its verdict."""
    body = []
    for d in rows:
        gap = Cell("best") if d["best"] else d.get("gap_pct")
        verdict = d.get("verdict") or (d["invalid"] or "" if not d["best"] else "")
        med = d["median"] if d["median"] is not None else Cell(str(d["status"]))
        body.append([d["case"], med, d["n"], gap, verdict])
    return Table(label, list(COLUMNS), body)


def html_section(records: list[dict[str, Any]]) -> list[str]:
    """``<h2>`` and one table per tune; nothing when the store holds no tune."""
    tunes = stored_tunes(records)
    if not tunes:
        return []
    out = ['<h2 id="tune">Tune results</h2>',
           '<p class="method">Each <code>dlscale tune</code> of the store: its measured cases, the fastest valid first; '
           'gap and verdict are compare\'s test against it (docs/tune.md).</p>']
    for label in sorted(tunes):
        rows = tune_rows(tunes[label])
        best = next((d for d in rows if d["best"]), None)
        fastest = f"<p>Fastest: <code>{escape(str(best['command']))}</code></p>" if best and best["command"] else ""
        out.append(html(table(label, rows), after=fastest))
    return out
