"""Validation of the performance model: the published tables (tests/fixtures/tables, read by the importer of
``dlscale import --format table``), the project's own 2-GPU records, and ``predict --validate STORE`` (the
same code path as ``predict``)."""
from __future__ import annotations

import copy
import json
import statistics
from pathlib import Path

import pytest
import yaml

from dlscale.cli import main
from dlscale.perfmodel.core import parse_shapes
from dlscale.perfmodel.inputs import ModelOptions, Query
from dlscale.perfmodel.predict import predict_workload
from dlscale.perfmodel.validate import validate
from dlscale.report.data import load_records
from dlscale.results.store import ResultStore
from dlscale.importers.table import yaml_table_records
from test_perfmodel import comm_record, run_record

HERE = Path(__file__).resolve().parent
TABLES = HERE / "fixtures" / "tables"
BENCH = HERE.parent / "docs" / "results" / "stores"


@pytest.fixture(scope="module")
def published() -> list[dict]:
    return yaml_table_records([TABLES])


# ----------------------------------------------------------------------------- the fixtures themselves

def test_tables_are_cited_and_keep_out_what_they_must():
    files = sorted(TABLES.glob("*.yaml"))
    assert len(files) >= 21
    for f in files:
        t = yaml.safe_load(f.read_text())
        assert t["format"] == "dlscale-table/1" and t["source"] and t["tool"] and t["rows"], f.name
        assert "https://" in t["source"] and t["unit"] in ("img", "seq", "tok")
        # kept out: OneFlow and NGC PyTorch tables (DLPerf), NVIDIA's A100 ResNet-50 PyTorch table (its page)
        text, src = f.read_text().lower(), t["source"].lower()
        assert t["framework"] != "oneflow" and "oneflow/" not in text.replace("oneflow-inc/dlperf", ""), f.name
        assert not ("dlperf" in text and ("pytorch" in t["framework"] or "/pytorch/" in text)), f.name
        assert "pytorch/classification" not in src, f.name
        for row in t["rows"]:
            assert row.get("status") == "oom" or ("throughput" in row) != ("runs" in row), (f.name, row)


def test_per_run_figures_reproduce_the_published_medians():
    """Where a page prints its per-run log reduction the fixture holds the runs; their median is the table's."""
    published = {  # (file, precision, batch, nodes, gpus) -> the table's median
        ("dlperf-tf2-resnet50-v100.yaml", "fp32", 128, 4, 8): 9418.44,
        ("dlperf-ngc-tf1-resnet50-v100.yaml", "fp32", 128, 1, 8): 2721.98,
        ("dlperf-ngc-mxnet-resnet50-v100.yaml", "fp32", 96, 4, 8): 10419.21,
        ("dlperf-paddle-bert-base-v100.yaml", "fp32", 64, 2, 8): 1426.52,
        ("dlperf-mindspore-resnet50-v100.yaml", "fp32", 128, 1, 2): 710.68,
        ("dlperf-mindspore-bert-base-v100.yaml", "fp32", 32, 4, 8): 3445.38,
        ("dlperf-deepspeed-bert-base-v100.yaml", "fp32", 32, 1, 1): 147.81,
        ("dlperf-deepspeed-bert-base-v100.yaml", "fp32", 32, 2, 8): 2267.55,
        ("dlperf-mindspore-bert-base-v100.yaml", "fp32", 32, 1, 1): 149.98,
    }
    for (name, prec, b, m, g), median in published.items():
        t = yaml.safe_load((TABLES / name).read_text())
        rows = [r for r in t["rows"] if r.get("precision", t["defaults"].get("precision")) == prec
                and r["batch_size"] == b and r["nodes"] == m and r["gpus_per_node"] == g]
        assert len(rows) == 1 and statistics.median(rows[0]["runs"]) == pytest.approx(median, abs=0.01)


