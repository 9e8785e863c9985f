"""Validation of the performance model: published MXNet BERT-base V100 figures, and ``predict --validate STORE``."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from dlscale.cli import main
from dlscale.perfmodel import validate_published
from dlscale.store import ResultStore
from test_perfmodel import comm_record, run_record

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "published_mxnet_bert_base_v100.yaml"
SERIES = ("fp32-b64", "fp32-b48", "fp32-b32", "fp16-b64", "fp16-b96", "fp16-b128")


@pytest.fixture(scope="module")
def fixture() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


def by_key(rows):
    return {(r["series"], r["shape"]): r for r in rows}


def test_fixture_matches_the_published_tables(fixture):
    """The fixture holds every row of ../shared/published/mxnet-bert-base-v100.md (both precisions)."""
    assert tuple(s["name"] for s in fixture["series"]) == SERIES
    for s in fixture["series"]:
        assert [tuple(p[:2]) for p in s["points"]] == [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8)]
        assert s["grad_bytes_per_param"] == (4 if s["precision"] == "fp32" else 2)
    assert fixture["params"] == 110_106_428 and fixture["overlap"] == "none"
    assert fixture["links"]["inter"]["busbw_gbps"] == 12.5
    pub = Path(__file__).resolve().parents[2] / "shared" / "published" / "mxnet-bert-base-v100.md"
    if pub.exists():  # the seed report beside the checkout: every figure transcribed
        text = pub.read_text()
        for s in fixture["series"]:
            for nodes, gpn, sps in s["points"]:
                assert f"| {s['batch_size']} | {nodes} | {nodes * gpn} | {sps:.2f} |" in text


def test_mxnet_bert_predicted_within_10_percent(fixture):
    """From the 1-GPU and 1x2 throughputs and the link figures: 8, 16 and 32 GPUs within 10 %."""
    rows = by_key(validate_published(fixture))
    table = []
    for name in SERIES:
        for shape in ("1x4", "1x8", "2x8", "4x8"):
            r = rows[(name, shape)]
            assert r["role"] == "predicted"
            table.append(f"{name:10} {shape:4} {r['samples_per_s']:10.1f} {r['published']:10.1f} "
                         f"{r['error_pct']:+6.1f}%")
            if shape != "1x4":  # the issue asks 8, 16, 32; 4 GPUs is predicted and reported only
                assert abs(r["error_pct"]) < 10.0, table[-1]
        assert rows[(name, "1x1")]["role"] == "baseline" and rows[(name, "1x2")]["role"] == "calibration"
        assert rows[(name, "1x2")]["error_pct"] == pytest.approx(0.0, abs=1e-9)
    print("\n".join(["series     shape  predicted  published  error"] + table))


def test_only_the_two_gpu_point_is_calibrated(fixture):
    """Changing the published 4/8/16/32-GPU figures changes no prediction; changing 1x2 does."""
    base = by_key(validate_published(fixture))
    moved = copy.deepcopy(fixture)
    for s in moved["series"]:
        for p in s["points"]:
            if p[0] * p[1] > 2:
                p[2] *= 1.5
    for k, r in by_key(validate_published(moved)).items():
        assert r["samples_per_s"] == pytest.approx(base[k]["samples_per_s"], rel=1e-12)
        assert r["overhead_ms"] == pytest.approx(base[k]["overhead_ms"], rel=1e-12)
    two = copy.deepcopy(fixture)
    for s in two["series"]:
        s["points"][1][2] *= 1.05
    changed = by_key(validate_published(two))
    assert all(changed[(n, "4x8")]["samples_per_s"] > base[(n, "4x8")]["samples_per_s"] for n in SERIES)


def test_insensitive_to_the_assumed_nvlink_figure(fixture):
    """The intra-node busbw is an assumption (130 GB/s): 60..150 GB/s moves no prediction by 2 % or more."""
    base = by_key(validate_published(fixture))
    for bw in (60.0, 150.0):
        for k, r in by_key(validate_published(fixture, intra_busbw_gbps=bw)).items():
            if r["role"] == "predicted":
                assert abs(r["samples_per_s"] / base[k]["samples_per_s"] - 1) < 0.02, (bw, k)
                if k[1] != "1x4":
                    assert abs(r["error_pct"]) < 10.0, (bw, k)


def test_validate_published_cli(capsys):
    assert main(["predict", "--validate", str(FIXTURE), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 36 and "DLPerf" in out["source"]
    assert main(["predict", "--validate", str(FIXTURE)]) == 0
    text = capsys.readouterr().out
    assert "| fp32-b32 | 4x8 | 32 | predicted |" in text and "max" in text


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


def test_validate_store_hand_computed(vstore, capsys):
    """overlap none, uniform buckets, latency 0: t_ar(2) = 2 ms, t_ar(4) = 3 ms.
    1x2: nothing calibrated: t = 102 ms -> 64/0.102. 1x4: o = 64/600 - 0.102 s, t = 0.103 + o."""
    out = json.loads(_run(["predict", "--validate", vstore, "--overlap", "none", "--intra-latency-us", "0",
                           "--format", "json"], capsys))
    rows = {r["shape"]: r for r in out["rows"]}
    assert sorted(rows) == ["1x2", "1x4"]
    assert rows["1x2"]["predicted"] == pytest.approx(64 / 0.102)
    assert rows["1x2"]["error_pct"] == pytest.approx((64 / 0.102 - 600) / 600 * 100)
    assert rows["1x2"]["overhead_ms"] == 0.0 and "nothing calibrated" in rows["1x2"]["calibration"]
    o = 64 / 600 - 0.102
    assert rows["1x4"]["overhead_ms"] == pytest.approx(o * 1e3)
    assert rows["1x4"]["predicted"] == pytest.approx(128 / (0.103 + o))
    assert rows["1x4"]["error_pct"] == pytest.approx((128 / (0.103 + o) - 1150) / 1150 * 100)
    assert "no 1-device baseline for m fp32 b32 eager ddp 1x2; skipped" in out["skipped"]
    assert any("2x4" in s and "--inter-busbw" in s for s in out["skipped"])
    assert out["max_abs_error_pct"] == pytest.approx(max(abs(r["error_pct"]) for r in rows.values()))


def test_validate_store_markdown_with_inter(vstore, capsys, tmp_path):
    text = _run(["predict", "--validate", vstore, "--inter-busbw", "12.5", "--plot", str(tmp_path / "v.png")], capsys)
    assert "| m amp-bf16 b32 eager ddp 2x4 | 2x4 |" in text
    assert "Skipped:" in text and "no 1-device baseline for m fp32 b32 eager ddp 1x2; skipped" in text
    assert "mean |error|" in text and (tmp_path / "v.png").exists()


def test_validate_bad_input(vstore, tmp_path, capsys):
    assert main(["predict", vstore, "--validate", vstore]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    s = ResultStore(tmp_path / "one")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    assert main(["predict", "--validate", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert "no multi-device ok ddp record" in err and err.count("\n") == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("series: [")
    assert main(["predict", "--validate", str(bad)]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def _run(argv, capsys) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out
