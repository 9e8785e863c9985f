"""Performance model: the terms and the step model against hand-computed values, and ``predict`` on a store."""
from __future__ import annotations

import json
import math
import random
import re

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.commands.perf_args import DeprecatedAlias
from dlscale.perfmodel import (MIB, HostInput, Link, Links, Measured, OverheadLaw, Shape, WorkloadModel, allreduce_phases_s,
                               allreduce_s, bucket_sizes, compute_terms, gradient_bytes, overlap_model, parse_shapes,
                               ring_allreduce_s, tree_allreduce_s)
from dlscale.results.store import ResultStore, new_record

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


def numbers(text: str) -> set[str]:
    """The numbers a message states, as written (sign kept; a thousands separator dropped)."""
    return set(re.findall(r"[+-]?\d+(?:\.\d+)?", text.replace(",", "")))


def run_json(argv, capsys):
    assert main(argv + ["--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


# ----------------------------------------------------------------------------- alpha-beta all-reduce

def test_ring_and_tree_allreduce_hand_computed():
    link = Link(250e9)
    assert ring_allreduce_s(500e6, 2, link) == pytest.approx(2e-3)          # 500e6 * 1 / 250e9
    assert ring_allreduce_s(500e6, 4, link) == pytest.approx(3e-3)          # 500e6 * 1.5 / 250e9
    assert ring_allreduce_s(500e6, 8, link) == pytest.approx(3.5e-3)        # 500e6 * 1.75 / 250e9
    assert ring_allreduce_s(500e6, 1, link) == 0.0
    assert ring_allreduce_s(500e6, 4, Link(250e9, 5e-6)) == pytest.approx(30e-6 + 3e-3)   # 2(n-1) alpha
    # NCCL's tree: each node sends and receives the gradient once: S / B, and 2 ceil(log2 n) alpha
    assert tree_allreduce_s(400e6, 4, Link(10e9, 5e-6)) == pytest.approx(20e-6 + 40e-3)
    assert tree_allreduce_s(400e6, 5, Link(10e9, 5e-6)) == pytest.approx(30e-6 + 40e-3)
    assert gradient_bytes(PARAMS) == 500e6 and gradient_bytes(PARAMS, 2) == 250e6
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ConfigError):
            Link(bad)
    with pytest.raises(ConfigError):
        Link(1e9, -1e-6)


def test_hierarchical_allreduce_hand_computed():
    links = Links({0: Link(100e9, 2e-6)}, Link(10e9, 5e-6), inter_algorithm="ring")
    s = 400e6
    ti, te = allreduce_phases_s(s, Shape(4, 8), links)
    # intra reduce-scatter + all-gather: 2 x 7 x 2 us + 2 x 400e6 x 7/8 / 100e9
    assert ti == pytest.approx(28e-6 + 7e-3)
    # ring across 4 nodes: the node's NIC carries 400e6 x 2 x 3/4 at 10 GB/s: 2 x 3 x 5 us + 60 ms
    assert te == pytest.approx(30e-6 + 60e-3)
    assert allreduce_s(s, Shape(4, 8), links) == pytest.approx(ti + te)
    # auto takes NCCL's tree here: 2 x 2 x 5 us + 40 ms; at 2 nodes ring and tree carry the same bytes
    auto = Links(links.intra, links.inter)
    assert allreduce_phases_s(s, Shape(4, 8), auto)[1] == pytest.approx(20e-6 + 40e-3)
    assert allreduce_phases_s(s, Shape(2, 8), auto)[1] == pytest.approx(10e-6 + 40e-3)
    # one node: exactly the flat ring
    assert allreduce_s(s, Shape(1, 8), links) == pytest.approx(ring_allreduce_s(s, 8, Link(100e9, 2e-6)))
    with pytest.raises(ConfigError, match="--inter-busbw"):
        allreduce_s(s, Shape(2, 8), Links({0: Link(100e9)}))
    with pytest.raises(ConfigError):
        Links(inter_algorithm="star")


def test_intra_link_by_gpu_count():
    """A source may state the intra-node busbw per GPU count (a DGX-1's 2 GPUs share one NVLink)."""
    links = Links({2: Link(21e9), 4: Link(85e9), 8: Link(130e9)})
    assert links.intra_for(2).busbw_bps == 21e9 and links.intra_for(3).busbw_bps == 85e9
    assert links.intra_for(8).busbw_bps == 130e9 and links.intra_for(16).busbw_bps == 130e9
    assert Links({0: Link(50e9)}).intra_for(8).busbw_bps == 50e9 and Links().intra_for(2) is None


def test_parse_shapes():
    assert parse_shapes("1x2, 8,4x8,125X8,1x2") == [Shape(1, 2), Shape(1, 8), Shape(4, 8), Shape(125, 8)]
    assert Shape(125, 8).devices == 1000 and Shape(4, 8).label == "4x8"
    for bad in ("0x8", "2x0", "x8", "2x8x1", "a", ""):
        with pytest.raises(ConfigError):
            parse_shapes(bad)


# ----------------------------------------------------------------------------- buckets and overlap

def test_bucket_sizes_ddp_rule():
    assert bucket_sizes(60 * MIB, 25 * MIB) == [25 * MIB, 25 * MIB, 10 * MIB]
    assert bucket_sizes(65, 25, [10, 20, 30, 5]) == [30, 30, 5]
    assert bucket_sizes(102, 25, [100, 1, 1]) == [100, 2]
    assert bucket_sizes(31.2, 25, [0.5, 0.7, 30], first_cap_bytes=1) == [1.2, 30]
    assert bucket_sizes(0, 25) == []


def test_bucket_pipeline_hand_example():
    """Three buckets of 10, 20, 30 MB over a 60 ms backward; 2 GPUs at busbw 0.5 GB/s: all-reduces of
    20, 40, 60 ms. Ready at 10, 30, 60 ms. b1 10->30; b2 30->70; b3 waits for b2: 70->130.
    Exposed = 130 - 60 = 70 ms of 120 ms."""
    buckets = [10e6, 20e6, 30e6]
    links = Links({0: Link(0.5e9)})
    ov = overlap_model(buckets, 0.060, Shape(1, 2), links, "buckets")
    assert ov.allreduce_s == pytest.approx(0.120) and ov.exposed_s == pytest.approx(0.070)
    assert ov.intra_s == pytest.approx(0.120) and ov.inter_s == 0.0
    assert overlap_model(buckets, 0.060, Shape(1, 2), links).exposed_s == pytest.approx(0.120)   # default: none
    assert overlap_model(buckets, 0.060, Shape(1, 2), links, 0.25).exposed_s == pytest.approx(0.090)
    assert overlap_model(buckets, 1.0, Shape(1, 2), links, "buckets").exposed_s == pytest.approx(0.060)
    for bad in (1.5, "sometimes", True):
        with pytest.raises(ConfigError):
            overlap_model(buckets, 0.06, Shape(1, 2), links, bad)


def test_compute_terms_split():
    c = compute_terms(0.090)
    assert (c.data_s, c.forward_s, c.backward_s, c.update_s) == pytest.approx((0.0, 0.030, 0.060, 0.0))
    assert "2/3" in c.split
    bd = {"data_ms": 5.0, "forward_ms": 30.0, "backward_ms": 55.0, "optimizer_ms": 10.0, "step_ms": 100.0}
    c = compute_terms(0.120, bd)   # the breakdown's phases scaled to the 120 ms of the timed window
    assert (c.data_s, c.forward_s, c.backward_s, c.update_s) == pytest.approx((0.006, 0.036, 0.066, 0.012))
    assert c.total_s == pytest.approx(0.120)


# ----------------------------------------------------------------------------- the step model

LAW = OverheadLaw({"ln_gpus": 0.05}, {"ln_nodes": 0.1}, {"from-1-gpu": 0.2, "from-node": 0.1, "from-multinode": 0.05})


def model(measured=(), law=LAW, **kw) -> WorkloadModel:
    """t1 = 100 ms, 32 samples per step, G = 500 MB in one bucket, intra 250 GB/s, inter 12.5 GB/s."""
    return WorkloadModel(compute_terms(0.1), 32, [500e6], Links({0: Link(250e9)}, Link(12.5e9)), "none", law,
                         kw.pop("base_rel_spread", None), list(measured), **kw)


def test_model_from_one_gpu_hand_computed():
    """1x4: exposed 2 x 500e6 x 3/4 / 250e9 = 3 ms, o = 0.05 ln 4 x 100 ms = 6.931 ms.
    2x4: + 40 ms across 2 nodes (ring = tree = S / B), o_net = 0.1 ln 2 x t_node(4)."""
    m = model()
    p1 = m.predict(Shape(1, 1))
    assert p1.step_s == pytest.approx(0.1) and p1.samples_per_s == pytest.approx(320.0) and p1.basis == "measured"
    p4 = m.predict(Shape(1, 4))
    o4 = 0.05 * 0.1 * math.log(4)
    assert p4.overlap.exposed_s == pytest.approx(0.003) and p4.node_overhead_s == pytest.approx(o4)
    assert p4.step_s == pytest.approx(0.103 + o4) and p4.samples_per_s == pytest.approx(128 / (0.103 + o4))
    assert p4.basis == "from-1-gpu" and p4.band_pct == pytest.approx(20.0)
    assert p4.low == pytest.approx(0.8 * p4.samples_per_s) and p4.high == pytest.approx(1280.0)  # capped at ideal
    p24 = m.predict(Shape(2, 4))
    t_node = 0.103 + o4
    assert p24.overlap.inter_s == pytest.approx(0.040)
    assert p24.net_overhead_s == pytest.approx(0.1 * math.log(2) * t_node)
    assert p24.step_s == pytest.approx(0.143 + o4 + 0.1 * math.log(2) * t_node)
    # 4 nodes: the tree (40 ms) beats the ring (60 ms)
    assert m.predict(Shape(4, 4)).overlap.inter_s == pytest.approx(0.040)
    # the node's own losses across nodes (a candidate network term): 0.5 x o_node(4) x ln 2
    nl = model(law=OverheadLaw({"ln_gpus": 0.05}, {"node_loss_ln_nodes": 0.5})).predict(Shape(2, 4))
    assert nl.net_overhead_s == pytest.approx(0.5 * o4 * math.log(2))
    # the slowest of M nodes (the default's network term): 0.1 x t_node x sqrt(ln 4)
    sq = model(law=OverheadLaw({"ln_gpus": 0.05}, {"sqrt_ln_nodes": 0.1})).predict(Shape(4, 4))
    assert sq.net_overhead_s == pytest.approx(0.1 * math.sqrt(math.log(4)) * t_node)
    d = p24.to_dict()
    assert d["ideal_speedup"] == 8 and d["speedup"] == pytest.approx(p24.samples_per_s / 320.0)
    assert d["efficiency"] == pytest.approx(d["speedup"] / 8) and d["allreduce_inter_ms"] == pytest.approx(40.0)


def test_model_calibrated_on_measured_points():
    """Measured 1x4 step 115 ms: o_node(4) = 115 - 100 - 3 = 12 ms, reproduced at 1x4; 1x8 takes the law's
    growth with g scaled to it (12 ms x ln 8 / ln 4); 2x4 rests on the measured node (from-node)."""
    node = Measured(Shape(1, 4), 0.115, 0.02, "run n4")
    m = model([node], base_rel_spread=0.01)
    p4 = m.predict(Shape(1, 4))
    assert p4.step_s == pytest.approx(0.115) and p4.basis == "measured"
    assert p4.band_pct == pytest.approx(100 * math.hypot(0.01, 0.02))        # input spread only
    p8 = m.predict(Shape(1, 8))
    assert p8.node_overhead_s == pytest.approx(0.012 * math.log(8) / math.log(4)) and p8.basis == "from-1-gpu"
    assert m.predict(Shape(1, 2)).node_overhead_s == pytest.approx(0.006)     # and down: 12 ms x ln 2 / ln 4
    p24 = m.predict(Shape(2, 4))
    assert p24.basis == "from-node" and p24.band_pct == pytest.approx(100 * math.hypot(0.01, 0.02, 0.1))
    assert p24.step_s == pytest.approx(0.1 + 0.043 + 0.012 + 0.1 * math.log(2) * 0.115)
    # a measured multi-node point scales the law's network term: it is then reproduced exactly
    m2 = model([node, Measured(Shape(2, 4), 0.170, 0.03, "run 2x4")])
    assert m2.predict(Shape(2, 4)).step_s == pytest.approx(0.170) and m2.predict(Shape(2, 4)).basis == "measured"
    p44 = m2.predict(Shape(4, 4))
    assert p44.net_overhead_s == pytest.approx(0.015 * math.log(4) / math.log(2))
    # 4x4 rests on the node and a measured multi-node point: its band is that protocol's (5 %) with the spreads
    # of the node (2 %) and of the multi-node point (3 %)
    assert p44.basis == "from-multinode" and p44.band_pct == pytest.approx(100 * math.hypot(0.02, 0.03, 0.05))
    # the law's shape carries the measured amplitude: sqrt(ln M) from 2 nodes to 4 is sqrt(2), ln M's is 2
    m2s = model([node, Measured(Shape(2, 4), 0.170, None, "run 2x4")],
                law=OverheadLaw({"ln_gpus": 0.05}, {"sqrt_ln_nodes": 0.1}))
    assert m2s.predict(Shape(4, 4)).net_overhead_s == pytest.approx(0.015 * math.sqrt(2))
    # a multi-node step shorter than the node's step and the modelled inter-node all-reduce (115 + 40 ms): no
    # network term, and the inter-node all-reduce scaled to it, 35 / 40 ms (a faster link, or overlap), with a
    # note; 2x4 is reproduced, and 4x4 (the tree: 40 ms modelled again) pays the same 35 ms
    short = model([node, Measured(Shape(2, 4), 0.150, None, "run 2x4")])
    assert short.predict(Shape(2, 4)).step_s == pytest.approx(0.150)
    p = short.predict(Shape(4, 4))
    assert p.net_overhead_s == 0.0 and p.step_s == pytest.approx(0.150)
    assert p.overlap.inter_s == pytest.approx(0.035) and p.overlap.exposed_s == pytest.approx(0.003 + 0.035)
    assert any("0.87" in numbers(n) for n in p.notes), p.notes  # the scale, 0.875
    # a law whose network term is nothing for this workload (the node's own losses, here 0) cannot carry a
    # measured multi-node point: the default's shape does, t_node x sqrt(ln M)
    flat = model([Measured(Shape(1, 4), 0.103, None, "n4"), Measured(Shape(2, 4), 0.150, None, "2x4")],
                 law=OverheadLaw({"ln_gpus": 0.05}, {"node_loss_ln_nodes": 0.5}))
    assert flat.predict(Shape(4, 4)).net_overhead_s == pytest.approx(0.007 * math.sqrt(2))
    # never below the node's own step: a multi-node point faster than the node scales it to 0, no further
    fast = model([node, Measured(Shape(2, 4), 0.100, None, "run 2x4")]).predict(Shape(4, 4))
    assert fast.overlap.inter_s == 0.0 and fast.step_s == pytest.approx(0.115)
    # a fixed overhead replaces law and calibration
    m3 = model([node], fixed_overhead_s=0.005)
    assert m3.predict(Shape(2, 4)).step_s == pytest.approx(0.1 + 0.043 + 0.005)
    assert m3.predict(Shape(2, 4)).basis == "fixed overhead"


def test_model_with_absolute_and_bandwidth_terms_and_an_asymmetric_band():
    """o_node(4) = 0.05 x 100 ms x ln 4 + 2 ms x ln 4; across 2 nodes o_net = 5 ms x ln 2 + 0.5 x 40 ms (the
    inter-node all-reduce, none hidden). Band from-1-gpu: 30 % below, 10 % above (with 1 % input spread)."""
    law = OverheadLaw({"ln_gpus": 0.05, "abs_ln_gpus": 0.002}, {"abs_ln_nodes": 0.005, "inter_bw": 0.5},
                      {"from-1-gpu": [0.3, 0.1], "from-node": 0.1})
    m = model(law=law, base_rel_spread=0.01)
    o4 = (0.005 + 0.002) * math.log(4)
    p = m.predict(Shape(2, 4))
    assert p.node_overhead_s == pytest.approx(o4)
    assert p.net_overhead_s == pytest.approx(0.005 * math.log(2) + 0.5 * 0.040)
    assert p.step_s == pytest.approx(0.143 + o4 + 0.005 * math.log(2) + 0.020)
    down, up = math.hypot(0.01, 0.3), math.hypot(0.01, 0.1)
    assert p.low == pytest.approx(p.samples_per_s * (1 - down)) and p.high == pytest.approx(p.samples_per_s * (1 + up))
    assert (p.band_below_pct, p.band_above_pct, p.band_pct) == pytest.approx((100 * down, 100 * up, 100 * down))
    # half the all-reduce hidden: the bandwidth term scales with the exposed inter-node part only
    half = WorkloadModel(
        compute_terms(0.1), 32, [500e6], Links({0: Link(250e9)}, Link(12.5e9)), 0.5, law)
    assert half.predict(Shape(2, 4)).net_overhead_s == pytest.approx(0.005 * math.log(2) + 0.5 * 0.020)


def test_negative_overhead_is_clamped_never_used():
    """A measured 1x4 step faster than the modelled communication allows: the overhead is clamped at 0,
    with a note, and the prediction stays at or below ideal."""
    p = model([Measured(Shape(1, 4), 0.101)]).predict(Shape(1, 4))
    assert p.node_overhead_s == 0.0 and p.step_s == pytest.approx(0.103)
    assert any("clamped at 0" in n for n in p.notes)
    with pytest.raises(ConfigError, match=">= 0"):
        model(fixed_overhead_s=-0.001)
    with pytest.raises(ConfigError):
        OverheadLaw({"ln_gpus": -0.01})
    with pytest.raises(ConfigError):
        OverheadLaw({"sunspots": 0.01})


def test_no_prediction_above_ideal_or_with_negative_overhead():
    """Random workloads, links, laws and measured points (some faster than ideal): every predicted
    throughput and band edge is at most ideal, every overhead term >= 0."""
    rng = random.Random(7)
    for _ in range(300):
        t1 = rng.uniform(0.005, 2.0)
        law = OverheadLaw({"ln_gpus": rng.uniform(0, 0.2), "abs_ln_gpus": rng.choice([0.0, rng.uniform(0, 0.01)])},
                          {"ln_nodes": rng.uniform(0, 0.2), "abs_ln_nodes": rng.choice([0.0, rng.uniform(0, 0.01)]),
                           "inter_bw": rng.choice([0.0, rng.uniform(0, 1.0)]),
                           "sqrt_ln_nodes": rng.choice([0.0, rng.uniform(0, 0.2)])},
                          {"from-1-gpu": [rng.uniform(0, 0.9), rng.uniform(0, 0.5)], "from-node": rng.uniform(0, 0.5),
                           "from-multinode": [rng.uniform(0, 0.5), rng.uniform(0, 0.5)]})
        links = Links({0: Link(rng.uniform(1e9, 900e9), rng.uniform(0, 2e-5))},
                      Link(rng.uniform(1e9, 400e9), rng.uniform(0, 2e-5)))
        meas = [Measured(Shape(rng.choice([1, 2]), g), t1 * rng.uniform(0.5, 1.5), rng.uniform(0, 0.3))
                for g in rng.sample([2, 4, 8], rng.randint(0, 3))]
        m = WorkloadModel(compute_terms(t1), rng.choice([1, 16, 256]), [rng.uniform(1e6, 2e9)], links,
                          rng.choice(["none", "buckets", 0.5]), law, rng.uniform(0, 0.1), meas)
        for sh in (Shape(1, 1), Shape(1, 2), Shape(1, 8), Shape(2, 8), Shape(16, 8), Shape(512, 8), Shape(4, 1)):
            p = m.predict(sh)
            assert p.node_overhead_s >= 0 and p.net_overhead_s >= 0
            assert 0 <= p.overlap.exposed_s <= p.overlap.allreduce_s * (1 + 1e-12) and p.overlap.inter_s >= 0
            assert p.samples_per_s <= p.ideal_samples_per_s * (1 + 1e-12)
            assert p.high <= p.ideal_samples_per_s * (1 + 1e-12) and 0 <= p.low <= p.samples_per_s
            assert p.speedup <= sh.devices * (1 + 1e-12)


def test_limited_by_names_a_cause_only_with_evidence():
    big_law = OverheadLaw({"ln_gpus": 0.5}, {"ln_nodes": 0.5})
    p = model(law=big_law).predict(Shape(1, 8))            # the law's overhead dominates, nothing measured
    assert p.limiting == "unknown" and "default overhead law" in p.evidence
    slow = WorkloadModel(compute_terms(0.1), 32, [500e6], Links({0: Link(1e9)}, sources={"intra": "--intra-busbw 1"}),
                         "none", OverheadLaw())
    p = slow.predict(Shape(1, 8))
    assert p.limiting == "intra-node all-reduce" and p.evidence == "--intra-busbw 1"
    p = model(law=OverheadLaw()).predict(Shape(1, 2))     # 2 ms of 102: a loss, the link has no source given
    assert p.limiting == "intra-node all-reduce"
    tiny = WorkloadModel(compute_terms(0.1), 32, [1e6], Links({0: Link(250e9)}), "none", OverheadLaw())
    assert tiny.predict(Shape(1, 2)).limiting == "compute"


def test_host_input_floor_hand_computed():
    """Loaders at 0.01 core-s a sample on a 16-core host: 8 ranks of 32 samples need 2.56 core-s a step over
    the 8 cores they leave, a 320 ms floor above the modelled ~103 ms step: 800 samples/s, limited by the
    host input. At 1x2 the floor is 2 x 32 x 0.01 / 14 = 45.7 ms, under the step: no change."""
    host = HostInput(0.01, 16, "loaders: 0.01 core-s a sample")
    m, free = model(law=OverheadLaw(), host=host), model(law=OverheadLaw())
    p8 = m.predict(Shape(1, 8))
    assert p8.host_floor_s == pytest.approx(0.32) and p8.step_s == pytest.approx(0.32)
    assert p8.samples_per_s == pytest.approx(800.0) and p8.limiting == "host input"
    # the evidence carries the host's source and the cores 8 ranks leave the loaders
    assert host.source in p8.evidence and str(host.free_cores(8)) in numbers(p8.evidence), p8.evidence
    assert any("host input floor" in n for n in p8.notes) and p8.to_dict()["host_floor_ms"] == pytest.approx(320.0)
    # a floor-bound row takes the floor's measured band, not the law's (this law has none)
    from dlscale.perfmodel.model import HOST_FLOOR_BAND
    below, above = HOST_FLOOR_BAND
    assert (p8.band_below_pct, p8.band_above_pct) == pytest.approx((100 * below, 100 * above))
    assert p8.low == pytest.approx(800.0 * (1 - below)) and p8.high == pytest.approx(800.0 * (1 + above))
    p2 = m.predict(Shape(1, 2))
    assert p2.host_floor_s == pytest.approx(2 * 32 * 0.01 / 14)
    assert p2.step_s == pytest.approx(free.predict(Shape(1, 2)).step_s) and p2.limiting != "host input"
    assert m.predict(Shape(1, 1)).step_s == pytest.approx(0.1)       # the measured 1-device step stands
    assert HostInput(0.01, 4, "").floor_s(8, 32) == pytest.approx(8 * 32 * 0.01)   # fewer cores than ranks: one


def test_host_input_floor_bounds_one_device_on_another_host():
    """The 1-device record ran on 16 cores; on a 4-core host its one rank leaves 3 to the loaders: 32 x 0.02 / 3 =
    213 ms, above the measured 100 ms step, so the 1x1 row is the floor. On the record's own host it stands."""
    small = model(law=OverheadLaw(), host=HostInput(0.02, 4, "", record_cores=16))
    p1 = small.predict(Shape(1, 1))
    assert p1.step_s == pytest.approx(32 * 0.02 / 3) and p1.limiting == "host input"
    assert p1.samples_per_s == pytest.approx(3 / 0.02)
    same = model(law=OverheadLaw(), host=HostInput(0.02, 16, "", record_cores=16)).predict(Shape(1, 1))
    assert same.step_s == pytest.approx(0.1) and same.host_floor_s == 0.0


# ----------------------------------------------------------------------------- predict verb

def test_predict_cli_json_from_store(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2", "--nproc-per-node", "4",
                    "--devices", "2,4", "--overlap", "none", "--overhead-ms", "0"], capsys)
    inp = out["inputs"]
    assert inp["intra_busbw_gbps"] == {"2": pytest.approx(BUSBW)}   # largest all_reduce row, at its 2 ranks
    assert inp["step_ms"] == pytest.approx(STEP_MS) and inp["gradient_bytes"] == 500e6
    assert inp["backward_ms"] == pytest.approx(STEP_MS * 2 / 3)     # no 1-device breakdown: FLOPs split
    rows = {r["shape"]: r for r in out["rows"]}
    assert sorted(rows) == ["1x1", "1x2", "1x4"]                   # --devices (deprecated) is the last --shapes
    # latency from the 8-byte row: (20 us - 8 B / 250 GB/s) / 2(n-1); 20 buckets, each 2 x 1 x alpha
    alpha = (20e-6 - 8 / 250e9) / 2
    assert inp["buckets"] == 20
    assert rows["1x2"]["allreduce_ms"] == pytest.approx((500e6 / 250e9 + 20 * 2 * alpha) * 1e3)
    assert rows["1x2"]["measured_samples_per_s"] == 600.0 and rows["1x2"]["basis"] == "fixed overhead"
    t2 = 0.1 + 500e6 / 250e9 + 40 * alpha
    assert rows["1x2"]["error_pct"] == pytest.approx((64 / t2 - 600) / 600 * 100)
    assert rows["1x4"]["measured_samples_per_s"] is None
    for r in out["rows"]:
        assert r["samples_per_s_low"] <= r["samples_per_s"] <= r["samples_per_s_high"]


