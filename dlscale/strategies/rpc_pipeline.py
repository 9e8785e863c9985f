"""`rpc-pipeline`: a pipeline over ``torch.distributed.rpc`` with micro-batches (PyTorch's RPC tutorial design).

PyTorch's "Distributed Pipeline Parallelism Using RPC" tutorial, on dlscale's stages: the model
is split by blocks into one stage per rank exactly as ``pipeline`` splits it (stage 0: ``embed``
and the first blocks, the last stage the last blocks and ``head`` with the loss; ``balance`` as
``pipeline``'s), and rank 0 drives every step:

* inside a distributed-autograd context, for each micro-batch: rank 0 runs stage 0 itself, then
  hands the activation on by RPC (``rpc.remote`` between middle stages, passing RRefs so the
  activations go from stage to stage directly; ``rpc_async`` to the last stage, which returns the
  micro-batch's loss). Calls are asynchronous: while stage 1 works on micro-batch i, rank 0 runs
  stage 0 on micro-batch i+1 (each stage serialises its own calls with a lock);
* one ``dist_autograd.backward`` over the mean of the micro-batch losses (the global batch's
  loss, as the schedule of ``pipeline`` reports it), then a ``DistributedOptimizer`` step: the
  model's own optimizer (AdamW or SGD, same settings) on every stage's parameters;
* tied weights (GPT-2's and BERT's embedding/output) are on the first and the last stage, as
  under ``pipeline``: their gradients in the context are summed over RPC before the step.

The other ranks only serve RPCs: their ``step`` waits until rank 0 says the step is done (so
every rank leaves its window together); only rank 0's step times and losses are recorded, which
is what the record's per-step times are.

RPC gets its own rendezvous on the job's c10d store (``MASTER_ADDR:MASTER_PORT``, under its own
key prefix) and the TensorPipe backend; on CUDA each rank maps its GPU to every peer's
(``device_maps``), so activations go GPU to GPU (CUDA IPC or the network, as TensorPipe picks)
rather than through the host. Options: ``microbatches`` (default 4; must divide
``--batch-size``), ``balance`` (``time``, ``blocks`` or counts, as ``pipeline``). Not with
``--clip-grad-norm``, ``amp-fp16`` or ``--compile`` (recorded unsupported). ``DistributedOptimizer``
gets the model's optimizer eagerly (its TorchScript functional optimizers, deprecated in torch
2.13, refuse the foreach and fused implementations every other strategy uses).
``loss_after`` is not computed (as ``pipeline``).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
from torch import nn
from torch.distributed import rpc
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rendezvous import register_rendezvous_handler
from torch.distributed.rpc import RRef

from dlscale.models import get_model
from dlscale.strategies import Capabilities, Hooks, Parallelized, register_strategy, staged
from dlscale.strategies._common import autocast, optimizer_recipe, parse_options, unique_params
from dlscale.strategies.pipeline import (
    PipelineJob, PipelinePlace, PipelineShape, StageModule, _free_unowned, _split,
    validate_pipeline,
)

NAME = "rpc-pipeline"
OPTIONS = {"microbatches": 4, "balance": "time"}
SCHEME = "dlscalerpc"


def options(cfg) -> dict:
    opts = parse_options(NAME, cfg, OPTIONS)
    validate_pipeline(NAME, cfg, get_model(cfg.model, cfg.flavor), cfg.world_size,
                      PipelineShape("gpipe", opts["microbatches"], 1, opts["balance"]))
    return opts


# ---------------------------------------------------------------- this process's stage (RPC handlers use it)


@dataclass
class _Stage:
    module: StageModule
    cfg: Any
    device: torch.device
    last: bool
    tied: list[nn.Parameter]
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: int = 0  # steps rank 0 has finished
    cond: threading.Condition = field(default_factory=threading.Condition)
    param_rrefs: list = field(default_factory=list)


_STAGE: _Stage | None = None


def _forward(x, labels):
    """RPC handler: this rank's stage on an activation (or an RRef to one); the loss on the last stage."""
    st = _STAGE
    if isinstance(x, RRef):
        x = x.to_here()
    with st.lock, autocast(st.cfg, st.device):  # autocast is per thread: set it in the handler's
        h = st.module(x)
        return st.module.shell.head(h, *labels) if labels is not None else h


def _param_rrefs():
    return _STAGE.param_rrefs


def _tied_grads(ctx_id: int):
    grads = dist_autograd.get_gradients(ctx_id)
    return [grads[p] for p in _STAGE.tied]


