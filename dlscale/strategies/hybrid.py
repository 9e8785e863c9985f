"""`hybrid`: data x tensor x pipeline parallelism on one DeviceMesh ``(dp, pp, tp)``.

Ranks are laid out with tp fastest (a tensor-parallel group is consecutive ranks, i.e. the GPUs
of one node's NVLink domain), then pp, then dp. Options:

* ``dp``, ``tp``, ``pp``: the degrees; their product must be the world size. ``dp`` may be left
  out (it is then world / (tp * pp)); ``tp`` and ``pp`` default to 1.
* ``dp_shard``: what the data-parallel dimension does: ``ddp`` (default: replicas, gradients
  averaged) or ``fsdp`` (FSDP2 over the dp dimension: parameters, gradients and optimizer state
  sharded across the replicas; with tp > 1 this is torch's "2-D" FSDP + TP).
* ``shard`` (``zero3``/``zero2``) and ``mixed_precision``: as for fsdp, when dp_shard=fsdp.
* ``sequence_parallel``: as for tensor, when tp > 1.
* ``schedule``, ``microbatches``, ``virtual``: as for pipeline, when pp > 1.

Combinations:

* dp x tp (pp = 1): TP inside each replica (as ``tensor``), then the dp dimension: with
  ``dp_shard=fsdp`` FSDP2 on the dp sub-mesh per block and root; with ``ddp`` torch's
  DistributedDataParallel when tp = 1, and for tp > 1 (DDP does not take DTensor parameters) each
  gradient is all-reduced over the dp group as soon as it is accumulated (a per-parameter hook,
  no buckets: slower than DDP's bucketing, same arithmetic).
* dp x pp (tp = 1): one pipeline per replica (as ``pipeline``); after each pipeline step the
  gradients are averaged over the dp group (one flat all-reduce per dtype, not overlapped).
* pp x tp (both > 1): not implemented (recorded unsupported); nor pp with dp_shard=fsdp.
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import ConfigError
from dlscale.strategies import Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import is_transformer, parse_options
from dlscale.strategies.fsdp import CHOICES as FSDP_CHOICES, apply_fsdp, fsdp_no_sync
from dlscale.strategies.pipeline import CHOICES as PP_CHOICES, build_pipeline, validate_pipeline
from dlscale.strategies.tensor import apply_tensor_parallel, replicate_rest, validate_tp

OPTIONS = {"dp": None, "tp": 1, "pp": 1, "dp_shard": "ddp", "shard": "zero3", "mixed_precision": True,
           "sequence_parallel": False, "schedule": "1f1b", "microbatches": 4, "virtual": 2,
           "balance": "time"}
CHOICES = {"dp_shard": ("ddp", "fsdp"), **FSDP_CHOICES, **PP_CHOICES}


def options(cfg) -> dict:
    from dlscale.models import get_model

    opts = parse_options("hybrid", cfg, OPTIONS, CHOICES)
    world = cfg.world_size
    tp, pp = opts["tp"], opts["pp"]
    for k in ("tp", "pp"):
        if opts[k] < 1:
            raise ConfigError(f"hybrid {k} must be >= 1, got {opts[k]}")
    if opts["dp"] is None:
        if world % (tp * pp):
            raise ConfigError(f"hybrid degrees tp {tp} x pp {pp} = {tp * pp} do not divide the world size {world} "
                              f"(nnodes {cfg.nnodes} x nproc-per-node {cfg.nproc_per_node})")
        opts["dp"] = world // (tp * pp)
    dp = opts["dp"]
    if dp < 1:
        raise ConfigError(f"hybrid dp must be >= 1, got {dp}")
    if dp * tp * pp != world:
        raise ConfigError(f"hybrid degrees dp {dp} x tp {tp} x pp {pp} = {dp * tp * pp} do not match the world size "
                          f"{world} (nnodes {cfg.nnodes} x nproc-per-node {cfg.nproc_per_node})")
    spec = get_model(cfg.model, cfg.flavor)
    if tp > 1:
        validate_tp("hybrid", cfg, spec, tp, opts["sequence_parallel"])
    if pp > 1:
        validate_pipeline("hybrid", cfg, spec, pp, opts["schedule"], opts["microbatches"], opts["virtual"],
                          opts["balance"])
    return opts


def check(cfg, env) -> str | None:
    from dlscale.models import get_model

    opts = options(cfg)
    spec = get_model(cfg.model, cfg.flavor)
    if opts["tp"] > 1 and not is_transformer(spec):
        return f"hybrid tp {opts['tp']}: tensor parallelism splits transformer blocks; {cfg.model} has no such plan"
    if opts["pp"] > 1 and opts["tp"] > 1:
        return "hybrid pp x tp (both > 1) is not implemented; use dp x tp or dp x pp"
    if opts["pp"] > 1 and opts["dp_shard"] == "fsdp":
        return "hybrid pp > 1 with dp_shard=fsdp is not implemented; use dp_shard=ddp with pipelines"
    return None


def _grad_allreduce_hooks(params, group, n: int):
    """Average each gradient over ``group`` once it is accumulated; returns a no_sync context."""
    from torch.distributed.tensor import DTensor

    state = {"sync": True}

    def hook(p):
        if not state["sync"] or p.grad is None:
            return
        g = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
        dist.all_reduce(g, group=group)
        g.div_(n)

    for p in params:
        if p.requires_grad:
            p.register_post_accumulate_grad_hook(hook)

    @contextlib.contextmanager
    def no_sync():
        state["sync"] = False
        try:
            yield
        finally:
            state["sync"] = True

    return no_sync


@register_strategy("hybrid", description="dp x tp x pp on a DeviceMesh (-o dp=N -o tp=M -o pp=K, -o dp_shard=fsdp)",
                   check=check, validate=options, min_world=1)
def parallelize(model, spec, cfg, denv):
    from torch.distributed.device_mesh import init_device_mesh

    opts = options(cfg)
    dp, tp, pp = opts["dp"], opts["tp"], opts["pp"]
    mesh = init_device_mesh(denv.device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
    d, p, t = mesh.get_coordinate()
    dp_group = mesh.get_group("dp")
    info = {"mesh": [dp, pp, tp], "mesh_dims": ["dp", "pp", "tp"], "dp_rank": d, "pp_rank": p, "tp_rank": t,
            "options": opts}

    if pp > 1:
        grid = mesh.mesh  # (dp, pp, tp) tensor of global ranks
        pp_groups = [grid[i, :, j].tolist() for i in range(dp) for j in range(tp)]
        return build_pipeline(model, spec, cfg, denv, schedule=opts["schedule"], microbatches=opts["microbatches"],
                              virtual=opts["virtual"], balance=opts["balance"], pp_group=mesh.get_group("pp"), pp_rank=p, pp_size=pp,
                              pp_groups=pp_groups, dp_group=dp_group, dp_size=dp, dp_rank=d, name="hybrid",
                              extra_info=info)

    if tp > 1:
        apply_tensor_parallel(model, spec, mesh["tp"], opts["sequence_parallel"])
        info["replicated_params"] = replicate_rest(model, mesh["tp"])
        info["local_heads"] = spec.extra["n_heads"] // tp
    if opts["dp_shard"] == "fsdp":
        apply_fsdp(model, spec, cfg, mesh["dp"], opts["shard"], opts["mixed_precision"])
        module, no_sync = model, fsdp_no_sync(model)
        info["dp_impl"] = "fsdp2"
    elif tp == 1:
        module = DDP(model, device_ids=[denv.local_rank] if denv.device.type == "cuda" else None,
                     process_group=dp_group)
        no_sync = module.no_sync
        info["dp_impl"] = "ddp"
    else:
        module = model
        no_sync = _grad_allreduce_hooks(list(model.parameters()), dp_group, dp) if dp > 1 else contextlib.nullcontext
        info["dp_impl"] = "per-parameter all-reduce hooks" if dp > 1 else "none"
    optimizer = make_optimizer(module.parameters(), spec, cfg, denv.device)
    return Parallelized(module=module, optimizer=optimizer, dp_size=dp, dp_group=dp_group, no_sync=no_sync,
                        info=info)
