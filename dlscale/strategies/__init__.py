"""Strategy registry.

A strategy is one function in one file, registered by name:

    @register_strategy("ddp", description="DistributedDataParallel")
    def parallelize(model, spec, cfg, dist) -> Parallelized: ...

It receives the model already on its device, and returns what the worker trains: the module
to call (``module(*batch) -> loss``), its optimizer, the data-parallel degree (how many
different micro-batches one step consumes), and optionally its own ``step`` for strategies
whose step is not forward/backward/optimizer (pipelining).

``check(cfg, env)`` returns None when the strategy can run, or the reason it cannot: the
launcher records such a case ``unsupported`` without starting processes.
``validate(cfg)`` raises ConfigError for impossible degrees, before any process starts.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from dlscale.registry import Registry


@dataclass
class DistEnv:
    """What a worker knows about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str  # "nccl" or "gloo"


@dataclass
class Parallelized:
    module: nn.Module
    optimizer: torch.optim.Optimizer
    dp_size: int  # micro-batches consumed per step across the job
    dp_group: Any = None  # process group of the data-parallel replicas (None: the whole world)
    # context manager that suppresses gradient synchronisation (grad accumulation, no_sync runs)
    no_sync: Callable[[], Any] = contextlib.nullcontext
    # context manager around every backward call (ddp compiled_autograd: the backward traced and compiled)
    backward_context: Callable[[], Any] = contextlib.nullcontext
    # optional custom step(batch) -> loss tensor (pipeline schedules); None = standard step
    step: Callable[[tuple], torch.Tensor] | None = None
    # does this rank compute the loss value the worker reports? (pipeline: last stage only)
    reports_loss: bool = True
    # with a custom step: the trained model's loss on one micro-batch, forward only (loss_after)
    eval_loss: Callable[[tuple], torch.Tensor] | None = None
    dp_rank: int = 0  # which data-parallel slice of the global batch this rank trains on
    devices_per_process: int = 1  # nn.DataParallel: one process feeds every device of its node
    loss_global: bool = False  # the step's loss is already the global batch's (pipelines): not averaged again
    # what the record keeps of the strategy (its options, degrees, ranks): descriptive only
    info: dict[str, Any] = field(default_factory=dict)
    # called once after a successful training loop, on every rank (torch.distributed.rpc's shutdown)
    teardown: Callable[[], None] | None = None

    def record_info(self) -> dict[str, Any]:
        """``strategy_info`` as records keep it: the typed fields that describe the run, then ``info``."""
        out: dict[str, Any] = {"dp_rank": self.dp_rank}
        if self.devices_per_process != 1:
            out["devices_per_process"] = self.devices_per_process
        if self.loss_global:
            out["loss_global"] = True
        return {**out, **self.info}


@dataclass
class StrategyInfo:
    name: str
    fn: Callable[..., Parallelized]
    description: str
    check: Callable[[Any, dict], str | None] | None = None
    validate: Callable[[Any], None] | None = None
    min_world: int = 1
    # one process drives all nproc-per-node devices (nn.DataParallel): the launcher starts one
    single_process: bool = False
    # model_spec(spec, cfg) -> the spec this strategy trains (its options may resize the model)
    model_spec: Callable[[Any, Any], Any] | None = None
    # capabilities, declared next to the strategy's code:
    # its compiled region holds no collective of its own, so torch.compile may run it as CUDA graphs
    cudagraph_safe: bool = False
    # the precisions it trains in (None: every one); others are recorded unsupported
    precisions: tuple[str, ...] | None = None
    # memory_layout(world, nnodes, options) -> dlscale.layout.Layout: how it spreads the model
    # state over devices (the memory planner and the plan's check against a run)
    memory_layout: Callable[[int, int, dict], Any] | None = None

    def unsupported(self, cfg, env: dict) -> str | None:
        """Why the strategy cannot run this case here (recorded ``unsupported``), or None."""
        if self.precisions is not None and cfg.precision not in self.precisions:
            return f"strategy {self.name} runs {' or '.join(self.precisions)}, not {cfg.precision}"
        return self.check(cfg, env) if self.check else None


_STRATEGIES: Registry[StrategyInfo] = Registry("strategy", __name__)


def register_strategy(name: str, description: str = "", check=None, validate=None, min_world: int = 1,
                      single_process: bool = False, model_spec=None, cudagraph_safe: bool = False,
                      precisions: tuple[str, ...] | None = None, memory_layout=None):
    """Decorator registering ``fn(model, spec, cfg, dist) -> Parallelized`` under ``name``, with the
    strategy's checks and capabilities (StrategyInfo)."""

    def deco(fn):
        _STRATEGIES.add(name, StrategyInfo(name, fn, description or (fn.__doc__ or "").strip().split("\n")[0],
                                       check, validate, min_world, single_process, model_spec, cudagraph_safe,
                                       precisions, memory_layout))
        return fn

    return deco


def strategy_names() -> list[str]:
    return _STRATEGIES.names()


def get_strategy(name: str) -> StrategyInfo:
    return _STRATEGIES.get(name)


def resolve_spec(cfg):
    """The model a case trains: its registered flavour, resized by the strategy where it says so."""
    from dlscale.models import get_model

    spec = get_model(cfg.model, cfg.flavor)
    hook = get_strategy(cfg.strategy).model_spec
    return hook(spec, cfg) if hook is not None else spec


def make_optimizer(params, spec, cfg, device: torch.device) -> torch.optim.Optimizer:
    """The model's default optimizer: AdamW or SGD with momentum, fused on CUDA (foreach on CPU)."""
    params = [p for p in params if p.requires_grad]
    if spec.optimizer == "sgd":
        from torch.distributed.tensor import DTensor

        # fused: one kernel pass over parameters, gradients and momentum; DTensor has no fused SGD
        fused = device.type == "cuda" and not any(isinstance(p, DTensor) for p in params)
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay,
                               fused=fused or None, foreach=None if fused else True)
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95),
                             fused=fused or None, foreach=None if fused else True)
