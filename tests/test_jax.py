"""The JAX backend (--framework jax): same models, same data, same records as the torch one.

Fast tier: parameter counts equal to the torch models' for every model and flavour (shapes
only, nothing allocated), the tiny models' loss equal to torch's from the same weights and batch
(a structural check stronger than counts), the FLOPs are the torch spec's, strategy checks, the
fp16 loss-scale rule, and the one-line error when JAX is missing.

Slow tier: JAX fsdp on 2 processes (gloo, through `dlscale run`, module-scoped so it runs once)
against JAX single on the same global batch, the single and the one-device ddp references trained
by the JAX worker's ``train`` in this process (ddp's layout at one device is single's program, bit
for bit). REL as in test_strategies: fp32 on the CPU, the runs differ only in the order of the
gradient reduction's and the loss mean's summation (measured ~1e-7 relative after 3 AdamW steps).
XLA's CPU compile dominates each run (the step and the eval-loss program, once per process); the
2-process run asks XLA for its cheapest backend optimisation (the numbers are not performance
figures).
All JAX tests skip without the jax extra, except those that check dlscale without it.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale import ConfigError
from dlscale.case.config import RunConfig
from helpers_cli import RunsAhead, cases, names


MODELS = ("resnet50", "bert-base", "gpt2", "gpt2-vpad")
REL = 1e-5
WARMUP = 3


def _cli(args: list[str]) -> tuple[int, str, str]:
    from dlscale.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli_main(args)
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue()


# ---------------------------------------------------------------- no JAX needed


def test_framework_field_and_case_key():
    from dlscale.frameworks import worker_module

    assert RunConfig().framework == "torch"
    assert "framework" not in __import__("dlscale.case.config", fromlist=["workload_fields"]).workload_fields(
        RunConfig().to_dict())  # old records keep their keys
    assert RunConfig(framework="jax").case_key() != RunConfig().case_key()
    assert worker_module("torch") == "dlscale.train.worker"
    assert worker_module("jax") == "dlscale.frameworks.jax.worker"
    with pytest.raises(ConfigError, match=names("'tf'", "torch", "jax")):  # the value and the choices
        RunConfig(framework="tf")


def test_jax_strategy_check_reasons():
    from dlscale.frameworks.jax.strategies import jax_strategy_check

    assert jax_strategy_check(RunConfig(framework="jax", strategy="ddp")) is None
    assert jax_strategy_check(RunConfig(framework="jax", strategy="fsdp", model="resnet50")) is None
    from dlscale.frameworks.jax.strategies import STRATEGIES

    why = jax_strategy_check(RunConfig(framework="jax", strategy="pipeline"))  # the strategy and those JAX runs
    assert "pipeline" in why and all(s in why for s in STRATEGIES) and "--compile" not in why, why
    why = jax_strategy_check(RunConfig(framework="jax", compile=True))  # the option and who compiles instead
    assert "--compile" in why and "XLA" in why and "pipeline" not in why, why


def test_missing_jax_is_one_line_exit_2(tmp_path, monkeypatch):
    import importlib.util

    from dlscale import frameworks

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in frameworks.JAX_PACKAGES else real(name, *a))
    rc, out, err = _cli(["run", "--framework", "jax", "--flavor", "tiny", "--device", "cpu",
                         "--store", str(tmp_path / "st")])
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "pip install -e '.[jax]'" in lines[0]
    assert not (tmp_path / "st" / "results.jsonl").exists()


def test_profile_kernels_by_kind_from_jax_and_torch_traces():
    from dlscale.frameworks.jax.profile import by_kind, top_ops

    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #13(Compute)"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 8, "args": {"name": "XLA Ops"}}]
    ev = [{"ph": "X", "pid": 1, "tid": 7, "name": "nvjet_hsh_gemm", "dur": 3000},
          {"ph": "X", "pid": 1, "tid": 7, "name": "cudnn_generated_fort_native_sdpa", "dur": 1000},
          {"ph": "X", "pid": 1, "tid": 7, "name": "loop_add_convert_fusion", "dur": 500},
          {"ph": "X", "pid": 1, "tid": 8, "name": "dot.3", "dur": 3000},  # derived op line: not counted
          {"ph": "X", "pid": 2, "tid": 1, "name": "PjitFunction(step)", "dur": 9000}]  # host
    jk = by_kind({"traceEvents": meta + ev}, steps=2)
    assert jk == {"matmul": {"ms_per_step": 1.5, "kernels_per_step": 0.5},
                  "attention": {"ms_per_step": 0.5, "kernels_per_step": 0.5},
                  "other": {"ms_per_step": 0.25, "kernels_per_step": 0.5}}
    torch_trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "flash_fwd_kernel", "dur": 800},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 5000},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "dur": 200}]}
    assert by_kind(torch_trace, 1) == {"attention": {"ms_per_step": 0.8, "kernels_per_step": 1.0},
                                       "memcpy/memset": {"ms_per_step": 0.2, "kernels_per_step": 1.0}}
    top = top_ops({"traceEvents": meta + ev}, 2)
    assert top[0]["name"] == "nvjet_hsh_gemm" and top[0]["kind"] == "matmul" and top[0]["share"] == 3000 / 4500


@pytest.mark.slow
def test_dlscale_imports_without_jax():
    code = ("import sys, dlscale.cli, dlscale.case.launch, dlscale.frameworks, dlscale.report.cli; "
            "from dlscale.frameworks.jax import strategies; assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---------------------------------------------------------------- JAX, in-process

jax = pytest.importorskip("jax", reason="the jax extra is not installed (pip install -e '.[jax]')")


def _torch_count(name: str, flavor: str) -> int:
    import torch

    from dlscale.models import count_parameters, get_model

    with torch.device("meta"):
        return count_parameters(get_model(name, flavor).build())


@pytest.mark.parametrize("flavor", ["full", "tiny"])
@pytest.mark.parametrize("name", MODELS)
def test_parameter_counts_equal_torch(name, flavor):
    from dlscale.frameworks.jax.layers import ShapeInit
    from dlscale.frameworks.jax.models import count_params, get_jax_model

    model = get_jax_model(name, flavor)
    params, _ = model.init(ShapeInit())  # ShapeDtypeStructs: nothing allocated
    assert count_params(params) == _torch_count(name, flavor)


def test_flops_and_recipe_are_the_torch_specs():
    from dlscale.frameworks.jax.models import get_jax_model
    from dlscale.models import get_model

    for name in MODELS:
        j, t = get_jax_model(name, "full").spec, get_model(name, "full")
        assert (j.flops_per_sample, j.optimizer, j.lr, j.weight_decay) == (
            t.flops_per_sample, t.optimizer, t.lr, t.weight_decay)


@pytest.mark.parametrize("name", [pytest.param("resnet50", marks=pytest.mark.slow),  # two conv-net compiles
                                  "bert-base", "gpt2", "gpt2-vpad"])
def test_tiny_loss_equals_torch_from_the_same_weights(name):
    """Torch's weights mapped onto the JAX tree (every tensor used, every shape matching), the
    same batch: the losses agree in training and eval mode (BatchNorm batch vs running stats)."""
    import torch

    from dlscale.frameworks.jax.convert import torch_to_jax
    from dlscale.frameworks.jax.layers import Ctx, ShapeInit
    from dlscale.frameworks.jax.models import get_jax_model

    model = get_jax_model(name, "tiny")
    torch.manual_seed(0)
    tm = model.spec.build()
    params, stats = torch_to_jax(tm, *model.init(ShapeInit()))
    batch = model.spec.make_batch(4, torch.device("cpu"), torch.Generator().manual_seed(1))
    # training and eval differ only where BatchNorm is (the tiny transformers have no dropout)
    for train in ((True, False) if name == "resnet50" else (True,)):
        tm.train(train)
        with torch.no_grad():
            want = tm(*batch).item()
        loss = jax.jit(lambda p, s, b: model.loss(p, s, b, Ctx(train=train))[0])  # one compile, not one per op
        got = float(loss(params, stats, model.to_numpy(batch)))
        assert abs(got - want) <= 1e-5 * abs(want), (train, got, want)


def test_fsdp_spec_shards_the_largest_divisible_dim():
    from jax.sharding import PartitionSpec as P

    from dlscale.frameworks.jax.strategies import fsdp_spec

    assert fsdp_spec((768, 2304), 2) == P(None, "data")
    assert fsdp_spec((50257, 768), 2) == P(None, "data")  # 50257 is odd
    assert fsdp_spec((7,), 2) == P()
    assert fsdp_spec((), 2) == P()
    assert fsdp_spec((64, 64), 1) == P()


def test_optax_states_start_at_zero():
    """setup() fills the optimizer state with zeros instead of compiling tx.init: true for these."""
    import numpy as np

    from dlscale.frameworks.jax import train as T
    from dlscale.frameworks.jax.layers import HostInit
    from dlscale.frameworks.jax.models import get_jax_model

    for name in ("resnet50", "gpt2"):
        model = get_jax_model(name, "tiny")
        params, _ = model.init(HostInit(0))
        for clip in (None, 1.0):
            state = jax.jit(T.make_optimizer(model, clip).init)(params)
            assert all(not np.any(np.asarray(x)) for x in jax.tree_util.tree_leaves(state))


def test_fp16_loss_scale_skips_non_finite_steps_and_backs_off():
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dlscale.frameworks.jax import train as T
    from dlscale.frameworks.jax.layers import Ctx
    from dlscale.frameworks.jax.models import JaxModel
    from dlscale.models import get_model

    toy = JaxModel("toy", "tiny", get_model("gpt2", "tiny"), init=None,
                   loss=lambda p, s, b, ctx, key: (jnp.mean((p["w"] * b[0]) ** 2), s), to_numpy=None)
    step = jax.jit(T.build_step(toy, Ctx(dtype="float16"), optax.sgd(0.1), accum=1, fp16=True, seed=0))
    state = T.TrainState({"w": jnp.ones((2,))}, {}, optax.sgd(0.1).init({"w": jnp.ones((2,))}),
                         jnp.zeros((), jnp.int32), jnp.asarray(T.SCALE_INIT), jnp.zeros((), jnp.int32))
    ok, _ = step(state, (jnp.ones((1, 2)),))
    assert float(ok.scale) == T.SCALE_INIT and int(ok.good_steps) == 1
    # loss = mean((w x)^2) at w = x = 1: gradient 1 per weight once unscaled; SGD lr 0.1 -> 0.9
    np.testing.assert_allclose(np.asarray(ok.params["w"]), 0.9, rtol=1e-6)
    bad, _ = step(ok, (jnp.full((1, 2), jnp.inf),))
    assert float(bad.scale) == T.SCALE_INIT * T.SCALE_BACKOFF and int(bad.good_steps) == 0
    np.testing.assert_array_equal(np.asarray(bad.params["w"]), np.asarray(ok.params["w"]))  # skipped


def test_the_fp16_loss_scale_around_the_window_counts_the_skipped_updates():
    """The JAX worker's record fields from its state's scale, read as the worker reads it (XLA's CPU dot
    has no fp16, so the worker itself does not run amp-fp16 here): two halvings are two skipped
    updates; no scale, no fields."""
    import jax.numpy as jnp

    from dlscale.results import metrics
    from dlscale.frameworks.jax import train as T
    from dlscale.frameworks.jax.worker import _scale_reading

    def state(scale, good):
        return T.TrainState({}, {}, {}, jnp.asarray(0), jnp.asarray(scale), jnp.asarray(good, dtype=jnp.int32))

    before, after = _scale_reading(state(65536.0, 10)), _scale_reading(state(16384.0, 7))
    assert before == metrics.ScaleReading(65536.0, 10, 2000)
    assert metrics.loss_scale_fields(before, after, 30) == {"loss_scale": [65536.0, 16384.0], "skipped_steps": 2,
                                                            "loss_scale_tracker": [10, 7]}
    assert metrics.loss_scale_fields(None, after, 30) == {}


def _dot_dtypes(fn, *args) -> set[tuple[str, ...]]:
    """(lhs, rhs, out) dtypes of every dot_general and convolution in fn's jaxpr."""
    prims = {"dot_general", "conv_general_dilated"}
    found = set()

    def walk(jaxpr):
        for e in jaxpr.eqns:
            if e.primitive.name in prims:
                found.add(tuple(str(v.aval.dtype) for v in (*e.invars, *e.outvars)))
            for v in e.params.values():
                inner = getattr(v, "jaxpr", v)
                if hasattr(inner, "eqns"):
                    walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return found


