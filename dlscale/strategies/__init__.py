"""Strategy registry.

A strategy is one function in one file, registered by name:

    @register_strategy("ddp", description="DistributedDataParallel", hooks=Hooks(...), caps=Capabilities(...))
    def parallelize(model, spec, cfg, dist) -> Parallelized: ...

It receives the model already on its device, and returns what the worker trains: the module
to call (``module(*batch) -> loss``), its optimizer, the data-parallel degree (how many
different micro-batches one step consumes), and optionally its own ``step`` for strategies
whose step is not forward/backward/optimizer (pipelining).

Beside it the strategy declares its ``Hooks`` (``check(cfg, env)``: None when it can run, or
the reason it cannot, recorded ``unsupported`` without starting processes; ``validate(cfg)``:
ConfigError for impossible options, before any process starts; ``dims``: the job's
``ParallelDims``, the one place its degrees are derived; ``memory_layout``; ``model_spec``) and
its ``Capabilities`` (what it can do: precisions, clipping, compiling, activation checkpointing,
CUDA graphs), which the rest of the package reads instead of testing strategy names.
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from dlscale import ConfigError
from dlscale.models import get_model
from dlscale.planner.layout import Layout, ParallelDims
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


@dataclass(frozen=True)
class Capabilities:
    """What a strategy can do, declared next to its code: the registry and the checks read these,
    nothing tests a strategy's name."""

    min_world: int = 1
    # one process drives all nproc-per-node devices (nn.DataParallel): the launcher starts one
    single_process: bool = False
    # the precisions it trains in (None: every one); others are recorded unsupported
    precisions: tuple[str, ...] | None = None
    # its compiled region holds no collective of its own, so torch.compile may run it as CUDA graphs
    cudagraph_safe: bool = False
    # its gradients stay at fixed addresses from step to step, so --optimizer-graph may capture the step
    optimizer_graph: bool = False
    # its forward and backward under no_sync run no collective: per-rank solo steps time the rank alone
    solo_steps: bool = False
    # a torch module and optimizer that DCP's state_dict API takes: --checkpoint-every saves it
    checkpoint_saves: bool = False
    # why it does not do what a case asks ("": it does); a case asking for it is recorded unsupported
    # (clipping, compiling) or refused before launch (activation checkpointing)
    no_clip: str = ""
    no_compile: str = ""
    no_checkpointing: str = ""


def replicated(world: int, nnodes: int, opts: dict) -> ParallelDims:
    """Degrees of a job of data-parallel replicas only (the default)."""
    return ParallelDims(world, dp_replicate=world)


def sharded(world: int, nnodes: int, opts: dict) -> ParallelDims:
    """Degrees of a job that shards parameters, gradients and optimizer state over all ranks."""
    return ParallelDims(world, dp_shard=world)


def staged(world: int, nnodes: int, opts: dict) -> ParallelDims:
    """Degrees of a job that is one pipeline over all ranks."""
    return ParallelDims(world, pp=world)


@dataclass(frozen=True)
class Hooks:
    """A strategy's functions beside ``parallelize``, each optional but ``dims``."""

    # check(cfg, env) -> why the case cannot run here (recorded ``unsupported``), or None
    check: Callable[[Any, dict], str | None] | None = None
    # validate(cfg): ConfigError for impossible options or degrees, before any process starts
    validate: Callable[[Any], None] | None = None
    # model_spec(spec, cfg) -> the spec this strategy trains (its options may resize the model)
    model_spec: Callable[[Any, Any], Any] | None = None
    # dims(world, nnodes, options) -> the job's ParallelDims (its degrees, the one place they are derived)
    dims: Callable[[int, int, dict], ParallelDims] = replicated
    # memory_layout(dims, options) -> dlscale.planner.layout.Layout: how it spreads the model state over
    # devices (the memory planner and the plan's check against a run)
    memory_layout: Callable[[ParallelDims, dict], Layout] | None = None


