"""`embedding-shard`: embedding tables sharded across ranks (row-wise or table-wise), the rest data parallel.

For models with embedding tables (``model.embedding_groups()``: wide-deep). Each table module
(the fields of one width, stored fused) is replaced by a ``ShardedTables`` holding this rank's
share, and the rest of the model (the MLP) is wrapped in DDP with the shards' parameters ignored.
Every rank keeps its own slice of the global batch (dp = world size), as under ``ddp``.

One forward of a ``ShardedTables`` (TorchRec's sequence of input dist, lookup, output dist):

1. each of this rank's ids (B x fields) is mapped to its owner and the row it has there:
   ``shard=table`` - a field lives whole on one rank (fields dealt out largest first to the
   least-filled rank, over both widths: greedy by bytes); ``shard=row`` - rank r holds rows
   [r x ceil(rows/K), (r+1) x ceil(rows/K)) of every field (the last shares may be short);
2. the ids are grouped by owner and exchanged (``all_to_all_single``). Table-wise: owner by
   owner, batch-major inside each owner's block (B x its fields; a fixed permutation made once
   per batch size, no sort; none at all where one owner holds every field, as at one rank), and
   the counts are known in advance. Row-wise: sorted by owner (stable), and the counts exchanged
   first (one small all-to-all and a host read of the split sizes: the path's only host sync;
   with one rank no owner map, sort or count exchange);
3. the owner gathers the rows from its shard; the vectors go back by the reverse all-to-all and
   are put back in the batch's order by one gather (``permute_rows``; its backward is a gather
   too), straight into (B, fields, dim). At one rank a table's step is the plain lookup's
   kernels (row-wise: one more, the remainder) plus its three all-to-alls (ids, vectors, and the
   gradients in the backward). Backward: the vectors' gradients travel the same way back to the
   owners (scaled by 1/world: each rank's loss is the mean over its own slice, so the sum over
   ranks would be world x the gradient of the global mean that DDP gives the MLP), where the
   lookup's backward adds them into the shard's gradient.

Options:

* ``shard`` (``row``): ``row`` or ``table``;
* ``shards`` (the world size): K, the ranks one copy of the tables is spread over; K must divide
  the world size: with K < world, consecutive groups of K ranks each hold a whole copy, the
  exchange stays inside a group, and the shards' gradients are all-reduced across the world/K
  copies (K = 1: every rank holds every table whole, their gradients all-reduced: data
  parallel tables, without DDP's buckets);
* size knobs of the model, passed to ``spec.resize`` (wide-deep: ``fields``, ``vocab_scale``,
  ``dim``; default: the flavour's). The model is built on the meta device and each rank allocates
  and initialises only its shard (row blocks seeded as in the whole table, so the training is
  the same as unsharded, which the tests check).

Recorded in ``strategy_info``: the plan (``shards``, rows held by each rank), and the bytes each
rank sends to the other ranks per optimizer step (``exchange_bytes_per_step``: ids and vectors
in the forward, gradients in the backward, counts; all-reduce of replicated shards separately),
measured on the first step (the batches repeat, so every step sends the same; the hook that
measures it removes itself).
Not with ``--clip-grad-norm`` (the worker would clip by a per-rank norm), ``amp-fp16`` (the loss
scaler's overflow check is per rank) or ``--compile``: recorded unsupported.
At one process the same path runs with groups of one rank (no DDP: nothing to average).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlscale import ConfigError
from dlscale.strategies import Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.strategies._sharding import all_to_all, data_parallel, materialize, meta_spec, probe, resized

MODES = ("row", "table")
OPTIONS = {"shard": "row", "shards": None, "fields": None, "vocab_scale": None, "dim": None}
KNOBS = ("fields", "vocab_scale", "dim")
NAME = "embedding-shard"


def _knobs(opts: dict) -> dict:
    return {k: opts[k] for k in KNOBS}


def supports(spec) -> bool:
    return hasattr(probe(spec), "embedding_groups")


def table_sizes(model) -> list[tuple[str, int, int, int]]:
    """(group, field, rows, width) of every table, in the model's order."""
    return [(g, f, r, t.dim) for g, t in model.embedding_groups().items() for f, r in enumerate(t.rows)]