def test_bf16_backward_matmuls_and_convs_run_in_bf16():
    """Every matmul and convolution of the forward AND backward pass takes and gives bfloat16 (as
    torch autocast's): a float32 output cast down would make the gradient ones float32 x bfloat16
    (run in fp32/TF32 on GPUs), the cause of the JAX GPT-2's 1.8x deficit (docs/frameworks.md)."""
    import jax.numpy as jnp

    from dlscale.frameworks.jax import layers as L

    ctx, bf = L.Ctx(dtype="bfloat16"), ("bfloat16",) * 3
    ini = L.HostInit(0)
    dense, table = L.dense_params(ini, 8, 16, std=0.02), jnp.asarray(ini.normal((10, 8), 0.02))
    conv = {"kernel": jnp.asarray(ini.normal((3, 3, 4, 6), 0.1))}
    x, img, q = jnp.ones((2, 3, 8)), jnp.ones((2, 5, 5, 4)), jnp.ones((2, 4, 2, 8), jnp.bfloat16)
    cases = {
        "dense": (lambda p, x: jnp.sum(L.dense(p, x, ctx).astype(jnp.float32)), dense, x),
        "vocab": (lambda w, x: jnp.sum(L.vocab_logits(x, w, None, L.Ctx(dtype="bfloat16", vocab_multiple=4))
                                       .astype(jnp.float32)), table, x),
        "conv": (lambda p, x: jnp.sum(L.conv(p, x, ctx, padding=1).astype(jnp.float32)), conv, img),
        "attention with dropout": (lambda q, k: jnp.sum(L.attention(
            q, k, q, ctx, causal=True, dropout_rate=0.1, key=jax.random.PRNGKey(0)).astype(jnp.float32)), q, q),
    }
    for name, (f, a, b) in cases.items():
        found = _dot_dtypes(jax.grad(f, argnums=(0, 1)), a, b)
        assert found == {bf}, (name, found)


