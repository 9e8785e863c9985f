"""`embedding-shard`: embedding tables sharded across ranks (row-wise or table-wise), the rest data parallel.

For models with embedding tables (``model.embedding_groups()``: wide-deep). Each table module
(the fields of one width, stored fused) is replaced by a ``ShardedTables`` holding this rank's
share, and the rest of the model (the MLP) is wrapped in DDP with the shards' parameters ignored.
Every rank keeps its own slice of the global batch (dp = world size), as under ``ddp``.

The model looks all its tables up in one call (``model.embed(*ids)``, one ids tensor per table
module), which the strategy replaces by one ``Exchange`` over all of them, so wide and deep share
their collectives. One forward (TorchRec's sequence of input dist, lookup, output dist):

1. each of this rank's ids (B x fields, every table's, flattened and concatenated table by
   table) is mapped to its owner and the row it has there: ``shard=table`` - a field lives whole
   on one rank (fields dealt out largest first to the least-filled rank, over both widths:
   greedy by bytes); ``shard=row`` - rank r holds rows [r x ceil(rows/K), (r+1) x ceil(rows/K))
   of every field (the last shares may be short);
2. the ids are grouped by owner, table by table inside each owner's block, the other ranks'
   blocks in rank order and this rank's own last, and the others' blocks are exchanged in one
   ``all_to_all_single`` (this rank's own ids never go through a collective: its split is 0).
   Table-wise: batch-major inside each (owner, table) block (a fixed permutation made once per
   batch size, no sort), the counts known in advance. Row-wise: a stable sort by owner, and the
   counts of every (owner, table) exchanged first (one small all-to-all and one host read of the
   split sizes: the path's only host sync). At one rank, in either mode, every id is the rank's
   own: each table's ids plus its fields' offsets, as the unsharded module computes them; no
   owner map, sort, permutation or count exchange, and no collective (a group of one has
   nothing to move);
3. the owner looks each table's ids up in one ``F.embedding`` (every other rank's piece and its
   own together); the other ranks' vectors go back in one all-to-all and its own stay; each
   table's vectors are put back in the batch's order by one gather (none at one rank: the outputs
   are the lookups themselves, as the unsharded module's), (B, fields, dim). Everything but the
   all-to-alls is a native autograd op. Backward: the gradients of the vectors that went back
   return to the owners in one all-to-all, and ``F.embedding``'s backward sums them, with the own
   ones, into each shard's gradient, scaled by 1/world (each rank's loss is the mean over its own
   slice, so the sum over ranks would be world x the gradient of the global mean that DDP gives
   the MLP).

Collectives per micro-batch (forward and backward), whatever the number of tables: 3
all-to-alls (ids, vectors, gradients) among the K ranks of a copy (none at K = 1), plus 1 (the
counts) row-wise at more than one rank (before
the merge: 3 per table module, 6 for wide-deep, 8 row-wise). Per optimizer step, with ``shards``
< world, one all-reduce per table module across the copies; DDP's buckets for the MLP at more
than one rank (the shards' layout buffers are kept out of DDP: no buffer broadcast per step).
At one rank a step runs the plain lookups' ops (offsets added, ``F.embedding`` and its native
backward) and nothing else: no collective, autograd function, buffer, copy, split or view
(benchmarks/embshard_host_cpu.py counts them). A model without ``embed`` gets one exchange per
table module (3 all-to-alls each).

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
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from dlscale import ConfigError
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.strategies._sharding import ShardedPart, data_parallel, materialize, probed

MODES = ("row", "table")
OPTIONS = {"shard": "row", "shards": None, "fields": None, "vocab_scale": None, "dim": None}
KNOBS = ("fields", "vocab_scale", "dim")
NAME = "embedding-shard"


def _knobs(opts: dict) -> dict:
    return {k: opts[k] for k in KNOBS}


def _has_tables(model) -> bool:
    return hasattr(model, "embedding_groups")


def table_sizes(model) -> list[tuple[str, int, int, int]]:
    """(group, field, rows, width) of every table, in the model's order."""
    return [(g, f, r, t.dim) for g, t in model.embedding_groups().items() for f, r in enumerate(t.rows)]


