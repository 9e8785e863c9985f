"""`hybrid`: data x tensor x pipeline parallelism on one DeviceMesh, in any combination.

The degrees form a ``ParallelDims`` (``_mesh.py``): validated once (their product must be the world
size; the error names it) and built into one mesh, ranks laid out with tp fastest (a
tensor-parallel group is consecutive ranks, i.e. the GPUs of one node's NVLink domain), then pp,
then dp. Options:

* ``dp``, ``tp``, ``pp``: the degrees; ``dp`` may be left out (it is then world / (tp * pp));
  ``tp`` and ``pp`` default to 1.
* ``dp_shard``: what the data-parallel dimension does: ``ddp`` (default: replicas, gradients
  averaged) or ``fsdp`` (FSDP2 over the dp dimension: parameters, gradients and optimizer state
  sharded across the replicas; with tp > 1 this is torch's "2-D" FSDP + TP, with pp > 1 too "3-D").
* ``shard`` (``zero3``/``zero2``) and ``mixed_precision``: as for fsdp, when dp_shard=fsdp.
* ``sequence_parallel``: as for tensor, when tp > 1.
* ``schedule``, ``microbatches``, ``virtual``, ``balance``: as for pipeline, when pp > 1.

How the dimensions combine (torchtitan's order: split into stages, then tensor parallel, then
FSDP):

* pp > 1: the model is split into this rank's pipeline stages (as ``pipeline``, one pipeline per
  (dp, tp) coordinate); then each stage's blocks are sharded over tp (as ``tensor``, with the
  stage's embedding/head parameters replicated DTensors) and, with ``dp_shard=fsdp``, each block
  and the stage are ``fully_shard``-ed over dp (torch's PipelineStage runs FSDP's gradient
  reduction once per schedule step). With ``dp_shard=ddp`` the step averages the gradients over
  dp after each schedule run (one flat all-reduce per dtype, not overlapped). Tied embeddings on
  the first and last stage have their gradients summed between them, as in ``pipeline``.
* pp = 1: TP inside each replica (as ``tensor``), then the dp dimension: with ``dp_shard=fsdp``
  FSDP2 on the dp sub-mesh per block and root; with ``ddp`` torch's DistributedDataParallel when
  tp = 1, and for tp > 1 (DDP does not take DTensor parameters) each gradient is all-reduced over
  the dp group as soon as it is accumulated (a per-parameter hook, no buckets: slower than DDP's
  bucketing, same arithmetic).
"""
from __future__ import annotations

import contextlib

import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import ConfigError
from dlscale.models import get_model
from dlscale.planner.layout import Layout
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import is_transformer, parse_option_dict, parse_options
from dlscale.strategies._mesh import ParallelDims, ParallelMesh
from dlscale.strategies.fsdp import CHOICES as FSDP_CHOICES, Units, apply_fsdp, fsdp_no_sync
from dlscale.strategies.pipeline import (
    CHOICES as PP_CHOICES, PipelineJob, PipelinePlace, PipelineShape, build_pipeline,
    validate_pipeline,
)
from dlscale.strategies.tensor import apply_tensor_parallel, replicate_rest, validate_tp

OPTIONS = {"dp": None, "tp": 1, "pp": 1, "dp_shard": "ddp", "shard": "zero3", "mixed_precision": True,
           "sequence_parallel": False, "schedule": "1f1b", "microbatches": 4, "virtual": 2,
           "balance": "time"}
CHOICES = {"dp_shard": ("ddp", "fsdp"), **FSDP_CHOICES, **PP_CHOICES}


def options(cfg) -> dict:
    opts = parse_options("hybrid", cfg, OPTIONS, CHOICES)
    dims = parallel_dims(cfg.world_size, cfg.nnodes, opts)
    opts["dp"] = dims.dp
    spec = get_model(cfg.model, cfg.flavor)
    if dims.tp > 1:
        validate_tp("hybrid", cfg, spec, dims.tp, opts["sequence_parallel"])
    if dims.pp > 1:
        validate_pipeline("hybrid", cfg, spec, dims.pp, PipelineShape.of(opts))
    return opts


DEGREES = ("dp", "tp", "pp", "dp_shard")


def parallel_dims(world: int, nnodes: int, given: dict) -> ParallelDims:
    """The job's degrees from hybrid's options (dp defaults to world / (tp x pp)); the other
    options are not read (a record's may be of an older spelling)."""
    opts = parse_option_dict("hybrid", {k: v for k, v in given.items() if k in DEGREES},
                             {k: OPTIONS[k] for k in DEGREES}, CHOICES)
    tp, pp = opts["tp"], opts["pp"]
    ctx = f"nnodes {nnodes} x nproc-per-node {world // max(1, nnodes)}"
    for k in ("tp", "pp"):
        if isinstance(opts[k], bool) or opts[k] < 1:
            raise ConfigError(f"hybrid {k} must be >= 1, got {opts[k]}")
    dp = opts["dp"]
    if dp is None:
        if world % (tp * pp):
            raise ConfigError(f"hybrid degrees tp {tp} x pp {pp} = {tp * pp} do not divide the world size {world} "
                              f"({ctx})")
        dp = world // (tp * pp)
    if dp < 1:
        raise ConfigError(f"hybrid dp must be >= 1, got {dp}")
    fsdp = opts["dp_shard"] == "fsdp"
    return ParallelDims(world, dp_replicate=1 if fsdp else dp, dp_shard=dp if fsdp else 1, pp=pp, tp=tp,
                        where="hybrid", context=ctx,
                        labels=(("dp_shard" if fsdp else "dp_replicate", "dp"), ("pp", "pp"), ("tp", "tp")))


