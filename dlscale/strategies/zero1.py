"""`zero1`: DDP plus ``torch.distributed.optim.ZeroRedundancyOptimizer`` (ZeRO stage 1).

Gradients are all-reduced by DDP as usual; the optimizer state (AdamW's two moments, SGD's
momentum) is sharded: each rank keeps and updates the state of ~1/N of the parameters, then
the updated parameters are broadcast from their owners. Model-state memory per rank:
params + grads + optimizer state / N (see docs/strategies.md, "memory model").

Options: ``overlap_with_ddp`` (default false): run the sharded optimizer step inside DDP's
communication hook, overlapped with the gradient all-reduce (``hook_with_zero_step``). PyTorch
documents that with overlap the first two iterations do not update the parameters (DDP's
buckets are being rebuilt), so a correctness comparison must skip them; ``clip-grad-norm`` is
refused with overlap (as is amp-fp16's loss scaling) because the step happens before the worker
could clip or unscale.
``parameters_as_bucket_view`` (default false); ``bucket_cap_mb`` (default 25),
``gradient_as_bucket_view`` (default true), ``broadcast_buffers`` (default true): as for ddp.
"""
from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import hook_with_zero_step
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import ConfigError
from dlscale.strategies import Capabilities, Hooks, Parallelized, register_strategy
from dlscale.strategies._common import optimizer_recipe, parse_options
from dlscale.planner.layout import Layout

OPTIONS = {"overlap_with_ddp": False, "parameters_as_bucket_view": False, "bucket_cap_mb": 25.0,
           "gradient_as_bucket_view": True, "broadcast_buffers": True}


def options(cfg) -> dict:
    opts = parse_options("zero1", cfg, OPTIONS)
    if opts["overlap_with_ddp"] and (cfg.clip_grad_norm is not None or cfg.precision == "amp-fp16"):
        raise ConfigError("zero1 overlap_with_ddp=true steps the optimizer inside the gradient hook, so "
                          "clip-grad-norm and amp-fp16 loss scaling cannot apply; drop one of them")
    return opts


def check(cfg, env) -> str | None:
    if parse_options("zero1", cfg, OPTIONS)["overlap_with_ddp"] and env.get("device_type") != "cuda":
        return "zero1 overlap_with_ddp needs NCCL (torch refuses it on gloo: it may hang); run it on GPUs"
    return None


class _NoopStepOptimizer(torch.optim.Optimizer):
    """With overlap_with_ddp the ZeRO step runs in DDP's hook: the worker's step() must not
    step again. zero_grad and param_groups are the real optimizer's."""

    def __init__(self, zero):  # a ZeroRedundancyOptimizer
        self.zero = zero
        self.param_groups = zero.param_groups
        self.defaults = zero.defaults
        self.state = zero.state

    def step(self, closure=None):  # the real step already ran in the communication hook
        return None

    def zero_grad(self, set_to_none: bool = True):
        self.zero.zero_grad(set_to_none=set_to_none)


def memory_layout(dims, opts: dict):
    return Layout("zero1", dims, zero=1, persistent_grads=True)


@register_strategy("zero1", description="DDP + ZeroRedundancyOptimizer (optimizer state sharded, ZeRO-1)",
                   hooks=Hooks(check=check, validate=options, memory_layout=memory_layout),
                   caps=Capabilities(solo_steps=True))
def parallelize(model, spec, cfg, dist):
    # imported here: torch.distributed.optim takes about a second to import, and every worker
    # process imports the whole strategy registry
    from torch.distributed.optim import ZeroRedundancyOptimizer

    opts = options(cfg)
    cuda = dist.device.type == "cuda"
    extra = {} if opts["broadcast_buffers"] else {"broadcast_buffers": False}  # (deprecated name in 2.13)
    ddp = DDP(model, device_ids=[dist.local_rank] if cuda else None,
              bucket_cap_mb=float(opts["bucket_cap_mb"]),
              gradient_as_bucket_view=bool(opts["gradient_as_bucket_view"]), **extra)
    cls, kwargs = optimizer_recipe(spec, cfg, dist.device)
    overlap = bool(opts["overlap_with_ddp"])
    if overlap:
        # the functional optimizers behind overlap accept the plain hyper-parameters only
        kwargs = {k: v for k, v in kwargs.items() if k in ("lr", "betas", "eps", "weight_decay", "momentum")}
    zero = ZeroRedundancyOptimizer([p for p in ddp.parameters() if p.requires_grad], optimizer_class=cls,
                                   parameters_as_bucket_view=bool(opts["parameters_as_bucket_view"]),
                                   overlap_with_ddp=overlap, **kwargs)
    optimizer = zero
    if overlap:
        ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
        optimizer = _NoopStepOptimizer(zero)
    return Parallelized(module=ddp, optimizer=optimizer, dp_size=dist.world_size, no_sync=ddp.no_sync,
                        dp_rank=dist.rank, info={"optimizer": cls.__name__,
                              "optimizer_state_shards": dist.world_size, **opts})
