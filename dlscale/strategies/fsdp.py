"""`fsdp`: FSDP2 (``torch.distributed.fsdp.fully_shard``), parameters sharded over all ranks.

Wrapping: every ``blocks_per_unit`` consecutive blocks of ``spec.blocks(model)`` (transformer
layers, ResNet bottlenecks; default 1: each block) form one ``fully_shard`` unit (one all-gather
and one reduce-scatter), then the root (embeddings, heads, what is left). Tied weights (GPT-2's
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
* ``blocks_per_unit`` (default 1): blocks per ``fully_shard`` unit. FSDP2's hooks cost host time
  per unit (all-gather copy-in/out, reduce-scatter, bookkeeping: about 2 ms per unit and step in
  a profile of BERT-base on an H200; docs/results/h200.md), which a 124M-parameter model at a
  40 ms step only partly hides; larger units pay it fewer times, and with ``zero3`` hold more
  gathered parameters at once.
* ``optimizer_on_shards`` (default true): the optimizer steps each rank's local shards as plain
  tensors (``ShardLocalOptimizer``: the same elementwise update, without DTensor's per-parameter
  dispatch: less host work, on a host whose work is already close to the GPU's step); false:
  torch's optimizer on the DTensor parameters, as FSDP2's examples do.

The model is built whole on every device before sharding (the worker builds it); the steady
state holds 1/N of the parameters, gradients and optimizer state per rank, plus the gathered
blocks in flight.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dlscale import ConfigError
from dlscale.train.precision import compute_dtype
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy, sharded
from dlscale.strategies._common import ShardLocalOptimizer, optimizer_recipe, parse_options
from dlscale.planner.layout import Layout

OPTIONS = {"shard": "zero3", "mixed_precision": True, "blocks_per_unit": 1, "optimizer_on_shards": True}
CHOICES = {"shard": ("zero3", "zero2")}


def options(cfg, name: str = "fsdp", defaults: dict | None = None) -> dict:
    """fsdp's options, typed and checked (hsdp passes its own name and defaults)."""
    opts = parse_options(name, cfg, defaults or OPTIONS, CHOICES)
    if opts.get("blocks_per_unit", 1) < 1:
        raise ConfigError(f"strategy {name} option blocks_per_unit must be >= 1, got {opts['blocks_per_unit']}")
    return opts


def mp_policy(cfg, enabled: bool):
    """The MixedPrecisionPolicy for --precision (None: keep everything fp32)."""
    dtype = compute_dtype(cfg.precision)
    if not enabled or dtype is None:
        return None
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


@dataclass(frozen=True)
class Units:
    """How ``fully_shard`` wraps a model: reshard after forward (zero3) or not (zero2), FSDP's mixed
    precision, and how many blocks make one unit (one all-gather)."""

    shard: str = "zero3"
    mixed_precision: bool = True
    blocks_per_unit: int = 1

    @classmethod
    def of(cls, opts: dict) -> "Units":
        return cls(opts["shard"], opts["mixed_precision"], opts.get("blocks_per_unit", 1))


def apply_fsdp(model, spec, cfg, mesh, units: Units, blocks: list | None = None,
               units_first: list | None = None) -> int:
    """fully_shard runs of ``units.blocks_per_unit`` blocks, then the root; returns the number of block
    units. ``mesh``: 1-D (FSDP) or 2-D (HSDP); None = world. ``blocks``: the model's blocks by
    default (a pipeline stage passes its own); ``units_first``: modules made units of their own
    before the blocks (a last pipeline stage's head modules, which the schedule's loss function
    calls outside the stage's forward: as units they gather their parameters when called)."""
    kwargs = {"reshard_after_forward": units.shard == "zero3"}
    if mesh is not None:
        kwargs["mesh"] = mesh
    mp = mp_policy(cfg, units.mixed_precision)
    if mp is not None:
        kwargs["mp_policy"] = mp
    for m in units_first or []:
        fully_shard(m, **kwargs)
    if blocks is None:
        blocks = list(spec.blocks(model)) if spec.blocks else []
    k = units.blocks_per_unit
    runs = [blocks[i:i + k] for i in range(0, len(blocks), k)]
    for unit in runs:
        fully_shard(unit if len(unit) > 1 else unit[0], **kwargs)  # a list: one group, one collective
    fully_shard(model, **kwargs)
    return len(runs)


def fsdp_optimizer(model, spec, cfg, device, on_shards: bool):
    """The model's optimizer for FSDP2 parameters: on the local shards, or on the DTensors."""
    if on_shards:
        # make_optimizer's class and arguments, built directly: the shards (no_grad aliases) do not
        # require grad, which make_optimizer's filter would drop
        cls, kwargs = optimizer_recipe(spec, cfg, device)
        return ShardLocalOptimizer(model.parameters(), lambda shards: cls(shards, **kwargs))
    return make_optimizer(model.parameters(), spec, cfg, device)


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


def memory_layout(dims, opts: dict):
    return Layout("fsdp", dims, zero=2 if opts.get("shard") == "zero2" else 3,
                  fsdp_params_bf16=bool(opts.get("mixed_precision", True)), options=opts)


@register_strategy("fsdp", description="FSDP2 fully_shard per block (ZeRO-3, or ZeRO-2 with -o shard=zero2)",
                   hooks=Hooks(validate=options, dims=sharded, memory_layout=memory_layout),
                   caps=Capabilities(checkpoint_saves=True))
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    n_units = apply_fsdp(model, spec, cfg, None, Units.of(opts))
    mp = mp_policy(cfg, opts["mixed_precision"])
    return Parallelized(module=model, optimizer=fsdp_optimizer(model, spec, cfg, dist.device,
                                                               opts["optimizer_on_shards"]),
                        dp_size=dist.world_size, no_sync=fsdp_no_sync(model),
                        dp_rank=dist.rank, info={"shard_degree": dist.world_size,
                              "reshard_after_forward": opts["shard"] == "zero3",
                              "param_dtype": str(mp.param_dtype).replace("torch.", "") if mp else "float32",
                              "wrapped_blocks": len(spec.blocks(model)) if spec.blocks else 0,
                              "block_units": n_units, **opts})
