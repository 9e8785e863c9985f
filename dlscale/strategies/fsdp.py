"""`fsdp`: FSDP2 (``torch.distributed.fsdp.fully_shard``), parameters sharded over all ranks.

Wrapping: every block of ``spec.blocks(model)`` (transformer layers, ResNet bottlenecks) is its
own ``fully_shard`` unit, then the root (embeddings, heads, what is left). Tied weights (GPT-2's
``lm_head``/``wte``, BERT's decoder/word embedding) live in the root unit, so the tie holds.

Options:

* ``shard``: ``zero3`` (default; ``reshard_after_forward=True``: parameters are gathered for the
  forward, freed, gathered again for the backward) or ``zero2`` (``reshard_after_forward=False``:
  the gathered parameters stay from forward to backward, one all-gather less per block, more
  memory). Gradients are reduce-scattered and optimizer state is sharded in both.
* ``mixed_precision`` (default true): with ``--precision amp-bf16`` (``amp-fp16``) FSDP keeps fp32
  sharded master parameters, gathers them in bf16 (fp16) and reduces gradients in fp32
  (``MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)``). The worker's autocast still wraps
  the forward; with bf16 parameters it changes nothing but the ops autocast runs in fp32
  (softmax, losses), as without FSDP. ``mixed_precision=false`` keeps fp32 parameters and
  communication and lets autocast alone do the casting (as DDP does). Ignored for fp32.

The model is built whole on every device before sharding (the worker builds it); the steady
state holds 1/N of the parameters, gradients and optimizer state per rank, plus the gathered
blocks in flight.
"""
from __future__ import annotations

import contextlib

import torch

from dlscale.strategies import Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options

OPTIONS = {"shard": "zero3", "mixed_precision": True}
CHOICES = {"shard": ("zero3", "zero2")}


def options(cfg) -> dict:
    return parse_options("fsdp", cfg, OPTIONS, CHOICES)


def mp_policy(cfg, enabled: bool):
    """The MixedPrecisionPolicy for --precision (None: keep everything fp32)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not enabled or cfg.precision == "fp32":
        return None
    dtype = torch.bfloat16 if cfg.precision == "amp-bf16" else torch.float16
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def apply_fsdp(model, spec, cfg, mesh, shard: str, mixed_precision: bool):
    """fully_shard each block, then the root. ``mesh``: 1-D (FSDP) or 2-D (HSDP); None = world."""
    from torch.distributed.fsdp import fully_shard

    kwargs = {"reshard_after_forward": shard == "zero3"}
    if mesh is not None:
        kwargs["mesh"] = mesh
    mp = mp_policy(cfg, mixed_precision)
    if mp is not None:
        kwargs["mp_policy"] = mp
    blocks = spec.blocks(model) if spec.blocks else []
    for block in blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model


def fsdp_no_sync(module):
    """FSDP2's way of accumulating gradients without reduce-scatter (the worker's grad_accum)."""

    @contextlib.contextmanager
    def no_sync():
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return no_sync


@register_strategy("fsdp", description="FSDP2 fully_shard per block (ZeRO-3, or ZeRO-2 with -o shard=zero2)",
                   validate=options)
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    apply_fsdp(model, spec, cfg, None, opts["shard"], opts["mixed_precision"])
    mp = mp_policy(cfg, opts["mixed_precision"])
    return Parallelized(module=model, optimizer=make_optimizer(model.parameters(), spec, cfg, dist.device),
                        dp_size=dist.world_size, no_sync=fsdp_no_sync(model),
                        info={"dp_rank": dist.rank, "shard_degree": dist.world_size,
                              "reshard_after_forward": opts["shard"] == "zero3",
                              "param_dtype": str(mp.param_dtype).replace("torch.", "") if mp else "float32",
                              "wrapped_blocks": len(spec.blocks(model)) if spec.blocks else 0, **opts})