@pytest.mark.slow  # XLA compiles the loss and its gradient: seconds on a 2-core CPU
def test_cross_entropy_by_hand():
    """logsumexp - label logit: against values computed by hand, with and without ignore_index."""
    import math

    import jax.numpy as jnp
    import numpy as np

    from dlscale.frameworks.jax.layers import cross_entropy

    logits = jnp.asarray([[[0.0, 0.0, 0.0, 0.0], [1.0, 2.0, 3.0, 0.0]]], jnp.bfloat16)  # (1, 2, 4)
    labels = jnp.asarray([[1, 2]])
    a, b = math.log(4.0), math.log(math.e + math.e ** 2 + math.e ** 3 + 1.0) - 3.0
    np.testing.assert_allclose(float(cross_entropy(logits, labels)), (a + b) / 2, rtol=1e-6)
    np.testing.assert_allclose(float(cross_entropy(logits, jnp.asarray([[-100, 2]]), ignore_index=-100)), b,
                               rtol=1e-6)
    # gradient: softmax - one_hot(label), over the batch mean
    g = np.asarray(jax.grad(lambda z: cross_entropy(z, labels))(logits.astype(jnp.float32)))
    np.testing.assert_allclose(g[0, 0], np.array([0.25, -0.75, 0.25, 0.25]) / 2, rtol=1e-6)


