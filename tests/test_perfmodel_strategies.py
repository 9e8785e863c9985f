"""The strategy model (dlscale/perfmodel/strategies.py): collectives on mesh groups, the two-stream overlap,
the pipeline bubble, the tensor-parallel collectives by hand; the basis order; bad input; plan and predict
--strategy through the command line."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from dlscale import ConfigError
from dlscale.models import get_model
from dlscale.perfmodel.core import Link, Links
from dlscale.perfmodel.strategies import (BASES, Candidate, Evidence, Group, LayerTiming, Machine, Reference,
                                          allreduce_group_s, gather_group_s, mesh_group, predict, stage_blocks,
                                          step_terms, throughput, two_streams)
from tests.test_plan import _cli

ARCH = get_model("llama", "tiny").arch
B_INTRA, B_INTER, A = 100e9, 20e9, 5e-6
LINKS = Links(intra={0: Link(B_INTRA, A)}, inter=Link(B_INTER, 2 * A), inter_algorithm="ring")
PEAK = 100e12


def _machine(gpus: int, gpn: int = 8, links: Links = LINKS) -> Machine:
    return Machine(gpus, gpn, PEAK, links)


# ---------------------------------------------------------------- groups and collectives by hand

def test_mesh_groups_follow_the_mesh_order():
    assert mesh_group(1, 8, 8) == Group(8, 1, 1)  # tp 8: one node
    assert mesh_group(1, 16, 8) == Group(8, 2, 1)  # fsdp 16 on two nodes
    assert mesh_group(64, 8, 8) == Group(1, 8, 8)  # dp 8 strided by tp x pp = 64: one rank a node, 8 groups share it
    assert mesh_group(2, 4, 8) == Group(4, 1, 1)  # pp 4 strided by tp 2: inside the node
    assert mesh_group(4, 4, 8) == Group(2, 2, 4)
    assert mesh_group(7, 2, 8) == Group(2, 1, 1)  # pp 8's first and last stage: one node, not two
    assert mesh_group(3, 4, 8) == Group(3, 2, 2)  # ranks 0, 3, 6 | 9: two nodes


def test_collectives_by_hand():
    s = 1e9
    g = Group(8, 2, 1)
    ar = 2 * 7 * A + 2 * s * 7 / 8 / B_INTRA + 2 * 1 * 2 * A + 2 * s * 1 / 2 / B_INTER
    assert allreduce_group_s(s, g, LINKS) == pytest.approx(ar)
    ag = 7 * A + s * 7 / 8 / B_INTRA + 2 * A + s * 1 / 2 / B_INTER
    assert gather_group_s(s, g, LINKS) == pytest.approx(ag)
    # c groups of a node share its link: 8 groups of one rank a node move 8 x the bytes across it
    assert gather_group_s(s, Group(1, 2, 8), LINKS) == pytest.approx(2 * A + 8 * s / 2 / B_INTER)
    assert allreduce_group_s(s, Group(1, 1, 1), LINKS) == 0.0


def test_two_streams_by_hand():
    # gather 1 before each of two 2-s computes: the second gather runs behind the first compute
    assert two_streams([(1, 2, 0), (1, 2, 0)]) == 5
    # a reduction after the first compute overlaps the second; the step ends when it does
    assert two_streams([(0, 2, 3), (0, 2, 0)]) == 5
    # nothing to hide behind: compute and communication add
    assert two_streams([(3, 0, 0), (0, 1, 0)]) == 4


def test_stage_split():
    assert stage_blocks(8, 1, 1.0, "time") == (8, True)
    assert stage_blocks(8, 2, 0.0, "blocks") == (4, True)
    # a head worth 2 blocks: balance by time gives the last stage fewer blocks (3 + 2 against 5)
    assert stage_blocks(8, 2, 2.0, "time") == (5, False)


# ---------------------------------------------------------------- strategies by hand and by property

@pytest.mark.parametrize("pp, m, schedule, v", [(2, 4, "1f1b", 1), (2, 8, "gpipe", 1), (2, 4, "interleaved", 1)])
def test_pipeline_bubble_share(pp, m, schedule, v):
    c = Candidate("pipeline", pp=pp, batch_size=m, microbatches=m, schedule=schedule, virtual=v)
    untied = replace(ARCH, tied_embeddings=False)
    t = step_terms(c, untied, _machine(pp), 0.5)
    fill = (pp - 1) / v
    assert t.bubble_s / t.step_s == pytest.approx(fill / (m + fill))
    assert t.p2p_s > 0 and t.dp_exposed_s == 0
    # tied embeddings: the first and last stage all-reduce the embedding's fp32 gradient after the schedule
    tied = step_terms(c, ARCH, _machine(pp), 0.5)
    one = 2 * A + 2 * 4.0 * ARCH.embedding_params() * (1 / 2) / B_INTRA
    assert tied.step_s - t.step_s == pytest.approx(one, rel=1e-6)


def test_tensor_parallel_collectives_by_hand():
    c = Candidate("tensor", tp=2, batch_size=4)
    t = step_terms(c, ARCH, _machine(2), 0.5)
    nbytes = 4 * ARCH.seq_len * ARCH.hidden * 2  # bf16 activations of the micro-batch
    one = 2 * A + 2 * nbytes * (1 / 2) / B_INTRA  # ring all-reduce over 2 GPUs
    assert t.tp_s == pytest.approx(ARCH.n_layers * 4 * one)  # 2 forward + 2 backward a block
    full = step_terms(replace(c, checkpointing="full"), ARCH, _machine(2), 0.5)
    assert full.tp_s == pytest.approx(ARCH.n_layers * 6 * one)  # the recomputed forward's two again


def test_fsdp_zero3_gathers_twice_and_hsdp_adds_the_replica_all_reduce():
    z2 = step_terms(Candidate("fsdp", dp_shard=8, zero=2, batch_size=2), ARCH, _machine(8), 0.5)
    z3 = step_terms(Candidate("fsdp", dp_shard=8, zero=3, batch_size=2), ARCH, _machine(8), 0.5)
    assert z3.dp_total_s > z2.dp_total_s
    hsdp = step_terms(Candidate("hsdp", dp_replicate=2, dp_shard=8, zero=3, batch_size=2), ARCH, _machine(16), 0.5)
    fsdp16 = step_terms(Candidate("fsdp", dp_shard=16, zero=3, batch_size=2), ARCH, _machine(16), 0.5)
    assert hsdp.dp_total_s < fsdp16.dp_total_s  # the gathers stay inside the node
    ddp = step_terms(Candidate("ddp", dp_replicate=8, batch_size=2), ARCH, _machine(8), 0.5)
    assert ddp.dp_exposed_s <= ddp.dp_total_s


@pytest.mark.parametrize("cand", [
    Candidate("ddp", dp_replicate=16, batch_size=2), Candidate("zero1", dp_replicate=16, zero=1, batch_size=2),
    Candidate("fsdp", dp_shard=16, zero=3, batch_size=2),
    Candidate("hybrid", dp_shard=4, tp=2, pp=2, zero=3, batch_size=8, microbatches=4),
    Candidate("hybrid", dp_replicate=4, tp=4, batch_size=2)])
def test_never_faster_than_its_compute(cand):
    t = step_terms(cand, ARCH, _machine(16), 0.5)
    assert t.step_s >= t.compute_s
    assert t.step_s == pytest.approx(t.compute_s + t.tp_s + t.p2p_s + t.bubble_s + t.dp_exposed_s)


def test_the_once_a_step_update_by_hand():
    """At a known memory bandwidth the step adds the AdamW update (fp32 parameter, gradient and two moments: read
    16 B, write 12 B a parameter) and the AMP weight casts (fp32 weight to bf16 for the forward, its bf16 gradient
    back to fp32: 12 B a matmul weight); none without a bandwidth, none of the casts in fp32; FSDP over 8 does
    1/8 of both on each device."""
    bw = 1e12
    fast = replace(_machine(1), mem_bw_bps=bw)
    c = Candidate("single", batch_size=2, precision="fp32")
    assert step_terms(c, ARCH, _machine(1), 0.5).update_s == 0.0
    fp32 = step_terms(c, ARCH, fast, 0.5)
    assert fp32.update_s == pytest.approx(ARCH.param_count() * 28 / bw)
    assert fp32.step_s == pytest.approx(step_terms(c, ARCH, _machine(1), 0.5).step_s + fp32.update_s)
    weights = ARCH.n_layers * ARCH.block_params() + ARCH.rows * ARCH.hidden  # tied or not, the head's matmul casts
    amp = step_terms(replace(c, precision="amp-bf16"), ARCH, fast, 0.5)
    assert amp.update_s - fp32.update_s == pytest.approx(weights * 12 / bw)
    sharded = step_terms(Candidate("fsdp", dp_shard=8, zero=3, batch_size=2), ARCH, replace(_machine(8), mem_bw_bps=bw),
                         0.5)
    assert sharded.update_s == pytest.approx(amp.update_s / 8)


def test_the_update_orders_batches_the_rate_alone_ties():
    """With the rate from a micro layer timing (the same for every batch), the once-a-step update makes a larger
    batch faster per sample; the block's own casts come off its timing, so the rate rises."""
    ev = Evidence(layer=LayerTiming(1e-3, 5e10, "row"))
    fast = replace(_machine(1), mem_bw_bps=1e12)
    sps = [predict(Candidate("single", batch_size=b), ARCH, fast, ev).tokens_per_s_per_device for b in (1, 2, 4)]
    assert sps[0] < sps[1] < sps[2]
    flat = [predict(Candidate("single", batch_size=b), ARCH, _machine(1), ev).tokens_per_s_per_device for b in (1, 4)]
    assert flat[0] == pytest.approx(flat[1])
    with_bw = predict(Candidate("single", batch_size=1), ARCH, fast, ev).efficiency
    assert with_bw == pytest.approx(5e10 / (1e-3 - ARCH.block_params() * 12 / 1e12) / PEAK)


