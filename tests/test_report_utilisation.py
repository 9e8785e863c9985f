"""`dlscale report` with utilisation, step-time breakdown, series files and profiler traces.

Hand-computed store (gpt2 amp-bf16 batch 8 ddp, plus two tables to check columns stay compact):

* 1n1g: GPU 90 %, CPU 25 %, host mem 16 GiB, disk 50/10 MB/s, net 1/2 MB/s; breakdown on one
  device: data 1 + forward 5 + backward 10 + optimizer 2 = step 18 ms, no comm fields.
* 1n2g: GPU 80 %, CPU 40 %, host mem 24 GiB, disk 100/20 MB/s, net 250/125 MB/s; breakdown: data 1,
  forward 5, backward 12 (of which 2 exposed comm, 10 compute), optimizer 2 = step 20 ms; exposed
  comm 2.0 / 20.0 = 10.0 %, overlap 0.75 = 75.0 %; a 20-sample series file for its median repeat
  (repeat 1) and a profiler trace.
* resnet50 (no utilisation, no breakdown): none of the new columns.
* bert-base without NVML: CPU util only, no GPU column.
"""
from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.report.data import build_report, load_records
from dlscale.report.plots import breakdown_segments, over_time_plot
from dlscale.report.render import MISSING

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)

GIB = 2 ** 30
GPT2 = "gpt2 · amp-bf16 · eager · ddp · batch 8/device"
RN50 = "resnet50 · fp32 · eager · ddp · batch 64/device"
BERT = "bert-base · fp32 · eager · ddp · batch 16/device"
SLUG = "gpt2"  # the model has one table in this store: its DLPerf key is the model name
NEW_HEADERS = ["GPU util (%)", "CPU util (%)", "host mem (GiB)", "disk r/w (MB/s)", "net tx/rx (MB/s)",
               "exposed comm (%)", "overlap (%)"]
SERIES = "series/g2-r1-rank0.jsonl"
TRACE = "traces/g2.json"
UNSUPPORTED = "strategy has its own step (pipeline schedule)"  # a breakdown's reason, as a record states it
CHROMIUM = "/usr/bin/chromium"


def util(gpu, cpu, host_gib, disk_r, disk_w, net_tx, net_rx, nvml=True) -> dict:
    """The flat summary of dlscale.monitor (rates given in MB/s, stored in bytes/s)."""
    return {"gpu_util_pct_mean": gpu, "gpu_util_pct_max": gpu and gpu + 5, "gpu_mem_util_pct_mean": gpu and 30.0,
            "gpu_mem_used_bytes_mean": 40 * GIB if nvml else None, "cpu_util_pct_mean": cpu,
            "cpu_util_pct_max": cpu + 10, "cpu_util_per_core_mean": [cpu, cpu],
            "host_mem_used_bytes_mean": host_gib * GIB, "host_mem_used_bytes_max": host_gib * GIB,
            "proc_rss_bytes_mean": 3 * GIB, "disk_read_bps_mean": disk_r * 1e6, "disk_write_bps_mean": disk_w * 1e6,
            "net_sent_bps_mean": net_tx * 1e6, "net_recv_bps_mean": net_rx * 1e6, "n_samples": 20,
            "interval_s": 0.1, "window_s": 2.0, "nvml": nvml, "sampling_error": None, "per_gpu": []}


def sample(i: int, t0: float = 1_700_000_000.0) -> dict:
    """One line of a series file, shaped as dlscale.monitor writes it (two GPUs)."""
    busy = 5 <= i < 15  # the "timed window" of this fake run
    return {"t": t0 + 0.1 * i, "dt": 0.1, "cpu_util_pct": 40.0 if busy else 10.0, "cpu_util_per_core": [40.0, 40.0],
            "host_mem_used_bytes": 24 * GIB, "proc_rss_bytes": 3 * GIB,
            "disk_read_bps": 100e6 if busy else 0.0, "disk_write_bps": 20e6 if busy else None,
            "net_sent_bps": 250e6 if busy else 0.0, "net_recv_bps": 125e6 if busy else 0.0,
            "gpus": [{"index": k, "util_pct": (80.0 + 4 * k) if busy else 0.0, "mem_util_pct": 30.0,
                      "mem_used_bytes": 40 * GIB, "power_w": 500.0, "sm_clock_mhz": 1980.0, "pcie_tx_bps": None,
                      "pcie_rx_bps": None, "nvlink_tx_bps": None, "nvlink_rx_bps": None} for k in range(2)],
            "sampler_cpu_s": 0.01 * i}


