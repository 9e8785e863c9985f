"""`hsdp`: hybrid sharded data parallel (FSDP2 on a 2-D device mesh: replicate x shard).

Parameters are sharded within a group of ``shard`` ranks (by default one node: the fast
links) and replicated across ``replicate`` such groups (by default the nodes): gradients are
reduce-scattered within the shard group and all-reduced across the replicas. Wrapping and mixed
precision as for ``fsdp``.

Options: ``replicate`` (default: ``--nnodes``; the mesh is ``(replicate, world / replicate)``, so
``-o replicate=2`` on one node with 2 processes is a testable (2, 1) mesh: pure replication, and
``replicate=1`` is plain FSDP); ``shard`` (``zero3`` default, or ``zero2``) and
``mixed_precision`` (default true), ``blocks_per_unit`` (default 1) and ``optimizer_on_shards``
(default true) as for fsdp.
"""
from __future__ import annotations

from dlscale.strategies import Capabilities, Hooks, Parallelized, register_strategy
from dlscale.strategies._common import require_divides
from dlscale.strategies._mesh import ParallelDims, ParallelMesh
from dlscale.strategies.fsdp import Units, apply_fsdp, fsdp_no_sync, fsdp_optimizer, mp_policy, options as fsdp_options
from dlscale.planner.layout import Layout

OPTIONS = {"replicate": None, "shard": "zero3", "mixed_precision": True, "blocks_per_unit": 1,
           "optimizer_on_shards": True}


def options(cfg) -> dict:
    opts = fsdp_options(cfg, "hsdp", OPTIONS)
    if opts["replicate"] is None:
        opts["replicate"] = cfg.nnodes
    require_divides("hsdp replicate degree", opts["replicate"], "the world size", cfg.world_size)
    return opts


def dims(world: int, nnodes: int, opts: dict):
    rep = int(opts.get("replicate") or nnodes)
    return ParallelDims(world, dp_replicate=rep, dp_shard=world // rep, where="hsdp")


def memory_layout(dims, opts: dict):
    return Layout("hsdp", dims, zero=2 if opts.get("shard") == "zero2" else 3,
                  fsdp_params_bf16=bool(opts.get("mixed_precision", True)), options=opts)


@register_strategy("hsdp", description="FSDP2 on a (replicate, shard) mesh: shard within a node, replicate across",
                   hooks=Hooks(validate=options, dims=dims, memory_layout=memory_layout),
                   caps=Capabilities(checkpoint_saves=True))
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    rep = opts["replicate"]
    pm = ParallelMesh.build(dims(dist.world_size, cfg.nnodes, opts), dist.device.type)
    apply_fsdp(model, spec, cfg, pm.fsdp_mesh, Units.of(opts))
    mp = mp_policy(cfg, opts["mixed_precision"])
    return Parallelized(module=model, optimizer=fsdp_optimizer(model, spec, cfg, dist.device,
                                                               opts["optimizer_on_shards"]),
                        dp_size=dist.world_size, no_sync=fsdp_no_sync(model),
                        dp_rank=pm.dp_rank, info={"mesh": [rep, dist.world_size // rep],
                              "mesh_dims": ["replicate", "shard"],
                              "param_dtype": str(mp.param_dtype).replace("torch.", "") if mp else "float32",
                              **opts})
