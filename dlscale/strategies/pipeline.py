"""`pipeline`: pipeline parallelism with ``torch.distributed.pipelining`` schedules.

Stages are built by hand from the model's own pieces, split by blocks: stage 0 runs
``model.embed`` and the first blocks, the last stage the last blocks; the loss function given to
the schedule runs ``model.head(h, *labels)`` on the last stage's output, so the loss is exactly
the model's. Blocks are dealt out in contiguous runs as evenly as possible (the first stages get
one more when they do not divide). Which of the model's modules ``embed`` and ``head`` use is
found by running them once (eval mode, one sample) with hooks; everything else is dropped from
each rank, and the parameters this rank does not own are freed.

Tied weights (GPT-2's ``lm_head``/``wte``, BERT's decoder/word embedding) end up on the first
and the last stage: as in Megatron-LM, both copies start equal and their gradients are summed
(all-reduced between the two ranks) before every optimizer step, so they stay equal and the
training is exactly that of the tied model.

Options:

* ``schedule``: ``gpipe`` (all forwards, then all backwards), ``1f1b`` (default; one forward one
  backward in the steady state: at most ``pp`` micro-batches of activations in flight), or
  ``interleaved`` (Interleaved 1F1B: ``virtual`` stages per rank, smaller bubble, more p2p).
* ``microbatches`` (default 4): micro-batches per optimizer step; they must divide
  ``--batch-size``; 1f1b needs at least as many micro-batches as stages.
* ``virtual`` (default 2, interleaved only): stages per rank; ``pp * virtual`` must not exceed
  the number of blocks.
* ``balance`` (default ``time``): how blocks are dealt to stages. ``time``: rank 0 times the
  forward and backward of the embedding, of every block and of the head (with the loss) on one
  micro-batch, and the contiguous split that minimises the slowest stage is broadcast to all
  ranks (as torchgpipe's ``balance_by_time``); the head of a language model (vocabulary
  projection and cross-entropy) costs several blocks, so an even count of blocks leaves the last
  stage the bottleneck. ``blocks``: equal counts of blocks. Or explicit counts, ``8,4``. The
  record's ``strategy_info`` keeps the counts and the timed cost of each stage.

Data: pipelining does not add data parallelism: every rank is handed the same batch of
``--batch-size`` samples (dp_size 1), which the schedule cuts into micro-batches; so a pipeline
run trains exactly what ``single`` trains on ``--batch-size`` (up to BatchNorm, whose statistics
are per micro-batch: resnet50's results then differ from single's as under any micro-batching).

Loss: the schedule's losses live on the last stage; every step all-reduces their mean to all
ranks (one scalar, as trainers do for logging), so the reported loss is the global batch's (with
``--grad-accum``, that of the last accumulated batch, as in the worker's own step).
``loss_after`` (the worker's post-training evaluation) runs one schedule step in eval mode on
micro-batch 0 whose gradients are dropped (``eval_loss``), all-reduced the same way.

amp-fp16: a loss scaler shared by all stages (``_StageScaler``: every stage checks its own
gradients, one all-reduce of the overflow flag makes all skip the same steps). ``--compile``
compiles each block instead of the whole model.
"""
from __future__ import annotations