def check(cfg, env) -> str | None:
    opts = options(cfg)
    spec = get_model(cfg.model, cfg.flavor)
    if opts["tp"] > 1 and not is_transformer(spec):
        return f"hybrid tp {opts['tp']}: tensor parallelism splits transformer blocks; {cfg.model} has no such plan"
    return None


def _grad_allreduce_hooks(params, group, n: int):
    """Average each gradient over ``group`` once it is accumulated; returns a no_sync context."""
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


def memory_layout(dims: ParallelDims, o: dict):
    fsdp, tp, pp = o.get("dp_shard") == "fsdp", dims.tp, dims.pp
    return Layout("hybrid", dims, zero=(2 if o.get("shard") == "zero2" else 3) if fsdp else 0,
                  sequence_parallel=bool(o.get("sequence_parallel")),
                  microbatches=int(o.get("microbatches", 4)) if pp > 1 else 1, schedule=o.get("schedule", "1f1b"),
                  persistent_grads=not fsdp and tp == pp == 1,
                  fsdp_params_bf16=fsdp and bool(o.get("mixed_precision", True)), options=o)


@register_strategy("hybrid", description="dp x tp x pp on a DeviceMesh (-o dp=N -o tp=M -o pp=K, -o dp_shard=fsdp)",
                   hooks=Hooks(check=check, validate=options, dims=parallel_dims, memory_layout=memory_layout),
                   caps=Capabilities(checkpoint_saves=True))
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    dims = parallel_dims(cfg.world_size, cfg.nnodes, opts)
    pm = ParallelMesh.build(dims, denv.device.type)
    fsdp = opts["dp_shard"] == "fsdp"
    info = {**pm.info(), "options": opts}
    if dims.tp > 1:
        info["local_heads"] = spec.arch.n_heads // dims.tp
    if dims.pp > 1:
        return _pipeline(model, spec, cfg, denv, opts, pm, info)
    if dims.tp > 1:
        apply_tensor_parallel(spec.blocks(model), spec, pm["tp"], opts["sequence_parallel"])
        info["replicated_params"] = replicate_rest(model, pm["tp"])
    dp = dims.dp
    if fsdp:
        apply_fsdp(model, spec, cfg, pm.fsdp_mesh, Units.of(opts))
        module, no_sync = model, fsdp_no_sync(model)
        info["dp_impl"] = "fsdp2"
    elif dims.tp == 1:
        module = DDP(model, device_ids=[denv.local_rank] if denv.device.type == "cuda" else None,
                     process_group=pm.dp_group)
        no_sync = module.no_sync
        info["dp_impl"] = "ddp"
    else:
        module = model
        no_sync = _grad_allreduce_hooks(list(model.parameters()), pm.dp_group, dp) if dp > 1 else contextlib.nullcontext
        info["dp_impl"] = "per-parameter all-reduce hooks" if dp > 1 else "none"
    optimizer = make_optimizer(module.parameters(), spec, cfg, denv.device)
    return Parallelized(module=module, optimizer=optimizer, dp_size=dp, dp_group=pm.dp_group, no_sync=no_sync,
                        dp_rank=pm.dp_rank, info=info)


def _pipeline(model, spec, cfg, denv, opts, pm, info) -> Parallelized:
    """pp > 1: this rank's stages, each sharded over tp and (dp_shard=fsdp) over dp."""
    dims = pm.dims
    fsdp = opts["dp_shard"] == "fsdp"

    def prepare_stage(stage) -> None:
        if dims.tp > 1:
            apply_tensor_parallel(list(stage.blocks), spec, pm["tp"], opts["sequence_parallel"])
            replicate_rest(stage, pm["tp"])
        if fsdp:
            head = list(stage.shell.children()) if stage.last else []
            apply_fsdp(stage, spec, cfg, pm.fsdp_mesh, Units.of(opts), blocks=list(stage.blocks), units_first=head)

    info["dp_impl"] = "fsdp2 per stage" if fsdp else ("all-reduce after each step" if dims.dp > 1 else "none")
    job = PipelineJob(PipelineShape.of(opts), PipelinePlace.of_mesh(pm), name="hybrid", dp_reduced=fsdp,
                      prepare_stage=prepare_stage if (dims.tp > 1 or fsdp) else None, extra_info=info)
    return build_pipeline(model, spec, cfg, denv, job)