def test_predict_host_input_floor_from_a_real_data_record(tmp_path, capsys):
    """A 1-GPU record whose loaders used 3.2 cores for 320 samples/s on a 16-core host: at 1x8 the host floor
    (8 x 32 x 0.01 / 8 = 320 ms) is the step; --host-cores 64 lifts it; a synthetic record has none."""
    s = ResultStore(tmp_path / "real")
    rec = run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00",
                     env=dict(GPU_ENV, cpu_count=16, cpu_affinity_count=16))
    rec["data"] = {"loader_cpu_cores_total": 3.2}
    s.append(rec)
    argv = ["predict", str(tmp_path / "real"), "--model", "m", "--shapes", "1x8", "--intra-busbw", "250"]
    out = run_json(argv, capsys)
    row = out["rows"][-1]
    assert row["limiting"] == "host input" and row["host_floor_ms"] == pytest.approx(320.0)
    assert row["samples_per_s"] == pytest.approx(800.0)
    assert {"3.20", "320.0"} <= numbers(out["inputs"]["host_input_floor"])  # the loaders' cores and the rate
    assert main(argv) == 0
    md = capsys.readouterr().out
    assert "| host input |" in md and "320.0 ms" in md  # the row's limit and the floor it rests on
    lifted = run_json(argv + ["--host-cores", "64"], capsys)["rows"][-1]
    assert lifted["limiting"] != "host input" and lifted["samples_per_s"] > 2000
    assert "--host-cores" in run_json(argv + ["--host-cores", "64"], capsys)["inputs"]["host_input_floor"]
    s2 = ResultStore(tmp_path / "syn")
    s2.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    both = ResultStore(tmp_path / "both")   # the real-data record beside its synthetic twin: --data tells them apart
    both.append(run_record(1, 500.0, "single", "2025-01-01T00:00:00+00:00"))
    both.append(dict(rec, config=dict(rec["config"], data="imagefolder:/d/imgs"), id="real",
                     case_key=rec["case_key"] + "-imagefolder"))
    assert main(["predict", str(tmp_path / "both"), "--model", "m", "--shapes", "1x2", "--intra-busbw", "250"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--data" in err and "data=synthetic" in err and "data=imagefolder:/d/imgs" in err
    assert main(["predict", str(tmp_path / "both"), "--model", "m", "--data", "tokens", "--shapes", "1x2"]) == 2
    err = capsys.readouterr().err  # one line naming the data each record there read
    assert err.count("\n") == 1 and "imagefolder:/d/imgs" in err and "synthetic" in err, err
    for data, sps in (("imagefolder", 320.0), ("imagefolder:/d/imgs", 320.0), ("synthetic", 500.0)):
        got = run_json(["predict", str(tmp_path / "both"), "--model", "m", "--data", data, "--shapes", "1x2",
                        "--intra-busbw", "250"], capsys)
        assert got["inputs"]["step_ms"] == pytest.approx(32 / sps * 1e3)
    # an input-bound real-data record (loaders on 15 of the 15 cores left: 0.046875 core-s a sample): on 64 cores
    # the GPU's own step is the synthetic twin's (64 ms, above the 32 x 0.046875 / 63 = 23.8 ms floor); on 8
    # cores the floor, 32 x 0.046875 / 7 = 214 ms; without the twin the record's step stands (a lower bound)
    bound = dict(rec, config=dict(rec["config"], data="imagefolder:/d/imgs"), id="bound",
                 case_key=rec["case_key"] + "-bound", data={"loader_cpu_cores_total": 15.0})
    ResultStore(tmp_path / "bound").append(run_record(1, 500.0, "single", "2025-01-01T00:00:00+00:00"))
    ResultStore(tmp_path / "bound").append(bound)
    q = ["predict", str(tmp_path / "bound"), "--model", "m", "--data", "imagefolder", "--shapes", "1x1",
         "--intra-busbw", "250", "--host-cores"]
    big = run_json(q + ["64"], capsys)
    assert big["rows"][0]["samples_per_s"] == pytest.approx(500.0) and "synthetic run" in big["inputs"]["step_source"]
    assert big["rows"][0]["basis"] == "from-1-gpu" and "synthetic run" in big["inputs"]["host_input_floor"]
    assert run_json(q + ["8"], capsys)["rows"][0]["samples_per_s"] == pytest.approx(7 / 0.046875)
    pair = ResultStore(tmp_path / "pair")   # --validate on another host: nothing measured there to compare
    pair.append(rec)
    pair.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00", env=dict(GPU_ENV, cpu_count=16,
                                                                                   cpu_affinity_count=16)))
    pair.append(comm_record())
    assert main(["predict", "--validate", str(tmp_path / "pair"), "--host-cores", "4", "--format", "json"]) == 2
    err = capsys.readouterr().err  # every point skipped: nothing validated, the reason named
    assert err.count("\n") == 1 and "--host-cores 4" in err and "16 cores" in err
    ResultStore(tmp_path / "alone").append(bound)
    alone = run_json(["predict", str(tmp_path / "alone")] + q[2:] + ["64"], capsys)
    assert alone["rows"][0]["samples_per_s"] == pytest.approx(320.0)
    assert "lower bound" in alone["inputs"]["host_input_floor"]
    syn = run_json(["predict", str(tmp_path / "syn"), "--model", "m", "--shapes", "1x8", "--intra-busbw", "250"],
                   capsys)
    assert syn["inputs"]["host_input_floor"].startswith("none") and syn["rows"][-1]["host_floor_ms"] == 0.0
    busy = ResultStore(tmp_path / "busy")   # loaders on 14 of the 15 cores the loop left: the record may be input-bound
    busy.append(dict(rec, data={"loader_cpu_cores_total": 14.0}))
    busy_src = run_json(["predict", str(tmp_path / "busy")] + argv[2:], capsys)["inputs"]["host_input_floor"]
    assert "input-bound" in busy_src and {"14.00", "15"} <= numbers(busy_src)  # the cores used of those left
    assert "input-bound" not in out["inputs"]["host_input_floor"]
    small = run_json(argv[:4] + ["--shapes", "1x1", "--host-cores", "2"], capsys)
    assert small["rows"][0]["samples_per_s"] == pytest.approx(100.0)   # 1 core left: 1 / 0.01 core-s a sample
    assert small["rows"][0]["measured_samples_per_s"] is None        # measured on 16 cores: not this host's
    assert any("--host-cores" in n and "2" in numbers(n) for n in small["notes"]), small["notes"]
    assert {"2", "16"} <= numbers(small["inputs"]["host_input_floor"])  # the cores predicted for and those measured on
    with pytest.raises(SystemExit) as e:
        main(argv + ["--host-cores", "0"])
    err = capsys.readouterr().err  # argparse's refusal: the option and what it takes
    assert e.value.code == 2 and "--host-cores" in err and "positive" in err, err


