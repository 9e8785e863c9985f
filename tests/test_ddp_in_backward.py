"""ddp's optimizer_in_backward: each bucket's parameters stepped inside the backward (a comm hook:
all-reduce, then torch's functional optimizer) train as the model's optimizer stepping after it does.

On a one-rank gloo group in this process (DDP's bucket hooks and futures run as with more ranks;
the 2-process runs of the other ddp options are in test_strategies.py)."""
from __future__ import annotations

import contextlib
import os
import socket

import pytest
import torch
import torch.distributed as dist

from dlscale import ConfigError
from dlscale.case.config import RunConfig
from dlscale.models import get_model
from dlscale.strategies import DistEnv
from dlscale.train.worker import build_parallel, build_step, make_batches


@contextlib.contextmanager
def _one_rank_group():
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _train(model: str, in_backward: bool, steps: int = 3):
    opts = {"optimizer_in_backward": True, "bucket_cap_mb": 0.05} if in_backward else {"bucket_cap_mb": 0.05}
    cfg = RunConfig(model=model, flavor="tiny", batch_size=2, strategy="ddp", device="cpu", precision="fp32",
                    strategy_options=opts, seed=0)
    spec = get_model(model, "tiny")
    dev = torch.device("cpu")
    par, _ = build_parallel(spec, cfg, DistEnv(0, 1, 0, 1, dev, "gloo"))
    step = build_step(par, cfg, dev, make_batches(spec, cfg, par, par.dp_rank, dev))
    losses = [float(step().detach()) for _ in range(steps)]
    return losses, {n: p.detach().clone() for n, p in par.module.module.named_parameters()}, par


@pytest.mark.slow  # seconds: two tiny models trained twice each
@pytest.mark.parametrize("model", ["gpt2", "resnet50"])  # AdamW and SGD with momentum
def test_optimizer_in_backward_trains_as_the_step_after_it(model):
    with _one_rank_group():
        torch.manual_seed(0)
        ref_losses, ref, _ = _train(model, False)
        torch.manual_seed(0)
        losses, got, par = _train(model, True)
    assert par.info["optimizer_in_backward"] is True and par.optimizer.state == {}  # the model's optimizer never stepped
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ref_losses[-1] != ref_losses[0]  # it trained
    worst = max(float((got[n] - ref[n]).abs().max()) for n in ref)
    assert worst < 1e-5, worst


@pytest.mark.parametrize("extra,words", [
    ({"grad_accum": 2}, "grad-accum 2"),
    ({"clip_grad_norm": 1.0}, "clip-grad-norm"),
    ({"precision": "amp-fp16"}, "amp-fp16"),
    ({"strategy_options": {"optimizer_in_backward": True, "comm_hook": "fp16"}}, "comm_hook fp16"),
])
def test_optimizer_in_backward_refuses_what_needs_the_whole_gradient(extra, words):
    fields = {"model": "gpt2", "strategy": "ddp", "nproc_per_node": 2, "device": "cpu",
              "strategy_options": {"optimizer_in_backward": True}, **extra}
    from dlscale.strategies import get_strategy

    with pytest.raises(ConfigError, match=f"optimizer_in_backward.*{words}"):
        get_strategy("ddp").validate(RunConfig(**fields))


@pytest.mark.parametrize("fused", [False, True])  # torch's CPU kernels take fused=True as CUDA does
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_bucket_update_steps_as_the_optimizer(kind, fused):
    from dlscale.strategies.ddp import _BucketUpdate

    torch.manual_seed(0)
    ref = [torch.randn(5, 3), torch.randn(7)]
    mine = [p.clone() for p in ref]
    hyper = {"lr": 0.1, "weight_decay": 0.01, "fused": fused, "foreach": None if fused else True}
    make = {"AdamW": lambda ps: torch.optim.AdamW(ps, betas=(0.9, 0.95), **hyper),
            "SGD": lambda ps: torch.optim.SGD(ps, momentum=0.9, **hyper)}[kind]
    ref_opt = make([torch.nn.Parameter(p) for p in ref])
    update = _BucketUpdate(make([torch.nn.Parameter(p.clone()) for p in mine]))
    for _ in range(3):
        grads = [torch.randn_like(p) for p in ref]
        for p, g in zip(ref_opt.param_groups[0]["params"], grads):
            p.grad = g.clone()
        ref_opt.step()
        update.step(mine, grads)
    for a, b in zip(ref_opt.param_groups[0]["params"], mine):
        torch.testing.assert_close(b, a.detach(), rtol=1e-6, atol=1e-7)
    assert len(update.state) == 2 and update.opt.state == {}
