"""The seed's MXNet BERT-base log reduction, end to end through `dlscale import --format dlperf-logs`.

DLPerf's MXNet BERT page (tests/fixtures/published/mxnet-bert-base-v100.md) lists, for fp32 at
batch 32, the per-run figures of 7 runs per case (200 iterations each, the first 100 discarded)
and their median and mean. This test writes DLPerf-style logs (gluon-nlp's per-rank
``[step N] ... throughput=X K tks/s`` lines, behind horovodrun's ``[1,rank]<stdout>:`` prefix)
whose per-iteration figures reduce, run by run, to exactly those per-run values, imports the
folder, and checks the report's medians, means and speedups against the page.

The logs print four decimals more than gluon-nlp's ``{:.1f}``: with one decimal, a 32-GPU run's
mean moves in steps of 0.125 samples/s and could not hit every published per-run value. The
warm-up iterations run at a different speed, so a wrong skip changes every figure.
"""
import json
import re
from pathlib import Path

import pytest

from dlscale.cli import main

PUBLISHED = Path(__file__).parent / "fixtures" / "published" / "mxnet-bert-base-v100.md"
SEQ = 128


def page():
    md = PUBLISHED.read_text()
    raw = {}
    for m in re.finditer(r"^(\d)n(\d)g: ([\d. ]+) -> median ([\d.]+), mean ([\d.]+)$", md, flags=re.M):
        raw[(int(m.group(1)), int(m.group(2)))] = ([float(x) for x in m.group(3).split()], float(m.group(4)),
                                                   float(m.group(5)))
    table = {}
    fp32 = md.split("## FP32")[1].split("## FP16")[0]
    for m in re.finditer(r"^\| 32 \| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \|$", fp32, flags=re.M):
        n, g = int(m.group(1)), int(m.group(2))
        table[(n, g // n)] = (float(m.group(3)), float(m.group(4)))
    return raw, table


def write_run(path: Path, run_value: float, devices: int, iters: int = 200, warmup: int = 100) -> None:
    """One run's log: per iteration one line per rank; the window's mean of the per-iteration median
    over ranks of X*1000/128*devices is run_value (rank and iteration spreads cancel exactly)."""
    x = round(run_value * SEQ / 1000.0 / devices, 6)  # K tokens/s of one rank
    lines = []
    for it in range(1, iters + 1):
        if it <= warmup:
            base = x * (0.6 if it < 10 else 0.97)  # start-up and a slower warm-up
        else:
            base = x + (0.01 if it % 2 else -0.01)  # 50 above, 50 below
        for rank in range(devices):
            v = base if devices == 1 else base + (0.001 if rank % 2 else -0.001)
            lines.append(f"[1,{rank}]<stdout>:INFO:root:[step {it}]\tmlm_loss=7.33858\tmlm_acc=4.24000\t"
                         f"nsp_loss=0.68000\tnsp_acc=54.020\tthroughput={v:.6f}K tks/s\tlr=0.0000100 "
                         f"time=0.82, latency=820.4 ms/batch")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    raw, table = page()
    root = tmp_path_factory.mktemp("dlperf") / "bz32"
    for (n, g), (runs, _, _) in raw.items():
        case = root / f"{n}n{g}g"
        case.mkdir(parents=True)
        for i, v in enumerate(runs, 1):
            write_run(case / f"bert_base_b32_fp32_{i}.log", v, n * g)
    store = root.parent / "store"
    code = main(["import", str(root), "--format", "dlperf-logs", "--model", "bert-base", "--framework", "mxnet",
                 "--warmup", "100", "--steps", "100", "--gpu", "Tesla V100-SXM2-16GB", "--tool", "MXNet 1.6.0",
                 "--source", "DLPerf MXNet BERT-base page", "--store", str(store)])
    assert code == 0
    out = root.parent / "report.json"
    assert main(["report", str(store), "--format", "json", "--output", str(out)]) == 0
    return raw, table, json.loads(out.read_text()), store


def test_each_run_reduces_to_the_published_per_run_figure(imported):
    raw, _, rep, _ = imported
    recs = {(r["config"]["nnodes"], r["config"]["nproc_per_node"]): r for r in rep["records"]}
    assert set(recs) == set(raw)
    for key, (runs, _, _) in raw.items():
        got = [round(r["samples_per_s"], 2) for r in recs[key]["repeats"]]
        assert got == runs, key
        assert all(r["window_steps"] == 100 and r["skipped_steps"] == 100 for r in recs[key]["repeats"])


def test_medians_means_and_speedups_equal_the_page(imported):
    raw, table, rep, _ = imported
    (name,) = rep["dlperf"]
    assert rep["groups"][name]["kind"] == "imported"
    cases = rep["dlperf"][name]
    assert set(cases) == {f"{n}n{g}g" for n, g in raw}
    for (n, g), (_, median, mean) in raw.items():
        e = cases[f"{n}n{g}g"]
        assert round(e["median_speed"], 2) == median and round(e["average_speed"], 2) == mean
        pub_median, pub_speedup = table[(n, g)]
        assert round(e["median_speed"], 2) == pub_median
        assert round(e["speedup"], 2) == pub_speedup, (n, g)
        assert e["n_repeats"] == 7


def test_the_reduction_is_recorded_as_dlperfs(imported):
    *_, store = imported
    from dlscale.results.store import ResultStore

    rec = ResultStore(store).load().records[0]
    assert rec["provenance"]["method"].startswith("DLPerf MXNet BERT: per iteration the median over")
    assert rec["provenance"]["format"] == "dlperf-logs" and rec["config"]["framework"] == "mxnet"
