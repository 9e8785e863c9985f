"""`ddp`: torch DistributedDataParallel, one replica per process, gradients all-reduced in buckets.

Options (``strategy_options``): ``bucket_cap_mb`` (default 25, DDP's own), ``gradient_as_bucket_view``
(default True: gradients live in the communication buckets, saving a copy and memory),
``broadcast_buffers`` (default True, DDP's own: BatchNorm buffers follow rank 0),
``static_graph`` (default False), ``comm_hook`` (default ``none``: fp32 gradients are all-reduced
as they are; ``bf16``/``fp16``: torch's compression hooks, which all-reduce each bucket in half
precision and cast back, halving the bytes on the wire at the cost of rounding the averaged
gradients; the record says which ran), ``compiled_autograd`` (default False; with ``--compile`` only:
torch's compiled autograd traces the whole backward, DDP's all-reduces included, into one compiled
graph, with DDP's Python reducer (dynamo's ``optimize_ddp="python_reducer"``) in place of the C++
reducer's per-gradient hooks and of DDPOptimizer's graph cuts at bucket boundaries; inductor buckets
the all-reduces by ``bucket_cap_mb`` and places them), ``optimizer_in_backward`` (default False: the
model's optimizer steps each bucket's parameters as soon as that bucket's all-reduce is queued,
inside the backward (a comm hook: DDP's default all-reduce of the bucket, then torch's functional
AdamW/SGD over the bucket's parameters, one fused call per bucket on CUDA as the model's optimizer
would make), so nothing is left between the backward's last kernel and the next forward but the last
bucket's update; the step's ``optimizer.step()`` does nothing. The update runs on the streams
torch gives a CUDA future's callback (from its pool, made to wait for the bucket's all-reduce),
beside the backward's kernels. Measured slower, not faster (GPT-2, 2 H200s: 0.965 of default;
not profiled). Not with gradient accumulation, gradient clipping, amp-fp16's
loss scaling, a comm_hook or compiled_autograd.)
"""
import contextlib
import functools

import torch

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.adamw import adamw
from torch.optim.sgd import sgd

from dlscale import ConfigError
from dlscale.planner.layout import Layout
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.train.compiling import inductor_options, uses_cudagraphs

OPTIONS = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True, "broadcast_buffers": True,
           "static_graph": False, "comm_hook": "none", "compiled_autograd": False, "optimizer_in_backward": False}
COMM_HOOKS = ("none", "bf16", "fp16")


def options(cfg) -> dict:
    opts = parse_options("ddp", cfg, OPTIONS, {"comm_hook": COMM_HOOKS})
    if opts["bucket_cap_mb"] <= 0:
        raise ConfigError(f"strategy ddp option bucket_cap_mb must be > 0, got {opts['bucket_cap_mb']}")
    if opts["compiled_autograd"]:
        if not cfg.compile:
            raise ConfigError("strategy ddp option compiled_autograd needs --compile (it compiles the backward "
                              "that torch.compile's forward graph leaves to eager autograd)")
        if opts["comm_hook"] != "none":
            raise ConfigError("strategy ddp option compiled_autograd runs DDP's Python reducer, which takes no "
                              f"comm_hook; got comm_hook={opts['comm_hook']} (allowed with it: none)")
        if uses_cudagraphs(cfg):
            raise ConfigError(f"strategy ddp option compiled_autograd puts the all-reduces inside the compiled "
                              f"graph, which CUDA graphs cannot hold; compile-mode {cfg.compile_mode} captures "
                              "them: use compile-mode default or max-autotune-no-cudagraphs")
    if opts["optimizer_in_backward"]:
        # each bucket's update runs once its all-reduce is queued: nothing may need the whole
        # gradient first (a global norm, an inf check) or several backwards' sum (torch refuses no_sync)
        bad = [what for what, on in (("comm_hook " + opts["comm_hook"], opts["comm_hook"] != "none"),
                                     ("compiled_autograd", opts["compiled_autograd"]),
                                     (f"grad-accum {cfg.grad_accum}", cfg.grad_accum > 1),
                                     ("clip-grad-norm", cfg.clip_grad_norm is not None),
                                     ("precision amp-fp16 (loss scaling)", cfg.precision == "amp-fp16"),
                                     ("optimizer-graph (the step replayed after the backward)",
                                      cfg.optimizer_graph)) if on]
        if bad:
            raise ConfigError(f"strategy ddp option optimizer_in_backward steps each bucket inside the backward; "
                              f"it does not go with {', '.join(bad)} (each needs the whole gradient, or several "
                              f"backwards, before the step)")
    return opts


def check(cfg, env) -> str | None:
    if options(cfg)["comm_hook"] == "bf16" and env.get("device_type") != "cuda":
        return "ddp comm_hook=bf16 needs CUDA and NCCL (torch's bf16 hook refuses gloo); on the CPU use fp16 or none"
    return None


def memory_layout(dims, opts: dict):
    return Layout("ddp", dims, persistent_grads=True)  # the buckets hold the gradients