def test_deprecated_spellings_warn_once(store, capsys):
    DeprecatedAlias.warned.clear()
    assert main(["predict", store, "--model", "m", "--devices", "2", "--busbw", "250", "--gpus-per-node-max", "2",
                 "--format", "json"]) == 0
    err = capsys.readouterr().err
    for old, new in (("--devices", "--shapes"), ("--busbw", "--intra-busbw"),
                     ("--gpus-per-node-max", "--nproc-per-node")):
        said = [ln for ln in err.splitlines() if "warning" in ln and old in ln and new in ln]
        assert len(said) == 1 and said[0].index(old) < said[0].index(new), err  # the old spelling, then the new
    assert main(["predict", store, "--model", "m", "--devices", "2", "--format", "json"]) == 0
    assert "deprecated" not in capsys.readouterr().err          # once per process


def test_predict_calibrates_on_the_measured_point(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2,1x8", "--intra-busbw", "250",
                    "--overlap", "none", "--param-sizes", "uniform"], capsys)
    rows = {r["shape"]: r for r in out["rows"]}
    assert rows["1x2"]["calibration_point"] and rows["1x2"]["samples_per_s"] == pytest.approx(600.0)
    assert rows["1x2"]["basis"] == "measured"
    assert rows["1x2"]["overhead_ms"] == pytest.approx((64 / 600 - 0.102) * 1e3)
    assert "1x2" in out["inputs"]["overhead_source"] and "--overhead-ms" not in out["inputs"]["overhead_source"]
    assert rows["1x8"]["basis"] == "from-1-gpu" and rows["1x8"]["overhead_ms"] > rows["1x2"]["overhead_ms"]