import copy
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.pipelining import (
    PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor

from dlscale import ConfigError
from dlscale.models import get_model
from dlscale.planner.layout import Layout, ParallelDims, split_blocks
from dlscale.strategies import (
    Capabilities, Hooks, Parallelized, make_optimizer, register_strategy, staged,
)
from dlscale.strategies._common import autocast, parse_options, unique_params
from dlscale.train.compiling import inductor_options
from dlscale.train.precision import needs_grad_scaler

SCHEDULES = ("gpipe", "1f1b", "interleaved")
OPTIONS = {"schedule": "1f1b", "microbatches": 4, "virtual": 2, "balance": "time"}
BALANCE_MODES = ("time", "blocks")
CHOICES = {"schedule": SCHEDULES}


# ---------------------------------------------------------------- configuration


def num_blocks(spec, model=None) -> int:
    n = getattr(spec.arch, "n_blocks", None)
    if n is not None:
        return int(n)
    if spec.blocks is None:
        raise ConfigError(f"{spec.name} has no blocks (spec.blocks) to split into pipeline stages")
    if model is not None:
        return len(spec.blocks(model))
    with torch.random.fork_rng(devices=[]), torch.device("meta"):  # a model may draw its seed when built
        return len(spec.blocks(spec.build()))


def parse_balance(name: str, value, n_stages: int, n_blocks: int) -> str | list[int]:
    """``time``/``blocks``, or explicit blocks per stage (``"8,4"`` or a list) checked against the shape."""
    if isinstance(value, str) and value.lower() in BALANCE_MODES:
        return value.lower()
    items = value if isinstance(value, list) else str(value).replace("+", ",").split(",")
    try:
        counts = [int(x) for x in items]
    except (TypeError, ValueError):
        counts = None
    if counts is None or isinstance(value, bool) or any(isinstance(x, bool) for x in items):
        raise ConfigError(f"{name} balance must be time, blocks or blocks per stage such as 8,4; got {value!r}")
    if len(counts) != n_stages or min(counts) < 1 or sum(counts) != n_blocks:
        raise ConfigError(f"{name} balance {','.join(map(str, counts))} must give each of the {n_stages} stages "
                          f">= 1 block and sum to the model's {n_blocks} blocks")
    return counts


@dataclass(frozen=True)
class PipelineShape:
    """The pipeline's options: schedule, micro-batches per step, stages per rank (interleaved), balance."""

    schedule: str = "1f1b"
    microbatches: int = 4
    virtual: int = 2
    balance: Any = "time"

    @classmethod
    def of(cls, opts: dict) -> "PipelineShape":
        return cls(opts["schedule"], opts["microbatches"], opts["virtual"], opts["balance"])

    def n_stages(self, pp: int) -> int:
        """Stages of the whole pipeline over ``pp`` ranks."""
        return pp * (self.virtual if self.schedule == "interleaved" else 1)


def validate_pipeline(name: str, cfg, spec, pp: int, shape: PipelineShape) -> None:
    """Impossible pipeline shapes, as one-line ConfigErrors before any process starts."""
    schedule, microbatches, virtual = shape.schedule, shape.microbatches, shape.virtual
    if microbatches < 1:
        raise ConfigError(f"{name} microbatches must be >= 1, got {microbatches}")
    if cfg.batch_size % microbatches:
        raise ConfigError(f"{name} microbatches {microbatches} do not divide the batch size {cfg.batch_size}")
    if virtual < 1:
        raise ConfigError(f"{name} virtual must be >= 1, got {virtual}")
    stages = shape.n_stages(pp)
    blocks = num_blocks(spec)
    if stages > blocks:
        what = f"{pp} ranks x {virtual} virtual" if schedule == "interleaved" else f"{pp} ranks"
        raise ConfigError(f"{name}: {stages} pipeline stages ({what}) but {spec.name} ({spec.flavor}) "
                          f"has only {blocks} blocks to split")
    parse_balance(name, shape.balance, stages, blocks)
    if schedule == "1f1b" and microbatches < pp:
        raise ConfigError(f"{name} schedule 1f1b needs microbatches >= stages: got {microbatches} "
                          f"microbatches for {pp} stages")
    if schedule == "interleaved":
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            raise ConfigError(f"{name} schedule interleaved needs microbatches {microbatches} to be a multiple "
                              f"of max(1, microbatches // pp) = {rounds} (pp {pp})")


def options(cfg) -> dict:
    opts = parse_options("pipeline", cfg, OPTIONS, CHOICES)
    validate_pipeline("pipeline", cfg, get_model(cfg.model, cfg.flavor), cfg.world_size, PipelineShape.of(opts))
    return opts


class _StageScaler:
    """Dynamic loss scaling for amp-fp16 across pipeline stages (torch's GradScaler is per process).

    The last stage multiplies each micro-batch loss by the scale; every stage unscales its own
    gradients and checks them for inf/NaN with the ops GradScaler uses; one all-reduce (MAX) of the
    flag over the whole world makes every stage and replica skip the same steps, and the scale
    follows GradScaler's defaults (x0.5 on overflow, x2 after 2000 good steps) identically on all.
    """

    def __init__(self, device: torch.device, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.scale = torch.full((1,), init_scale, dtype=torch.float32, device=device)
        self.growth_tracker = torch.zeros(1, dtype=torch.int32, device=device)
        self.growth_interval = growth_interval

    def unscale_and_check(self, grads: list[torch.Tensor], divisor: float) -> torch.Tensor:
        """grads /= scale x divisor in place; returns the world-wide found-inf flag (1 = skip)."""
        found = torch.zeros(1, dtype=torch.float32, device=self.scale.device)
        if grads:
            inv = (self.scale.double() * divisor).reciprocal().float()
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return found

    def update(self, found: torch.Tensor) -> None:
        torch._amp_update_scale_(self.scale, self.growth_tracker, found, 2.0, 0.5, self.growth_interval)

    def get_scale(self) -> float:
        """The current scale, as GradScaler.get_scale gives it (a host sync)."""
        return float(self.scale.item())

    def get_growth_tracker(self) -> int:
        """Good steps since the scale last changed (a host sync)."""
        return int(self.growth_tracker.item())

    def get_growth_interval(self) -> int:
        return self.growth_interval


def split_by_cost(block_costs: list[float], n_stages: int, first_extra: float = 0.0,
                  last_extra: float = 0.0) -> list[list[int]]:
    """Contiguous runs of blocks (each >= 1) that minimise the costliest stage.

    The first stage also pays ``first_extra`` (the embedding), the last ``last_extra`` (the head
    and loss). Exact, by dynamic programming over (blocks used, stages made): O(S n^2).
    """
    n = len(block_costs)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot split {n} blocks into {n_stages} stages")
    prefix = [0.0]
    for c in block_costs:
        prefix.append(prefix[-1] + c)

    def cost(i: int, j: int, s: int) -> float:  # blocks i..j-1 as stage s
        return (prefix[j] - prefix[i] + (first_extra if s == 0 else 0.0)
                + (last_extra if s == n_stages - 1 else 0.0))

    inf = float("inf")
    # best[s][j]: the smallest max-stage cost of putting blocks 0..j-1 into stages 0..s
    best = [[inf] * (n + 1) for _ in range(n_stages)]
    cut = [[0] * (n + 1) for _ in range(n_stages)]
    for j in range(1, n + 1):
        best[0][j] = cost(0, j, 0)
    for s in range(1, n_stages):
        for j in range(s + 1, n + 1):
            for i in range(s, j):  # stage s = blocks i..j-1
                v = max(best[s - 1][i], cost(i, j, s))
                if v < best[s][j]:
                    best[s][j], cut[s][j] = v, i
    runs, j = [], n
    for s in range(n_stages - 1, 0, -1):
        i = cut[s][j]
        runs.append(list(range(i, j)))
        j = i
    runs.append(list(range(0, j)))
    return runs[::-1]


def runs_from_counts(counts: list[int]) -> list[list[int]]:
    out, start = [], 0
    for c in counts:
        out.append(list(range(start, start + c)))
        start += c
    return out


def time_pieces(model: nn.Module, spec, cfg, device: torch.device, batch_size: int,
                reps: int = 3) -> tuple[float, list[float], float]:
    """Seconds of forward + backward of (embed, each block, head with its loss) on one micro-batch.

    Each piece runs alone on the previous piece's (detached) output with a random output
    gradient; best of ``reps`` after one warm-up. The model comes back as it was: gradients
    dropped, buffers (BatchNorm statistics) and the RNG restored.
    """
    k = spec.embed_args
    batch = spec.make_batch(batch_size, torch.device("cpu"), torch.Generator().manual_seed(0))
    batch = tuple(t.to(device) for t in batch)
    saved = {id(b): b.detach().clone() for b in model.buffers()}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def best_of(fn) -> float:
        fn()
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    def fwd_bwd(piece, x, *rest):
        def fn():
            inp = x.detach().requires_grad_(x.is_floating_point())
            out = piece(inp, *rest)
            if out.dim() == 0:
                out.backward()
            else:
                out.backward(torch.ones_like(out))
        return fn

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), autocast(cfg, device):
        def embed_fn():
            h = model.embed(*batch[:k])
            h.backward(torch.ones_like(h))
        embed = best_of(embed_fn)
        with torch.no_grad():
            h = model.embed(*batch[:k])
        blocks = []
        for b in spec.blocks(model):
            blocks.append(best_of(fwd_bwd(b, h)))
            with torch.no_grad():
                h = b(h)
        head = best_of(fwd_bwd(model.head, h, *batch[k:]))
    for p in model.parameters():
        p.grad = None
    with torch.no_grad():
        for b in model.buffers():
            b.copy_(saved[id(b)])
    return embed, blocks, head


def choose_runs(model, spec, cfg, device, balance, n_stages: int, micro_bs: int) -> tuple[list[list[int]], dict]:
    """The blocks of each stage for ``balance`` and what the record says about the choice."""
    n_blocks = len(spec.blocks(model))
    if isinstance(balance, list):
        return runs_from_counts(balance), {"balance": "given"}
    if balance == "blocks" or n_stages == 1:
        return split_blocks(n_blocks, n_stages), {"balance": "blocks"}
    if n_blocks == n_stages:  # one block per stage is the only split: nothing to time
        return split_blocks(n_blocks, n_stages), {"balance": "time", "stage_cost_ms": None}
    # rank 0 times the pieces and every rank takes its numbers: one split, whatever the jitter
    payload = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        payload[0] = time_pieces(model, spec, cfg, device, micro_bs)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(payload, src=0)
    embed, blocks, head = payload[0]
    runs = split_by_cost(blocks, n_stages, embed, head)
    stage_ms = [1e3 * (sum(blocks[i] for i in r) + (embed if s == 0 else 0) + (head if s == n_stages - 1 else 0))
                for s, r in enumerate(runs)]
    return runs, {"balance": "time", "stage_cost_ms": [round(x, 3) for x in stage_ms],
                  "piece_cost_ms": {"embed": round(1e3 * embed, 3), "blocks": [round(1e3 * b, 3) for b in blocks],
                                    "head": round(1e3 * head, 3)}}


# ---------------------------------------------------------------- stage modules


def _used_children(model: nn.Module, spec, device) -> tuple[set[str], set[str]]:
    """Names of the model's direct children that ``embed`` and ``head`` call (run once, eval, 1 sample)."""
    k = spec.embed_args
    batch = spec.make_batch(2, torch.device("cpu"), torch.Generator().manual_seed(0))
    batch = tuple(t[:2].to(device) for t in batch)
    called: set[str] = set()
    hooks = [child.register_forward_pre_hook(lambda m, a, name=name: called.add(name))
             for name, child in model.named_children()]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            h = model.embed(*batch[:k])
            embed = set(called)
            for b in spec.blocks(model):
                h = b(h)
            called.clear()
            model.head(h, *batch[k:])
            head = set(called)
    finally:
        for hk in hooks:
            hk.remove()
        model.train(was_training)
    return embed, head


def _shell(model: nn.Module, keep: set[str]) -> nn.Module:
    """A shallow copy of ``model`` that holds only the children named in ``keep``.

    Its ``embed``/``head`` methods work as long as they use only those children.
    """
    shell = copy.copy(model)
    shell._modules = {name: m for name, m in model._modules.items() if name in keep}
    shell._parameters = dict(model._parameters)
    shell._buffers = dict(model._buffers)
    shell._forward_hooks = type(model._forward_hooks)()
    shell._forward_pre_hooks = type(model._forward_pre_hooks)()
    return shell


class StageModule(nn.Module):
    """One pipeline stage: [embed] + a run of blocks; the last stage's head runs in ``loss``."""

    def __init__(self, shell: nn.Module | None, blocks: list[nn.Module], first: bool, last: bool, n_embed: int):
        super().__init__()
        self.shell = shell
        self.blocks = nn.ModuleList(blocks)
        self.first, self.last, self.n_embed = first, last, n_embed

    def forward(self, *args):
        h = self.shell.embed(*args) if self.first else args[0]
        for block in self.blocks:
            h = block(h)
        return h


@dataclass
class _Packer:
    """The label tensors of a batch packed into one (B, K) tensor: the schedule takes one target."""

    shapes: list[tuple] = field(default_factory=list)

    def pack(self, labels: tuple) -> torch.Tensor:
        if not labels:
            raise ConfigError("pipeline needs the model's labels after its embed inputs")
        dtypes = {t.dtype for t in labels}
        if len(dtypes) != 1:
            raise ConfigError(f"pipeline packs the labels into one tensor, but they have dtypes {dtypes}")
        self.shapes = [tuple(t.shape[1:]) for t in labels]
        return torch.cat([t.reshape(t.shape[0], -1) for t in labels], dim=1)

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        out, start = [], 0
        for shape in self.shapes:
            n = 1
            for d in shape:
                n *= d
            # a column slice of the packed rows is strided: copy it, heads may .view() their labels
            out.append(packed[:, start:start + n].reshape(packed.shape[0], *shape).contiguous())
            start += n
        return out


# ---------------------------------------------------------------- the builder


@dataclass(frozen=True)
class PipelinePlace:
    """Where this rank's pipeline sits in the job: the degrees, this rank's coordinates and the
    groups. The ``pipeline`` and ``model`` strategies are one pipeline over the world (no mesh)."""

    dims: ParallelDims
    pp_rank: int
    dp_rank: int = 0
    pp_group: Any = None  # this rank's pipeline (None: the world)
    # the global ranks of every pipeline in the job, each in stage order (None: one pipeline of the
    # whole world), needed to create the tied-weight groups
    pp_groups: list[list[int]] | None = None
    dp_group: Any = None  # the replicas of this pipeline, whose gradients the step averages

    @classmethod
    def of_world(cls, denv) -> "PipelinePlace":
        return cls(staged(denv.world_size, 1, {}), pp_rank=denv.rank)

    @classmethod
    def of_mesh(cls, pm) -> "PipelinePlace":
        return cls(pm.dims, pp_rank=pm.pp_rank, dp_rank=pm.dp_rank, pp_group=pm.group("pp"),
                   pp_groups=pm.pipelines(), dp_group=pm.dp_group)


@dataclass
class PipelineJob:
    """What ``build_pipeline`` builds: the shape, this rank's place and how the stages are prepared.

    ``dp_reduced``: the stages reduce their gradients over the replicas themselves (FSDP stages
    reduce-scatter them), the step does not average them again; ``prepare_stage(stage_module)``:
    shards a stage's blocks (tensor parallel, FSDP), applied after the split and before compiling."""

    shape: PipelineShape
    place: PipelinePlace
    name: str = "pipeline"
    dp_reduced: bool = False
    prepare_stage: Callable[[nn.Module], None] | None = None
    extra_info: dict = field(default_factory=dict)


@dataclass
class _LocalStages:
    """This rank's stages of the split model and what their step needs to know of them."""

    modules: list[StageModule]
    ids: list[int]  # their stage numbers
    n_stages: int
    params: list[nn.Parameter]


@dataclass
class _Ties:
    """Weights shared by the first and the last stage (tied embeddings): their gradients are summed."""

    params: list[nn.Parameter] = field(default_factory=list)  # as this rank holds them
    group: Any = None  # the first and last stage's ranks of this pipeline (None: nothing to sum)
    norm_skip: set = field(default_factory=set)  # ids counted on another rank in the gradient norm


def _split(model, spec, cfg, device, job: PipelineJob):
    """(this rank's StageModules and their stage ids, the runs of blocks, the balance's info, the
    embed's and the head's children)."""
    name, shape, place = job.name, job.shape, job.place
    pp_size = place.dims.pp
    n_stages = shape.n_stages(pp_size)
    blocks = spec.blocks(model)
    if n_stages > len(blocks):
        raise ConfigError(f"{name}: {n_stages} stages but only {len(blocks)} blocks")
    balance = parse_balance(name, shape.balance, n_stages, len(blocks))
    runs, balance_info = choose_runs(model, spec, cfg, device, balance, n_stages, cfg.batch_size // shape.microbatches)
    embed_names, head_names = _used_children(model, spec, device)
    block_ids = {id(b) for b in blocks}
    for nm in embed_names | head_names:
        if any(id(m) in block_ids for m in getattr(model, nm).modules()):
            raise ConfigError(f"{name}: {spec.name}.embed/head use the container {nm!r} of its blocks")
    # looped assignment (torch's default): stage s lives on pp rank s % pp_size
    my_stages = [s for s in range(n_stages) if s % pp_size == place.pp_rank]
    modules: list[StageModule] = []
    for s in my_stages:
        first, last = s == 0, s == n_stages - 1
        keep = (embed_names if first else set()) | (head_names if last else set())
        shell = _shell(model, keep) if keep else None
        modules.append(StageModule(shell, [blocks[i] for i in runs[s]], first, last, spec.embed_args))
    return modules, my_stages, runs, balance_info, (embed_names, head_names)


def _ties(model, modules, tied_names, place: PipelinePlace, n_stages: int) -> _Ties:
    """The tied weights as this rank's (prepared) stages hold them, and their group."""
    tied = _resolve_tied(model, tied_names, modules)
    pp_size = place.dims.pp
    tie_ranks = sorted({0, (n_stages - 1) % pp_size})  # pp ranks of the first and the last stage
    group = _tie_group(tie_ranks, place.pp_groups) if tied_names and len(tie_ranks) > 1 else None
    # count each tied weight once in the gradient norm: on the first stage's rank
    return _Ties(tied if place.pp_rank in tie_ranks else [], group,
                 {id(p) for p in tied} if place.pp_rank != 0 else set())


def build_pipeline(model, spec, cfg, denv, job: PipelineJob) -> Parallelized:
    """Stages of this rank, their schedule and a ``step`` for the worker (see ``PipelineJob``)."""
    device, place, shape = denv.device, job.place, job.shape
    modules, my_stages, runs, balance_info, (embed_names, head_names) = _split(model, spec, cfg, device, job)
    n_stages = shape.n_stages(place.dims.pp)
    _free_unowned(model, modules)
    # weights shared by the first and the last stage (tied embeddings), by name: sharding replaces
    # the Parameter objects, the modules stay
    tied_names = _tied_names(model, embed_names, head_names)
    if job.prepare_stage is not None:
        for m in modules:
            job.prepare_stage(m)
    ties = _ties(model, modules, tied_names, place, n_stages)
    if cfg.compile:
        options = inductor_options(cfg) or None  # CUDA graphs were refused before launch
        for m in modules:
            for b in m.blocks:
                b.compile(options=options)
    stages = _LocalStages(modules, my_stages, n_stages, unique_params(modules))
    step = _PipelineStep(cfg, device, spec, job, stages, ties)
    step.prime(spec)
    info = {"pp_rank": place.pp_rank, "pp": place.dims.pp, "schedule": shape.schedule,
            "microbatches": shape.microbatches, "stages": my_stages, "num_stages": n_stages,
            "blocks_per_stage": [len(r) for r in runs], **balance_info, "embed_modules": sorted(embed_names),
            "head_modules": sorted(head_names), "tied_params": len(tied_names),
            "stage_params": sum(p.numel() for p in stages.params),
            "reported_loss": "global batch mean (all-reduced from the last stage every step)"}
    if shape.schedule == "interleaved":
        info["virtual"] = shape.virtual
    info.update(job.extra_info)
    return Parallelized(module=nn.ModuleList(modules), optimizer=step.optimizer, dp_size=place.dims.dp,
                        dp_group=place.dp_group, step=step, reports_loss=True, eval_loss=step.eval_loss,
                        dp_rank=place.dp_rank, loss_global=True, info=info)


def _free_unowned(model: nn.Module, modules: list[StageModule]) -> None:
    """Free what this rank does not run (the worker built the whole model on every device)."""
    mine = {id(p) for m in modules for p in m.parameters()} | {id(b) for m in modules for b in m.buffers()}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in mine:
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)


def _tied_names(model: nn.Module, embed_names: set[str], head_names: set[str]) -> list[tuple[str, str, str, str]]:
    """(embed child, its parameter name, head child, its parameter name) of every parameter the
    embedding and the head share."""
    first = {id(p): (nm, pn) for nm in sorted(embed_names) for pn, p in getattr(model, nm).named_parameters()}
    return [(*first[id(p)], nm, pn) for nm in sorted(head_names) for pn, p in getattr(model, nm).named_parameters()
            if id(p) in first]


def _resolve_tied(model: nn.Module, pairs, modules: list[StageModule]) -> list[nn.Parameter]:
    """The tied parameters as this rank's stages hold them now (after sharding replaced them)."""
    held = {nm for m in modules if m.shell is not None for nm in m.shell._modules}
    out: dict[int, nn.Parameter] = {}
    for e_nm, e_pn, h_nm, h_pn in pairs:
        for nm, pn in ((h_nm, h_pn), (e_nm, e_pn)):
            if nm in held:
                p = getattr(model, nm).get_parameter(pn)
                out[id(p)] = p
                break
    return list(out.values())


def _tie_group(tie_ranks: list[int], pp_groups: list[list[int]] | None):
    """This pipeline's group of its first and last stage ranks (every rank enters new_group for
    every pipeline's pair, in the same order)."""
    mine = None
    for ranks in pp_groups or [list(range(dist.get_world_size()))]:
        g = dist.new_group(ranks=[ranks[r] for r in tie_ranks])
        if dist.get_rank() in ranks:
            mine = g
    return mine


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (an alias: in-place changes reach the DTensor), else ``t``."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


class _PipelineStep:
    """One optimizer step: the schedule over the accumulated batches, gradient averaging (micro-batches,
    accumulation, data-parallel replicas), tied-weight sums, clipping, the optimizer, the loss."""

    def __init__(self, cfg, device, spec, job: PipelineJob, stages: _LocalStages, ties: _Ties):
        place, shape, modules = job.place, job.shape, stages.modules
        self.cfg, self.device, self.params, self._modules = cfg, device, stages.params, modules
        self.n_embed = spec.embed_args
        pipe = [PipelineStage(m, s, stages.n_stages, device, group=place.pp_group)
                for m, s in zip(modules, stages.ids)]
        self.packer = _Packer()
        self.last_module = next((m for m in modules if m.last), None)
        self.has_first = any(m.first for m in modules)
        self.scaler = _StageScaler(device) if needs_grad_scaler(cfg.precision) else None
        cls = {"interleaved": ScheduleInterleaved1F1B, "gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[shape.schedule]
        kwargs = {"n_microbatches": shape.microbatches, "loss_fn": self._loss}
        # The schedules' own scaling divides *all* of .grad by the micro-batch count at the end of each
        # step, which would also shrink what earlier --grad-accum steps accumulated: scale here instead.
        if "scale_grads" in inspect.signature(cls.__init__).parameters:
            kwargs["scale_grads"] = False
        self.sched = cls(pipe if shape.schedule == "interleaved" else pipe[0], **kwargs)
        self.optimizer = make_optimizer(stages.params, spec, cfg, device)
        self.divisor = float(shape.microbatches * cfg.grad_accum)
        self.tied, self.tie_group, self.norm_skip = ties.params, ties.group, ties.norm_skip
        self.pp_group, self.dp_group, self.dp_size = place.pp_group, place.dp_group, place.dims.dp
        self.dp_reduced = job.dp_reduced
        self.loss_ranks = place.dims.dp * place.dims.tp  # ranks that hold the last stage's loss, per pipeline stage
        self.world = dist.get_world_size()

    def _loss(self, output, target):
        loss = self.last_module.shell.head(output, *self.packer.unpack(target))
        return loss * self.scaler.scale if self.scaler is not None else loss

    def _run_schedule(self, micro_batches: list[tuple]) -> list[torch.Tensor]:
        losses_all: list[torch.Tensor] = []
        with autocast(self.cfg, self.device):
            for batch in micro_batches:
                losses_all = self._schedule_step(batch)  # as the worker's step: the last accumulation batch's
        return losses_all

    def _schedule_step(self, batch: tuple) -> list[torch.Tensor]:
        args = tuple(batch[:self.n_embed]) if self.has_first else ()
        losses: list[torch.Tensor] = []
        if self.last_module is not None:
            self.sched.step(*args, target=self.packer.pack(tuple(batch[self.n_embed:])), losses=losses)
        else:
            self.sched.step(*args)
        return losses

    def _reduce_grads(self):
        """Mean over micro-batches, accumulation steps and replicas; tied weights summed. Returns
        the loss scale used and the overflow flag (amp-fp16), else (None, None)."""
        grads = [_local(p.grad) for p in self.params if p.grad is not None]
        found = used_scale = None
        if self.scaler is not None:  # unscale and take the mean in one pass; every rank learns of any overflow
            used_scale = self.scaler.scale.clone()
            found = self.scaler.unscale_and_check(grads, self.divisor)
        elif grads:  # each loss is a micro-batch mean
            torch._foreach_div_(grads, self.divisor)
        if self.dp_size > 1 and not self.dp_reduced:
            _allreduce_mean(grads, self.dp_size, self.dp_group)
        if self.tie_group is not None:
            for p in self.tied:
                dist.all_reduce(_local(p.grad), group=self.tie_group)
        return used_scale, found

    def __call__(self, micro_batches: list[tuple]) -> torch.Tensor:
        losses_all = self._run_schedule(micro_batches)
        used_scale, found = self._reduce_grads()
        # an overflow skips the step everywhere (the host reads the flag, as GradScaler.step does)
        if not (found is not None and bool(found.item())):
            if self.cfg.clip_grad_norm is not None:
                _clip_pipeline(self.params, self.norm_skip, self.cfg.clip_grad_norm, self.pp_group)
            self.optimizer.step()
        if self.scaler is not None:
            self.scaler.update(found)
        self.optimizer.zero_grad(set_to_none=True)
        return self._global_loss(losses_all, used_scale)

    def _global_loss(self, losses: list[torch.Tensor], scale) -> torch.Tensor:
        """The global batch's loss on every rank: last stages contribute their micro-batch mean, the
        rest zero; one all-reduce."""
        if self.last_module is not None and losses:
            loss = torch.stack([x.detach().float() for x in losses]).mean().reshape(1)
            if scale is not None:
                loss = loss / scale
        else:
            loss = torch.zeros(1, device=self.device)
        if self.world > 1:
            dist.all_reduce(loss)
            loss = loss / self.loss_ranks
        return loss[0]

    def eval_loss(self, batch: tuple) -> torch.Tensor:
        """The trained pipeline's loss on one micro-batch in eval mode (dropout off, BatchNorm on its
        running statistics): one schedule step whose gradients are dropped, no optimizer step (the
        schedule's forward-only ``eval`` returned NaN for a gpipe stage on torch 2.13)."""
        modules = [m for m in self._modules]
        for m in modules:
            m.eval()
        try:
            with autocast(self.cfg, self.device):
                losses = self._schedule_step(batch)
        finally:
            for m in modules:
                m.train()
            self.optimizer.zero_grad(set_to_none=True)
        return self._global_loss(losses, self.scaler.scale if self.scaler is not None else None)

    def prime(self, spec) -> None:
        """One schedule step before training whose only lasting effect is the stages' set-up.

        torch's PipelineStage infers its shapes by running each stage once, in train mode and on
        placeholder data, inside its first step: BatchNorm would count that run in its running
        statistics (which `single` never sees, and which eval mode then uses). Here that first step
        runs on a synthetic batch; buffers, gradients and the RNG are put back afterwards.
        """
        cfg, device = self.cfg, self.device
        saved = [(b, b.detach().clone()) for m in self._modules for b in m.buffers()]
        gen = torch.Generator().manual_seed(cfg.seed + 54321)
        batch = []
        for t in spec.make_batch(cfg.batch_size, torch.device("cpu"), gen):
            t = t.to(device)
            batch.append(t.contiguous(memory_format=torch.channels_last)
                         if spec.channels_last and device.type == "cuda" and t.dim() == 4 else t.contiguous())
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), autocast(cfg, device):
            self._schedule_step(tuple(batch))
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for b, v in saved:
                b.copy_(v)


def _allreduce_mean(grads: list[torch.Tensor], n: int, group) -> None:
    """Average gradients over the data-parallel replicas (one flat all-reduce per dtype)."""
    by_dtype: dict[Any, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for group_grads in by_dtype.values():
        flat = _flatten_dense_tensors(group_grads)
        dist.all_reduce(flat, group=group)
        flat.div_(n)
        for g, f in zip(group_grads, _unflatten_dense_tensors(flat, group_grads)):
            g.copy_(f)


def _clip_pipeline(params, skip: set, max_norm: float, pp_group) -> None:
    """Clip to the global gradient norm across all stages (each weight counted once).

    Sharded gradients (DTensors of tensor parallel or FSDP) contribute their whole norm: each
    parameter's norm is made whole over its mesh (one small all-reduce per sharded parameter).
    """
    device = params[0].device
    sq = torch.zeros(1, device=device, dtype=torch.float32)
    for p in params:
        if p.grad is None or id(p) in skip:
            continue
        n = torch.linalg.vector_norm(p.grad)
        if isinstance(n, DTensor):
            n = n.full_tensor()
        sq += n.float().pow(2)
    dist.all_reduce(sq, group=pp_group)
    coef = torch.clamp(max_norm / (sq.sqrt() + 1e-6), max=1.0)
    local = [_local(p.grad) for p in params if p.grad is not None]
    if local:
        torch._foreach_mul_(local, coef.reshape(()).to(local[0].dtype))


def memory_layout(dims, opts: dict):
    return Layout("pipeline", dims, microbatches=int(opts.get("microbatches", 4)),
                  schedule=opts.get("schedule", "1f1b"), options=opts)


@register_strategy("pipeline", description="pipeline parallel (torch.distributed.pipelining: gpipe, 1f1b, "
                   "interleaved), stages split by blocks",
                   hooks=Hooks(validate=options, dims=staged, memory_layout=memory_layout),
                   caps=Capabilities(min_world=2))
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    job = PipelineJob(PipelineShape.of(opts), PipelinePlace.of_world(denv), extra_info={"options": opts})
    return build_pipeline(model, spec, cfg, denv, job)
