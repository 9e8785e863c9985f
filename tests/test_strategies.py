"""Parallel strategies: correctness against `single`, bad input, the compatibility matrix, memory model.

Correctness (keeps a fast strategy honest): through the CLI, on the CPU with gloo and tiny
flavours, the loss after k optimizer steps from a fixed seed must equal the single-process run
on the same global batch within REL (fp32). Data-parallel strategies are compared on
``loss_after`` (the trained model's loss on micro-batch 0, averaged over replicas: the global
batch), model-parallel ones (dp_size 1, the whole batch on every rank) on the per-step
``warmup_losses``. Measured differences are ~1e-7 relative (float summation order).

AdamW is invariant to a constant gradient scale, so the gpt2/bert comparisons cannot catch a
wrong averaging factor (sum instead of mean); resnet50 trains with SGD, which can: `model` is
compared with `single` on it, and so is the interleaved schedule with one micro-batch (BatchNorm
statistics are per micro-batch, so only then is resnet50 comparable with `single`).

Each multi-process case costs ~10 s of torchrun start-up on 2 cores (the 8-process 3-D case ~50 s).
Every `single` reference is a real `dlscale run` in the module's store (its one rank trained in
the test process with one thread, conftest.py ``single_in_process``, not under torchrun): the
parity view at the end compares each strategy's record with its workload's single record. The cases the selected tests
name (``@cases``) all run when the first is read, two at a time, those of the most processes first
(helpers_cli.py): the 8-process case then shares the cores with the rest, not with one-rank runs
that end at once.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

from dlscale.cli import main as cli_main
from dlscale.models import get_model
from helpers_cli import RunsAhead, cases, names

REL = 1e-5  # fp32 on the CPU, one thread per process: measured <= 2e-7
WARMUP = 3
# gpt2 runs accumulate 2 micro-batches per step: exercises every strategy's no_sync / accumulation path
GRAD_ACCUM = {"gpt2": 2}
EXPECTED = {"single", "dp", "ddp", "zero1", "fsdp", "hsdp", "pipeline", "model", "tensor", "hybrid", "deepspeed"}
DOC = Path(__file__).resolve().parents[1] / "docs" / "strategies.md"

_RECORDS: dict[tuple, dict] = {}


def case(model: str, strategy: str, nproc: int, batch: int, *opts: str, precision: str = "fp32",
         extra: tuple[str, ...] = ()) -> tuple:
    """The key of one case, as _run takes its arguments."""
    return (model, strategy, nproc, batch, opts, precision, extra)


def _args(store: Path, key: tuple) -> list[str]:
    """`dlscale run` of the case ``key`` into ``store``."""
    model, strategy, nproc, batch, opts, precision, extra = key
    args = ["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", str(nproc),
            "--batch-size", str(batch), "--grad-accum", str(GRAD_ACCUM.get(model, 1)), "--precision", precision,
            "--warmup", str(WARMUP), "--steps", "1", "--repeats", "1", "--device", "cpu", "--store", str(store),
            "--json", "--time-limit", "240", *extra]
    for o in opts:
        args += ["-o", o]
    return args


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(args)
    return rc, out.getvalue(), err.getvalue()


def _run(store: Path, model: str, strategy: str, nproc: int, batch: int, *opts: str, precision: str = "fp32",
         extra: tuple[str, ...] = ()) -> dict:
    """One case through `dlscale run --json` (cached per module), retried once if only torchrun's
    exit code failed after every rank had reported (a rare gloo abort at process exit). Its first
    run may run with the next cases the selected tests name (RunsAhead)."""
    key = case(model, strategy, nproc, batch, *opts, precision=precision, extra=extra)
    if key in _RECORDS:
        return _RECORDS[key]
    for attempt in range(2):
        done = _AHEAD.take(key) if attempt == 0 else None
        rc, out, err = (done.returncode, done.stdout, done.stderr) if done else _cli(_args(store, key))
        rec = json.loads(out[out.index("{"):])
        if rec["status"] == "ok" or "ranks without a result: []" not in (rec.get("error") or ""):
            break
    assert rec["status"] == "ok", (rec["error"], (rec["repeats"] or [{}])[0].get("output_tail", "")[-3000:])
    assert rc == 0
    _RECORDS[key] = rec
    return rec


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * abs(b)


def _assert_losses(got: list, want: list, rel: float = REL) -> None:
    assert len(got) == len(want) == WARMUP
    assert all(g is not None for g in got), got
    for i, (g, w) in enumerate(zip(got, want)):
        assert _close(g, w, rel), f"step {i}: {g} vs {w} (rel {abs(g - w) / abs(w):.2e})"


_AHEAD: RunsAhead


@pytest.fixture(scope="module")
def store(tmp_path_factory, request, single_in_process) -> Path:
    """The module's store; the cases the selected tests name (@cases) run ahead into it. The
    `single` references train in this process (conftest.py: the same `dlscale run`, record and
    store, no torchrun); every other strategy starts its real gloo processes."""
    global _AHEAD
    path = tmp_path_factory.mktemp("strategies-store")
    _AHEAD = RunsAhead(lambda key: _args(path, key), ahead=None, cost=lambda key: key[2])  # key[2]: processes
    _AHEAD.start(request)
    with single_in_process():
        yield path
    _AHEAD.finish(request)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """torchrun gives each of several workers one thread; give `single` one too, so both sum in the
    same order (otherwise SGD on resnet50 amplifies the last-bit differences to ~5e-5 in 3 steps)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("OMP_NUM_THREADS", "1")
    yield
    mp.undo()