def test_reader_gives_the_imported_record_shape():
    """The fixtures are read by the importer of `dlscale import --format table`; a per-precision gradient size
    (the MXNet BERT table: fp32 4 bytes, fp16 2) reaches each row's record resolved."""
    recs = yaml_table_records([TABLES / "dlperf-ngc-tf1-resnet50-v100.yaml"])
    r = next(x for x in recs if x["config"]["nnodes"] == 2 and x["config"]["precision"] == "fp32")
    assert r["kind"] == "imported" and r["status"] == "ok" and r["world_size"] == 16
    sps = r["summary"]["samples_per_s"]
    assert sps["median"] == pytest.approx(5099.425) and sps["n"] == 6
    assert r["model"]["params"] == 25557032 and r["system"]["inter"]["busbw_gbps"] == 12.5
    assert any(x["status"] == "oom" for x in recs)
    mx = yaml_table_records([TABLES / "mxnet-bert-base-v100.yaml"])
    assert {(r["config"]["precision"], r["system"]["grad_bytes_per_param"]) for r in mx} == {("fp32", 4),
                                                                                          ("amp-fp16", 2)}


# ----------------------------------------------------------------------------- the model on them

def test_no_published_prediction_above_ideal_or_with_negative_overhead(published):
    """Over every published point and every protocol: no overhead below 0, no prediction (or band edge)
    above ideal scaling of its series' 1-device figure (of its node's, where the series has no 1-device one)."""
    val = validate(published, Query(), ModelOptions(param_sizes="uniform"))
    assert len(val.rows) > 240

    def key(c):
        return c["precision"], c["batch_size"], c["compile"]

    base = {}  # series -> (devices, job throughput) of its smallest single-node point
    for rec in published:
        c, file = rec["config"], rec["provenance"]["file"]
        if rec["status"] == "ok" and c["nnodes"] == 1:
            n = c["nproc_per_node"]
            if (file, *key(c)) not in base or n < base[(file, *key(c))][0]:
                base[(file, *key(c))] = (n, rec["summary"]["samples_per_s"]["median"])
    series_base = {}
    for rec in published:
        if (rec["provenance"]["file"], *key(rec["config"])) in base:
            n, sps = base[(rec["provenance"]["file"], *key(rec["config"]))]
            series_base[rec["id"][:8]] = sps / n
    for r in val.rows:
        assert r.overhead_ms >= 0
        ideal = r.devices * series_base[r.record]
        assert r.predicted <= ideal * (1 + 1e-9) and r.high <= ideal * (1 + 1e-9)


def test_one_node_protocol_on_published_tables(published):
    """From the measured node to the multi-node points: the summary figures of docs/perfmodel.md come from
    benchmarks/perfmodel_validate.py (held-out law); here the shipped law, as a guard on the model."""
    val = validate(published, Query(), ModelOptions(param_sizes="uniform"), ["from-node"])
    s = val.summary("from-node")
    assert s.n >= 50 and s.mean_abs_error_pct < 10.0
    mx = [r for r in val.rows if r.group == "mxnet-bert-base-v100.yaml"]
    # every ok multi-node row of the table is predicted from its node
    multi = [r for r in published if r["provenance"]["file"].endswith("mxnet-bert-base-v100.yaml")
             and r["status"] == "ok" and r["config"]["nnodes"] > 1]
    assert len(mx) == len(multi) > 0 and max(abs(r.error_pct) for r in mx) < 12.0


def test_published_series_above_ideal_are_flagged():
    """DeepSpeed's BERT page: FP32 batch 32 reaches 33.15 x on 32 GPUs (runs printed: past their noise) and
    FP16 batch 128 16.29 x on 16 (one figure a side): flagged, left out of the summary; FP32 batch 64
    (29.61 x at 32, 15.22 x at 16) is not."""
    recs = yaml_table_records([TABLES / "dlperf-deepspeed-bert-base-v100.yaml",
                               TABLES / "dlperf-deepspeed-bert-base-fp16-v100.yaml"])
    val = validate(recs, Query(), ModelOptions(param_sizes="uniform"), ["from-node"])
    flags = {(r.series.split()[-1], r.series.split()[-2], r.shape): r.flags for r in val.rows}
    assert flags[("b32", "fp32", "4x8")] == flags[("b128", "amp-fp16", "2x8")] == "above_ideal"
    assert flags[("b64", "fp32", "2x8")] == flags[("b64", "fp32", "4x8")] == ""
    assert val.summary("from-node").n == 2 and len(val.select("from-node", flagged=True)) == 8