# ---------------------------------------------------------------- the compute rate and its basis

def test_a_reference_is_reproduced_and_the_basis_order_holds():
    fsdp2 = Candidate("fsdp", dp_shard=2, zero=3, batch_size=2)
    m2 = _machine(2)
    ref_tps = 0.8 * throughput(fsdp2, ARCH, m2, 0.5)
    same = Reference(fsdp2, m2, ref_tps, "r1")
    single = Reference(Candidate("single", batch_size=2), _machine(1), 1.2 * ref_tps, "r0")
    other = Reference(Candidate("ddp", dp_replicate=2, batch_size=4), m2, ref_tps, "r2")
    assert predict(fsdp2, ARCH, m2, Evidence((same,))).tokens_per_s_per_device == pytest.approx(ref_tps, rel=1e-6)
    assert predict(fsdp2, ARCH, m2, Evidence((same,))).basis == "measured"
    big = replace(fsdp2, dp_shard=16)
    assert predict(big, ARCH, _machine(16), Evidence((same, single, other))).basis == "from-node"
    assert predict(big, ARCH, _machine(16), Evidence((single, other))).basis == "from-1-gpu"
    assert predict(big, ARCH, _machine(16), Evidence((other,))).basis == "other-strategy"
    layer = LayerTiming(1e-3, 0.3 * PEAK * 1e-3, "micro")
    p = predict(big, ARCH, _machine(16), Evidence(layer=layer))
    assert p.basis == "micro-layer" and p.efficiency == pytest.approx(0.3)
    p = predict(big, ARCH, _machine(16), Evidence(assumed_mfu=0.25))
    assert p.basis == "assumed-mfu" and p.efficiency == 0.25 and "assumed" in p.evidence
    assert all(b in BASES for b in ("measured", "from-node", "from-1-gpu", "other-strategy"))
    assert p.low < p.tokens_per_s_per_device < p.high