def test_env_records_jax_versions_and_backend():
    from dlscale.results import envinfo

    env = envinfo.capture(include_topology=False, framework="jax", device_type="cpu")
    assert env["framework"] == "jax"
    assert env["jax"]["jax"] == jax.__version__ and env["jax"]["backend"] == "cpu"
    assert env["jax"]["optax"] and env["jax"]["jaxlib"]
    assert "jax" not in envinfo.capture(include_topology=False)


def test_suite_frameworks_axis(tmp_path):
    from dlscale.case.suite import load_suite

    path = tmp_path / "fw.yaml"
    path.write_text("device: cpu\nmatrix:\n  models: [gpt2]\n  flavors: [tiny]\n  frameworks: [torch, jax]\n"
                    "  strategies: [ddp]\n  devices: [1, 2]\n  batch_sizes: [2]\n")
    cases = load_suite(path).cases
    assert sorted((c.framework, c.world_size) for c in cases) == [("jax", 1), ("jax", 2), ("torch", 1), ("torch", 2)]
    path.write_text("matrix:\n  models: [gpt2]\n  frameworks: [tf]\n  batch_sizes: [2]\n")
    with pytest.raises(ConfigError, match="framework"):
        load_suite(path)


# ---------------------------------------------------------------- 2-process runs (gloo)