def test_measured_point_is_the_strategy_at_its_defaults(store, capsys):
    """Newer variants of ddp (a strategy option, the optimizer graph) beside the default run, all one
    workload: the model is calibrated on the default, whichever is newer."""
    variant = run_record(2, 650.0, "ddp", "2025-01-01T03:00:00+00:00", strategy_options={"static_graph": True})
    variant["case_key"] += "-static-graph"
    graphed = run_record(2, 660.0, "ddp", "2025-01-01T04:00:00+00:00", optimizer_graph=True)
    graphed["case_key"] += "-graph"
    for rec in (variant, graphed):
        ResultStore(store).append(rec)
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2", "--intra-busbw", "250",
                    "--overlap", "none", "--param-sizes", "uniform"], capsys)
    row = {r["shape"]: r for r in out["rows"]}["1x2"]
    assert row["calibration_point"] and row["samples_per_s"] == pytest.approx(600.0)


def test_predict_markdown_terms_band_and_plot(store, capsys, tmp_path):
    plot = tmp_path / "speedup.png"
    assert main(["predict", store, "--model", "m", "--shapes", "1x2,2x2,64x2", "--intra-busbw", "100",
                 "--inter-busbw", "12.5", "--overhead-ms", "0", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert ("| shape | GPUs | data+fwd (ms) | bwd+upd (ms) | overhead (ms) | all-reduce (ms) | exposed (ms) | "
            "step (ms) | seq/s | band (seq/s) | speedup | ideal | efficiency | basis | limited by |") in out
    assert "| 64x2 | 128 |" in out and "inter-node all-reduce" in out
    assert plot.exists() and plot.stat().st_size > 1000


def test_predict_overlap_auto(store, capsys):
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == 0.5 and "breakdown" in out["inputs"]["overlap_source"]
    ResultStore(store).append(run_record(1, 320.0, "single", "2025-01-03T00:00:00+00:00", precision="fp32"))
    out = run_json(["predict", store, "--model", "m", "--precision", "fp32", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == "none" and "no measured breakdown" in out["inputs"]["overlap_source"]


def test_predict_overlap_prefers_a_breakdown_that_agrees_with_its_window(store, tmp_path, capsys):
    """A newer 2-device breakdown whose phases sum to 150 ms against its window's 100 ms steps
    (breakdown_gap) gives way to the older one that agrees; alone, it is used and said to be off."""
    def gapped(created):
        rec = run_record(2, 640.0, "ddp", created, breakdown={"supported": True, "overlap_ratio": 0.9,
                                                              "comm_ms": 2.0, "exposed_comm_ms": 0.2, "step_ms": 150.0})
        rec["repeats"] = [{"status": "ok", "samples_per_s": 640.0, "step_times_ms": [100.0] * 10}]
        rec["case_key"] += "-gapped"  # another case (the newest record of a case stands for it)
        return rec
    ResultStore(store).append(gapped("2025-01-02T00:00:00+00:00"))
    out = run_json(["predict", store, "--model", "m", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == 0.5 and "breakdown_gap" not in out["inputs"]["overlap_source"]
    alone = ResultStore(tmp_path / "alone")
    alone.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    alone.append(gapped("2025-01-02T00:00:00+00:00"))
    alone.append(comm_record())
    out = run_json(["predict", str(tmp_path / "alone"), "--model", "m", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == 0.9
    src = out["inputs"]["overlap_source"]
    assert "breakdown_gap" in src and "+50.0" in numbers(src), src  # the key and its value


def test_predict_registered_model_buckets(tmp_path, capsys):
    """A model dlscale knows: DDP's buckets over its real parameter sizes (built on the meta device)."""
    s = ResultStore(tmp_path / "r")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00", model="resnet50", params=25_557_032))
    out = run_json(["predict", str(tmp_path / "r"), "--model", "resnet50", "--shapes", "1x2",
                    "--intra-busbw", "100"], capsys)
    from dlscale.perfmodel.inputs import registry_param_numels

    layout = out["inputs"]["bucket_layout"]  # cut over the model's own parameters, not uniform
    assert "uniform" not in layout and str(len(registry_param_numels("resnet50", "full"))) in numbers(layout)
    assert out["inputs"]["gradient_bytes"] == 25_557_032 * 4


def test_predict_says_cpu_and_flavour(tmp_path, capsys):
    s = ResultStore(tmp_path / "cpu")
    for n, v in ((1, 50.0), (2, 90.0)):
        rec = run_record(n, v, "single" if n == 1 else "ddp", f"2025-01-01T0{n}:00:00+00:00", flavor="tiny",
                         device="cpu")
        rec["device_type"] = "cpu"
        s.append(rec)
    assert main(["predict", str(tmp_path / "cpu"), "--model", "m", "--shapes", "1x2", "--intra-busbw", "5"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    out = run_json(["predict", str(tmp_path / "cpu"), "--model", "m", "--flavor", "tiny", "--shapes", "1x2",
                    "--intra-busbw", "5"], capsys)
    assert "CPU" in out["qualifier"] and "tiny" in out["qualifier"] and out["flavor"] == "tiny"
    assert out["qualifier"] in title  # the markdown's title says it too
    assert main(["predict", str(tmp_path / "cpu"), "--model", "m", "--flavor", "full", "--intra-busbw", "5"]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line: no record of that flavour


def test_predict_one_line_errors(store, capsys):
    cases = [
        (["--shapes", "1x4"], "more than the 2 of the measured node"),      # env saw 2 GPUs
        (["--shapes", "2x2"], "--inter-busbw"),                              # spans nodes, no inter figure
        (["--precision", "fp32"], "no run or imported records"),
    ]
    for extra, text in cases:
        assert main(["predict", store, "--model", "m"] + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("dlscale: error: ") and err.count("\n") == 1 and text in err
    assert main(["predict", store, "--model", "m", "--shapes", "1x4", "--intra-busbw", "100"]) == 0
    assert main(["predict", store, "--model", "m", "--shapes", "1x4", "--nproc-per-node", "8"]) == 0
    capsys.readouterr()
    assert main(["predict", store]) == 2 and "--model" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [["--intra-busbw", "0"], ["--inter-busbw", "-3"], ["--shapes", "0x8"],
                                   ["--overlap", "1.5"], ["--intra-latency-us", "-1"], ["--overhead-ms", "-1"],
                                   ["--nnodes", "0"], ["--inter-algorithm", "star"]])
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
    out = run_json(["predict", str(tmp_path / "r"), "--model", "m", "--intra-busbw", "250", "--shapes", "1x2"], capsys)
    assert out["inputs"]["overlap"] == "none" and "default law" in out["inputs"]["overhead_source"]
    assert out["rows"][1]["basis"] == "from-1-gpu" and out["rows"][1]["overhead_ms"] > 0


def test_ambiguous_workload(store, capsys):
    ResultStore(store).append(run_record(1, 100.0, "single", "2025-01-02T00:00:00+00:00", precision="fp32"))
    assert main(["predict", store, "--model", "m", "--shapes", "1x2"]) == 2
    assert "--precision" in capsys.readouterr().err
    assert main(["predict", store, "--model", "m", "--precision", "amp-bf16", "--shapes", "1x2", "--format",
                 "json"]) == 0


@pytest.mark.slow
def test_host_floor_check_reproduces_the_measured_table_and_the_floor_band():
    """benchmarks/host_floor_check.py on the stored H200 runs (docs/results/stores/h200-2026-11-29/host-floor:
    call1-3, three calls with their synthetic runs; r1-r3, three rounds of 4, 8 and 16 cores in one call) prints the
    errors docs/results/h200.md gives and the band model.HOST_FLOOR_BAND holds. One call of the script, in this
    process (it reads stores and calls ``dlscale predict``): each run's rows are its own, whatever runs follow."""
    import contextlib
    import importlib.util
    import io
    import sys
    from pathlib import Path
    from unittest import mock

    from dlscale.perfmodel.model import HOST_FLOOR_BAND
    root = Path(__file__).resolve().parent.parent
    d = root / "docs/results/stores/h200-2026-11-29/host-floor"
    runs = [f"{d / 'call1'},{d / 'synthetic-call1/store'}", f"{d / 'call2'},{d / 'synthetic-call1/store'}",
            f"{d / 'call3'},{d / 'synthetic-call4/store'}"]
    runs += [f"{d / r},{d / 'synthetic-call4/store'}" for r in ("r1", "r2", "r3")]
    spec = importlib.util.spec_from_file_location("host_floor_check", root / "benchmarks" / "host_floor_check.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    buf = io.StringIO()
    with mock.patch.object(sys, "argv", ["host_floor_check.py", *runs]), contextlib.redirect_stdout(buf):
        assert script.main() == 0
    out = buf.getvalue()
    for names in (("| call",), ("| r1 ", "| r2 ", "| r3 ")):
        rows = [line for line in out.splitlines() if line.startswith(names)]
        # each run is predicted on its own host and on fewer cores: as many "fewer cores" rows as the others
        assert rows and 2 * sum("| fewer cores" in r for r in rows) == len(rows)
    for err in ("-7.4 %", "+7.9 %", "-21.1 %", "-5.4 %", "+2.4 %", "+22.3 %", "+0.8 %",  # call1-3
                "+2.5 %", "-11.6 %", "+15.4 %", "+16.2 %", "-6.9 %"):  # r1-r3
        assert err in out
    (summary,) = [line for line in out.splitlines() if "floor-bound" in line]
    assert {"37", "8.1", "22.3"} <= numbers(summary), summary  # predictions, mean and max |error| (%)
    assert f"[{HOST_FLOOR_BAND[0]}, {HOST_FLOOR_BAND[1]}]" in out