def options(cfg) -> dict:
    from dlscale.models import get_model

    opts = parse_options(NAME, cfg, OPTIONS, {"shard": MODES})
    world = cfg.world_size
    k = world if opts["shards"] is None else opts["shards"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{NAME} shards must be an integer >= 1, got {opts['shards']!r}")
    if world % k:
        raise ConfigError(f"{NAME} shards {k} does not divide the {world} processes "
                          f"(allowed: the divisors of {world})")
    opts["shards"] = k
    spec = get_model(cfg.model, cfg.flavor)
    if supports(spec):
        spec = resized(spec, _knobs(opts))
        n_tables = len(table_sizes(probe(spec)))
        if opts["shard"] == "table" and n_tables < k:
            raise ConfigError(f"{NAME} shard=table: {n_tables} tables cannot fill {k} shards; "
                              f"use shard=row or shards <= {n_tables}")
    return opts


def check(cfg, env) -> str | None:
    from dlscale.models import get_model

    if not supports(get_model(cfg.model, cfg.flavor)):
        return f"{NAME} shards embedding tables (model.embedding_groups(), as wide-deep's); this model has none"
    if cfg.clip_grad_norm is not None:
        return f"{NAME} does not clip gradients (each rank holds different table rows: a per-rank norm is wrong)"
    if cfg.compile:
        return f"{NAME} is not compiled (autograd functions with collectives; row-wise reads split sizes on the host)"
    return None


def model_spec(spec, cfg):
    if not supports(spec):
        return spec
    return meta_spec(resized(spec, _knobs(options(cfg))))


def plan_tables(sizes: list[tuple[str, int, int, int]], k: int) -> dict[tuple[str, int], int]:
    """Table-wise: owner rank (in the group) of each (group, field), largest tables first to the
    rank holding the fewest bytes (ties: the lower rank)."""
    load = [0] * k
    owner: dict[tuple[str, int], int] = {}
    for g, f, rows, width in sorted(sizes, key=lambda s: (-s[2] * s[3], s[0], s[1])):
        r = min(range(k), key=lambda i: (load[i], i))
        owner[(g, f)] = r
        load[r] += rows * width
    return owner


class ShardedTables(nn.Module):
    """This rank's share of a ``FusedTables`` module; ``forward(ids) -> (B, fields, dim)`` as the whole."""

    def __init__(self, tables, mode: str, owners: list[int] | None, group, group_rank: int, k: int,
                 grad_scale: float, device: torch.device):
        super().__init__()
        self.mode, self.group, self.me, self.k, self.grad_scale = mode, group, group_rank, k, grad_scale
        self.rows, self.dim = tuple(tables.rows), tables.dim
        nf = len(self.rows)
        if mode == "table":
            self.owners = list(owners)
            # the owner's layout: its fields stacked in field order (every rank computes every owner's)
            off = [0] * nf
            fill = [0] * k
            for f, r in enumerate(self.rows):
                off[f] = fill[self.owners[f]]
                fill[self.owners[f]] += r
            local_rows = fill[group_rank]
            self.fields_of = [sum(1 for o in self.owners if o == j) for j in range(k)]
            self.one_owner = sum(1 for n in self.fields_of if n) == 1  # the send layout is the batch's own
            self._perms: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
        else:
            self.block = [math.ceil(r / k) for r in self.rows]
            off = [sum(self.block[:f]) for f in range(nf)]
            local_rows = sum(self.block)
            self.register_buffer("block_t", torch.tensor(self.block, dtype=torch.long, device=device),
                                 persistent=False)
        self.register_buffer("off_t", torch.tensor(off, dtype=torch.long, device=device), persistent=False)
        self.weight = nn.Parameter(torch.zeros(local_rows, self.dim, device=device))
        held = 0
        with torch.no_grad():
            for f, r in enumerate(self.rows):
                if mode == "table":
                    if self.owners[f] == group_rank:
                        tables.fill(f, self.weight.data[off[f]:off[f] + r], 0)
                        held += r
                else:
                    start = group_rank * self.block[f]
                    n = max(0, min(self.block[f], r - start))
                    tables.fill(f, self.weight.data[off[f]:off[f] + n], start)
                    held += n
        self.held_rows = held  # rows of the whole tables this rank holds (row-wise: without the padding)
        self.sent = {"ids": 0, "vectors": 0, "gradients": 0, "counts": 0}

    def send_order(self, b: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Table-wise, a batch of ``b``: (order, inverse) over the batch's flat (row, field) slots.

        The send layout is owner by owner, each owner's block batch-major over its fields
        (``ids.reshape(-1)[order]``); ``inverse`` puts a tensor in that layout back in the batch's
        order. Made once per batch size, on the device."""
        key = (b, str(device))
        if key not in self._perms:
            nf = len(self.rows)
            slots = torch.arange(b * nf, device=device).view(b, nf)
            order = torch.cat([slots[:, [f for f in range(nf) if self.owners[f] == j]].reshape(-1)
                               for j in range(self.k) if self.fields_of[j]])
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=device)
            self._perms[key] = (order, inverse)
        return self._perms[key]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, nf = ids.shape
        counts_bytes = 0
        perm = None
        if self.mode == "table":
            # owner by owner, batch-major inside each owner's block: rank j gets B x its fields, and
            # every rank receives B x this rank's fields from each source. With every field on one
            # owner (one rank) that layout is the batch's own: no permutation at all.
            send_rows = (ids + self.off_t).reshape(-1)
            if not self.one_owner:
                perm = self.send_order(b, ids.device)
                send_rows = send_rows.index_select(0, perm[0])
            send = [b * self.fields_of[j] for j in range(self.k)]
            recv = [b * self.fields_of[self.me]] * self.k
        else:
            # the row within the owner's block, plus the field's offset in the owner's stack
            row = (torch.remainder(ids, self.block_t) + self.off_t).reshape(-1)
            if self.k == 1:  # one owner: the owner map, the sort and the count exchange are no-ops
                send_rows, send = row, [b * nf]
                recv = send
            else:
                owner = torch.div(ids, self.block_t, rounding_mode="floor").reshape(-1)
                order = torch.argsort(owner, stable=True)
                perm = (order, torch.empty_like(order))
                perm[1][order] = torch.arange(order.numel(), device=order.device)
                send_rows = row.index_select(0, order)
                counts = torch.bincount(owner, minlength=self.k)
                got = torch.empty_like(counts)
                dist.all_to_all_single(got, counts, group=self.group)
                send, recv = counts.tolist(), got.tolist()  # the host sync of the row-wise exchange
                counts_bytes = 8 * (self.k - 1)
        recv_rows = send_rows.new_empty(sum(recv))
        dist.all_to_all_single(recv_rows, send_rows, recv, send, group=self.group)
        vectors = F.embedding(recv_rows, self.weight)
        back = all_to_all(vectors, send, recv, self.group, self.grad_scale)
        out_peers, in_peers = sum(send) - send[self.me], sum(recv) - recv[self.me]
        self.sent = {"ids": 8 * out_peers, "vectors": 4 * self.dim * in_peers,
                     "gradients": 4 * self.dim * out_peers, "counts": counts_bytes}
        if perm is not None:  # back in the batch's order; backward: the gradients gathered the other way
            back = permute_rows(back, perm[1], perm[0])
        return back.view(b, nf, self.dim)


class _PermuteRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, index, inverse):
        ctx.inverse = inverse
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        return grad.index_select(0, ctx.inverse), None, None


def permute_rows(x: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for a permutation ``index`` (``inverse`` its inverse). Backward: ``grad[inverse]``,
    a gather as the forward (index_select's own backward scatter-adds into zeros)."""
    return _PermuteRows.apply(x, index, inverse)


def once_after_forward(module: nn.Module, fn) -> None:
    """Run ``fn()`` after the first forward of ``module``, then drop the hook (a module with no
    hooks takes the plain call path: nothing left per step)."""
    def hook(mod, args, output):
        handle.remove()
        fn()

    handle = module.register_forward_hook(hook)


def _groups(world: int, k: int, rank: int):
    """(this rank's shard group, rank in it, its replica group or None); every rank creates every
    group, in the same order (torch's rule for new_group)."""
    shard_group = replica_group = None
    for g in range(world // k):
        ranks = list(range(g * k, (g + 1) * k))
        pg = dist.new_group(ranks=ranks)
        if rank in ranks:
            shard_group = pg
    if world // k > 1:
        for j in range(k):
            ranks = list(range(j, world, k))
            pg = dist.new_group(ranks=ranks)
            if rank in ranks:
                replica_group = pg
    return shard_group, rank % k, replica_group


@register_strategy(NAME, description="embedding tables sharded row- or table-wise (all-to-all of ids and "
                   "vectors), the rest data parallel", check=check, validate=options, model_spec=model_spec,
                   precisions=("fp32", "amp-bf16"))  # no amp-fp16: torch's loss scaler would check each rank's shards alone
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    k, world, device = opts["shards"], denv.world_size, denv.device
    shard_group, me, replica_group = _groups(world, k, denv.rank)
    groups = model.embedding_groups()
    owners = plan_tables(table_sizes(model), k) if opts["shard"] == "table" else None
    sharded: dict[str, ShardedTables] = {}
    for name, tables in groups.items():
        own = [owners[(name, f)] for f in range(len(tables.rows))] if owners else None
        sharded[name] = ShardedTables(tables, opts["shard"], own, shard_group, me, k, 1.0 / world, device)
        setattr(model, name, sharded[name])
    materialize(model, set(groups), device)
    model.init_weights(tables=False)

    sync = {"on": True}
    if replica_group is not None:  # copies of each shard across groups: sum their gradients
        def allreduce(p):
            if sync["on"]:
                dist.all_reduce(p.grad, group=replica_group)
        for st in sharded.values():
            st.weight.register_post_accumulate_grad_hook(allreduce)

    module = data_parallel(model, [f"{n}.weight" for n in sharded], denv)

    @contextlib.contextmanager
    def no_sync():
        sync["on"] = False
        try:
            with (module.no_sync() if module is not model else contextlib.nullcontext()):
                yield
        finally:
            sync["on"] = True

    held = [st.held_rows for st in sharded.values()]
    rows_by_rank = [None] * world
    dist.all_gather_object(rows_by_rank, sum(held))
    info = {"shard": opts["shard"], "shards": k, "replicas": world // k,
            "knobs": {key: opts[key] for key in KNOBS if opts[key] is not None},
            "table_rows": sum(sum(t.rows) for t in sharded.values()), "rows_held_per_rank": rows_by_rank,
            "exchange_bytes_per_step": None}
    if owners:
        info["table_owner"] = {f"{g}[{f}]": o for (g, f), o in sorted(owners.items())}

    def record_volume():
        """Bytes each rank sends to the others per optimizer step, from the first forward."""
        sent = {key: sum(st.sent[key] for st in sharded.values()) for key in ("ids", "vectors", "gradients",
                                                                            "counts")}
        sent = {key: v * cfg.grad_accum for key, v in sent.items()}
        per_rank = [None] * world
        dist.all_gather_object(per_rank, sent)
        totals = [sum(d.values()) for d in per_rank]
        info["exchange_bytes_per_step"] = {"max_per_rank": max(totals), "per_rank": totals,
                                           "by_kind_rank0": per_rank[0]}
        if replica_group is not None:  # ring all-reduce sends 2(n-1)/n of the shard per rank
            n = world // k
            shard_bytes = sum(st.weight.numel() * st.weight.element_size() for st in sharded.values())
            info["replica_allreduce_bytes_per_step"] = int(2 * (n - 1) / n * shard_bytes)

    once_after_forward(model, record_volume)
    return Parallelized(module=module, optimizer=make_optimizer(module.parameters(), spec, cfg, device),
                        dp_size=world, dp_rank=denv.rank, no_sync=no_sync, info=info)
