"""`dlscale report`: DLPerf tables, JSON/CSV values, plots, HTML in a real browser, bad input."""
from __future__ import annotations

import csv
import hashlib
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

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)

CHROMIUM = "/usr/bin/chromium"
DDP = "bert-base · amp-bf16 · eager · ddp · batch 128/device"
FSDP = "bert-base · amp-bf16 · eager · fsdp · batch 128/device"
B256 = "bert-base · amp-bf16 · eager · ddp · batch 256/device"
RN50 = "resnet50 · fp32 · eager · ddp · batch 64/device"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    shutil.copytree(FIXTURES / "report_store", d)
    return d


def _stored(store: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(store.glob("*.jsonl")) for line in f.read_text().splitlines() if line]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def md_tables(text: str) -> dict[str, list[list[str]]]:
    """{### heading: the first table's body rows as cell lists} of a Markdown report (a later table under
    the same heading, the step growth, is left out)."""
    tables, heading, rows = {}, None, None
    for line in text.splitlines():
        if line.startswith("### "):
            heading, rows = line[4:], None
        elif not line.startswith("|") and rows is not None:
            heading, rows = None, None  # the first table ended
        elif line.startswith("|") and heading is not None:
            if rows is None:
                rows = tables.setdefault(heading, [])
                rows.append(None)  # header
            elif set(line.replace("|", "").strip()) <= set("-: "):
                continue
            else:
                rows.append([c.strip() for c in line.strip()[1:-1].split(" | ")])
    return {k: [r for r in v if r is not None] for k, v in tables.items()}


def digest(path: Path) -> dict[str, tuple[str, int]]:
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_fixture_file_matches_generator():
    assert (FIXTURES / "report_store" / "results.jsonl").read_text() == F.dumps(F.main_store_records())


def test_markdown_dlperf_tables(store, capsys):
    rc, out, err = cli(capsys, "report", str(store))
    assert rc == 0, err
    t = md_tables(out)
    # node_num, gpu_num, median, speedup, efficiency %, MFU %, peak mem GiB, min-max, stdev, n,
    # then (these records carry utilisation and breakdown) GPU util %, CPU util %, exposed comm %, overlap %
    assert t[DDP] == [
        ["1", "1", "100.00", "1.00", "100.0", "40.0", "10.00", "98.00–102.00", "1.58", "5", "95.0", "30.0", "—", "—"],
        ["1", "2", "190.00", "1.90", "95.0", "38.0", "10.50", "186.00–194.00", "3.16", "5", "88.3", "30.0", "5.2", "80.0"],
        ["1", "4", "360.00", "3.60", "90.0", "36.0", "11.00", "352.00–368.00", "6.32", "5", "80.8", "30.0", "11.1", "80.0"],
        ["2", "8", "TIMEOUT"] + ["—"] * 11,
    ]
    # OOM batch sizes are listed with their status, never numbers
    assert t[B256] == [["1", "1", "OOM"] + ["—"] * 7, ["1", "2", "OOM"] + ["—"] * 7]
    # fsdp has no 1-device run: the ddp 1-device record is its baseline (shown as the 1n1g row)
    assert [r[:5] for r in t[FSDP]] == [["1", "1", "100.00", "1.00", "100.0"], ["1", "2", "180.00", "1.80", "90.0"],
                                        ["1", "4", "340.00", "3.40", "85.0"]]
    # no 1-device baseline: speedup and efficiency missing, not guessed; MiB for small peaks
    assert [r[:7] for r in t[RN50]] == [["1", "2", "500.00", "—", "—", "—", "768.00"],
                                        ["1", "4", "960.00", "—", "—", "—", "819.20"]]
    assert "peak mem / device (GiB)" in out and "peak mem / device (MiB)" in out
    assert "throughput median (seq/s)" in out and "throughput median (img/s)" in out
    # the notes name their rows: the newest of several ok records, and the timed-out case with its error
    notes = [ln[2:] for ln in out.splitlines() if ln.startswith("- ")]
    assert any(n.startswith("1n1g: ") for n in notes)
    assert any(n.startswith("2n4g timeout: ") and "1200 s" in n for n in notes)
    assert "dlscale run --model bert-base --strategy ddp --nnodes 2 --nproc-per-node 4" in out
    assert "## Micro-benchmarks" in out and "## Environment" in out and "gpu-node-2" in out
    assert err == ""


