"""--precision fp8 (torchao float8 training) and --activation-checkpointing: refusals, the
conversion, and that checkpointing never changes what is computed."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import pytest
import torch

from dlscale import ConfigError
from dlscale.cli import main as cli_main
from dlscale.case.config import RunConfig
from dlscale.models import get_model
from dlscale.train.fp8 import MIN_CAPABILITY
from helpers_cli import names

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None
CAPABILITY = ".".join(map(str, MIN_CAPABILITY))  # what a fp8 refusal for the device must name


def test_fp8_is_a_precision_rated_against_bf16():
    from dlscale.results import metrics

    assert RunConfig(precision="fp8").precision == "fp8"
    assert metrics.precision_dtype("fp8", "cuda") == "bf16"


@pytest.mark.parametrize("strategy, opts, device, expect", [
    ("single", {}, "cpu", "needs a CUDA GPU of compute capability >= 8.9"),
    ("tensor", {}, "cuda", "Float8 tensor-parallel styles"),
    ("hybrid", {"tp": 2}, "cuda", "Float8 tensor-parallel styles"),
])
def test_fp8_refusals(strategy, opts, device, expect):
    from dlscale.train import fp8

    cfg = RunConfig(model="llama", flavor="tiny", strategy=strategy, nproc_per_node=2, precision="fp8",
                    strategy_options=opts)
    assert expect in fp8.check(cfg, {"device_type": device})
    assert fp8.check(RunConfig(precision="amp-bf16"), {"device_type": "cpu"}) is None


def test_fp8_reads_the_tensor_parallel_degree_the_strategy_declares():
    from dlscale.train import fp8

    env = {"device_type": "cuda", "assume_extras": True}
    for opts, refused in (({"pp": 2}, False), ({"tp": 2}, True), ({"dp": 1, "tp": 2}, True)):
        cfg = RunConfig(model="llama", flavor="tiny", strategy="hybrid", nproc_per_node=2, precision="fp8",
                        strategy_options=opts)
        assert (fp8.check(cfg, env) is not None) is refused, opts


def test_fp8_without_torchao(monkeypatch):
    from dlscale.train import fp8

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "torchao" else real(n, *a))
    reason = fp8.check(RunConfig(precision="fp8", model="llama", flavor="tiny"), {"device_type": "cuda"})
    # one line naming the missing package and the extra that installs it
    assert reason and "\n" not in reason and "torchao" in reason and "dlscale[fp8]" in reason, reason


def test_fp8_on_the_cpu_is_recorded_unsupported(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(["run", "--model", "llama", "--flavor", "tiny", "--precision", "fp8", "--device", "cpu",
                       "--store", str(tmp_path), "--json"])
    rec = json.loads(out.getvalue()[out.getvalue().index("{"):])
    # the device is the cause (its type and the capability it lacks), not a missing package
    assert rc == 6 and rec["status"] == "unsupported" and rec["error"].count("\n") == 0, rec["error"]
    assert CAPABILITY in rec["error"] and "cpu" in rec["error"] and "dlscale[fp8]" not in rec["error"]
    assert rec["repeats"] == []


@pytest.mark.slow  # trains two models for 3 steps
@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao (optional extra fp8) not installed")
def test_fp8_converts_the_blocks_linears_and_trains():
    """torch._scaled_mm runs on the CPU too, so the conversion and a few steps can be checked here
    (the device check is what keeps real runs on float8 tensor cores)."""
    from dlscale.train import fp8

    spec = get_model("llama", "tiny")
    cfg = RunConfig(model="llama", flavor="tiny", precision="fp8")
    losses = {}
    for precision in ("amp-bf16", "fp8"):
        torch.manual_seed(0)
        model = spec.build()
        info = fp8.convert(model, spec, RunConfig(model="llama", flavor="tiny", precision=precision),
                           check_device=False)
        if precision == "fp8":
            assert info["fp8"]["recipe"] == "tensorwise" and info["fp8"]["converted_linears"] == 7 * 2
            assert type(model.blocks[0].attn.wq).__name__ == "Float8Linear"
            assert type(model.output).__name__ == "VocabProjection"  # the head stays bf16
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        batch = spec.make_batch(4, torch.device("cpu"), torch.Generator().manual_seed(0))
        out = []
        for _ in range(3):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(*batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(float(loss.detach()))
        losses[precision] = out
    assert losses["fp8"][-1] < losses["fp8"][0]
    for a, b in zip(losses["fp8"], losses["amp-bf16"]):
        assert abs(a - b) < 0.05 * abs(b)
    with pytest.raises(RuntimeError, match=names(CAPABILITY, "cpu")) as e:  # the device is the cause
        fp8.convert(spec.build(), spec, cfg, torch.device("cpu"))
    assert "dlscale[fp8]" not in str(e.value)


def test_checkpointing_modes_and_refusals():
    from dlscale.train import checkpointing
    from dlscale.case.config import validate_case

    with pytest.raises(ConfigError, match=names("activation-checkpointing", "some", *checkpointing.MODES)):
        RunConfig(activation_checkpointing="some")
    with pytest.raises(ConfigError, match="BatchNorm"):
        validate_case(RunConfig(model="resnet50", flavor="tiny", activation_checkpointing="full"))
    validate_case(RunConfig(model="llama", flavor="tiny", strategy="single", activation_checkpointing="selective"))
    spec = get_model("gpt2", "tiny")
    model = spec.build()
    assert checkpointing.apply(model, spec, "none") == {}
    info = checkpointing.apply(model, spec, "full")["activation_checkpointing"]
    assert info["mode"] == "full" and info["blocks"] == 2
    assert "forward" in vars(model.blocks[0])  # the instance's forward runs the checkpoint


def test_activation_checkpointing_is_left_out_of_old_case_keys():
    """A record stored before the field existed keeps its case key."""
    assert RunConfig().case_key() == RunConfig(activation_checkpointing="none").case_key()
    assert RunConfig().case_key() != RunConfig(activation_checkpointing="full").case_key()
    assert "activation_checkpointing" not in __import__("dlscale.case.config", fromlist=["workload_fields"]).workload_fields(
        RunConfig().to_dict())