@pytest.mark.parametrize("cand, machine", [
    (Candidate("fsdp", dp_shard=4, zero=3), _machine(8)),  # degrees do not multiply to the GPUs
    (Candidate("tensor", tp=16), _machine(16)),  # tensor parallel across nodes
    (Candidate("tensor", tp=8), _machine(8)),  # 8 does not divide the tiny model's 4 heads
    (Candidate("fsdp", dp_shard=16, zero=3), _machine(16, links=Links(intra={0: Link(B_INTRA)}))),  # no inter link
    (Candidate("nope"), _machine(1)),
    (Candidate("pipeline", pp=2, batch_size=3, microbatches=2), _machine(2)),
])
def test_bad_candidates_are_one_line_errors(cand, machine):
    with pytest.raises(ConfigError) as e:
        predict(cand, ARCH, machine)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the commands

def test_plan_rows_say_their_basis_and_rank_by_the_model():
    rc, out, err = _cli(["plan", "--model", "llama", "--flavor", "8b", "--nproc-per-node", "8", "--gpu-memory", "80GiB",
                         "--format", "json"])
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    assert {r["basis"] for r in rows} == {"assumed-mfu"}
    fitting = [r["tokens_per_s_per_gpu"] for r in rows if r["fits"]]
    assert fitting == sorted(fitting, reverse=True)
    assert all(r["runs_here"] for r in rows)


