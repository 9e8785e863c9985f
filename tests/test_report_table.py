"""The report's table model: one table, every format renders the same columns and values."""
from __future__ import annotations

import csv
import io

from dlscale.fmt import MISSING
from dlscale.report import table as T


def _t() -> T.Table:
    cols = [T.Column("case", left=True), T.Column("rate", "samples/s", 2, key="rate"),
            T.Column("disk r/w", "MB/s", 1)]
    rows = [["a", 1.234, (2.0, None)], ["b", T.Cell("OOM", None, cls="status", tip="why"), (None, None)]]
    return T.Table("title", cols, rows, notes=["n1", T.Cell("n2", cls="flag")])


def test_column_text_formats_numbers_pairs_and_missing():
    t = _t()
    assert t.headers() == ["case", "rate (samples/s)", "disk r/w (MB/s)"]
    assert t.texts() == [["a", "1.23", f"2.0 / {MISSING}"], ["b", "OOM", MISSING]]


def test_a_columns_note_follows_the_tables_notes_where_it_is_shown():
    t = _t()
    cols = [T.Column("x", note="what x is")] + t.columns[1:]
    t2 = T.Table("t", cols, t.rows, ["n1"])
    assert t2.all_notes() == ["n1", "x: what x is"]
    assert "- x: what x is" in T.markdown(t2) and "<li>x: what x is</li>" in T.html(t2)


def test_markdown_aligns_text_left_numbers_right():
    lines = T.markdown(_t())
    assert lines[0] == "### title"
    assert "|---|---:|---:|" in lines[2].splitlines()
    assert lines[-3:] == ["- n1", "- n2", ""]
    assert T.markdown(_t(), heading="")[0] == "title"


def test_html_carries_cell_classes_and_tooltips():
    h = T.html(_t())
    assert '<td class="status" title="why">OOM</td>' in h
    assert '<th class="l">case</th>' in h
    assert '<li class="flag">n2</li>' in h


def test_csv_and_json_carry_raw_values():
    t = _t()
    rows = list(csv.reader(io.StringIO(T.csv_text(t))))
    assert rows[0] == ["case", "rate", "disk r/w (MB/s)"]
    assert rows[1][1] == "1.234" and rows[2][1] == ""
    obj = T.json_obj(t)
    assert obj["rows"][0]["rate"] == 1.234 and obj["rows"][1]["rate"] is None
    assert [c["decimals"] for c in obj["columns"]] == [None, 2, 1]


def test_console_pads_every_line_to_the_columns():
    text = T.console(_t()).splitlines()
    header, rule = text[1], text[2]
    assert len(rule.split("  ")) == 3
    assert text[3].endswith("2.0 / " + MISSING) and header.startswith("case")


def test_the_slowest_rank_step_column_is_its_median_step_in_ms():
    from types import SimpleNamespace

    from dlscale.report import lostcols, render

    ranks = [{"rank": 0, "host": "h", "device": "cpu", "window_median_ms": 10.0, "solo_ms": [9.0, 10.0, 11.0]},
             {"rank": 1, "host": "h", "device": "cpu", "window_median_ms": 12.0, "solo_ms": [12.0, 14.0, 13.0]}]
    row = SimpleNamespace(record={"repeats": [{"repeat": 0, "status": "ok", "rank_steps": ranks}], "median_repeat": 0})
    col, accessor = next((c, f) for c, f in render.EXTRA_COLUMNS
                         if isinstance(c, T.Column) and c.title == "slowest rank step (ms)")
    assert col.decimals == 1 and col.note
    assert accessor(row) == (13.0,)  # rank 1's median solo step
    assert lostcols.fields(row)["slowest_rank_step_ms"] == 13.0
    assert accessor(SimpleNamespace(record={"repeats": []})) == (None,)  # one rank or none: no column value