def _set_tied_grads(ctx_id: int, values):
    grads = dist_autograd.get_gradients(ctx_id)
    for p, v in zip(_STAGE.tied, values):
        grads[p].copy_(v)  # the context's own gradient tensor: the optimizer step reads it


def _step_done():
    with _STAGE.cond:
        _STAGE.done += 1
        _STAGE.cond.notify_all()


# ---------------------------------------------------------------- RPC start


def _rendezvous(url: str, timeout: timedelta | None = None, **kwargs):
    """The job's c10d store (torchrun's agent store, or rank 0's under srun) under a prefix of
    its own, so RPC needs no second port and a restarted attempt does not read an old one's keys."""
    query = parse_qs(urlparse(url).query)
    rank, world = int(query["rank"][0]), int(query["world_size"][0])
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0 and not agent, multi_tenant=not agent,
                          timeout=timeout or timedelta(seconds=300))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    yield dist.PrefixStore(f"dlscale-rpc-attempt{attempt}", store), rank, world
    raise RuntimeError("rpc-pipeline: no re-rendezvous")


def _start_rpc(denv, timeout_s: float) -> dict:
    try:
        register_rendezvous_handler(SCHEME, _rendezvous)
    except RuntimeError:  # registered by an earlier case in this process
        pass
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"{SCHEME}://", rpc_timeout=timeout_s)
    maps = {}
    if denv.device.type == "cuda":
        devices: list = [None] * denv.world_size
        dist.all_gather_object(devices, denv.local_rank)
        for peer in range(denv.world_size):
            if peer != denv.rank:
                opts.set_device_map(f"stage{peer}", {denv.local_rank: devices[peer]})
                maps[f"stage{peer}"] = {denv.local_rank: devices[peer]}
        opts.set_devices([denv.device])
    rpc.init_rpc(f"stage{denv.rank}", rank=denv.rank, world_size=denv.world_size, rpc_backend_options=opts)
    return maps


def _local_optimizer(params, cls, kwargs):
    """DistributedOptimizer's constructor on each stage: the model's own optimizer, eager.

    Handing DistributedOptimizer a function rather than torch's class keeps it off its
    TorchScript functional optimizers, which refuse foreach and fused implementations (those of
    every other strategy).
    """
    return cls(params, **kwargs)


# ---------------------------------------------------------------- the strategy


@register_strategy(NAME, description="pipeline over torch.distributed.rpc: micro-batches, distributed "
                   "autograd, DistributedOptimizer", hooks=Hooks(validate=options, dims=staged),
                   caps=Capabilities(min_world=2, precisions=("fp32", "amp-bf16"),  # no loss scaler across RPC stages
                                     no_clip="they live in the distributed-autograd context",
                                     no_compile="stages run inside RPC handlers"))
def parallelize(model, spec, cfg, denv):
    global _STAGE

    opts = options(cfg)
    n, rank, device, micro = denv.world_size, denv.rank, denv.device, opts["microbatches"]
    stage, runs, balance_info, tied = _build_stage(model, spec, cfg, denv, opts)
    first, last = rank == 0, rank == n - 1
    params = unique_params([stage])

    maps = _start_rpc(denv, cfg.collective_timeout)
    _STAGE = _Stage(module=stage, cfg=cfg, device=device, last=last, tied=tied if (first or last) else [])
    _STAGE.param_rrefs = [rpc.RRef(p) for p in params]
    dist.barrier()  # every stage registered before rank 0 asks for parameters

    cls, kwargs = optimizer_recipe(spec, cfg, device)
    info = {"pp_rank": rank, "pp": n, "microbatches": micro, "stages": [rank], "num_stages": n,
            "blocks_per_stage": [len(r) for r in runs], **balance_info, "tied_params": len(tied),
            "stage_params": sum(p.numel() for p in params), "transport": "TensorPipe",
            "device_maps": maps or None, "optimizer": f"DistributedOptimizer({cls.__name__})",
            "schedule": "all micro-batches' forwards issued asynchronously, one distributed backward",
            "reported_loss": "the batch's mean (the last accumulation batch's); rank 0 drives, the others serve RPCs",
            "exchange_bytes_per_step": None}
    timeout = cfg.collective_timeout
    teardown = lambda: rpc.shutdown(graceful=True, timeout=timeout)  # noqa: E731
    if not first:
        return Parallelized(module=nn.ModuleList([stage]), optimizer=None, dp_size=1,
                            step=_serve(rank, timeout, device), reports_loss=False, info=info, teardown=teardown)
    drive = _drive(_STAGE, micro, spec.embed_args, _distributed_optimizer(n, cls, kwargs), info)
    return Parallelized(module=nn.ModuleList([stage]), optimizer=None, dp_size=1, step=drive,
                        reports_loss=True, info=info, teardown=teardown)