def options(cfg) -> dict:
    opts = parse_options(NAME, cfg, OPTIONS, {"shard": MODES})
    world = cfg.world_size
    k = world if opts["shards"] is None else opts["shards"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{NAME} shards must be an integer >= 1, got {opts['shards']!r}")
    if world % k:
        raise ConfigError(f"{NAME} shards {k} does not divide the {world} processes "
                          f"(allowed: the divisors of {world})")
    opts["shards"] = k
    if PART.supports(cfg):
        n_tables = len(table_sizes(probed(cfg.model, cfg.flavor, _knobs(opts))))
        if opts["shard"] == "table" and n_tables < k:
            raise ConfigError(f"{NAME} shard=table: {n_tables} tables cannot fill {k} shards; "
                              f"use shard=row or shards <= {n_tables}")
    return opts


PART = ShardedPart(NAME, _has_tables, "embedding tables (model.embedding_groups(), as wide-deep's)",
                   lambda cfg: _knobs(options(cfg)))


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
    """This rank's share of a ``FusedTables`` module (its rows in one weight) and where each field's ids go.

    ``forward(ids) -> (B, fields, dim)`` as the whole module, through ``exchange`` (set by
    ``parallelize``); a model that looks every table up in one ``embed`` call exchanges them together."""

    def __init__(self, tables, mode: str, owners: list[int] | None, group_rank: int, k: int, device: torch.device):
        super().__init__()
        self.mode = mode
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
        else:
            self.owners = [0] * nf if k == 1 else None  # row-wise: the owner depends on the id
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
        self.exchange = None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.exchange(ids)[0]


class _Plan:
    """One exchange's sizes, in block order: the ranks of the group with this rank last (the others
    in rank order, then itself; its own share never goes through a collective). ``out_n[i * T + t]``
    ids of table t go to block i's rank (its vectors come back), ``in_n[i * T + t]`` come from it (for
    the last block, this rank, both are its own ids of table t). The all-to-alls carry the other
    blocks alone: their splits are per rank in rank order, 0 for this rank (None, the equal split,
    when every rank's is the same, as at one rank: nothing to send). ``shapes``: the outputs';
    ``perms``: per table None or the gather from the blocks' pieces concatenated to the batch's
    order (its backward, ``index_select``'s, scatters the gradients back)."""

    __slots__ = ("out_n", "in_n", "out_el", "in_el", "others", "out_ids", "in_ids", "out_vec", "in_vec",
                 "out_ids_n", "in_ids_n", "out_vec_n", "in_vec_n", "self_n", "self_el", "shapes", "perms",
                 "off", "order")

    def __init__(self, out_n: list[int], in_n: list[int], dims: list[int], k: int, me: int, shapes: list[tuple],
                 perms: list):
        t = len(dims)
        o = (k - 1) * t  # entries of the other ranks' blocks
        ranks = [j for j in range(k) if j != me]

        def splits(xs):
            per = [0] * k
            for i, j in enumerate(ranks):
                per[j] = sum(xs[i * t:(i + 1) * t])
            return None if len(set(per)) == 1 else per

        self.out_n, self.in_n, self.others = out_n, in_n, o
        self.out_el = [n * dims[i % t] for i, n in enumerate(out_n)]
        self.in_el = [n * dims[i % t] for i, n in enumerate(in_n)]
        self.out_ids, self.in_ids = splits(out_n), splits(in_n)
        self.out_vec, self.in_vec = splits(self.out_el), splits(self.in_el)
        self.out_ids_n, self.in_ids_n = sum(out_n[:o]), sum(in_n[:o])
        self.out_vec_n, self.in_vec_n = sum(self.out_el[:o]), sum(self.in_el[:o])
        self.self_n, self.self_el = out_n[o:], self.out_el[o:]
        self.shapes, self.perms = shapes, perms
        self.off = self.order = None


class Exchange:
    """The exchange of a set of tables, all at once: ``exchange(*ids) -> one (B, fields, dim) per table``.

    The ids of every table are flattened and concatenated (table by table, batch-major), mapped to
    their owners' rows and sent in one all-to-all (rank by rank, table by table inside each rank's
    block). The owner looks each table's ids up in one ``F.embedding`` (the other ranks' pieces and
    its own together), and the other ranks' vectors go back in one all-to-all (``_VectorsBack``:
    its backward sends their gradients to the owners in one all-to-all). This rank's own ids (the
    last block of the send buffer) stay here. Everything but the all-to-alls is a native autograd
    op, so the lookups' backward is ``F.embedding``'s. Row-wise at more than one rank, one count
    all-to-all and one host read of the counts come first. Sizes, offsets and permutations that
    depend only on the batch size (table-wise; any mode at one rank) are made once per batch size.
    At one rank every id is its own: each table's ids plus its fields' offsets go through
    ``F.embedding`` as the unsharded module's do, with no collective (a group of one has nothing to
    move: Megatron-LM's model-parallel mappings skip theirs at world size 1 the same way)."""

    def __init__(self, tables: list[ShardedTables], group, k: int, me: int, grad_scale: float):
        self.tables, self.group, self.k, self.me, self.grad_scale = list(tables), group, k, me, grad_scale
        self.mode = self.tables[0].mode
        self.dims = [st.dim for st in self.tables]
        self.blocks = [j for j in range(k) if j != me] + [me]  # block order: the others, then this rank
        self._plans: dict[int, _Plan] = {}
        self._flat: dict[int, tuple] = {}
        self.last: _Plan | None = None  # the last forward's plan: the volume record reads it

    def _scaled(self, grad: torch.Tensor) -> torch.Tensor:
        return grad * self.grad_scale

    def __call__(self, *ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = ids[0].shape[0]
        if self.k == 1:  # every id is this rank's: the rows in its stack, table by table
            self.last = self._plans.get(b) or self._fixed_plan(b, ids[0].device)
            outs = tuple(F.embedding(x + st.off_t, st.weight) for x, st in zip(ids, self.tables))
            if self.grad_scale != 1.0 and outs[0].requires_grad:  # copies elsewhere: their gradients are summed
                for o in outs:
                    o.register_hook(self._scaled)
            return outs
        flat = torch.cat([x.reshape(-1) for x in ids]) if len(ids) > 1 else ids[0].reshape(-1)
        if self.mode == "table":
            plan = self._plans.get(b) or self._fixed_plan(b, flat.device)
            send = flat + plan.off
            if plan.order is not None:
                send = send.index_select(0, plan.order)
        else:
            plan, send = self._row_plan(b, flat)
        self.last = plan
        n_t, dims, o = len(self.tables), self.dims, plan.others
        send, *mine = send.split_with_sizes([plan.out_ids_n, *plan.self_n])
        recv = send.new_empty(plan.in_ids_n)
        _all_to_all(recv, send, plan.in_ids, plan.out_ids, self)
        asked = recv.split_with_sizes(plan.in_n[:o])  # piece i * T + t: table t's ids from block i
        # each table's lookups in one F.embedding: the other blocks' pieces, then this rank's own
        served, own = [None] * o, []
        for t, st in enumerate(self.tables):
            vec = F.embedding(torch.cat([*asked[t:o:n_t], mine[t]]), st.weight)
            if self.grad_scale != 1.0 and vec.requires_grad:
                vec.register_hook(self._scaled)
            *others, mine_vec = vec.split_with_sizes([*plan.in_n[t:o:n_t], plan.self_n[t]])
            served[t:o:n_t] = [v.reshape(-1) for v in others]
            own.append(mine_vec)
        back = _VectorsBack.apply(torch.cat(served), self, plan)
        pieces, outs = back.split_with_sizes(plan.out_el[:o]), []
        for t, (shape, perm) in enumerate(zip(plan.shapes, plan.perms)):
            x = torch.cat([*pieces[t:o:n_t], own[t].reshape(-1)]).view(-1, dims[t])
            if perm is not None:
                x = x.index_select(0, perm)
            outs.append(x.view(shape))
        return tuple(outs)

    def _fixed_plan(self, b: int, device: torch.device) -> _Plan:
        """Table-wise (or any mode at one rank): rank j gets B x its fields of each table, batch-major."""
        k, me, n_t = self.k, self.me, len(self.tables)
        nf = [len(st.rows) for st in self.tables]
        out_n = [b * st.owners.count(j) for j in self.blocks for st in self.tables]
        in_n = [b * st.owners.count(me) for _ in self.blocks for st in self.tables]
        perms, by_block, base = [], [], 0
        for st, n in zip(self.tables, nf):
            slots = torch.arange(b * n, device=device).view(b, n)
            mine = [slots[:, [f for f in range(n) if st.owners[f] == j]].reshape(-1) for j in self.blocks]
            order = torch.cat(mine)
            if torch.equal(order, slots.view(-1)):
                perms.append(None)
            else:
                inverse = torch.empty_like(order)
                inverse[order] = torch.arange(order.numel(), device=device)
                perms.append(inverse)
            by_block.append([m + base for m in mine])
            base += b * n
        plan = _Plan(out_n, in_n, self.dims, k, me, [(b, n, d) for n, d in zip(nf, self.dims)], perms)
        plan.off = torch.cat([st.off_t.repeat(b) for st in self.tables])  # each slot's offset in its owner's stack
        order = torch.cat([by_block[t][i] for i in range(k) for t in range(n_t)])
        plan.order = None if torch.equal(order, torch.arange(base, device=device)) else order
        self._plans[b] = plan
        return plan

    def _row_plan(self, b: int, flat: torch.Tensor) -> tuple[_Plan, torch.Tensor]:
        """Row-wise at K > 1 ranks: owners from the ids, a stable sort by block, the counts exchanged."""
        k, n_t = self.k, len(self.tables)
        if b not in self._flat:  # each slot's block size, offset and table; 0..N-1; each rank's block
            dev = flat.device
            block_of = [0] * k
            for i, j in enumerate(self.blocks):
                block_of[j] = i
            self._flat[b] = (torch.cat([st.block_t.repeat(b) for st in self.tables]),
                             torch.cat([st.off_t.repeat(b) for st in self.tables]),
                             torch.cat([torch.full((b * len(st.rows),), t, dtype=torch.long, device=dev)
                                        for t, st in enumerate(self.tables)]),
                             torch.arange(flat.numel(), device=dev), torch.ones_like(flat),
                             torch.tensor(block_of, dtype=torch.long, device=dev))
        block, off, table, arange, ones, block_of = self._flat[b]
        owner = torch.div(flat, block, rounding_mode="floor")
        row = torch.remainder(flat, block).add_(off)
        slot_block = block_of.index_select(0, owner)
        key = torch.add(table, slot_block, alpha=n_t)  # (block, table) of each slot
        # not bincount: on CUDA it reads the largest key on the host first (a sync)
        per_block = torch.zeros(k * n_t, dtype=torch.long, device=flat.device).index_add_(0, key, ones)
        counts = per_block.view(k, n_t).index_select(0, block_of).view(-1)  # rank order, as the ranks exchange them
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)
        # slots are table by table, so a stable sort by block leaves each block table by table
        order = torch.argsort(slot_block, stable=True)
        send = row.index_select(0, order)
        inverse = torch.empty_like(order).index_put_((order,), arange)
        # a slot's place among its own table's vectors as they come back (the blocks' pieces in block
        # order): its place in the send buffer less the other tables' ids sent before it
        ahead = per_block.cumsum(0) - per_block
        per_table = per_block.view(k, n_t)
        ahead = ahead - (per_table.cumsum(0) - per_table).view(-1)
        pos = inverse - ahead.index_select(0, key)
        sizes = torch.stack([counts, got]).tolist()  # the one host sync of the row-wise exchange
        out_n = [sizes[0][j * n_t + t] for j in self.blocks for t in range(n_t)]
        in_n = [sizes[1][j * n_t + t] for j in self.blocks for t in range(n_t)]
        nf = [len(st.rows) for st in self.tables]
        perms = list(pos.split_with_sizes([b * n for n in nf]))
        shapes = [(b, n, d) for n, d in zip(nf, self.dims)]
        return _Plan(out_n, in_n, self.dims, k, self.me, shapes, perms), send

    def volume(self) -> dict[str, int]:
        """Bytes this rank sent to the other ranks of its group in the last forward and its backward."""
        p, n_t = self.last, len(self.tables)
        size = self.tables[0].weight.element_size()
        return {"ids": 8 * p.out_ids_n, "vectors": size * p.in_vec_n, "gradients": size * p.out_vec_n,
                "counts": 8 * n_t * (self.k - 1) if self.mode == "row" and self.k > 1 else 0}


def _all_to_all(out: torch.Tensor, inp: torch.Tensor, out_splits, in_splits, ex: Exchange) -> None:
    """``all_to_all_single`` among the exchange's K ranks (K > 1: at one rank nothing is exchanged)."""
    dist.all_to_all_single(out, inp, out_splits, in_splits, group=ex.group)


class _VectorsBack(torch.autograd.Function):
    """The vectors this rank looked up for the other ranks, back to them, and theirs for this rank
    (forward: one all-to-all); the gradients of what came back to the owners (backward: one)."""

    @staticmethod
    def forward(ctx, served: torch.Tensor, ex: Exchange, plan: _Plan) -> torch.Tensor:
        back = served.new_empty(plan.out_vec_n)
        _all_to_all(back, served, plan.out_vec, plan.in_vec, ex)
        ctx.ex, ctx.plan = ex, plan
        return back

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ex, plan = ctx.ex, ctx.plan
        recv = grad.new_empty(plan.in_vec_n)
        _all_to_all(recv, grad.contiguous(), plan.in_vec, plan.out_vec, ex)
        return recv, None, None


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
                   "vectors), the rest data parallel",
                   hooks=Hooks(check=PART.check, validate=options, model_spec=PART.model_spec),
                   # no amp-fp16: torch's loss scaler would check each rank's shards alone
                   caps=Capabilities(precisions=("fp32", "amp-bf16"),
                                     no_clip="each rank holds different table rows: a per-rank norm is wrong",
                                     no_compile="autograd functions with collectives; row-wise reads split sizes "
                                                "on the host"))
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    world = denv.world_size
    shards = _shard_tables(model, opts, denv)
    # the shards and their layout buffers (the same constants on every rank: DDP would broadcast
    # them every forward, a collective per step for nothing)
    module = data_parallel(model, [f"{n}.{name}" for n, st in shards.tables.items()
                                   for name, _ in [*st.named_parameters(), *st.named_buffers()]], denv)

    @contextlib.contextmanager
    def no_sync():
        shards.sync["on"] = False
        try:
            with (module.no_sync() if module is not model else contextlib.nullcontext()):
                yield
        finally:
            shards.sync["on"] = True

    held = [st.held_rows for st in shards.tables.values()]
    rows_by_rank = [None] * world
    dist.all_gather_object(rows_by_rank, sum(held))
    info = {"shard": opts["shard"], "shards": opts["shards"], "replicas": world // opts["shards"],
            "knobs": {key: opts[key] for key in KNOBS if opts[key] is not None},
            "table_rows": sum(sum(t.rows) for t in shards.tables.values()), "rows_held_per_rank": rows_by_rank,
            "exchange_bytes_per_step": None}
    if shards.owners:
        info["table_owner"] = {f"{g}[{f}]": o for (g, f), o in sorted(shards.owners.items())}
    once_after_forward(model, lambda: _record_volume(shards, info, cfg.grad_accum, world, opts["shards"]))
    return Parallelized(module=module, optimizer=make_optimizer(module.parameters(), spec, cfg, denv.device),
                        dp_size=world, dp_rank=denv.rank, no_sync=no_sync, info=info)