def test_plan_of_one_node_needs_no_inter_link_with_tied_embeddings():
    """GPT-2's tied embedding is summed between a pipeline's first and last stage: one node, no network."""
    rc, out, err = _cli(["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "80GiB", "--format", "json"])
    assert rc == 0, err
    assert any(r["strategy"] == "pipeline" and r["tokens_per_s_per_gpu"] for r in json.loads(out)["rows"])


def test_plan_needs_the_inter_link_for_several_nodes():
    rc, out, err = _cli(["plan", "--model", "llama", "--nproc-per-node", "8", "--nnodes", "2", "--gpu-memory", "80GiB"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--inter-busbw" in err
    rc, out, err = _cli(["plan", "--model", "llama", "--nproc-per-node", "8", "--nnodes", "2", "--gpu-memory", "80GiB",
                         "--inter-busbw", "400", "--format", "json"])
    assert rc == 0, err
    # the inter-node latency reaches the model: every row crossing nodes is slower, none faster
    rc, slow, err = _cli(["plan", "--model", "llama", "--nproc-per-node", "8", "--nnodes", "2", "--gpu-memory",
                          "80GiB", "--inter-busbw", "400", "--inter-latency-us", "1000", "--format", "json"])
    assert rc == 0, err
    fast_rows = {r["config"]: r["step_ms"] for r in json.loads(out)["rows"]}
    slow_rows = {r["config"]: r["step_ms"] for r in json.loads(slow)["rows"]}
    assert fast_rows.keys() == slow_rows.keys()
    assert all(slow_rows[k] >= fast_rows[k] for k in fast_rows) and any(slow_rows[k] > fast_rows[k] for k in fast_rows)


STORE = "docs/results/stores/h200x2-2026-11-22/strategies.jsonl"


def test_predict_strategy_rows_and_measured_point():
    shapes = ["1x2", "1x8", "2x8"]
    rc, out, err = _cli(["predict", STORE, "--model", "gpt2", "--strategy", "fsdp", "-o", "shard=zero2",
                         "--shapes", ",".join(shapes), "--intra-busbw", "300", "--inter-busbw", "100",
                         "--format", "json"])
    assert rc == 0, err
    rows = json.loads(out)["rows"]
    assert [r["shape"] for r in rows] == shapes
    assert rows[0]["measured_tokens_per_s_per_gpu"] and rows[0]["basis"] == "from-1-gpu"
    assert rows[1]["basis"] == "from-node"  # the measured 1x2 point of the same configuration
    assert math.isfinite(rows[0]["error_pct"])


@pytest.mark.parametrize("args, name", [
    (["--strategy", "hybrid", "-o", "tp=4", "--shapes", "1x2"], "do not divide"),
    (["--strategy", "fsdp", "--shapes", "2x8"], "--inter-busbw"),
    (["--strategy", "embedding-shard", "--shapes", "1x2"], "embedding-shard"),
    (["--strategy", "ddp", "-o", "x=1"], "-o"),
])
def test_predict_strategy_bad_input(args, name):
    rc, out, err = _cli(["predict", STORE, "--model", "gpt2", "--intra-busbw", "300", *args])
    assert rc == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and name in err and out == ""


# ---------------------------------------------------------------- on the published tables

TABLES = "tests/fixtures/tables"
RESERVED = ("ultra-scale", "ultrascale", "nanotron", "mlperf", "2407.21783", "llama 3 herd")


def test_sharded_tables_cite_their_page_and_none_of_the_reserved_sources():
    from pathlib import Path

    import yaml

    texts = {p.name: p.read_text() for p in sorted(Path(TABLES).glob("*.yaml"))}
    sharded = {name: text for name, text in texts.items() if "\nx-model:" in text}
    assert sharded
    for name, text in sharded.items():
        t = yaml.safe_load(text)
        assert "https://" in t["source"] and all(r.get("x-parallel") for r in t["rows"]), name
        assert not any(k in text.lower() for k in RESERVED), name


def test_published_points_from_the_node_and_the_ranking():
    """Every published point with the same configuration at fewer devices in its source, predicted from there:
    within 10 % on average and 25 % at most; where a source publishes several configurations of one model on one
    GPU count, the fastest is in the model's top three."""
    from pathlib import Path

    from dlscale.perfmodel import validate_strategies as vs

    cases = vs.published_cases([Path(TABLES)])
    rows = vs.from_smaller(cases)
    same = [r for r in rows if r.protocol in ("from-node", "from-multinode")]
    assert same and {r.protocol for r in rows} <= {"from-node", "from-multinode", "other-strategy"}
    errs = [abs(r.error_pct) for r in same]
    assert sum(errs) / len(errs) <= 10.0 and max(errs) <= 25.0
    # the points predicted never inform themselves: halving a predicted point's figure moves no prediction
    predicted = {id(r.case) for r in rows}
    refs = {id(c) for c in cases if id(c) not in predicted}
    halved = [c if id(c) in refs else replace(c, measured=c.measured / 2) for c in cases]
    assert [r.predicted for r in vs.from_smaller(halved)] == pytest.approx([r.predicted for r in rows])
    ranked = vs.ranking(cases)
    assert ranked and all(ok for _, _, ok in ranked)


def test_plan_takes_its_compute_rate_from_the_store():
    """With --store, a row of a measured configuration reproduces its record (basis measured), another
    configuration rests on the 1-GPU record (from-1-gpu); none is an assumption."""
    # the store's GPUs: on another device the once-a-step update runs at its bandwidth, not the record's
    rc, out, err = _cli(["plan", "--model", "gpt2", "--nproc-per-node", "2", "--gpu", "H200", "--gpu-memory", "80GiB",
                         "--batch-size", "16", "--eager", "--store", STORE, "--format", "json"])
    assert rc == 0, err
    rows = {(r["strategy"], r["options"].get("shard"), r["options"].get("microbatches")): r
            for r in json.loads(out)["rows"]}
    recs = [json.loads(line) for line in open(STORE)]
    ddp = next(r for r in recs if r["config"]["strategy"] == "ddp" and r["config"]["model"] == "gpt2")
    measured = ddp["summary"]["samples_per_s_per_device"] * get_model("gpt2").arch.seq_len
    assert rows[("ddp", None, None)]["basis"] == "measured"
    assert rows[("ddp", None, None)]["tokens_per_s_per_gpu"] == pytest.approx(measured, rel=1e-6)
    assert rows[("pipeline", None, 4)]["basis"] == "from-1-gpu"  # the stored pipeline ran 8 micro-batches
    assert "assumed-mfu" not in {r["basis"] for r in rows.values()}


def test_a_block_never_runs_faster_than_its_host_floor():
    """Micro-batches so small that a block's FLOPs take less than the floor: each block takes the floor; a large
    batch's blocks are unaffected. The floor is read from a pipeline record's timed pieces (their median)."""
    from dlscale.perfmodel.evidence import block_floor

    c = Candidate("pipeline", pp=2, batch_size=4, microbatches=4)
    free = step_terms(c, ARCH, _machine(2), 0.5)
    floored = step_terms(c, ARCH, replace(_machine(2), block_floor_s=1.0), 0.5)
    per_stage_blocks = ARCH.n_layers // 2
    # 4 micro-batches + 1 of fill, each slot at least one block's floor on the busiest stage
    assert floored.step_s >= (4 + 1) * per_stage_blocks * 1.0 > free.step_s
    rec = {"status": "ok", "config": {"model": "gpt2", "flavor": "full", "compile": False},
           "strategy_info": {"piece_cost_ms": {"blocks": [3.0, 1.0, 2.0], "head": 9.0}}, "id": "abc"}
    assert block_floor([rec], "gpt2", "full", False)[0] == pytest.approx(2e-3)
    assert block_floor([rec], "gpt2", "full", True) == (0.0, "")


# ---------------------------------------------------------------- micro layer rows as evidence

def _layer_rec(*rows: dict, rid: str = "r1") -> dict:
    return {"kind": "micro", "micro": "layer", "id": rid, "created": "2026-01-01", "results": list(rows)}


def _layer_row(precision: str = "bf16", time_us: float = 1000.0, **kw) -> dict:
    row = {"status": "ok", "pass": "forward+backward", "d_model": ARCH.hidden, "d_ff": ARCH.ffn_hidden,
           "heads": ARCH.n_heads, "kv_heads": ARCH.n_kv_heads or ARCH.n_heads, "seq": ARCH.seq_len, "batch": 1,
           "precision": precision, "time_us": time_us, "flops": 1e9}
    return {**row, **kw}


def test_layer_timing_matches_precision_kv_heads_and_fused_fp8():
    from dlscale.perfmodel.evidence import layer_timing

    rec = _layer_rec(_layer_row("bf16", 100.0), _layer_row("fp8", 300.0))
    assert layer_timing([rec], ARCH, 1, "amp-bf16").seconds == pytest.approx(100e-6)
    assert layer_timing([rec], ARCH, 1, "fp8", compiled=False).seconds == pytest.approx(300e-6)
    # an eager fp8 row (no "compiled": measured before the option) never stands for a compiled fp8 candidate
    assert layer_timing([rec], ARCH, 1, "fp8", compiled=True) is None
    fused = _layer_rec(_layer_row("fp8", 50.0, compiled=True))
    assert layer_timing([fused], ARCH, 1, "fp8", compiled=True).seconds == pytest.approx(50e-6)
    # a compiled bf16 candidate may take an eager bf16 row: no casts to fuse
    assert layer_timing([rec], ARCH, 1, "amp-bf16", compiled=True).seconds == pytest.approx(100e-6)
    assert layer_timing([rec], ARCH, 1, "amp-fp16") is None
    kv = ARCH.n_kv_heads or ARCH.n_heads
    assert layer_timing([_layer_rec(_layer_row(kv_heads=kv * 2))], ARCH, 1) is None
    no_kv = _layer_row()
    del no_kv["kv_heads"]
    assert layer_timing([_layer_rec(no_kv)], ARCH, 1) is not None  # older rows without kv heads still match


def test_store_evidence_gives_each_candidate_its_precisions_layer():
    from dlscale.perfmodel.evidence import StoreQuery, store_evidence

    # tiny llama's block at 2 x the bf16 time in fp8 (eager): the candidates' rates differ by that factor
    rec = _layer_rec(_layer_row("bf16", 100.0), _layer_row("fp8", 200.0))
    ev = store_evidence([rec], StoreQuery("llama", "tiny", PEAK, LINKS))
    bf16 = Candidate("fsdp", dp_shard=8, zero=3, batch_size=1)
    p_bf16 = predict(bf16, ARCH, _machine(8), ev)
    p_fp8 = predict(replace(bf16, precision="fp8"), ARCH, _machine(8), ev)
    assert p_bf16.basis == p_fp8.basis == "micro-layer"
    assert p_bf16.efficiency == pytest.approx(2 * p_fp8.efficiency)
    assert predict(replace(bf16, precision="fp8", compiled=True), ARCH, _machine(8), ev).basis == "assumed-mfu"


def test_micro_layer_protocol_scales_the_block_row_and_refuses_eager_fp8():
    from dlscale.perfmodel.validate_strategies import Case, from_micro_layer

    cand = Candidate("fsdp", dp_shard=8, zero=3, batch_size=2, compiled=True)
    m = _machine(8)
    bf16 = Case("src", "t.yaml", ARCH, cand, m, 1000.0)
    fp8 = replace(bf16, candidate=replace(cand, precision="fp8"))
    rec = _layer_rec(_layer_row("bf16", 100.0), _layer_row("fp8", 50.0))
    rows, skipped = from_micro_layer([bf16, fp8], [rec])
    assert [r.case for r in rows] == [bf16] and [c for c, _ in skipped] == [fp8]
    # the prediction is the model's at the row's rate, flops over time over the peak
    assert rows[0].predicted == pytest.approx(throughput(cand, ARCH, m, 1e9 / 100e-6 / PEAK))
    assert rows[0].protocol == "micro-layer"