def records() -> list[dict]:
    # throughputs whose window steps (8 / 444.4 s, 16 / 800 s) are the breakdowns' 18 and 20 ms
    one = F.run_record("g1", "gpt2", "amp-bf16", 8, "ddp", 1, 1, [444.4, 444.4, 444.4], mfu=0.3, mem_gib=2,
                       steps=100, extra={
        "utilisation": util(90.0, 25.0, 16, 50, 10, 1, 2),
        "breakdown": {"supported": True, "steps": 10, "data_ms": 1.0, "forward_ms": 5.0, "backward_ms": 10.0,
                      "optimizer_ms": 2.0, "step_ms": 18.0, "backward_compute_ms": None, "exposed_comm_ms": None,
                      "comm_ms": None, "overlap_ratio": None},
        "median_repeat": 0, "trace": None})
    two = F.run_record("g2", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [790, 800, 810], mfu=0.28, mem_gib=2,
                       steps=100, extra={
        "utilisation": util(80.0, 40.0, 24, 100, 20, 250, 125),
        "breakdown": {"supported": True, "steps": 10, "data_ms": 1.0, "forward_ms": 5.0, "backward_ms": 12.0,
                      "optimizer_ms": 2.0, "step_ms": 20.0, "backward_compute_ms": 10.0, "exposed_comm_ms": 2.0,
                      "comm_ms": 8.0, "overlap_ratio": 0.75},
        "median_repeat": 1, "trace": TRACE})
    for i, rep in enumerate(two["repeats"]):
        rep["series"] = [f"series/g2-r{i}-rank0.jsonl"]
    rn = F.run_record("rn2", "resnet50", "fp32", 64, "ddp", 1, 2, [500, 500, 500], unit="img")
    bert = F.run_record("b2", "bert-base", "fp32", 16, "ddp", 1, 2, [50, 50, 50], extra={
        "utilisation": util(None, 55.0, 8, 0, 0, 0, 0, nvml=False),
        "breakdown": {"supported": False, "reason": UNSUPPORTED}})
    return [one, two, rn, bert]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    F.write_store(d, records())
    (d / "series").mkdir()
    (d / SERIES).write_text("".join(json.dumps(sample(i)) + "\n" for i in range(20)))
    (d / "traces").mkdir()
    (d / TRACE).write_text('{"traceEvents": []}\n')
    return d


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def md_tables(text: str) -> dict[str, tuple[list[str], list[list[str]]]]:
    """{### heading: (header cells, body rows)} of a Markdown report."""
    tables: dict[str, tuple[list[str], list[list[str]]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("### "):
            heading = line[4:]
        elif not line.startswith("|") and heading in tables:
            heading = None  # the first table under the heading ended (the step growth's is left out)
        elif line.startswith("|") and heading is not None:
            cells = [c.strip() for c in line.strip()[1:-1].split(" | ")]
            if heading not in tables:
                tables[heading] = (cells, [])
            elif not set(line.replace("|", "").strip()) <= set("-: "):
                tables[heading][1].append(cells)
    return tables


def test_md_columns_hand_computed(store, capsys):
    rc, out, err = cli(capsys, "report", str(store))
    assert rc == 0, err
    t = md_tables(out)
    head, rows = t[GPT2]
    dlperf = head[:-len(NEW_HEADERS)]  # the DLPerf columns every table has
    assert head[len(dlperf):] == NEW_HEADERS
    assert rows[0][len(dlperf):] == ["90.0", "25.0", "16.0", "50.0 / 10.0", "1.0 / 2.0", MISSING, MISSING]
    # exposed comm 2.0 ms of a 20.0 ms step = 10.0 %; overlap 0.75 = 75.0 %
    assert rows[1][len(dlperf):] == ["80.0", "40.0", "24.0", "100.0 / 20.0", "250.0 / 125.0", "10.0", "75.0"]
    # no utilisation, no breakdown: the table keeps its ten DLPerf columns
    head, rows = t[RN50]
    assert len(head) == len(dlperf) and not set(NEW_HEADERS) & set(head) and all(len(r) == len(dlperf) for r in rows)
    # without NVML: CPU, memory, disk and net, but no GPU column; unsupported breakdown -> no comm columns
    head, rows = t[BERT]
    assert head[len(dlperf):] == ["CPU util (%)", "host mem (GiB)", "disk r/w (MB/s)", "net tx/rx (MB/s)"]
    assert rows[0][len(dlperf):] == ["55.0", "8.0", "0.0 / 0.0", "0.0 / 0.0"]
    notes = [ln[2:] for ln in out.splitlines() if ln.startswith("- ")]
    # the unsupported breakdown's reason (as recorded) and the profiler trace by its path in the store
    assert any(n.startswith("1n2g: ") and UNSUPPORTED in n for n in notes)
    assert any(n.startswith("1n2g: ") and str(store / TRACE) in n for n in notes)


def test_csv_and_json_carry_the_raw_values(store, capsys):
    rc, out, _ = cli(capsys, "report", str(store), "--format", "csv")
    assert rc == 0
    by = {(r["group"], r["devices"]): r for r in csv.DictReader(io.StringIO(out))}
    r = by[("gpt2", "2")]
    assert float(r["gpu_util_pct_mean"]) == 80 and float(r["cpu_util_pct_mean"]) == 40
    assert float(r["host_mem_used_bytes_mean"]) == 24 * GIB and float(r["net_sent_bps_mean"]) == 250e6
    assert float(r["exposed_comm_ms"]) == 2 and float(r["breakdown_step_ms"]) == 20
    assert float(r["exposed_comm_pct"]) == pytest.approx(10.0) and float(r["overlap_pct"]) == pytest.approx(75.0)
    assert r["trace"] == TRACE
    assert by[("resnet50", "2")]["gpu_util_pct_mean"] == "" and by[("resnet50", "2")]["exposed_comm_pct"] == ""
    rc, out, _ = cli(capsys, "report", str(store), "--format", "json")
    e = json.loads(out)["dlperf"]["gpt2"]
    assert e["1n2g"]["exposed_comm_pct"] == pytest.approx(10.0) and e["1n2g"]["overlap_pct"] == pytest.approx(75.0)
    assert e["1n2g"]["gpu_util_pct_mean"] == 80.0 and e["1n2g"]["disk_write_bps_mean"] == 20e6
    assert e["1n1g"]["exposed_comm_pct"] is None and e["1n1g"]["cpu_util_pct_mean"] == 25.0


def test_breakdown_stack_sums_to_step_ms(store):
    report = build_report(load_records(store))
    (g,) = [g for g in report.groups if g.model == "gpt2"]
    one, two = [dict(breakdown_segments(r.breakdown)) for r in g.rows]
    assert list(two) == ["data", "forward", "backward compute", "exposed comm", "optimizer"]
    assert two == {"data": 1.0, "forward": 5.0, "backward compute": 10.0, "exposed comm": 2.0, "optimizer": 2.0}
    assert sum(two.values()) == pytest.approx(20.0)  # step_ms: backward_ms already holds the exposed comm
    assert one["exposed comm"] == 0.0 and sum(one.values()) == pytest.approx(18.0)
    # the shared fixture store (written as dlscale.train.breakdown writes it) stacks to its step_ms too
    main = build_report(load_records(FIXTURES / "report_store"))
    bds = [r.breakdown for g in main.groups for r in g.own_rows if r.breakdown]
    assert len(bds) == 3
    for b in bds:
        assert sum(v for _, v in breakdown_segments(b)) == pytest.approx(b["step_ms"])


def _notes(md: str, row: str) -> str:
    """The Markdown notes of one row (``- 1n2g: ...``), joined."""
    return "\n".join(ln for ln in md.splitlines() if ln.startswith(f"- {row}: "))


def _img_count(html: str) -> int:
    return len(re.findall(r'<img alt="[^"]*" src="data:image/png;base64,', html))


@pytest.mark.slow  # renders PNG/SVG plots with matplotlib: seconds, kept out of the quick tier
def test_over_time_plot_file_and_html(store, tmp_path, capsys):
    import matplotlib.image as mpimg

    plots, html = tmp_path / "plots", tmp_path / "out" / "report.html"
    html.parent.mkdir()
    rc, _, err = cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html),
                     "--plots-dir", str(plots))
    assert rc == 0, err
    png = plots / f"{SLUG}__utilisation_over_time.png"
    assert png.exists() and (plots / f"{SLUG}__utilisation_over_time.svg").exists()
    img = mpimg.imread(png)
    assert img.shape[0] > 300 and img.std() > 0.01
    assert (plots / f"{SLUG}__breakdown.png").exists()
    text = html.read_text()
    caption = re.search(r"utilisation over time \(([^)]*)\)", text)  # the plot's title: its case and repeat
    assert caption and "1n2g" in caption[1] and re.search(r"\brepeat 1\b", caption[1]), caption
    # the trace is linked relative to the page, and named with the viewers to open it in
    assert f'href="../results/{TRACE}"' in text and "ui.perfetto.dev" in text and "chrome://tracing" in text
    assert "<script" not in text and 'href="http' not in text
    with_series = _img_count(text)
    os.remove(store / SERIES)
    assert cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html))[0] == 0
    assert _img_count(html.read_text()) == with_series - 1

    # window shading, when a repeat entry carries the window's wall-clock bounds
    report = build_report(load_records(store))
    (g,) = [g for g in report.groups if g.model == "gpt2"]
    row = g.rows[1]
    row.record["repeats"][1]["window_wall"] = [1_700_000_000.5, 1_700_000_001.5]
    assert over_time_plot(g, row, SERIES, [sample(i) for i in range(20)], ("png",)) is not None


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_bad_series_file_never_fails_the_report(store, tmp_path, capsys, damage):
    if damage == "missing":
        os.remove(store / SERIES)
    else:  # unreadable lines, odd field types, one sample too few to draw
        (store / SERIES).write_text('{"t": "x"}\nnot json\n\n{"t": 1.0, "gpus": 3}\n')
        with open(store / "series" / "g2-r1-rank1.jsonl", "w") as f:  # node 1: samples of odd shapes
            f.write('{"t": 1.0, "gpus": 3, "cpu_util_pct": "high"}\n{"t": 2.0, "gpus": [null, {"util_pct": []}]}\n')
        rec = json.loads((store / "results.jsonl").read_text().splitlines()[1])
        assert rec["id"] == "g2"
        rec["repeats"][1]["series"].append("series/g2-r1-rank1.jsonl")
        lines = (store / "results.jsonl").read_text().splitlines()
        lines[1] = json.dumps(rec)
        (store / "results.jsonl").write_text("\n".join(lines) + "\n")
    rc, out, err = cli(capsys, "report", str(store))
    assert rc == 0, err
    assert (SERIES in _notes(out, "1n2g")) == (damage == "missing")  # a missing file is named under its row
    html = tmp_path / "r.html"
    rc, _, err = cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html))
    assert rc == 0, err
    text = html.read_text()
    assert "utilisation over time" not in text
    assert '<img alt="utilisation"' in text and '<img alt="step-time breakdown"' in text  # the rest is there