@dataclass
class _Shards:
    """This rank's shares of the model's tables, how their ids are exchanged, and the copies of them."""

    tables: dict[str, ShardedTables]
    exchanges: list[Exchange]
    owners: dict[tuple[str, int], int] | None  # table-wise: the owner of each (group, field)
    replica_group: Any  # the ranks holding the same shard (None: one copy)
    sync: dict = field(default_factory=lambda: {"on": True})  # off: no all-reduce across the copies


def _shard_tables(model, opts: dict, denv) -> _Shards:
    """Swap each table module of ``model`` for this rank's share, exchanges set (in place)."""
    k, world, device = opts["shards"], denv.world_size, denv.device
    shard_group, me, replica_group = _groups(world, k, denv.rank)
    groups = model.embedding_groups()
    owners = plan_tables(table_sizes(model), k) if opts["shard"] == "table" else None
    sharded: dict[str, ShardedTables] = {}
    for name, tables in groups.items():
        own = [owners[(name, f)] for f in range(len(tables.rows))] if owners else None
        sharded[name] = ShardedTables(tables, opts["shard"], own, me, k, device)
        setattr(model, name, sharded[name])
    materialize(model, set(groups), device)
    model.init_weights(tables=False)
    for st in sharded.values():  # a module called on its own exchanges its own ids
        st.exchange = Exchange([st], shard_group, k, me, 1.0 / world)
    if hasattr(model, "embed"):  # every table looked up in one call: one exchange for all of them
        exchanges = [Exchange(list(sharded.values()), shard_group, k, me, 1.0 / world)]
        model.embed = exchanges[0]
    else:
        exchanges = [st.exchange for st in sharded.values()]
    out = _Shards(sharded, exchanges, owners, replica_group)
    if replica_group is not None:  # copies of each shard across groups: sum their gradients
        def allreduce(p):
            if out.sync["on"]:
                dist.all_reduce(p.grad, group=replica_group)
        for st in sharded.values():
            st.weight.register_post_accumulate_grad_hook(allreduce)
    return out


def _record_volume(shards: _Shards, info: dict, grad_accum: int, world: int, k: int) -> None:
    """Bytes each rank sends to the others per optimizer step, from the first forward."""
    volumes = [ex.volume() for ex in shards.exchanges]
    sent = {key: sum(v[key] for v in volumes) * grad_accum for key in volumes[0]}
    per_rank = [None] * world
    dist.all_gather_object(per_rank, sent)
    totals = [sum(d.values()) for d in per_rank]
    info["exchange_bytes_per_step"] = {"max_per_rank": max(totals), "per_rank": totals,
                                       "by_kind_rank0": per_rank[0]}
    if shards.replica_group is not None:  # ring all-reduce sends 2(n-1)/n of the shard per rank
        n = world // k
        shard_bytes = sum(st.weight.numel() * st.weight.element_size() for st in shards.tables.values())
        info["replica_allreduce_bytes_per_step"] = int(2 * (n - 1) / n * shard_bytes)