def test_json_dlperf_shape_and_values(store, capsys):
    rc, out, _ = cli(capsys, "report", str(store), "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    d = doc["dlperf"]
    assert sorted(d) == ["bert-base_amp-bf16_b128_ddp", "bert-base_amp-bf16_b128_fsdp",
                         "bert-base_amp-bf16_b256_ddp", "resnet50"]
    ddp = d["bert-base_amp-bf16_b128_ddp"]
    assert list(ddp) == ["1n1g", "1n2g", "1n4g", "2n4g"]
    for key, med, sp in (("1n1g", 100, 1.0), ("1n2g", 190, 1.9), ("1n4g", 360, 3.6)):
        e = ddp[key]
        assert e["median_speed"] == pytest.approx(med) and e["average_speed"] == pytest.approx(med)
        assert e["speedup"] == pytest.approx(sp)
        assert e["scaling_efficiency"] == pytest.approx(sp / int(key[2]))
        assert e["batch_size_per_device"] == 128 and e["status"] == "ok" and e["n_repeats"] == 5
    assert ddp["1n1g"]["record_id"] == "r02-1n1g" and ddp["1n1g"]["superseded_records"] == 1
    assert ddp["2n4g"]["status"] == "timeout" and ddp["2n4g"]["speedup"] is None
    assert ddp["2n4g"]["median_speed"] is None
    fsdp = d["bert-base_amp-bf16_b128_fsdp"]
    assert fsdp["1n1g"]["baseline"] is True and fsdp["1n1g"]["strategy"] == "ddp"
    assert fsdp["1n2g"]["speedup"] == pytest.approx(1.8) and fsdp["1n4g"]["speedup"] == pytest.approx(3.4)
    assert fsdp["1n4g"]["scaling_efficiency"] == pytest.approx(0.85)
    assert {e["status"] for e in d["bert-base_amp-bf16_b256_ddp"].values()} == {"oom"}
    rn = d["resnet50"]
    assert rn["1n2g"]["median_speed"] == 500 and rn["1n2g"]["average_speed"] == 500
    assert rn["1n2g"]["speedup"] is None and rn["1n4g"]["scaling_efficiency"] is None
    assert rn["1n4g"]["batch_size_per_device"] == 64
    g = doc["groups"]["bert-base_amp-bf16_b128_fsdp"]
    assert g["baseline_record_id"] == "r02-1n1g" and g["precision"] == "amp-bf16" and g["strategy"] == "fsdp"
    assert doc["skipped_lines"] == 0
    stored = _stored(store)
    assert [r["id"] for r in doc["records"]] == [r["id"] for r in stored]  # every record, superseded and micro ones
    assert {r["id"] for r in doc["records"]} >= {"r01-old-1n1g", "micro-0001"}


def test_csv_one_row_per_case(store, capsys):
    rc, out, _ = cli(capsys, "report", str(store), "--format", "csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    runs = [r for r in _stored(store) if r.get("kind", "run") == "run"]
    cases = {(r["case_key"], r["world_size"]) for r in runs}
    assert len(rows) == len(cases) < len(runs)  # one row per case: a superseded record adds none
    by = {(r["group"], r["nnodes"], r["nproc_per_node"]): r for r in rows}
    r = by[("bert-base_amp-bf16_b128_ddp", "1", "4")]
    assert float(r["median_samples_per_s"]) == 360 and float(r["speedup"]) == pytest.approx(3.6)
    assert float(r["scaling_efficiency"]) == pytest.approx(0.9) and r["devices"] == "4" and r["n_repeats"] == "5"
    assert r["baseline_record_id"] == "r02-1n1g" and r["command"].startswith("dlscale run")
    oom = by[("bert-base_amp-bf16_b256_ddp", "1", "1")]
    assert oom["status"] == "oom" and oom["median_samples_per_s"] == ""
    recs = [json.loads(ln) for f in sorted(store.glob("*.jsonl")) for ln in f.read_text().splitlines() if ln.strip()]
    assert oom["error"] == next(r["error"] for r in recs if r["id"] == oom["record_id"])  # the record's own error
    assert by[("resnet50", "1", "2")]["speedup"] == ""


def test_torn_and_foreign_lines_are_skipped_with_a_warning(store, capsys):
    f = store / "results.jsonl"
    lines = f.read_text().splitlines(keepends=True)
    torn = lines[3][: len(lines[3]) // 2] + "\n"  # the 1n4g ddp record, cut in half
    f.write_text("".join(lines[:3] + [torn] + lines[4:]) + '{"hello": "world"}\n')
    rc, out, err = cli(capsys, "report", str(store))
    assert rc == 0
    warned = [ln for ln in err.splitlines() if ln.startswith("dlscale: warning: ")]
    assert warned and "line 4" in err  # the torn line named
    assert "> **Warning:** " in out
    t = md_tables(out)
    assert [r[1] for r in t[DDP]] == ["1", "2", "8"]  # the rest is still reported
    assert t[DDP][1][3] == "1.90"
    rc, out, err = cli(capsys, "report", str(store), "--format", "json")
    assert json.loads(out)["skipped_lines"] == 2


# each cause by a word only its message has, and not the other causes' words
@pytest.mark.parametrize("setup, named, not_named", [
    ("missing", ("exist",), ("records",)),
    ("empty_dir", (r"\.jsonl",), ("exist", "records")),
    ("empty_file", ("records",), ("exist", "unreadable")),
    ("only_torn", ("records", "unreadable", r"\b1\b"), ("exist",)),
])
def test_bad_store_is_one_line_exit_2(tmp_path, capsys, setup, named, not_named):
    d = tmp_path / "results"
    if setup != "missing":
        d.mkdir()
    if setup == "empty_file":
        (d / "results.jsonl").write_text("")
    if setup == "only_torn":
        (d / "results.jsonl").write_text('{"schema": "dlscale.rec')
    rc, out, err = cli(capsys, "report", str(d))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dlscale: error: ") and str(d) in err, err
    said = err.replace(str(d), "")  # the words around the path
    assert all(re.search(w, said) for w in named) and not any(re.search(w, said) for w in not_named), err


def test_filters(store, capsys):
    rc, out, _ = cli(capsys, "report", str(store), "--model", "resnet50")
    assert rc == 0 and list(md_tables(out)) == [RN50]  # micro records only without workload filters
    rc, out, _ = cli(capsys, "report", str(store), "--strategy", "fsdp")
    t = md_tables(out)
    assert list(t) == [FSDP] and t[FSDP][1][3] == "1.80"  # the ddp baseline is still found
    rc, out, err = cli(capsys, "report", str(store), "--model", "gpt9")
    # one line: the filter that matched nothing and the models there are
    assert rc == 2 and err.count("\n") == 1 and "gpt9" in err and "bert-base" in err and "resnet50" in err, err
    rc, out, err = cli(capsys, "report", str(store), "--label", "nightly")
    assert rc == 2


def test_baseline_matching_rules(tmp_path, capsys):
    recs = [
        F.run_record("s1", "gpt2", "amp-bf16", 8, "single", 1, 1, [10, 10, 10]),
        F.run_record("d1", "gpt2", "amp-bf16", 8, "ddp", 1, 1, [20, 20, 20]),  # ddp 1-proc: same table wins
        F.run_record("d2", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [36, 36, 36]),
        F.run_record("f2", "gpt2", "amp-bf16", 8, "fsdp", 1, 2, [30, 30, 30]),  # no fsdp 1-dev: 'single' wins
        F.run_record("f4", "gpt2", "amp-bf16", 16, "fsdp", 1, 4, [50, 50, 50]),  # other batch: no baseline
        F.run_record("l2", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [40, 40, 40], label="x"),  # other label: none
        F.run_record("p2", "gpt2", "fp32", 8, "ddp", 1, 2, [40, 40, 40]),  # other precision: none
    ]
    F.write_store(tmp_path / "s", recs)
    rc, out, _ = cli(capsys, "report", str(tmp_path / "s"), "--format", "json")
    d = json.loads(out)["dlperf"]
    names = {k: v for k, v in d.items()}
    ddp = names["gpt2_amp-bf16_b8_ddp"]
    assert ddp["1n2g"]["speedup"] == pytest.approx(1.8)
    assert names["gpt2_amp-bf16_b8_fsdp"]["1n2g"]["speedup"] == pytest.approx(3.0)
    assert names["gpt2_amp-bf16_b8_fsdp"]["1n1g"]["strategy"] == "single"
    assert names["gpt2_amp-bf16_b16_fsdp"]["1n4g"]["speedup"] is None
    assert names["gpt2_amp-bf16_b8_ddp_x"]["1n2g"]["speedup"] is None
    assert names["gpt2_fp32_b8_ddp"]["1n2g"]["speedup"] is None


def test_variants_of_ddp_are_scaled_against_the_plain_one_device_run(tmp_path, capsys):
    """A ddp run with the optimizer graph or with strategy options has a table of its own, and its
    speedup is against the plain 1-device run (how the step was run, not what it computes)."""
    graphed = F.run_record("g2", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [38, 38, 38])
    graphed["config"]["optimizer_graph"] = True
    graphed["case_key"] = "graphed"
    option = F.run_record("o2", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [37, 37, 37])
    option["config"]["strategy_options"] = {"static_graph": True}
    option["case_key"] = "static"
    F.write_store(tmp_path / "s", [F.run_record("s1", "gpt2", "amp-bf16", 8, "single", 1, 1, [20, 20, 20]),
                                   graphed, option])
    rc, out, _ = cli(capsys, "report", str(tmp_path / "s"), "--format", "json")
    tables = json.loads(out)["dlperf"]
    speedups = sorted(t["1n2g"]["speedup"] for t in tables.values() if "1n2g" in t)
    assert speedups == [pytest.approx(1.85), pytest.approx(1.9)]


def test_nothing_writes_to_the_store(store, tmp_path, capsys):
    before = digest(store)
    for fmt in ("md", "csv", "json"):
        assert cli(capsys, "report", str(store), "--format", fmt)[0] == 0
    assert cli(capsys, "report", str(store), "--format", "html", "--no-plots", "-o", str(tmp_path / "r.html"))[0] == 0
    assert cli(capsys, "compare", str(store), str(store))[0] == 0
    rc, _, err = cli(capsys, "report", str(store), "--format", "csv", "-o", str(store / "results.jsonl"))
    assert rc == 2 and err.count("\n") == 1 and "results.jsonl" in err  # one line naming the store file
    assert digest(store) == before


@pytest.mark.slow  # renders PNG/SVG plots with matplotlib: seconds, kept out of the quick tier
def test_plots_dir_png_and_svg(store, tmp_path, capsys):
    import matplotlib.image as mpimg

    plots = tmp_path / "plots"
    out_md = tmp_path / "report.md"
    rc, _, err = cli(capsys, "report", str(store), "--model", "bert-base", "--strategy", "ddp",
                     "--plots-dir", str(plots), "-o", str(out_md))
    assert rc == 0, err
    names = sorted(p.name for p in plots.iterdir())
    stem = "bert-base_amp-bf16_b128_ddp__"
    for kind in ("throughput", "speedup", "efficiency", "step_times", "breakdown", "utilisation"):
        assert f"{stem}{kind}.png" in names and f"{stem}{kind}.svg" in names
    assert not any(n.startswith("bert-base_amp-bf16_b256") for n in names)  # no ok rows, nothing to plot
    img = mpimg.imread(plots / f"{stem}throughput.png")
    assert img.shape[0] > 200 and img.std() > 0.01
    assert (plots / f"{stem}speedup.svg").read_text().lstrip().startswith("<?xml")
    assert f"![throughput vs devices](plots/{stem}throughput.png)" in out_md.read_text()


def test_help_lists_options_with_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        main(["report", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for opt in ("--format", "--output", "--plots-dir", "--model", "--label", "--precision", "--strategy",
                "--no-plots"):
        assert opt in text
    assert "(default: md)" in text and "(default: results)" in text
    assert "report.html" in text and "default: stdout" in text
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 2000)" in text and "--fail-on-regression" in text and "--label-a" in text


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium here (CI installs it)")
def test_html_report_renders_in_headless_chromium(store, tmp_path, capsys):
    import matplotlib.image as mpimg
    import numpy as np

    html = tmp_path / "report.html"
    rc, out, err = cli(capsys, "report", str(store), "--format", "html", "-o", str(html))
    assert rc == 0 and out == "" and str(html) in err
    text = html.read_text()
    # self-contained: no external resources, no scripts
    assert "<script" not in text and "<link" not in text
    assert "src=\"http" not in text and "href=\"http" not in text and "url(" not in text

    shot = tmp_path / "shot.png"  # one headless start: the screenshot, and the DOM on stdout
    dom = _chromium(f"--screenshot={shot}", "--dump-dom", "--window-size=1280,2000", html.as_uri(),
                    tmp=tmp_path / "ud1").stdout
    assert shot.exists() and shot.stat().st_size > 50_000
    img = mpimg.imread(shot)
    assert img.shape[:2] == (2000, 1280)
    rgb = (img[..., :3] * 255).astype(np.uint32)
    colors = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])  # one int per colour: a 1-D sort
    assert len(colors) > 100 and img.std() > 0.05  # not blank, not a single colour

    assert dom.count('<table class="dlperf">') == 4
    assert "<td class=\"\">190.00</td>" in dom and "<td class=\"\">1.90</td>" in dom
    assert "TIMEOUT" in dom and "OOM" in dom
    # ddp: 6 plots (with breakdown and utilisation), fsdp: 4, resnet50: 2 (no speedup), micro: 1
    assert dom.count('<img alt="') == 13 and dom.count('src="data:image/png;base64,') == 13
    assert "Environment" in dom and "gpu-node-1" in dom and "dlscale run --model resnet50" in dom


def test_html_default_output_and_skipped_warning(store, tmp_path, capsys, monkeypatch):
    with open(store / "results.jsonl", "a") as f:
        f.write('{"schema": "dlscale.record/1", "kind": "ru')
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli(capsys, "report", str(store), "--format", "html", "--no-plots", "--model", "resnet50")
    assert rc == 0 and err.startswith("dlscale: warning: ")
    text = (tmp_path / "report.html").read_text()
    assert text.count('class="warn"') == 1 and "<img" not in text
