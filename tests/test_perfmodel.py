"""Performance model: pure functions against hand-computed values, and the ``predict`` verb on a store."""
from __future__ import annotations

import json

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.perfmodel import (MIB, Link, Shape, StepModel, allreduce_phases_s, allreduce_s, allreduce_time_s,
                               bucket_sizes, calibrate_overhead, compute_terms, gradient_bytes, overlap_model,
                               parse_shapes, ring_allreduce_s)
from dlscale.store import ResultStore, new_record

PARAMS = 125_000_000          # G = 500e6 bytes of fp32 gradients
BUSBW = 250.0                 # GB/s, the largest all_reduce row of the micro record
STEP_MS = 100.0               # 1-device step time (= 32 samples / 320 samples/s)
BATCH = 32
GPU_ENV = {"gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]}


def run_record(nproc: int, median: float, strategy: str, created: str, breakdown=None, model="m", nnodes=1,
               params=PARAMS, env=None, **cfg_extra):
    cfg = {"model": model, "flavor": "full", "precision": "amp-bf16", "compile": False, "batch_size": BATCH,
           "grad_accum": 1, "strategy": strategy, "nnodes": nnodes, "nproc_per_node": nproc, "device": "auto",
           "warmup": 2, "steps": 10, "seed": 0, "strategy_options": {}}
    cfg.update(cfg_extra)
    world = nnodes * nproc
    rec = new_record("run", config=cfg, status="ok", world_size=world, global_batch=BATCH * world,
                     device_type="cuda", case_key=f"{model}-{strategy}-{nnodes}x{nproc}-{cfg['precision']}",
                     model={"params": params, "flops_per_sample": 1e12, "unit": "seq", "seq_len": 1024},
                     summary={"samples_per_s": {"median": median, "n": 3},
                              "step_ms_p50": 1000.0 * BATCH * world / median},
                     breakdown=breakdown, env=env if env is not None else GPU_ENV,
                     ranks=[{"rank": r, "device_name": "NVIDIA H100 80GB HBM3"} for r in range(world)])
    rec["created"] = created
    return rec


def comm_record(created="2025-01-01T02:00:00+00:00", big_bw=BUSBW):
    return new_record("micro", micro="comm", status="ok", device="cuda", device_name="Test GPU", nranks=2,
                      config={}, env=GPU_ENV, created=created, results=[
                          {"op": "all_reduce", "bytes": 8, "time_us": 20.0, "busbw_gbps": 0.0004, "nranks": 2,
                           "status": "ok"},
                          {"op": "all_reduce", "bytes": 1 << 20, "time_us": 40.0, "busbw_gbps": 50.0, "nranks": 2,
                           "status": "ok"},
                          {"op": "all_gather", "bytes": 1 << 31, "time_us": 1.0, "busbw_gbps": 999.0, "nranks": 2,
                           "status": "ok"},
                          {"op": "all_reduce", "bytes": 1 << 30, "time_us": 4295.0, "busbw_gbps": big_bw,
                           "nranks": 2, "status": "ok"}])


@pytest.fixture()
def store(tmp_path):
    s = ResultStore(tmp_path / "res")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    s.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00",
                        breakdown={"supported": True, "overlap_ratio": 0.5, "comm_ms": 2.0, "exposed_comm_ms": 1.0,
                                   "step_ms": 101.0}))
    s.append(comm_record())
    return str(tmp_path / "res")