def test_predicted_points_never_inform_themselves(published):
    """Changing every published multi-node figure changes no multi-node prediction (from the node); changing
    the 4-node figures changes no 4-node prediction from the smaller node counts (from-multinode)."""
    a = validate(published, Query(), ModelOptions(param_sizes="uniform"), ["from-node"])
    changed = copy.deepcopy(published)
    for r in changed:
        if r["config"]["nnodes"] > 1 and r["status"] == "ok":
            r["summary"]["samples_per_s"]["median"] *= 0.5
            r["repeats"] = []
    b = validate(changed, Query(), ModelOptions(param_sizes="uniform"), ["from-node"])
    assert [r.predicted for r in a.rows] == pytest.approx([r.predicted for r in b.rows])
    assert [r.measured for r in b.rows] == pytest.approx([r.measured * 0.5 for r in a.rows])
    # from-multinode: the 4-node figures changed, no 4-node prediction moves (they rest on 1 and 2 nodes)
    a = validate(published, Query(), ModelOptions(param_sizes="uniform"), ["from-multinode"])
    for r in changed:
        if r["config"]["nnodes"] == 2 and r["status"] == "ok":
            r.update(copy.deepcopy(next(o for o in published if o["id"] == r["id"])))
    b = validate(changed, Query(), ModelOptions(param_sizes="uniform"), ["from-multinode"])
    assert {r.shape for r in a.rows} >= {"4x8", "4x16", "8x16"}  # 8x16 rests on 4x16 too
    four = [i for i, r in enumerate(a.rows) if r.shape.startswith("4x")]
    assert [a.rows[i].predicted for i in four] == pytest.approx([b.rows[i].predicted for i in four])


def _ddp_pairs(records) -> int:
    """Multi-GPU ddp shapes of a store's workloads that have a 1-GPU record: what from-1-gpu predicts."""
    from dlscale.perfmodel.inputs import group_workloads, usable

    return sum(len(w.measured("ddp")) for w in group_workloads(usable(records, Query())).values()
               if w.baseline is not None)


def test_own_two_gpu_records_within_5_percent():
    """The H200 pair stores (the suite stores' two-GPU runs too, JAX among them): every 2-GPU ddp record
    predicted from its 1-GPU record within 5 %."""
    comm = load_records(BENCH / "h200x2-2026-11-22/micro-comm.jsonl").records
    rows, expected = [], 0
    for name in ("h200x2-2026-11-22/core-eager.jsonl", "h200x2-2026-11-22/core-compiled.jsonl",
                 "h200x2-2026-11-22/dlperf.jsonl", "h200x2-2026-11-23/core-eager.jsonl",
                 "h200x2-2026-11-23/core-compiled.jsonl", "h200x2-2026-11-22/strategies.jsonl",
                 "h200x2-2026-11-28/two-gpu-data.jsonl", "h200x2-2026-11-28/two-gpu-data-2.jsonl",
                 "h200x2-2026-11-28/two-gpu-jax-2.jsonl", "h200x2-2026-11-28/ddp-overlap.jsonl",
                 "h200x2-2026-11-28/ddp-overlap-2.jsonl", "h200x2-2026-11-28/two-gpu-ddp-compiled.jsonl",
                 "h200x2-2026-11-28/optimizer-graph.jsonl", "h200x2-2026-11-28/ddp-overlap-3.jsonl",
                 "h200x2-2026-11-28/optimizer-graph-compiled.jsonl",
                 "h200x2-2026-11-28/optimizer-graph-compiled-2.jsonl", "h200x2-2026-11-28/two-gpu-account.jsonl",
                 "h200x2-2026-11-28/two-gpu-jax-3.jsonl", "h200x2-2026-11-28/two-gpu-breakdown.jsonl",
                 "h200x2-2026-11-28/resnet-compiled-2.jsonl", "h200x2-2026-11-28/two-gpu-breakdown-2.jsonl",
                 "h200x2-2026-11-29/two-gpu-strategies.jsonl"):
        # uniform buckets keep this test fast (no model built); benchmarks/perfmodel_validate.py uses the
        # registered models' buckets and holds each store out of the fit (docs/perfmodel.md: max 4.0 %
        # there, 4.0 % here; before the law's graph_split term the compiled pairs reached 5.5 %)
        recs = load_records(BENCH / name).records
        rows += validate(recs + comm, Query(), ModelOptions(param_sizes="uniform"), ["from-1-gpu"]).rows
        expected += _ddp_pairs(recs)
    assert len(rows) == expected > 0
    assert max(abs(r.error_pct) for r in rows) < 5.0