_RECORDS: dict[tuple, dict] = {}


@pytest.fixture(scope="module")
def run_case(tmp_path_factory, request):
    """run(model, strategy, nproc, batch, accum): the record of that case (run once per module; the
    cases the selected tests name run ahead, two at a time)."""
    store = tmp_path_factory.mktemp("jax-store")
    mp = pytest.MonkeyPatch()
    # cheapest XLA CPU backend optimisation: compiles faster, same arithmetic order in every run
    mp.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true")
    mp.setenv("OMP_NUM_THREADS", "1")

    def args(key: tuple) -> list[str]:
        model, strategy, nproc, batch, accum = key
        return ["run", "--framework", "jax", "--model", model, "--flavor", "tiny", "--strategy", strategy,
                "--nproc-per-node", str(nproc), "--batch-size", str(batch), "--grad-accum", str(accum),
                "--precision", "fp32", "--warmup", str(WARMUP), "--steps", "2", "--repeats", "1",
                "--device", "cpu", "--store", str(store), "--json", "--time-limit", "300", "--no-monitor"]

    # the other tiny models' JAX losses equal torch's (test_tiny_loss_equals_torch_from_the_same_weights):
    # data parallel does not depend on the model, so gpt2 alone trains under it here
    ahead = RunsAhead(args, ahead=None)  # all in one pool: none runs alone after a batch

    ahead.start(request)

    def run(model: str, strategy: str, nproc: int, batch: int, accum: int = 1) -> dict:
        key = (model, strategy, nproc, batch, accum)
        if key not in _RECORDS:
            done = ahead.take(key)
            rc, out, err = (done.returncode, done.stdout, done.stderr) if done else _cli(args(key))
            rec = json.loads(out[out.index("{"):])
            assert rec["status"] == "ok", (rec["error"], (rec["repeats"] or [{}])[0].get("output_tail", "")[-3000:])
            assert rc == 0
            _RECORDS[key] = rec
        return _RECORDS[key]

    yield run
    mp.undo()
    ahead.finish(request)


_HERE: dict[tuple, dict] = {}


def _here(tmp_path_factory, model: str, strategy: str, batch: int, accum: int) -> dict:
    """The JAX worker's ``train`` of one one-process case in this process (one CPU device, no
    torchrun, no interpreter to start): what the case's rank file holds."""
    key = (model, strategy, batch, accum)
    if key not in _HERE:
        from dlscale.frameworks.jax import worker

        assert jax.device_count() == 1
        cfg = RunConfig(framework="jax", model=model, flavor="tiny", strategy=strategy, batch_size=batch,
                        grad_accum=accum, precision="fp32", warmup=WARMUP, steps=2, repeats=1, device="cpu",
                        monitor=False)
        result: dict = {"marks": {}}
        worker.train(cfg, "cpu", (0, 1, 0, 1), result, tmp_path_factory.mktemp("jax-here"))
        assert result["status"] == "ok", result
        _HERE[key] = result
    return _HERE[key]


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= REL * abs(b)


