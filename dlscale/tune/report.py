"""The tunes of a store in the HTML report: one table per ``tune:<id>`` label, read from the
stored records alone (what was pruned is only in the tune's own output)."""
from __future__ import annotations

from html import escape
from typing import Any

from dlscale.results.record import newest_per_key
from dlscale.report.data import rec_label
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
    from dlscale.report.compare import Options, Pair, judge
    from dlscale.report.data import Row, repeat_samples
    from dlscale.tune.search import Measurement

    meas = [(Row(r), Measurement(None, r).invalid) for r in recs]
    meas.sort(key=lambda x: (x[1] is not None, -(x[0].median or 0.0)))
    best = meas[0][0] if meas and meas[0][1] is None else None
    out = []
    for row, invalid in meas:
        d = {"case": Pair(row, None, [], []).case, "median": row.median, "n": (row.stats or {}).get("n"),
             "status": row.status, "invalid": invalid, "command": row.record.get("command"), "best": row is best}
        if best is not None and row is not best and invalid is None:
            p = judge(Pair(best, row, repeat_samples(best.record), repeat_samples(row.record)), Options())
            d.update(gap_pct=p.change_pct, verdict=p.verdict)
        out.append(d)
    return out


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
        out.append(f"<h3>{escape(label)}</h3><table><thead><tr><th class=\"l\">case</th><th>samples/s</th><th>n</th>"
                   "<th>gap %</th><th class=\"l\">verdict</th></tr></thead><tbody>")
        for d in rows:
            gap = "best" if d["best"] else (f"{d['gap_pct']:+.1f}" if d.get("gap_pct") is not None else "-")
            verdict = d.get("verdict") or (d["invalid"] or "" if not d["best"] else "")
            med = f"{d['median']:,.1f}" if d["median"] is not None else d["status"]
            out.append(f'<tr><td class="l">{escape(d["case"])}</td><td>{escape(med)}</td><td>{d["n"] or "-"}</td>'
                       f'<td>{escape(gap)}</td><td class="l">{escape(verdict)}</td></tr>')
        out.append("</tbody></table>")
        best = next((d for d in rows if d["best"]), None)
        if best and best["command"]:
            out.append(f"<p>Fastest: <code>{escape(str(best['command']))}</code></p>")
    return out