def _rep(rec: dict) -> dict:
    return rec["repeats"][0]


# ---------------------------------------------------------------- registry


def test_all_strategies_registered():
    from dlscale.strategies import get_strategy, strategy_names

    assert EXPECTED <= set(strategy_names())
    assert get_strategy("dp").single_process
    assert not get_strategy("ddp").single_process


# ---------------------------------------------------------------- correctness (CLI, gloo, tiny)


CLIP = ("--clip-grad-norm", "0.05")


def _dp(strategy: str, nproc: int, opts: tuple[str, ...], extra: tuple[str, ...] = ()):
    return pytest.param(strategy, nproc, opts, extra, marks=cases(case("gpt2", "single", 1, 4, extra=extra),
                                                                  case("gpt2", strategy, nproc, 4 // nproc, *opts,
                                                                       extra=extra)))


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nproc, opts, extra", [
    # DDP + ZeRO-1 on one rank, trained in this process: dlscale's wrapping, the accumulation's no_sync
    # and the sharded optimizer's step; what crosses ranks in the data-parallel family: the fsdp run
    # on two processes (and ddp's: tests/test_run_cli.py), whose start-up is nearly all of the cost
    _dp("zero1", 1, ()),
    # zero3 (the default), per-block fully_shard: the clipping test's run below (clipping is the
    # optimizer step's, the same on every strategy; its own `single` reference); zero2 in one unit
    # of both blocks: that test's one-rank run
    _dp("fsdp", 2, (), CLIP),
    # hsdp's zero2 path: the one-rank zero2 fsdp run below; FSDP over dp with TP within: the 3-D llama run
])
def test_data_parallel_matches_single(store, strategy, nproc, opts, extra):
    # per-rank batch 4 / dp = global 4
    ref = _rep(_run(store, "gpt2", "single", 1, 4, extra=extra))
    rec = _run(store, "gpt2", strategy, nproc, 4 // nproc, *opts, extra=extra)
    assert rec["global_batch"] == 4 * GRAD_ACCUM["gpt2"]
    got, want = _rep(rec)["loss_after"], ref["loss_after"]
    assert got is not None and _close(got, want), (got, want)


# zero2, both tiny blocks in one unit (a list), torch's optimizer on the DTensors: on one rank, trained
# in this process (the wrapping and the optimizer's path; what crosses ranks: the zero3 run on two)
FSDP_ONE_RANK = ("shard=zero2", "blocks_per_unit=2", "optimizer_on_shards=false")


@pytest.mark.slow
@cases(case("gpt2", "single", 1, 4, extra=CLIP), case("gpt2", "fsdp", 2, 2, extra=CLIP),
       case("gpt2", "fsdp", 1, 4, *FSDP_ONE_RANK, extra=CLIP),
       case("gpt2", "single", 1, 4))
def test_fsdp_optimizer_on_shards_clips_the_global_norm(store):
    """The optimizer on local shards (fsdp's default) over two ranks with global-norm clipping tight
    enough to clip: the same training as `single`; a shard-local norm would clip each rank
    differently and drift. zero3 per block (fsdp's defaults) on two processes; zero2 with both
    blocks in one unit and torch's optimizer on the DTensors (clipped by DTensor's own norm) on one."""
    ref = _rep(_run(store, "gpt2", "single", 1, 4, extra=CLIP))["loss_after"]
    shards = _run(store, "gpt2", "fsdp", 2, 2, extra=CLIP)
    one = _run(store, "gpt2", "fsdp", 1, 4, *FSDP_ONE_RANK, extra=CLIP)
    assert one["strategy_info"]["block_units"] == 1 and one["strategy_info"]["reshard_after_forward"] is False
    dtensors = _rep(one)
    assert shards["strategy_info"]["optimizer_on_shards"] is True
    got = _rep(shards)["loss_after"]
    assert _close(got, ref) and _close(dtensors["loss_after"], ref), (got, dtensors["loss_after"], ref)
    unclipped = _rep(_run(store, "gpt2", "single", 1, 4))["loss_after"]
    assert not _close(unclipped, ref, rel=1e-6), "the clip did not change training: the test proves nothing"


@pytest.mark.slow
@cases(case("gpt2", "single", 1, 4), case("gpt2", "pipeline", 2, 4, "microbatches=2"))
def test_pipeline_matches_single(store):
    ref = _rep(_run(store, "gpt2", "single", 1, 4))
    rec = _run(store, "gpt2", "pipeline", 2, 4, "microbatches=2")  # 1f1b
    assert rec["global_batch"] == 4 * GRAD_ACCUM["gpt2"] and rec["strategy_info"]["tied_params"] == 1
    _assert_losses(_rep(rec)["warmup_losses"], ref["warmup_losses"])
    assert _close(_rep(rec)["loss_after"], ref["loss_after"])  # the schedule's forward-only evaluation


@pytest.mark.slow
@cases(case("gpt2", "single", 1, 4, precision="amp-fp16"), case("gpt2", "single", 1, 4))
def test_amp_fp16_records_the_loss_scale_around_the_window(store):
    """amp-fp16 reads its scaler around the window: the scale, the steps it skipped (each halves
    the scale) and the growth tracker. One process, trained in this process; the pipeline stages'
    shared scale follows the same rule: the test below."""
    r = _rep(_run(store, "gpt2", "single", 1, 4, precision="amp-fp16"))
    before, after = r["loss_scale"]
    assert before > 0 and after > 0 and r["skipped_steps"] == max(0, round(math.log2(before / after)))
    t0, t1 = r["loss_scale_tracker"]  # the growth tracker read at the same two points
    assert 0 <= t0 < 2000 and 0 <= t1 < 2000
    fp32 = _rep(_run(store, "gpt2", "single", 1, 4))
    assert _close(r["warmup_losses"][0], fp32["warmup_losses"][0], rel=1e-2)  # reported unscaled



def test_stage_scaler_skips_everywhere_and_moves_the_scale(monkeypatch):

    """The shared loss scaler: unscale + inf check, then GradScaler's growth/backoff rule (the
    stages' one scale for amp-fp16; the pipeline schedule itself: test_pipeline_matches_single)."""

    import torch

    from dlscale.strategies import pipeline

    reduced = []
    monkeypatch.setattr(pipeline.dist, "all_reduce", lambda t, op=None, group=None: reduced.append(op))
    sc = pipeline._StageScaler(torch.device("cpu"), init_scale=8.0, growth_interval=2)
    g = [torch.tensor([16.0, 32.0])]
    found = sc.unscale_and_check(g, divisor=2.0)  # / (8 x 2)
    assert found.item() == 0 and g[0].tolist() == [1.0, 2.0] and reduced == [torch.distributed.ReduceOp.MAX]
    sc.update(found)
    assert sc.scale.item() == 8.0 and sc.get_growth_tracker() == 1  # one good step of 2
    sc.update(sc.unscale_and_check([torch.tensor([1.0])], 1.0))
    assert sc.scale.item() == 16.0 and sc.get_growth_tracker() == 0  # two good steps: x2
    assert sc.get_growth_interval() == 2
    found = sc.unscale_and_check([torch.tensor([float("inf"), 1.0])], 1.0)
    assert found.item() == 1
    sc.update(found)
    assert sc.scale.item() == 8.0  # overflow: x0.5, and the growth count starts again


@pytest.mark.slow
@cases(case("gpt2", "single", 1, 4), case("gpt2", "tensor", 2, 4, "sequence_parallel=true"))
def test_tensor_sequence_parallel_matches_single(store):
    ref = _rep(_run(store, "gpt2", "single", 1, 4))
    rec = _run(store, "gpt2", "tensor", 2, 4, "sequence_parallel=true")
    assert rec["strategy_info"]["local_heads"] == 2
    _assert_losses(_rep(rec)["warmup_losses"], ref["warmup_losses"])
    assert _close(_rep(rec)["loss_after"], ref["loss_after"])


@pytest.mark.slow
@cases(case("llama", "single", 1, 4), case("llama", "single", 1, 4, extra=("--activation-checkpointing", "selective")))
def test_llama_selective_checkpointing_trains_as_without_it(store):
    """Llama (GQA, rotary, SwiGLU) with op-level selective activation checkpointing trains as
    without it: recomputation changes memory, never the arithmetic. Both runs are one process,
    trained in this process; checkpointing under FSDP2 over processes: the 3-D run below."""
    ref = _rep(_run(store, "llama", "single", 1, 4))
    rec = _run(store, "llama", "single", 1, 4, extra=("--activation-checkpointing", "selective"))
    assert rec["strategy_info"]["activation_checkpointing"]["mode"] == "selective"
    assert _rep(rec)["warmup_losses"] == ref["warmup_losses"]  # the same arithmetic: bit for bit
    got, want = _rep(rec)["loss_after"], ref["loss_after"]  # the loss after 3 steps
    assert got is not None and _close(got, want), (got, want)


LLAMA_3D = ("dp=2", "tp=2", "pp=2", "dp_shard=fsdp", "sequence_parallel=true", "microbatches=2", "balance=blocks")


@pytest.mark.slow
@cases(case("llama", "hybrid", 8, 2, *LLAMA_3D, extra=(*CLIP, "--activation-checkpointing", "full")),
       case("llama", "single", 1, 4, extra=CLIP), case("llama", "single", 1, 4))
def test_llama_3d_dp_tp_pp_matches_single(store):
    """The 2 x 2 x 2 mesh over 8 gloo processes: FSDP2 over dp, tensor parallel with sequence
    parallelism (GQA heads split), a 1F1B pipeline of 2 stages with the tied embedding on the
    first and the last; full activation checkpointing and global-norm clipping tight enough to
    clip: the per-step losses of `single` on the same global batch (4 = dp 2 x 2)."""
    ref = _rep(_run(store, "llama", "single", 1, 4, extra=CLIP))
    rec = _run(store, "llama", "hybrid", 8, 2, *LLAMA_3D, extra=(*CLIP, "--activation-checkpointing", "full"))
    info = rec["strategy_info"]
    assert (info["mesh"], info["dp_impl"], info["tied_params"]) == ([1, 2, 2, 2], "fsdp2 per stage", 1)
    assert rec["global_batch"] == 4
    _assert_losses(_rep(rec)["warmup_losses"], ref["warmup_losses"])
    unclipped = _rep(_run(store, "llama", "single", 1, 4))["warmup_losses"]
    assert not _close(unclipped[-1], ref["warmup_losses"][-1], rel=1e-7), "the clip changed nothing"


@pytest.mark.slow
@cases(case("resnet50", "single", 1, 4), case("resnet50", "model", 2, 4))
def test_model_parallel_resnet_matches_single(store):
    """SGD (scale-sensitive) and whole-batch BatchNorm: naive model parallel == single.

    Its 4 blocks on 2 stages go through ``balance=time``: rank 0 trains every piece once to time
    it, so this also checks that the timing leaves no trace (gradients, BatchNorm statistics, RNG).
    """
    ref = _rep(_run(store, "resnet50", "single", 1, 4))
    full = _run(store, "resnet50", "model", 2, 4)
    info = full["strategy_info"]
    assert info["balance"] == "time" and sum(info["blocks_per_stage"]) == 4, info
    assert len(info["stage_cost_ms"]) == 2 and len(info["piece_cost_ms"]["blocks"]) == 4, info
    rec = _rep(full)
    _assert_losses(rec["warmup_losses"], ref["warmup_losses"])


@pytest.mark.slow
@cases(case("resnet50", "single", 1, 4), case("resnet50", "pipeline", 2, 4, "schedule=interleaved", "microbatches=1"))
def test_interleaved_resnet_matches_single(store):
    """4 stages on 2 ranks (virtual 2): with one micro-batch BatchNorm sees the whole batch."""
    ref = _rep(_run(store, "resnet50", "single", 1, 4))
    inter = _run(store, "resnet50", "pipeline", 2, 4, "schedule=interleaved", "microbatches=1")
    assert inter["strategy_info"]["num_stages"] == 4 and inter["strategy_info"]["stages"] == [0, 2]
    _assert_losses(_rep(inter)["warmup_losses"], ref["warmup_losses"])


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed (optional extra) not installed")
@cases(case("gpt2", "zero1", 1, 4), case("gpt2", "deepspeed", 2, 2, "stage=3"))
def test_deepspeed_zero3_matches_zero1(store):
    """The per-step losses (the global batch's mean, as every strategy reports them) as under zero1."""
    ref = _rep(_run(store, "gpt2", "zero1", 1, 4))
    rec = _run(store, "gpt2", "deepspeed", 2, 2, "stage=3")
    assert rec["strategy_info"]["ds_config"]["gradient_clipping"] == 0.0
    _assert_losses(_rep(rec)["warmup_losses"], ref["warmup_losses"])


# every strategy the tests above run on the CPU (their runs are shared through the cache); ddp
# against single: tests/test_run_cli.py (gpt2 and bert-base), the parity view is the same for every strategy
PARITY_RUNS = [
    case("gpt2", "single", 1, 4), case("gpt2", "zero1", 1, 4),
    case("gpt2", "single", 1, 4, extra=CLIP), case("gpt2", "fsdp", 2, 2, extra=CLIP),
    case("gpt2", "fsdp", 1, 4, *FSDP_ONE_RANK, extra=CLIP),
    case("gpt2", "pipeline", 2, 4, "microbatches=2"), case("gpt2", "tensor", 2, 4, "sequence_parallel=true"),
    case("resnet50", "single", 1, 4), case("resnet50", "model", 2, 4),
    case("resnet50", "pipeline", 2, 4, "schedule=interleaved", "microbatches=1"),
]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # in the module's run the cases are cached (one new run); alone it runs them all
@cases(*PARITY_RUNS)
def test_parity_view_passes_for_every_strategy(store):
    """What `dlscale parity` shows a user, over this module's runs: every strategy's warm-up losses
    and loss_after within the tolerance of single's on the same global batch (the clipped fsdp
    run: the clipped single's)."""
    for model, strategy, nproc, batch, opts, precision, extra in PARITY_RUNS:
        _run(store, model, strategy, nproc, batch, *opts, precision=precision, extra=extra)
    rc, out, err = _cli(["parity", str(store), "--format", "json"])
    doc = json.loads(out)
    cases = [(g["model"], g["precision"], c) for g in doc["groups"] for c in g["cases"]]
    bad = [(m, p, c["strategy"], c["verdict"], c["max_rel_diff"], c["note"]) for m, p, c in cases
           if c["verdict"] != "pass"]
    assert rc == 0 and not bad, (bad, err)
    assert {c["strategy"] for _, _, c in cases} >= {key[1] for key in PARITY_RUNS} - {"single"}
    assert all(c["loss_after"] is not None and len(c["warmup_losses"]) == WARMUP for _, _, c in cases)


# ---------------------------------------------------------------- unsupported (no process started)


@pytest.mark.parametrize("model, strategy, reason", [
    ("gpt2", "dp", "DataParallel"),
    ("resnet50", "tensor", "resnet50 has no such plan"),
    ("resnet50", "hybrid", "resnet50 has no such plan"),
    ("gpt2", "ddp", "comm_hook=bf16 needs CUDA and NCCL"),
])
def test_unsupported_recorded(tmp_path, model, strategy, reason):
    opts = {"hybrid": ["-o", "tp=2"], "ddp": ["-o", "comm_hook=bf16"]}.get(strategy, [])
    rc, out, err = _cli(["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", "2",
                         "--device", "cpu", "--store", str(tmp_path), "--json", *opts])
    rec = json.loads(out[out.index("{"):])
    assert rc == 6 and rec["status"] == "unsupported" and reason in rec["error"]
    assert rec["repeats"] == [] and rec["ranks"] == []


def test_deepspeed_unsupported_when_missing(monkeypatch):
    from dlscale.case.config import RunConfig
    from dlscale.strategies import deepspeed as ds

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    ds._import_error.cache_clear()
    try:
        reason = ds.check(RunConfig(strategy="deepspeed", nproc_per_node=2), {"device_type": "cpu"})
    finally:
        ds._import_error.cache_clear()
    assert reason and "not installed" in reason
    assert ds.check(RunConfig(strategy="deepspeed"), {"device_type": "cpu", "assume_extras": True}) is None


def test_zero1_overlap_unsupported_on_cpu():
    from dlscale.case.config import RunConfig
    from dlscale.strategies import get_strategy

    cfg = RunConfig(strategy="zero1", nproc_per_node=2, strategy_options={"overlap_with_ddp": True})
    assert "NCCL" in get_strategy("zero1").check(cfg, {"device_type": "cpu"})
    assert get_strategy("zero1").check(cfg, {"device_type": "cuda"}) is None


# ---------------------------------------------------------------- bad input: exit 2, one line, nothing stored


@pytest.mark.parametrize("model, strategy, nproc, batch, opts, expect", [
    ("gpt2", "hybrid", 2, 4, ["dp=2", "tp=2"], "hybrid degrees dp 2 x pp 1 x tp 2 = 4 do not match the world size 2"),
    ("llama", "hybrid", 4, 4, ["dp=2", "tp=2", "pp=2"], "dp 2 x pp 2 x tp 2 = 8 do not match the world size 4"),
    ("llama", "tensor", 4, 4, [], "tensor parallel degree 4 does not divide llama's 2 key/value heads"),
    ("gpt2", "hybrid", 2, 4, ["tp=3"], "tp 3 x pp 1 = 3 do not divide the world size 2"),
    ("gpt2", "pipeline", 3, 6, ["microbatches=3"], "3 pipeline stages (3 ranks) but gpt2 (tiny) has only 2 blocks"),
    ("gpt2", "pipeline", 2, 4, ["schedule=interleaved"], "4 pipeline stages (2 ranks x 2 virtual)"),
    ("gpt2", "model", 3, 4, [], "3 pipeline stages"),
    ("gpt2", "hybrid", 2, 4, ["pp=2", "microbatches=3"], "microbatches 3 do not divide the batch size 4"),
    ("gpt2", "pipeline", 2, 4, ["microbatches=3"], "microbatches 3 do not divide the batch size 4"),
    ("gpt2", "pipeline", 2, 4, ["balance=2,1"], "pipeline balance 2,1 must give each of the 2 stages"),
    ("gpt2", "model", 2, 4, ["balance=even"], "model balance must be time, blocks or blocks per stage"),
    ("gpt2", "pipeline", 2, 4, ["schedule=1f1b", "microbatches=1"], "needs microbatches >= stages"),
    ("gpt2", "tensor", 3, 4, [], "tensor parallel degree 3 does not divide gpt2's 4 attention heads"),
    ("bert-base", "hybrid", 3, 4, ["tp=3"], "tensor parallel degree 3 does not divide bert-base's 4 attention heads"),
    ("gpt2", "hsdp", 2, 4, ["replicate=3"], "hsdp replicate degree 3 does not divide the world size 2"),
    ("gpt2", "fsdp", 2, 4, ["foo=1"], "unknown fsdp option(s) foo; allowed: shard, mixed_precision, blocks_per_unit"),
    ("gpt2", "fsdp", 2, 4, ["blocks_per_unit=0"], "fsdp option blocks_per_unit must be >= 1, got 0"),
    ("gpt2", "hsdp", 2, 4, ["blocks_per_unit=x"], "hsdp option blocks_per_unit must be an integer"),
    ("gpt2", "fsdp", 2, 4, ["shard=zero4"], "option shard must be one of zero3, zero2"),
    ("gpt2", "model", 2, 4, ["microbatches=2"], "allowed: balance"),
    ("gpt2", "zero1", 2, 4, ["overlap_with_ddp=maybe"], "must be true or false"),
    ("gpt2", "deepspeed", 2, 4, ["stage=4"], "option stage must be one of 1, 2, 3"),
    ("gpt2", "tensor", 2, 4, ["sequence_parallel=true", "tp=2"], "unknown tensor option(s) tp"),
    ("resnet50", "ddp", 2, 4, ["--activation-checkpointing=full"], "resnet50's blocks hold BatchNorm"),
    ("gpt2", "dp", 2, 4, ["--activation-checkpointing=selective"], "does not run under dp"),
])
def test_bad_input(tmp_path, model, strategy, nproc, batch, opts, expect):
    store = tmp_path / "store"
    args = ["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", str(nproc),
            "--batch-size", str(batch), "--device", "cpu", "--store", str(store)]
    for o in opts:
        if o.startswith("--"):
            args += o.split("=", 1)
        else:
            args += ["-o", o]
    rc, out, err = _cli(args)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlscale: error:"), err
    assert expect in lines[0], lines[0]
    assert not store.exists() or not any(store.iterdir())


# ---------------------------------------------------------------- pieces


def test_split_blocks():
    from dlscale.strategies.pipeline import split_blocks

    assert split_blocks(12, 4) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert split_blocks(5, 2) == [[0, 1, 2], [3, 4]]
    assert [len(r) for r in split_blocks(16, 3)] == [6, 5, 5]


def test_split_by_cost_minimises_the_slowest_stage():
    from dlscale.strategies.pipeline import split_by_cost

    # GPT-2-like: 12 equal blocks, a head worth 4 blocks: 10/2 would leave 2+4 vs 10; best is 8/4 (8 vs 8)
    assert [len(r) for r in split_by_cost([1.0] * 12, 2, 0.0, 4.0)] == [8, 4]
    # no extras: the even split
    assert split_by_cost([1.0] * 6, 3) == [[0, 1], [2, 3], [4, 5]]
    # hand example: costs 5,1,1,1,5 into 3 stages -> [5] [1,1,1] [5], slowest 5
    assert split_by_cost([5, 1, 1, 1, 5], 3) == [[0], [1, 2, 3], [4]]
    # a costly embedding pushes blocks off stage 0: 2.5 + [1,1] | [1,1,1,1] -> 4.5 vs 4
    assert [len(r) for r in split_by_cost([1.0] * 6, 2, 2.5, 0.0)] == [2, 4]
    # every stage keeps at least one block even when one block dominates
    assert split_by_cost([100, 1, 1], 3) == [[0], [1], [2]]
    with pytest.raises(ValueError):
        split_by_cost([1.0], 2)


def test_parse_balance():
    from dlscale import ConfigError
    from dlscale.strategies.pipeline import parse_balance

    assert parse_balance("pipeline", "TIME", 2, 12) == "time"
    assert parse_balance("pipeline", "8,4", 2, 12) == [8, 4]
    assert parse_balance("pipeline", [9, 3], 2, 12) == [9, 3]
    for bad, msg in [("8,3", "sum to the model's 12 blocks"), ("12,0", ">= 1 block"), ("4,4,4", "each of the 2"),
                     ("fast", "must be time, blocks or blocks per stage")]:
        with pytest.raises(ConfigError, match=msg):
            parse_balance("pipeline", bad, 2, 12)


def test_label_packing_roundtrip():
    import torch

    from dlscale.strategies.pipeline import _Packer

    mlm = torch.arange(12).reshape(3, 4)
    nsp = torch.tensor([0, 1, 1])
    p = _Packer()
    packed = p.pack((mlm, nsp))
    assert packed.shape == (3, 5)
    a, b = p.unpack(packed[1:])  # a micro-batch of the packed rows
    assert torch.equal(a, mlm[1:]) and torch.equal(b, nsp[1:])
    # BERT's two label tensors: the heads .view(-1) them, which a strided column slice refuses
    assert a.is_contiguous() and b.is_contiguous()
    assert a.view(-1).tolist() == mlm[1:].reshape(-1).tolist()



def test_qkv_permutation_keeps_heads_together():
    import torch
    from torch import nn

    from dlscale.strategies.tensor import _permute_qkv

    lin = nn.Linear(2, 3 * 8)  # C = 8, tp = 2: 4 rows of q, k and v per rank
    with torch.no_grad():
        lin.weight.copy_(torch.arange(24.0).unsqueeze(1).expand(24, 2))
        lin.bias.copy_(torch.arange(24.0))
    _permute_qkv(lin, 2)
    rank0 = lin.bias[:12].tolist()
    assert rank0 == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]  # q_0 | k_0 | v_0
    assert lin.weight[12:, 0].tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