# ----------------------------------------------------------------------------- --validate on a store

@pytest.fixture()
def vstore(tmp_path):
    s = ResultStore(tmp_path / "v")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    s.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00"))
    s.append(run_record(4, 1150.0, "ddp", "2025-01-01T02:00:00+00:00",
                        env={"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(4)]}))
    s.append(run_record(4, 2200.0, "ddp", "2025-01-01T02:30:00+00:00", nnodes=2))   # 2x4: spans nodes
    s.append(run_record(2, 500.0, "ddp", "2025-01-01T03:00:00+00:00", precision="fp32"))  # no baseline
    s.append(comm_record())
    return str(tmp_path / "v")


def _run(argv, capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


FLAGS = ["--overlap", "buckets", "--overhead-ms", "3", "--grad-bytes", "2", "--param-sizes", "uniform",
         "--intra-busbw", "100", "--inter-busbw", "12.5", "--bucket-mb", "50"]


def test_validate_is_predict_with_the_point_held_out(vstore, capsys):
    """Every option reaches --validate: each row equals ``predict`` of that shape with the same options,
    given only the 1-device record (from-1-gpu) or the node (from-node)."""
    out = json.loads(_run(["predict", "--validate", vstore, "--format", "json"] + FLAGS, capsys))
    rows = {(r["shape"], r["protocol"]): r for r in out["rows"]}
    assert set(rows) == {("1x2", "from-1-gpu"), ("1x4", "from-1-gpu"), ("2x4", "from-1-gpu"), ("2x4", "from-node")}
    # the same figures through predict, from a store holding only the 1-device record (and the comm record)
    recs = [r for r in load_records(vstore).records if r.get("kind") != "run"
            or (r["config"]["nproc_per_node"] == 1 and r["config"]["precision"] == "amp-bf16")]
    opts = ModelOptions(intra_busbw_gbps=100.0, inter_busbw_gbps=12.5, overlap="buckets", bucket_mb=50.0,
                        param_sizes="uniform", grad_bytes=2.0, overhead_ms=3.0)
    pred = predict_workload(recs, Query(model="m", precision="amp-bf16"), opts, parse_shapes("1x2,1x4,2x4"))
    for r in pred.rows[1:]:
        key = (r.prediction.shape.label, "from-1-gpu")
        assert rows[key]["predicted"] == pytest.approx(r.prediction.samples_per_s)
        assert rows[key]["overhead_ms"] == pytest.approx(3.0)             # --overhead-ms reached --validate
    # by hand: 2-byte gradients (250 MB) in 50 MiB buckets pipelined behind a 66.7 ms backward at 100 GB/s
    g = 125_000_000 * 2
    assert rows[("1x2", "from-1-gpu")]["exposed_ms"] == pytest.approx(
        _pipelined(g, 50 * 1024 * 1024, 0.1 * 2 / 3, lambda s: s / 100e9) * 1e3)


def test_validate_from_multinode_is_predict_from_the_smaller_node_counts(vstore, capsys):
    """With 1x4, 2x4 and 4x4 measured, from-multinode predicts 4x4 from 1x4 and 2x4 (the network term's amplitude
    measured at 2 nodes): the figure ``predict`` gives from a store without the 4x4 record. 2x4 has no smaller
    multi-node point, so no from-multinode row."""
    ResultStore(vstore).append(run_record(4, 4000.0, "ddp", "2025-01-01T04:00:00+00:00", nnodes=4))
    flags = ["--inter-busbw", "12.5", "--param-sizes", "uniform"]
    out = json.loads(_run(["predict", "--validate", vstore, "--format", "json"] + flags, capsys))
    rows = {(r["shape"], r["protocol"]): r for r in out["rows"]}
    assert {k for k in rows if k[1] == "from-multinode"} == {("4x4", "from-multinode")}
    recs = [r for r in load_records(vstore).records
            if not (r.get("kind") == "run" and r["config"]["nnodes"] == 4)]
    pred = predict_workload(recs, Query(model="m", precision="amp-bf16"),
                            ModelOptions(inter_busbw_gbps=12.5, param_sizes="uniform"), parse_shapes("4x4"))
    p = pred.rows[-1].prediction
    assert p.basis == "from-multinode"
    assert rows[("4x4", "from-multinode")]["predicted"] == pytest.approx(p.samples_per_s)
    assert rows[("4x4", "from-node")]["predicted"] != pytest.approx(p.samples_per_s)  # the 2x4 point moved it


def _pipelined(total, cap, t_bwd, time_of):
    done = finish = 0.0
    left = total
    while left > 1e-9 * total:
        b = min(cap, left)
        left -= b
        done += b
        finish = max(t_bwd * done / total, finish) + time_of(b)
    return max(0.0, finish - t_bwd)


def test_validate_store_markdown_and_plot(vstore, capsys, tmp_path):
    text = _run(["predict", "--validate", vstore, "--inter-busbw", "12.5", "--plot", str(tmp_path / "v.png")], capsys)
    assert "| protocol | points | mean abs error |" in text and "| from-node | 1 |" in text
    assert "m amp-bf16 b32 eager | 2x4 | from-node |" in text
    assert "Skipped:" in text and "no 1-device baseline" in text
    assert (tmp_path / "v.png").exists()
    text = _run(["predict", "--validate", vstore], capsys)             # no inter-node link: said, not hidden
    skipped = [ln for ln in text.splitlines() if "2x4" in ln and "--inter-busbw" in ln]
    assert skipped, text  # the 2x4 point skipped, with the option that would give its link


def test_validate_bad_input(vstore, tmp_path, capsys):
    assert main(["predict", vstore, "--validate", vstore]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    s = ResultStore(tmp_path / "one")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    assert main(["predict", "--validate", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert "ddp" in err and err.count("\n") == 1  # one line naming the strategy nothing multi-device ran



def test_validate_with_every_point_skipped_is_bad_input(tmp_path, capsys):
    """No link figure for any point: nothing validated is one line and exit 2, naming the option, no plot."""
    s = ResultStore(tmp_path / "nolink")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    s.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00"))
    plot = tmp_path / "v.png"
    assert main(["predict", "--validate", str(tmp_path / "nolink"), "--plot", str(plot)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--intra-busbw" in err and out == "" and not plot.exists()


def test_measured_beats_imported_when_picking_the_workload():
    """A measured 1-device record and a published table of the same workload: predict rests on the measured
    one; --source picks the table."""
    recs = yaml_table_records([TABLES / "dlperf-ngc-tf1-resnet50-v100.yaml"])
    own = run_record(1, 400.0, "single", "2025-01-01T00:00:00+00:00", model="resnet50", params=25_557_032,
                     precision="fp32", batch_size=128)
    opts = ModelOptions(param_sizes="uniform", intra_busbw_gbps=100.0)
    q = Query(model="resnet50", precision="fp32", batch_size=128)
    pred = predict_workload(recs + [own], q, opts, parse_shapes("1x2"))
    assert pred.inputs["baseline_kind"] == "run" and pred.rows[0].measured_samples_per_s == 400.0
    q.source = "NVIDIA-TensorFlow-ResNet50"
    pred = predict_workload(recs + [own], q, opts, parse_shapes("1x2"))
    assert pred.inputs["baseline_kind"] == "imported" and pred.rows[0].measured_samples_per_s == pytest.approx(362.44)