@pytest.mark.slow  # XLA compiles the step and the eval loss twice in this process: seconds
def test_ddp_on_one_device_is_single(tmp_path_factory):
    """ddp's replicated layout on a one-device mesh: single's arithmetic, bit for bit, and the whole
    state on the device (the two-process data-parallel path: test_gpt2_fsdp_on_two_processes_matches_single)."""
    ref = _here(tmp_path_factory, "gpt2", "single", 4, 2)
    got = _here(tmp_path_factory, "gpt2", "ddp", 4, 2)
    assert got["warmup_losses"] == ref["warmup_losses"] and got["loss_after"] == ref["loss_after"]
    assert got["dp_size"] == 1 and got["strategy_info"]["param_sharding"] == "replicated"
    assert got["strategy_info"]["state_bytes_per_device"] == ref["strategy_info"]["state_bytes_per_device"]
    assert ref["warmup_losses"][-1] < ref["warmup_losses"][0]  # it trains


@pytest.mark.slow
@cases(("gpt2", "fsdp", 2, 2, 2))
def test_gpt2_fsdp_on_two_processes_matches_single(run_case, tmp_path_factory):
    """Two processes, one CPU device each (jax.distributed, gloo): the batch split over the data axis,
    the parameters and optimizer state sharded over it, step by step single's losses."""
    rec = run_case("gpt2", "fsdp", 2, 2, accum=2)  # 2 x 2 ranks = the single run's 4, twice accumulated
    ref = _here(tmp_path_factory, "gpt2", "single", 4, 2)
    rep = rec["repeats"][0]
    assert rec["global_batch"] == 8 and rec["strategy_info"]["mesh"] == {"data": 2}
    # JAX reports the global batch's loss on every rank: step by step equal to single's
    for got, want in zip(rep["warmup_losses"], ref["warmup_losses"], strict=True):
        assert _close(got, want), (rep["warmup_losses"], ref["warmup_losses"])
    assert _close(rep["loss_after"], ref["loss_after"])
    # half of the parameters and optimizer state per device, against ddp's replicated whole
    ddp = _here(tmp_path_factory, "gpt2", "ddp", 4, 2)["strategy_info"]["state_bytes_per_device"]
    ratio = rec["strategy_info"]["state_bytes_per_device"] / ddp
    assert 0.45 < ratio < 0.6, ratio


@pytest.mark.slow
@cases(("gpt2", "fsdp", 2, 2, 2))
def test_records_carry_framework_versions_counts_and_flops(run_case):
    from dlscale.models import get_model

    rec = run_case("gpt2", "fsdp", 2, 2, accum=2)
    assert rec["config"]["framework"] == "jax" and rec["env"]["framework"] == "jax"
    assert rec["env"]["jax"]["jax"] == jax.__version__ and rec["env"]["jax"]["backend"] == "cpu"
    assert rec["model"]["params"] == _torch_count("gpt2", "tiny")
    assert rec["model"]["flops_per_sample"] == get_model("gpt2", "tiny").flops_per_sample
    rep = rec["repeats"][0]
    assert len(rep["step_times_ms"]) == 2 and all(t > 0 for t in rep["step_times_ms"])
    assert rep["samples_per_s"] > 0 and rep["peak_rss_bytes"] > 0


def test_unsupported_strategy_is_recorded_without_processes(tmp_path):
    rc, out, err = _cli(["run", "--framework", "jax", "--model", "gpt2", "--flavor", "tiny", "--strategy",
                         "pipeline", "--nproc-per-node", "2", "--device", "cpu", "--store", str(tmp_path), "--json"])
    rec = json.loads(out[out.index("{"):])
    assert rec["status"] == "unsupported" and "no JAX implementation" in rec["error"]
    assert rec["config"]["framework"] == "jax"
    assert Path(tmp_path, "results.jsonl").exists()