def _build_stage(model, spec, cfg, denv, opts) -> tuple:
    """This rank's stage (its blocks, with the embedding on the first and the head on the last), the
    blocks of every stage, the balance facts, and the head's parameters tied to the embedding: the
    split of ``pipeline``, one stage per rank."""
    job = PipelineJob(PipelineShape("gpipe", opts["microbatches"], 1, opts["balance"]), PipelinePlace.of_world(denv),
                      name=NAME)
    modules, _, runs, balance_info, (embed_names, head_names) = _split(model, spec, cfg, denv.device, job)
    _free_unowned(model, modules)
    first_params = {id(p) for nm in embed_names for p in getattr(model, nm).parameters()}
    tied = [p for nm in head_names for p in getattr(model, nm).parameters() if id(p) in first_params]
    return modules[0], runs, balance_info, tied


def _serve(rank: int, timeout: float, device):
    """The step of a stage other than the first: it only serves RPCs, and waits until rank 0 finished."""
    seen = {"steps": 0}

    def serve(micro_batches: list[tuple]) -> torch.Tensor:
        seen["steps"] += 1
        with _STAGE.cond:
            if not _STAGE.cond.wait_for(lambda: _STAGE.done >= seen["steps"], timeout=timeout):
                raise TimeoutError(f"{NAME} rank {rank}: rank 0 did not finish step {seen['steps']} "
                                   f"within {timeout} s")
        return torch.zeros((), device=device)

    return serve


def _distributed_optimizer(n: int, cls, kwargs):
    rrefs = list(_STAGE.param_rrefs)
    for peer in range(1, n):
        rrefs += rpc.rpc_sync(f"stage{peer}", _param_rrefs)
    log = logging.getLogger("torch.distributed.optim.optimizer")
    level = log.level
    log.setLevel(logging.ERROR)  # its warning that an eager optimizer may contend for the GIL
    try:
        return DistributedOptimizer(_local_optimizer, rrefs, cls, kwargs)
    finally:
        log.setLevel(level)


def _drive(local: _Stage, micro: int, n_embed: int, optimizer, info: dict):
    """Rank 0's step: every micro-batch's forward issued through the stages asynchronously, then one
    distributed backward and the distributed optimizer's step. ``local``: rank 0's own stage."""
    stage, cfg, device, tied = local.module, local.cfg, local.device, local.tied

    n = info["num_stages"]
    peers = [f"stage{r}" for r in range(1, n)]
    last_name = peers[-1]
    notices: list = []

    def drive(micro_batches: list[tuple]) -> torch.Tensor:
        for f in notices:  # last step's "done" notices (delivered long since)
            f.wait()
        notices.clear()
        sent = 0
        with dist_autograd.context() as ctx:
            futures = []
            for batch in micro_batches:
                chunks = [t.tensor_split(micro) for t in batch]
                for i in range(micro):
                    args = tuple(c[i] for c in chunks[:n_embed])
                    labels = tuple(c[i] for c in chunks[n_embed:])
                    with autocast(cfg, device):
                        h = stage(*args)
                    sent += h.numel() * h.element_size()
                    ref = h
                    for peer in peers[:-1]:
                        ref = rpc.remote(peer, _forward, args=(ref, None))
                    futures.append(rpc.rpc_async(last_name, _forward, args=(ref, labels)))
            losses = [f.wait().float() for f in futures]
            dist_autograd.backward(ctx, [torch.stack(losses).mean()])  # mean over micro-batches and accumulation
            if tied and n > 1:
                grads = dist_autograd.get_gradients(ctx)
                theirs = rpc.rpc_sync(last_name, _tied_grads, args=(ctx,))
                sums = [grads[p] + g for p, g in zip(tied, theirs)]
                for p, s in zip(tied, sums):
                    grads[p].copy_(s)
                rpc.rpc_sync(last_name, _set_tied_grads, args=(ctx, sums))
            optimizer.step(ctx)
        notices.extend(rpc.rpc_async(peer, _step_done) for peer in peers)
        if info["exchange_bytes_per_step"] is None:  # rank 0's activations out; their gradients come back
            info["exchange_bytes_per_step"] = {"max_per_rank": sent, "stage0_activations": sent,
                                               "stage1_gradients": sent}
        # as the worker's own step: the loss of the last accumulation batch
        return torch.stack(losses[-micro:]).detach().mean()

    return drive
