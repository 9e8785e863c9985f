"""`partial-fc`: a margin-softmax classifier sharded by class across ranks, the backbone data parallel.

The model parallelism of InsightFace's Partial FC (An et al., arXiv 2010.05222; ``arcface_torch``
``partial_fc_v2.py``) at sample rate 1 (every class centre in every step; the negative-class
sampling of Partial FC proper is not implemented). For models whose classifier is a swappable
``model.margin`` (face): rank r holds the class centres of classes [c_r, c_{r+1}) (N split as
evenly as possible, the first N mod world ranks one more), the rest of the model is wrapped in
DDP with those ignored. Each rank trains its own slice of the global batch (dp = world size).

One step of the sharded head, with G = world x B rows:

1. the features (B x F) of every rank are all-gathered (G x F), and so are the labels;
2. local logits: cos between the normalised features and this rank's normalised centres
   (G x N_r), the ArcFace margin applied to the target column where this rank holds the target;
3. the softmax normaliser across ranks: all-reduce (max) of each row's maximum, then one
   all-reduce (sum) of each row's sum of exp and of its target logit (0 where not held here);
   loss = mean over the G rows of log(sum exp) - target logit: the global batch's loss, equal on
   every rank (the record's per-step loss is the global batch's, not rank 0's slice's);
4. backward: softmax - one-hot, locally, gives the centres' gradients and each rank's share of
   the features' gradients, which a reduce-scatter sums into each rank's own rows (x world, since
   DDP then averages the backbone's gradients over the ranks).

Options: ``classes`` (default: the flavour's; face full: 85,742), N, passed to ``spec.resize``;
the model is built on the meta device and each rank allocates and initialises only its rows
(row blocks seeded as in the whole head, so training equals the unsharded model's, which the
tests check against ``ddp``, whose BatchNorm statistics are per rank as here). N below the
number of ranks is bad input (a rank without a class).

``strategy_info``: classes, the class range of each rank, the head's bytes per rank, and the
bytes each rank sends per step by collective (ring algorithms: an all-gather or reduce-scatter
sends (n-1)/n of the gathered tensor, an all-reduce 2(n-1)/n of its tensor).
Not with ``--clip-grad-norm``, ``amp-fp16`` or ``--compile`` (recorded unsupported, as
``embedding-shard``). At one process the same path runs on a group of one (no DDP).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from dlscale import ConfigError
from dlscale.models.face import arcface_logits, cosine
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.strategies._sharding import (ShardedPart, data_parallel, first_call, gather_labels, gather_rows,
                                          materialize, probed)

NAME = "partial-fc"
OPTIONS = {"classes": None}


def _has_margin(model) -> bool:
    margin = getattr(model, "margin", None)
    return margin is not None and hasattr(margin, "fill") and hasattr(margin, "classes")


def options(cfg) -> dict:
    opts = parse_options(NAME, cfg, OPTIONS)
    if PART.supports(cfg):
        n = probed(cfg.model, cfg.flavor, {"classes": opts["classes"]}).margin.classes
        if n < cfg.world_size:
            raise ConfigError(f"{NAME} classes {n} is below the {cfg.world_size} processes: every rank needs "
                              f"at least one class (use classes >= {cfg.world_size})")
        opts["classes"] = n
    return opts


PART = ShardedPart(NAME, _has_margin, "a margin-softmax classifier (model.margin, as face's)",
                   lambda cfg: {"classes": options(cfg)["classes"]})


def class_range(n: int, world: int, rank: int) -> tuple[int, int]:
    """[start, end) of the classes rank holds: N split evenly, the first N mod world ranks one more."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class _ShardedSoftmaxLoss(torch.autograd.Function):
    """mean_i(log sum_c exp(z_ic) - z_i,target) over logits split by class across ``group``."""

    @staticmethod
    def forward(ctx, logits, target, group):
        g = logits.shape[0]
        m = logits.detach().max(dim=1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = (logits - m.unsqueeze(1)).exp_()
        has = target >= 0
        col = target.clamp(min=0).unsqueeze(1)
        z_t = torch.where(has, logits.gather(1, col).squeeze(1) - m, torch.zeros_like(m))
        both = torch.stack([e.sum(dim=1), z_t], dim=1)
        dist.all_reduce(both, group=group)
        s = both[:, 0]
        ctx.save_for_backward(e, s, col, has)
        ctx.rows = g
        return (s.log() - both[:, 1]).mean()

    @staticmethod
    def backward(ctx, grad):
        # (softmax - one-hot) x grad / G in one pass over the (G x N_r) logits: the per-row factor
        # grad / (G x sum exp) first, then one multiply, then the target columns
        e, s, col, has = ctx.saved_tensors
        c = grad / ctx.rows
        p = e * (c / s).unsqueeze(1)
        p.scatter_add_(1, col, (-c * has.to(p.dtype)).unsqueeze(1))
        return p, None, None


class ShardedArcFace(torch.nn.Module):
    """This rank's class centres of an ``ArcFaceHead``; ``forward(features, labels) -> loss`` as the whole."""

    def __init__(self, head, start: int, end: int, group, size: int, device: torch.device):
        super().__init__()
        self.start, self.end, self.group, self.size = start, end, group, size
        self.scale, self.margin_m = head.scale, head.margin
        self.weight = torch.nn.Parameter(torch.empty(end - start, head.features, device=device))
        head.fill(self.weight.data, start)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.itemsize = features.element_size()  # bf16 under autocast: what the all-gather moves
        feats = gather_rows(features, self.group, self.size, grad_scale=float(self.size))
        labels = gather_labels(labels, self.group, self.size)
        mine = (labels >= self.start) & (labels < self.end)
        target = torch.where(mine, labels - self.start, torch.full_like(labels, -1))
        logits = arcface_logits(cosine(feats, self.weight), target, self.scale, self.margin_m)
        return _ShardedSoftmaxLoss.apply(logits, target, self.group)


@register_strategy(NAME, description="margin-softmax head sharded by class (all-gather of features, "
                   "distributed softmax), backbone data parallel",
                   hooks=Hooks(check=PART.check, validate=options, model_spec=PART.model_spec),
                   # no amp-fp16: torch's loss scaler would check each rank's centres alone
                   caps=Capabilities(precisions=("fp32", "amp-bf16"),
                                     no_clip="each rank holds different class centres: a per-rank norm is wrong",
                                     no_compile="custom autograd functions with collectives"))
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    world, device, n = denv.world_size, denv.device, opts["classes"]
    group = dist.new_group(ranks=list(range(world)))  # its own communicator, apart from DDP's
    start, end = class_range(n, world, denv.rank)
    head = ShardedArcFace(model.margin, start, end, group, world, device)
    model.margin = head
    materialize(model, {"margin"}, device)
    model.init_weights(head=False)
    if spec.channels_last and device.type == "cuda":
        model.to(memory_format=torch.channels_last)
    module = data_parallel(model, ["margin.weight"], denv)
    info = {"classes": n, "class_ranges": [class_range(n, world, r) for r in range(world)],
            "head_bytes_per_rank": [4 * head.weight.shape[1] * (e - s) for s, e in
                                    (class_range(n, world, r) for r in range(world))],
            "exchange_bytes_per_step": None,
            "reported_loss": "global batch (every rank computes the same sharded softmax loss)"}

    def record_volume():
        """Bytes each rank sends per step by collective (ring algorithms), from the first forward's dtypes."""
        b, f, ring = cfg.batch_size, head.weight.shape[1], (world - 1) / world
        per_micro = {
            "features_allgather": int(ring * world * b * f * head.itemsize),
            "labels_allgather": int(ring * world * b * 8),
            "softmax_allreduce": int(2 * ring * world * b * 3 * 4),  # max, then (sum exp, target logit), fp32
            "feature_grad_reducescatter": int(ring * world * b * f * head.itemsize),
        }
        info["exchange_bytes_per_step"] = {"max_per_rank": cfg.grad_accum * sum(per_micro.values()),
                                           "by_collective": {k: v * cfg.grad_accum for k, v in per_micro.items()}}

    first_call(model, record_volume)
    return Parallelized(module=module, optimizer=make_optimizer(module.parameters(), spec, cfg, device),
                        dp_size=world, dp_rank=denv.rank, no_sync=getattr(module, "no_sync", contextlib.nullcontext), info=info)