def run_json(argv, capsys):
    assert main(argv + ["--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- alpha-beta all-reduce

def test_ring_allreduce_hand_computed():
    link = Link(250e9)
    assert ring_allreduce_s(500e6, 2, link) == pytest.approx(2e-3)          # 500e6 * 1 / 250e9
    assert ring_allreduce_s(500e6, 4, link) == pytest.approx(3e-3)          # 500e6 * 1.5 / 250e9
    assert ring_allreduce_s(500e6, 8, link) == pytest.approx(3.5e-3)        # 500e6 * 1.75 / 250e9
    assert ring_allreduce_s(500e6, 1, link) == 0.0
    # latency: 2(n-1) alpha = 6 x 5 us
    assert ring_allreduce_s(500e6, 4, Link(250e9, 5e-6)) == pytest.approx(30e-6 + 3e-3)
    assert allreduce_time_s(500e6, 2, 250e9) == pytest.approx(2e-3)          # the v1 helper
    assert gradient_bytes(PARAMS) == 500e6 and gradient_bytes(PARAMS, 2) == 250e6
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError):
            Link(bad)
    with pytest.raises(ConfigError):
        Link(1e9, -1e-6)


def test_hierarchical_allreduce_hand_computed():
    intra, inter = Link(100e9, 2e-6), Link(10e9, 5e-6)
    s = 400e6
    ti, te = allreduce_phases_s(s, Shape(4, 8), intra, inter)
    # intra reduce-scatter + all-gather: 2 x 7 x 2 us + 2 x 400e6 x 7/8 / 100e9
    assert ti == pytest.approx(28e-6 + 7e-3)
    # across 4 nodes the node's NIC carries 400e6 x 2 x 3/4 at 10 GB/s: 2 x 3 x 5 us + 60 ms
    assert te == pytest.approx(30e-6 + 60e-3)
    assert allreduce_s(s, Shape(4, 8), intra, inter) == pytest.approx(ti + te)
    # one node: exactly the flat ring; one GPU per node: the ring of nodes on the network
    assert allreduce_s(s, Shape(1, 8), intra) == pytest.approx(ring_allreduce_s(s, 8, intra))
    assert allreduce_s(s, Shape(8, 1), None, inter) == pytest.approx(ring_allreduce_s(s, 8, inter))
    with pytest.raises(ConfigError, match="--inter-busbw"):
        allreduce_s(s, Shape(2, 8), intra, None)


def test_parse_shapes():
    assert parse_shapes("1x2, 8,4x8,125X8,1x2") == [Shape(1, 2), Shape(1, 8), Shape(4, 8), Shape(125, 8)]
    assert Shape(125, 8).devices == 1000 and Shape(4, 8).label == "4x8"
    for bad in ("0x8", "2x0", "x8", "2x8x1", "a", ""):
        with pytest.raises(ConfigError):
            parse_shapes(bad)


# ----------------------------------------------------------------------------- buckets and overlap

def test_bucket_sizes_ddp_rule():
    # uniform: 60 MiB in 25 MiB buckets
    assert bucket_sizes(60 * MIB, 25 * MIB) == [25 * MIB, 25 * MIB, 10 * MIB]
    # parameters in ready order: a bucket closes once it holds >= the cap
    assert bucket_sizes(65, 25, [10, 20, 30, 5]) == [30, 30, 5]
    # a parameter larger than the cap closes its bucket at once (its own bucket when it opens one)
    assert bucket_sizes(102, 25, [100, 1, 1]) == [100, 2]
    # DDP's small first bucket
    assert bucket_sizes(31.2, 25, [0.5, 0.7, 30], first_cap_bytes=1) == [1.2, 30]
    assert bucket_sizes(0, 25) == []


def test_bucket_pipeline_hand_example():
    """Three buckets of 10, 20, 30 MB over a 60 ms backward; 2 GPUs at busbw 0.5 GB/s: all-reduces of
    20, 40, 60 ms. Ready at 10, 30, 60 ms. b1 10->30; b2 30->70; b3 waits for b2: 70->130.
    Exposed = 130 - 60 = 70 ms of 120 ms."""
    buckets = [10e6, 20e6, 30e6]
    link = Link(0.5e9)
    ov = overlap_model(buckets, 0.060, Shape(1, 2), link, None, "buckets")
    assert ov.allreduce_s == pytest.approx(0.120)
    assert ov.exposed_s == pytest.approx(0.070)
    assert ov.intra_s == pytest.approx(0.120) and ov.inter_s == 0.0
    assert overlap_model(buckets, 0.060, Shape(1, 2), link, None, "none").exposed_s == pytest.approx(0.120)
    assert overlap_model(buckets, 0.060, Shape(1, 2), link, None, 0.25).exposed_s == pytest.approx(0.090)
    # a long backward hides everything but the last bucket's all-reduce
    assert overlap_model(buckets, 1.0, Shape(1, 2), link, None).exposed_s == pytest.approx(0.060)
    with pytest.raises(ConfigError):
        overlap_model(buckets, 0.06, Shape(1, 2), link, None, 1.5)
    with pytest.raises(ConfigError):
        overlap_model(buckets, 0.06, Shape(1, 2), link, None, "sometimes")


def test_compute_terms_split():
    c = compute_terms(0.090)
    assert (c.data_s, c.forward_s, c.backward_s, c.update_s) == pytest.approx((0.0, 0.030, 0.060, 0.0))
    assert "2/3" in c.split
    bd = {"data_ms": 5.0, "forward_ms": 30.0, "backward_ms": 55.0, "optimizer_ms": 10.0, "step_ms": 100.0}
    c = compute_terms(0.120, bd)   # the breakdown's phases scaled to the 120 ms of the timed window
    assert (c.data_s, c.forward_s, c.backward_s, c.update_s) == pytest.approx((0.006, 0.036, 0.066, 0.012))
    assert c.total_s == pytest.approx(0.120)


def test_step_model_and_overhead_calibration():
    """t1 = 100 ms (32 samples), G = 500 MB in one bucket, no overlap, busbw 250 GB/s.
    N=2: t_ar 2 ms; measured 600/s -> t2 = 64/600 s = 106.667 ms; o = 106.667 - 102 = 4.667 ms.
    N=4: t = 100 + 4.667 + 3 = 107.667 ms -> 128 / 0.107667 samples/s."""
    m = StepModel(compute_terms(0.1), 32, [500e6], Link(250e9), Link(12.5e9), "none")
    r2 = m.predict(Shape(1, 2))
    assert r2["allreduce_ms"] == pytest.approx(2.0) and r2["step_ms"] == pytest.approx(102.0)
    o = calibrate_overhead(m, Shape(1, 2), 600.0)
    assert o == pytest.approx(64 / 600 - 0.102)
    m.overhead_s = o
    assert m.predict(Shape(1, 2))["samples_per_s"] == pytest.approx(600.0)
    r4 = m.predict(Shape(1, 4))
    assert r4["step_ms"] == pytest.approx(100 + o * 1e3 + 3.0)
    assert r4["samples_per_s"] == pytest.approx(128 / (0.103 + o))
    assert r4["speedup"] == pytest.approx(r4["samples_per_s"] / 320.0)
    assert r4["efficiency"] == pytest.approx(r4["speedup"] / 4) and r4["ideal_speedup"] == 4
    assert r4["limiting"] == "overhead"                            # 4.67 ms overhead > 3 ms all-reduce
    r1 = m.predict(Shape(1, 1))                                   # no overhead, no communication at N=1
    assert r1["step_ms"] == pytest.approx(100.0) and r1["samples_per_s"] == pytest.approx(320.0)
    # 2 nodes x 8: intra 2 x 500e6 x 7/8 / 250e9 = 3.5 ms, inter 2 x 500e6 x 1/2 / 12.5e9 = 40 ms
    r16 = m.predict(Shape(2, 8))
    assert r16["allreduce_intra_ms"] == pytest.approx(3.5) and r16["allreduce_inter_ms"] == pytest.approx(40.0)
    assert r16["limiting"] == "inter-node all-reduce"
    with pytest.raises(ConfigError):
        calibrate_overhead(m, Shape(1, 1), 320.0)


# ----------------------------------------------------------------------------- predict verb

def test_predict_cli_json_from_store(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2", "--gpus-per-node-max", "4",
                    "--devices", "2,4", "--overlap", "none", "--overhead-ms", "0"], capsys)
    inp = out["inputs"]
    assert inp["intra_busbw_gbps"] == pytest.approx(BUSBW)        # largest all_reduce row, not all_gather
    # latency from the 8-byte row: (20 us - 8 B / 250 GB/s) / 2(n-1)
    assert inp["intra_latency_us"] == pytest.approx((20e-6 - 8 / 250e9) / 2 * 1e6)
    assert inp["step_ms"] == pytest.approx(STEP_MS) and inp["gradient_bytes"] == 500e6
    assert inp["backward_ms"] == pytest.approx(STEP_MS * 2 / 3)    # no 1-device breakdown: FLOPs split
    rows = {r["shape"]: r for r in out["rows"]}
    assert sorted(rows) == ["1x1", "1x2", "1x4"]                  # --devices is the last --shapes given
    # 20 buckets (19 x 25 MiB + the rest), each with 2 x 1 x alpha of latency
    alpha = inp["intra_latency_us"] * 1e-6
    assert inp["buckets"] == 20
    assert rows["1x2"]["allreduce_ms"] == pytest.approx((500e6 / 250e9 + 20 * 2 * alpha) * 1e3)
    assert rows["1x2"]["measured_samples_per_s"] == 600.0
    t2 = 0.1 + 500e6 / 250e9 + 40 * alpha
    assert rows["1x2"]["error_pct"] == pytest.approx((64 / t2 - 600) / 600 * 100)
    assert rows["1x4"]["measured_samples_per_s"] is None