def test_store_dir_of_a_single_jsonl_file(store, capsys):
    """Paths in records are relative to the store directory, also when the store is given as a file."""
    from dlscale.report.plots import utilisation_over_time

    report = build_report(load_records(store / "results.jsonl"))
    (g,) = [g for g in report.groups if g.model == "gpt2"]
    assert g.store_dir == str(store)
    p = utilisation_over_time(g, ("png",))
    assert p is not None and p.stem == f"{SLUG}__utilisation_over_time" and p.data["png"].startswith(b"\x89PNG")
    rc, out, err = cli(capsys, "report", str(store / "results.jsonl"))
    assert rc == 0, err
    assert SERIES not in _notes(out, "1n2g")  # found: not named as missing


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium here (CI installs it)")
def test_html_with_over_time_plot_renders_in_chromium(store, tmp_path, capsys):
    html = tmp_path / "report.html"
    assert cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html))[0] == 0
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'ud'}", "--dump-dom", html.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    img = re.search(r'<img alt="utilisation over time \(([^)]*)\)"', dom)  # the plot rendered, by its title
    assert img and "1n2g" in img[1], dom[-2000:]
    assert "<th class=\"\">exposed comm (%)</th>" in dom and "<td class=\"\">10.0</td>" in dom
    assert 'class="trace"' in dom and "ui.perfetto.dev" in dom
    shutil.rmtree(tmp_path / "ud", ignore_errors=True)