# CUDA graphs: DDP's all-reduce runs in autograd hooks, outside the compiled region
@register_strategy("ddp", description="DistributedDataParallel (all-reduce of gradient buckets)",
                   hooks=Hooks(check=check, validate=options, memory_layout=memory_layout),
                   caps=Capabilities(cudagraph_safe=True, optimizer_graph=True, solo_steps=True, checkpoint_saves=True))
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    # broadcast_buffers is passed only when off: torch 2.13 deprecates the argument, 2.11 lacks its successor
    extra = {} if opts["broadcast_buffers"] else {"broadcast_buffers": False}
    backward_context = contextlib.nullcontext
    if opts["compiled_autograd"]:
        # read by DDP's constructor (python reducer or C++ reducer) and by dynamo when it compiles
        torch._dynamo.config.optimize_ddp = "python_reducer"
        backward_context = _compiled_autograd(cfg)
    ddp = DDP(model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None,
              bucket_cap_mb=opts["bucket_cap_mb"], gradient_as_bucket_view=opts["gradient_as_bucket_view"],
              static_graph=opts["static_graph"], **extra)
    if opts["comm_hook"] != "none":
        hook = {"bf16": default_hooks.bf16_compress_hook, "fp16": default_hooks.fp16_compress_hook}
        ddp.register_comm_hook(state=None, hook=hook[opts["comm_hook"]])
    opt = make_optimizer(ddp.parameters(), spec, cfg, dist.device)
    if opts["optimizer_in_backward"]:
        opt = _in_backward(ddp, opt)
    return Parallelized(module=ddp, optimizer=opt, dp_size=dist.world_size, no_sync=ddp.no_sync,
                        backward_context=backward_context, dp_rank=dist.rank, info={**opts})


class _StepInBackward:
    """What the training step calls ``optimizer``: its ``step()`` is empty (``_BucketUpdate`` has
    updated every bucket during the backward); ``zero_grad`` and ``param_groups`` are the model's
    optimizer's, which never steps."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.inner, self.param_groups, self.state = opt, opt.param_groups, opt.state

    def step(self, closure=None) -> None:
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)


def _in_backward(ddp, opt: torch.optim.Optimizer) -> _StepInBackward:
    """Register a comm hook that all-reduces each bucket as DDP would and then applies ``opt``'s
    update to that bucket's parameters; the step's optimizer becomes a no-op."""
    ddp.register_comm_hook(state=None, hook=_BucketUpdate(opt).hook)
    return _StepInBackward(opt)


class _BucketUpdate:
    """DDP comm hook: the bucket's all-reduce (DDP's default: sum, divided by the group size), then
    ``opt``'s update of the bucket's parameters by torch's functional optimizer: one fused (or
    foreach) call per bucket with the hyper-parameters read from ``opt``'s group at each call. The
    state (moments, momentum, steps) lives here, laid out as ``opt`` would hold it; ``opt`` never
    steps. torch's own ``DDP._register_fused_optim`` updates parameter by parameter and keeps its step
    counts on the host, which its fused AdamW refuses."""

    def __init__(self, opt: torch.optim.Optimizer):
        self.opt, self.kind, self.state = opt, type(opt).__name__, {}
        if self.kind not in ("AdamW", "SGD") or len(opt.param_groups) != 1:
            raise ConfigError(f"strategy ddp option optimizer_in_backward supports one AdamW or SGD parameter "
                              f"group, got {self.kind} with {len(opt.param_groups)}")

    def hook(self, state, bucket):
        fut = default_hooks.allreduce_hook(None, bucket)

        def update(fut):
            self.step(bucket.parameters(), bucket.gradients())
            return fut.value()

        return fut.then(update)

    def step(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        g = self.opt.param_groups[0]
        fused, foreach = bool(g.get("fused")), g.get("foreach")
        with torch.no_grad():
            if self.kind == "SGD":
                bufs = [self.state.get(p) for p in params]
                sgd(params, grads, bufs, foreach=foreach, fused=fused or None,
                    weight_decay=g["weight_decay"], momentum=g["momentum"], lr=g["lr"],
                    dampening=g["dampening"], nesterov=g["nesterov"], maximize=g["maximize"])
                self.state.update(zip(params, bufs))  # the first call fills the momentum buffers in
                return
            for p in params:
                if p not in self.state:
                    # as torch.optim.AdamW: the step count on the device when fused, else on the host
                    step = torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu")
                    self.state[p] = (torch.zeros_like(p, memory_format=torch.preserve_format),
                                     torch.zeros_like(p, memory_format=torch.preserve_format), step)
            m, v, steps = (list(x) for x in zip(*(self.state[p] for p in params)))
            beta1, beta2 = g["betas"]
            adamw(params, grads, m, v, [], steps, foreach=foreach, fused=fused or None,
                  amsgrad=False, beta1=beta1, beta2=beta2, lr=g["lr"],
                  weight_decay=g["weight_decay"], eps=g["eps"], maximize=g["maximize"])


def _compiled_autograd(cfg):
    """A context manager for the backward: compiled autograd with torch.compile (the case's inductor
    options), one compiler for every step (its graphs are cached after the first)."""
    from torch._dynamo import compiled_autograd  # torch: dynamo is a second to import; only this option needs it

    compiler = torch.compile(options=inductor_options(cfg) or None)
    return functools.partial(compiled_autograd._enable, compiler)