# ---------------------------------------------------------------- compatibility matrix


@pytest.fixture(scope="module")
def matrix() -> str:
    """The generated matrix, made once for the two tests below (~6 s each time on 2 cores)."""
    from dlscale.strategies._matrix import compat_matrix

    return compat_matrix()


@pytest.mark.slow  # builds every model under every strategy's check: several seconds, kept out of the quick tier
def test_docs_hold_the_current_matrix(matrix):
    from dlscale.strategies._matrix import BEGIN, END

    text = DOC.read_text()
    assert BEGIN in text and END in text
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == matrix.strip(), \
        "docs/strategies.md is stale: run python -m dlscale.strategies._matrix --write"


@pytest.mark.slow  # as above
def test_matrix_covers_every_strategy_and_model(matrix):
    from dlscale.models import model_names
    from dlscale.strategies import strategy_names

    m = matrix
    header = m.splitlines()[0]
    for model in model_names():
        assert model in header
    rows = [ln.split("|")[1].strip() for ln in m.splitlines()[2:] if ln.startswith("| ")]
    for s in strategy_names():
        assert any(r == s or r.startswith(s + " ") for r in rows), s
    assert "GPU only" in m and "resnet50 has no such plan" in m


# ---------------------------------------------------------------- memory model


def test_capabilities_are_declared_by_the_strategies():
    """CUDA-graph safety, precisions and the memory layout come from each strategy's registration."""
    from dlscale.case.config import RunConfig
    from dlscale.strategies import get_strategy, strategy_names

    assert sorted(s for s in strategy_names() if get_strategy(s).cudagraph_safe) == ["ddp", "single"]
    ds = get_strategy("deepspeed")
    reason = ds.unsupported(RunConfig(model="gpt2", strategy="deepspeed", precision="fp8"), {"device_type": "cuda"})
    assert "\n" not in reason and all(p in reason for p in ("fp32", "amp-bf16", "amp-fp16", "fp8")), reason

    for s in ("single", "ddp", "dp", "zero1", "fsdp", "hsdp", "tensor", "pipeline", "model", "hybrid"):
        assert get_strategy(s).memory_layout is not None, s
    layout = get_strategy("hsdp").memory_layout(8, 2, {"shard": "zero2"})
    assert (layout.dp_replicate, layout.dp_shard, layout.zero) == (2, 4, 2)