def test_predict_calibrates_overhead_on_two_devices(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2", "--intra-busbw", "250",
                    "--overlap", "none", "--param-sizes", "uniform"], capsys)
    row = next(r for r in out["rows"] if r["shape"] == "1x2")
    assert row["calibration_point"] and row["samples_per_s"] == pytest.approx(600.0)
    assert out["inputs"]["overhead_ms"] == pytest.approx((64 / 600 - 0.102) * 1e3)
    assert "calibrated" in out["inputs"]["overhead_source"]


def test_predict_markdown_terms_and_plot(store, capsys, tmp_path):
    plot = tmp_path / "speedup.png"
    assert main(["predict", store, "--model", "m", "--shapes", "1x2,2x2,64x2", "--busbw", "100",
                 "--inter-busbw", "12.5", "--overhead-ms", "0", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    header = ("| shape | GPUs | data (ms) | fwd (ms) | bwd (ms) | upd (ms) | overhead (ms) | all-reduce (ms) | "
              "exposed (ms) | step (ms) | seq/s | speedup | ideal | efficiency | limited by |")
    assert header in out
    assert "| 64x2 | 128 |" in out and "inter-node all-reduce" in out
    assert plot.exists() and plot.stat().st_size > 1000


def test_predict_overlap_auto_uses_breakdown(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2", "--overlap", "auto"], capsys)
    assert out["inputs"]["overlap"] == 0.5 and "breakdown" in out["inputs"]["overlap_source"]
    s = ResultStore(store)
    s.append(run_record(1, 320.0, "single", "2025-01-03T00:00:00+00:00", precision="fp32"))
    out = run_json(["predict", store, "--model", "m", "--precision", "fp32", "--shapes", "1x2",
                    "--overlap", "auto"], capsys)
    assert out["inputs"]["overlap"] == "buckets" and "no measured breakdown" in out["inputs"]["overlap_source"]


def test_predict_registered_model_buckets(tmp_path, capsys):
    """A model dlscale knows: DDP's buckets over its real parameter sizes (built on the meta device)."""
    s = ResultStore(tmp_path / "r")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00", model="resnet50", params=25_557_032))
    out = run_json(["predict", str(tmp_path / "r"), "--model", "resnet50", "--shapes", "1x2",
                    "--intra-busbw", "100"], capsys)
    assert "registered model" in out["inputs"]["bucket_layout"]
    assert out["inputs"]["gradient_bytes"] == 25_557_032 * 4


def test_predict_one_line_errors(store, capsys):
    cases = [
        (["--shapes", "1x4"], "more than the 2 of the measured node"),      # env saw 2 GPUs
        (["--shapes", "2x2"], "--inter-busbw"),                              # spans nodes, no inter figure
        (["--precision", "fp32"], "no run records"),
    ]
    for extra, text in cases:
        assert main(["predict", store, "--model", "m"] + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("dlscale: error: ") and err.count("\n") == 1 and text in err
    # explicit link figures lift the node limit; so does --gpus-per-node-max
    assert main(["predict", store, "--model", "m", "--shapes", "1x4", "--intra-busbw", "100"]) == 0
    assert main(["predict", store, "--model", "m", "--shapes", "1x4", "--gpus-per-node-max", "8"]) == 0
    capsys.readouterr()
    assert main(["predict", store]) == 2 and "--model" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--intra-busbw", "0"], ["--inter-busbw", "-3"], ["--shapes", "0x8"],
                                   ["--overlap", "1.5"], ["--intra-latency-us", "-1"]])
def test_predict_bad_numbers_exit_2(store, capsys, extra):
    with pytest.raises(SystemExit) as e:
        main(["predict", store, "--model", "m"] + extra)
    assert e.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_predict_needs_bandwidth(tmp_path, capsys):
    s = ResultStore(tmp_path / "r")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    assert main(["predict", str(tmp_path / "r"), "--model", "m", "--shapes", "1x2"]) == 2
    err = capsys.readouterr().err
    assert "--intra-busbw" in err and "micro comm" in err and err.count("\n") == 1
    out = run_json(["predict", str(tmp_path / "r"), "--model", "m", "--busbw", "250", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == "buckets" and out["inputs"]["overhead_ms"] == 0.0
    assert "no measured 2-device" in out["inputs"]["overhead_source"]


def test_ambiguous_workload(store, capsys):
    ResultStore(store).append(run_record(1, 100.0, "single", "2025-01-02T00:00:00+00:00", precision="fp32"))
    assert main(["predict", store, "--model", "m", "--shapes", "1x2"]) == 2
    assert "--precision" in capsys.readouterr().err
    assert main(["predict", store, "--model", "m", "--precision", "amp-bf16", "--shapes", "1x2", "--format",
                 "json"]) == 0