def test_an_archived_store_with_gzipped_series_and_trace_reports_as_before(store, tmp_path, capsys):
    """An archived store keeps series and traces gzipped (NAME.gz beside no NAME): the report reads them."""
    html = tmp_path / "r.html"
    assert cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html))[0] == 0
    plain = _img_count(html.read_text())
    for rel in (SERIES, TRACE):
        src = store / rel
        with open(src, "rb") as f, gzip.open(src.with_name(src.name + ".gz"), "wb") as g:
            g.write(f.read())
        os.remove(src)
    rc, out, err = cli(capsys, "report", str(store), "--model", "gpt2", "--format", "html", "-o", str(html))
    assert rc == 0, err
    text = html.read_text()
    assert _img_count(text) == plain and f'href="results/{TRACE}.gz"' in text
    assert SERIES not in _notes(cli(capsys, "report", str(store))[1], "1n2g")


def test_step_growth_hand_computed(store, capsys, tmp_path):
    """The 1n2g row's step grows 20.0 - 18.0018 ms (the windows: 16 / 800 and 8 / 444.4 s per 1,000 steps):
    forward and backward computation unchanged (5 and 10 ms), 2.0 ms exposed of an 8.0 ms all-reduce
    (75 % hidden net), nothing in the optimizer or the fetch, and the phases' 2.0 ms leave -0.0018 unplaced."""
    from dlscale.report import account

    one, two = records()[:2]
    a = account.account(one, two, efficiency=800 / (2 * 444.4))
    assert a.window_1_ms == pytest.approx(8 / 444.4 * 1e3) and a.window_n_ms == pytest.approx(20.0)
    assert a.grows_ms == pytest.approx(20.0 - 8 / 444.4 * 1e3)
    assert (a.forward_ms, a.backward_compute_ms, a.exposed_comm_ms, a.comm_alone_ms) == (0.0, 0.0, 2.0, 8.0)
    assert a.hidden_share == pytest.approx(0.75) and a.optimizer_ms == 0.0 and a.data_ms == 0.0
    assert a.unplaced_ms == pytest.approx(a.grows_ms - 2.0) and a.off_window == []
    rc, out, err = cli(capsys, "report", str(store))
    assert rc == 0, err
    i = out.index("Step growth from the 1-device step (ms):")
    row = [ln for ln in out[i:].splitlines() if ln.startswith("| 1 | 2 |")][0]
    assert [c.strip() for c in row.strip()[1:-1].split(" | ")] == \
        ["1", "2", "90.0", "18.00", "20.00", "2.00", "0.00", "0.00", "2.00", "8.00", "75", "0.00", "0.00"]
    rc, out, err = cli(capsys, "report", str(store), "--format", "json")
    growth = json.loads(out)["groups"][SLUG]["step_growth"]
    assert list(growth) == ["1n2g"] and growth["1n2g"]["hidden_share"] == pytest.approx(0.75)
    html = tmp_path / "r.html"
    rc, out, err = cli(capsys, "report", str(store), "--format", "html", "-o", str(html), "--no-plots")
    assert rc == 0 and html.read_text().count(account.TITLE) == 1  # the account table, once
    # a 1-device breakdown 50 % off its window: named; an N-device one without its no_sync backward: no account
    off = json.loads(json.dumps(one))
    off["breakdown"]["step_ms"] = 27.0
    assert account.account(off, two).off_window == ["1 device"]
    partial = json.loads(json.dumps(two))
    partial["breakdown"]["backward_compute_ms"] = None
    assert account.account(one, partial) is None