@pytest.mark.parametrize("strategy, world, nnodes, opts, degrees", [
    ("ddp", 4, 1, {}, (4, 1, 1, 1)),
    ("fsdp", 4, 1, {"shard": "zero2"}, (1, 4, 1, 1)),
    ("hsdp", 8, 2, {}, (2, 4, 1, 1)),
    ("tensor", 2, 1, {}, (1, 1, 1, 2)),
    ("pipeline", 3, 1, {"microbatches": 6}, (1, 1, 3, 1)),
    ("hybrid", 8, 1, {"tp": 2, "pp": 2}, (2, 1, 2, 2)),  # dp left out: world / (tp x pp)
    ("hybrid", 8, 1, {"dp": 2, "tp": 2, "pp": 2, "dp_shard": "fsdp"}, (1, 2, 2, 2)),
])
def test_the_memory_layout_holds_the_degrees_the_strategy_declares(strategy, world, nnodes, opts, degrees):
    from dlscale.strategies import get_strategy

    info = get_strategy(strategy)
    dims = info.dims(world, nnodes, opts)
    assert dims.shape == degrees and dims.world_size == world
    assert info.layout(world, nnodes, opts).dims == dims


def test_impossible_declared_degrees_are_one_config_error():
    from dlscale import ConfigError
    from dlscale.strategies import get_strategy

    # the strategy, each degree, their product and the world size with the options that make it
    with pytest.raises(ConfigError, match=names("hybrid", "dp 3", "tp 2", "= 6 ", "8", "nproc-per-node 8")) as e:
        get_strategy("hybrid").dims(8, 1, {"dp": 3, "tp": 2})
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=names("single", "= 1 ", "2")):
        get_strategy("single").dims(2, 1, {})