@dataclass(frozen=True)
class StrategyInfo:
    name: str
    fn: Callable[..., Parallelized]
    description: str
    hooks: Hooks = Hooks()
    caps: Capabilities = Capabilities()

    @property
    def check(self):
        return self.hooks.check

    @property
    def validate(self):
        return self.hooks.validate

    @property
    def model_spec(self):
        return self.hooks.model_spec

    @property
    def min_world(self) -> int:
        return self.caps.min_world

    @property
    def single_process(self) -> bool:
        return self.caps.single_process

    @property
    def cudagraph_safe(self) -> bool:
        return self.caps.cudagraph_safe

    @property
    def precisions(self) -> tuple[str, ...] | None:
        return self.caps.precisions

    def dims(self, world: int, nnodes: int = 1, options: dict | None = None) -> ParallelDims:
        """The degrees of this strategy's job on ``world`` processes (ConfigError when impossible)."""
        return self.hooks.dims(world, nnodes, dict(options or {}))

    def parallel_dims(self, cfg) -> ParallelDims:
        """The degrees of one case's job."""
        return self.dims(cfg.world_size, cfg.nnodes, cfg.strategy_options)

    def layout(self, world: int, nnodes: int, options: dict | None = None) -> Layout:
        """How the job spreads the model state over its devices (the memory plan's Layout)."""
        if self.hooks.memory_layout is None:
            raise ConfigError(f"no memory plan for strategy {self.name!r}")
        opts = dict(options or {})
        return self.hooks.memory_layout(self.hooks.dims(world, nnodes, opts), opts)

    @property
    def memory_layout(self) -> Callable[[int, int, dict], Layout] | None:
        """``layout`` where the strategy declares one, else None."""
        return self.layout if self.hooks.memory_layout is not None else None

    def unsupported(self, cfg, env: dict) -> str | None:
        """Why the strategy cannot run this case here (recorded ``unsupported``), or None."""
        caps = self.caps
        if caps.precisions is not None and cfg.precision not in caps.precisions:
            return f"strategy {self.name} runs {' or '.join(caps.precisions)}, not {cfg.precision}"
        reason = self.hooks.check(cfg, env) if self.hooks.check else None
        if reason is None and caps.no_clip and cfg.clip_grad_norm is not None:
            reason = f"{self.name} does not clip gradients ({caps.no_clip})"
        if reason is None and caps.no_compile and cfg.compile:
            reason = f"{self.name} is not compiled ({caps.no_compile})"
        return reason


_STRATEGIES: Registry[StrategyInfo] = Registry("strategy", __name__)


def register_strategy(name: str, description: str = "", hooks: Hooks = Hooks(), caps: Capabilities = Capabilities()):
    """Decorator registering ``fn(model, spec, cfg, dist) -> Parallelized`` under ``name``, with the
    strategy's hooks and capabilities (StrategyInfo)."""

    def deco(fn):
        _STRATEGIES.add(name, StrategyInfo(name, fn, description or (fn.__doc__ or "").strip().split("\n")[0],
                                           hooks, caps))
        return fn

    return deco


def strategy_names() -> list[str]:
    return _STRATEGIES.names()


def has_strategy(name: str) -> bool:
    return _STRATEGIES.has(name)


def get_strategy(name: str) -> StrategyInfo:
    return _STRATEGIES.get(name)


def resolve_spec(cfg):
    """The model a case trains: its registered flavour, resized by the strategy where it says so."""
    spec = get_model(cfg.model, cfg.flavor)
    hook = get_strategy(cfg.strategy).model_spec
    return hook(spec, cfg) if hook is not None else spec


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor, without importing DTensor's module (most of a second) where no
    strategy of the process has: then nothing can be one."""
    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(t, mod.DTensor)


def make_optimizer(params, spec, cfg, device: torch.device) -> torch.optim.Optimizer:
    """The model's default optimizer: AdamW or SGD with momentum, fused on CUDA (foreach on CPU)."""
    params = [p for p in params if p.requires_grad]
    if spec.optimizer == "sgd":
        # fused: one kernel pass over parameters, gradients and momentum; DTensor has no fused SGD
        fused = device.type == "cuda" and not any(is_dtensor(p) for p in params)
        return torch.optim.SGD(params, lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay,
                               fused=fused or None, foreach=None if fused else True)
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95),
                             fused=fused or None, foreach=None if fused else True)