def test_refusals_follow_the_declared_capabilities(monkeypatch):
    """A capability read from the registration: the same case is refused or accepted as the strategy
    declares, whatever its name."""
    import dataclasses

    from dlscale import ConfigError
    from dlscale.train import checkpointing, step
    from dlscale.case.config import RunConfig
    from dlscale.strategies import _STRATEGIES, get_strategy

    cfg = RunConfig(model="gpt2", flavor="tiny", strategy="ddp", nproc_per_node=2, clip_grad_norm=1.0,
                    activation_checkpointing="full", optimizer_graph=True, warmup=3)
    ddp = get_strategy("ddp")
    assert ddp.unsupported(cfg, {"device_type": "cpu"}) is None
    checkpointing.check_case(cfg, get_model("gpt2", "tiny"))
    step.check_optimizer_graph(cfg)
    caps = dataclasses.replace(ddp.caps, optimizer_graph=False, no_clip="a test", no_checkpointing="a test")
    monkeypatch.setitem(_STRATEGIES._entries, "ddp", dataclasses.replace(ddp, caps=caps))
    assert "clip" in get_strategy("ddp").unsupported(cfg, {"device_type": "cpu"})
    with pytest.raises(ConfigError, match=names("activation-checkpointing full", "ddp")):  # option, value, strategy
        checkpointing.check_case(cfg, get_model("gpt2", "tiny"))
    with pytest.raises(ConfigError, match="optimizer-graph"):
        step.check_optimizer_graph(cfg)


def test_sharding_validation_builds_each_model_once(monkeypatch):
    """Validating many cases of one sharded model builds its meta model once per size."""
    from dlscale.case.config import RunConfig
    from dlscale.strategies import _sharding, get_strategy

    built = []
    real = _sharding.probe
    monkeypatch.setattr(_sharding, "probe", lambda spec: built.append(spec.name) or real(spec))
    _sharding._probed.cache_clear()
    info = get_strategy("partial-fc")
    for batch in (4, 8, 16):
        cfg = RunConfig(model="face", flavor="tiny", strategy="partial-fc", nproc_per_node=2, batch_size=batch)
        info.validate(cfg)
        assert info.unsupported(cfg, {"device_type": "cpu"}) is None
        info.model_spec(get_model("face", "tiny"), cfg)
    assert built == ["face"]
