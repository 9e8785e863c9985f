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
2. the ids are grouped by owner, table by table inside each owner's block, and exchanged in one
   ``all_to_all_single``. Table-wise: batch-major inside each (owner, table) block (a fixed
   permutation made once per batch size, no sort), the counts known in advance. Row-wise: a
   stable sort by owner, and the counts of every (owner, table) exchanged first (one small
   all-to-all and one host read of the split sizes: the path's only host sync). At one rank, in
   either mode, the ids go out as they are plus the fields' offsets: no owner map, sort,
   permutation or count exchange;
3. the owner looks every (source, table) piece up in its shards straight into one vector buffer,
   which goes back in one all-to-all; each table's vectors are put back in the batch's order by
   one gather (none at one rank: the outputs are views of the received buffer), (B, fields, dim).
   Backward: the gradients of every table go back to the owners in one all-to-all (scaled by
   1/world: each rank's loss is the mean over its own slice, so the sum over ranks would be world
   x the gradient of the global mean that DDP gives the MLP), where the lookups' backward
   (``embedding_dense_backward``, as ``F.embedding``'s) sums them into each shard's gradient.

Collectives per micro-batch (forward and backward), whatever the number of tables: 3
all-to-alls (ids, vectors, gradients), plus 1 (the counts) row-wise at more than one rank (before
the merge: 3 per table module, 6 for wide-deep, 8 row-wise). Per optimizer step, with ``shards``
< world, one all-reduce per table module across the copies; DDP's buckets for the MLP at more
than one rank. At one rank a step is the plain lookups' kernels plus the 3 all-to-alls (copies
over one rank) and one copy of the gradients into the send buffer. A model without ``embed``
gets one exchange per table module (3 all-to-alls each).

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
from torch import nn

from dlscale import ConfigError
from dlscale.strategies import Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.strategies._sharding import data_parallel, materialize, meta_spec, probe, resized

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
    """One exchange's sizes: ``out_n[j * T + t]`` ids of table t go to rank j (its vectors come back),
    ``in_n[j * T + t]`` come from rank j; the splits of the id, vector and gradient buffers (rank by
    rank, table by table inside a rank's block), the outputs' shapes, and per table None or the
    (gather, its inverse or None) that puts the vectors back in the batch's order."""

    __slots__ = ("out_n", "in_n", "out_el", "in_el", "out_ids", "in_ids", "out_vec", "in_vec", "in_total",
                 "out_el_total", "in_el_total", "shapes", "perms", "off", "order")

    def __init__(self, out_n: list[int], in_n: list[int], dims: list[int], k: int, shapes: list[tuple], perms: list):
        t = len(dims)

        def per_rank(xs):
            return [sum(xs[j * t:(j + 1) * t]) for j in range(k)]

        self.out_n, self.in_n = out_n, in_n
        self.out_el = [n * dims[i % t] for i, n in enumerate(out_n)]
        self.in_el = [n * dims[i % t] for i, n in enumerate(in_n)]
        self.out_ids, self.in_ids = per_rank(out_n), per_rank(in_n)
        self.out_vec, self.in_vec = per_rank(self.out_el), per_rank(self.in_el)
        self.in_total, self.out_el_total, self.in_el_total = sum(self.in_ids), sum(self.out_vec), sum(self.in_vec)
        self.shapes, self.perms = shapes, perms
        self.off = self.order = None


class Exchange:
    """The exchange of a set of tables, all at once: ``exchange(*ids) -> one (B, fields, dim) per table``.

    The ids of every table are flattened and concatenated (table by table, batch-major), mapped to
    their owners' rows and sent in one all-to-all (rank by rank, table by table inside each rank's
    block); the owner looks each piece up straight into one vector buffer, which goes back in one
    all-to-all; the gradients go the same way in one all-to-all in the backward. Row-wise at more
    than one rank, one count all-to-all and one host read of the counts come first. Sizes, offsets
    and permutations that depend only on the batch size (table-wise; any mode at one rank) are made
    once per batch size."""

    def __init__(self, tables: list[ShardedTables], group, k: int, me: int, grad_scale: float):
        self.tables, self.group, self.k, self.me, self.grad_scale = list(tables), group, k, me, grad_scale
        self.mode = self.tables[0].mode
        self.dims = [st.dim for st in self.tables]
        self._plans: dict[int, _Plan] = {}
        self._flat: dict[int, tuple] = {}
        self.last: _Plan | None = None  # the last forward's plan: the volume record reads it

    def __call__(self, *ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b = ids[0].shape[0]
        flat = torch.cat([x.reshape(-1) for x in ids]) if len(ids) > 1 else ids[0].reshape(-1)
        if self.k == 1 or self.mode == "table":
            plan = self._plans.get(b) or self._fixed_plan(b, flat.device)
            send = flat + plan.off
            if plan.order is not None:
                send = send.index_select(0, plan.order)
        else:
            plan, send = self._row_plan(b, flat)
        self.last = plan
        return _Exchange.apply(self, plan, send, *[st.weight for st in self.tables])

    def _fixed_plan(self, b: int, device: torch.device) -> _Plan:
        """Table-wise (or any mode at one rank): rank j gets B x its fields of each table, batch-major."""
        k, me, n_t = self.k, self.me, len(self.tables)
        nf = [len(st.rows) for st in self.tables]
        out_n = [b * st.owners.count(j) for j in range(k) for st in self.tables]
        in_n = [b * st.owners.count(me) for _ in range(k) for st in self.tables]
        perms, by_rank, base = [], [], 0
        for st, n in zip(self.tables, nf):
            slots = torch.arange(b * n, device=device).view(b, n)
            mine = [slots[:, [f for f in range(n) if st.owners[f] == j]].reshape(-1) for j in range(k)]
            order = torch.cat(mine)
            if torch.equal(order, slots.view(-1)):
                perms.append(None)
            else:
                inverse = torch.empty_like(order)
                inverse[order] = torch.arange(order.numel(), device=device)
                perms.append((inverse, order))
            by_rank.append([m + base for m in mine])
            base += b * n
        plan = _Plan(out_n, in_n, self.dims, k, [(b, n, d) for n, d in zip(nf, self.dims)], perms)
        plan.off = torch.cat([st.off_t.repeat(b) for st in self.tables])  # each slot's offset in its owner's stack
        order = torch.cat([by_rank[t][j] for j in range(k) for t in range(n_t)])
        plan.order = None if torch.equal(order, torch.arange(base, device=device)) else order
        self._plans[b] = plan
        return plan

    def _row_plan(self, b: int, flat: torch.Tensor) -> tuple[_Plan, torch.Tensor]:
        """Row-wise at K > 1 ranks: owners from the ids, a stable sort by owner, the counts exchanged."""
        k, n_t = self.k, len(self.tables)
        if b not in self._flat:  # each slot's block size, offset and table; 0..N-1
            dev = flat.device
            self._flat[b] = (torch.cat([st.block_t.repeat(b) for st in self.tables]),
                             torch.cat([st.off_t.repeat(b) for st in self.tables]),
                             torch.cat([torch.full((b * len(st.rows),), t, dtype=torch.long, device=dev)
                                        for t, st in enumerate(self.tables)]),
                             torch.arange(flat.numel(), device=dev), torch.ones_like(flat))
        block, off, table, arange, ones = self._flat[b]
        owner = torch.div(flat, block, rounding_mode="floor")
        row = torch.remainder(flat, block).add_(off)
        key = torch.add(table, owner, alpha=n_t)  # (owner, table) of each slot
        # not bincount: on CUDA it reads the largest key on the host first (a sync)
        counts = torch.zeros(k * n_t, dtype=torch.long, device=flat.device).index_add_(0, key, ones)
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts, group=self.group)
        # slots are table by table, so a stable sort by owner leaves each owner's block table by table
        order = torch.argsort(owner, stable=True)
        send = row.index_select(0, order)
        inverse = torch.empty_like(order).index_put_((order,), arange)
        # a slot's place among its own table's vectors as they come back: its place in the send
        # buffer less the other tables' ids sent before it
        ahead = counts.cumsum(0) - counts
        per_table = counts.view(k, n_t)
        ahead = ahead - (per_table.cumsum(0) - per_table).view(-1)
        pos = inverse - ahead.index_select(0, key)
        sizes = torch.stack([counts, got]).tolist()  # the one host sync of the row-wise exchange
        nf = [len(st.rows) for st in self.tables]
        perms = [(p, None) for p in pos.split_with_sizes([b * n for n in nf])]
        return _Plan(sizes[0], sizes[1], self.dims, k, [(b, n, d) for n, d in zip(nf, self.dims)], perms), send

    def volume(self) -> dict[str, int]:
        """Bytes this rank sent to the other ranks of its group in the last forward and its backward."""
        p, n_t = self.last, len(self.tables)
        others = [i for i in range(self.k * n_t) if i // n_t != self.me]
        size = self.tables[0].weight.element_size()
        return {"ids": 8 * sum(p.out_n[i] for i in others), "vectors": size * sum(p.in_el[i] for i in others),
                "gradients": size * sum(p.out_el[i] for i in others),
                "counts": 8 * n_t * (self.k - 1) if self.mode == "row" and self.k > 1 else 0}


class _Exchange(torch.autograd.Function):
    """Ids out, lookups, vectors back (forward); gradients back to the owners, the lookups' backward."""

    @staticmethod
    def forward(ctx, ex: Exchange, plan: _Plan, send: torch.Tensor, *weights: torch.Tensor):
        n_t, dims = len(weights), ex.dims
        recv = send.new_empty(plan.in_total)
        dist.all_to_all_single(recv, send, plan.in_ids, plan.out_ids, group=ex.group)
        ids = recv.split_with_sizes(plan.in_n)  # piece j * T + t: table t's ids from rank j
        vec = weights[0].new_empty(plan.in_el_total)
        for i, (x, v) in enumerate(zip(ids, vec.split_with_sizes(plan.in_el))):
            torch.index_select(weights[i % n_t], 0, x, out=v.view(plan.in_n[i], dims[i % n_t]))
        back = vec.new_empty(plan.out_el_total)
        dist.all_to_all_single(back, vec, plan.out_vec, plan.in_vec, group=ex.group)
        pieces = back.split_with_sizes(plan.out_el)
        outs = []
        for t, (shape, perm) in enumerate(zip(plan.shapes, plan.perms)):
            x = pieces[t] if ex.k == 1 else torch.cat(pieces[t::n_t])
            if perm is not None:
                x = x.view(-1, dims[t]).index_select(0, perm[0])
            outs.append(x.view(shape))
        ctx.ex, ctx.plan, ctx.ids, ctx.rows = ex, plan, ids, [w.shape[0] for w in weights]
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        ex, plan = ctx.ex, ctx.plan
        n_t, dims, k, scale = len(grads), ex.dims, ex.k, ex.grad_scale
        send = grads[0].new_empty(plan.out_el_total)
        if k == 1:  # each table's gradients straight into its piece (scaled on the way)
            for g, piece in zip(grads, send.split_with_sizes(plan.out_el)):
                if scale != 1.0:
                    torch.mul(g, scale, out=piece.view(g.shape))
                else:
                    piece.view(g.shape).copy_(g)
        else:  # into the send layout, then interleaved rank by rank
            parts = []
            for t, (g, perm) in enumerate(zip(grads, plan.perms)):
                rows = g.reshape(-1, dims[t])
                if perm is not None:
                    rows = (rows.index_select(0, perm[1]) if perm[1] is not None
                            else torch.empty_like(rows).index_copy_(0, perm[0], rows))
                parts.append(rows.reshape(-1).split_with_sizes(plan.out_el[t::n_t]))
            torch.cat([parts[t][j] for j in range(k) for t in range(n_t)], out=send)
            if scale != 1.0:
                send.mul_(scale)
        recv = send.new_empty(plan.in_el_total)
        dist.all_to_all_single(recv, send, plan.in_vec, plan.out_vec, group=ex.group)
        pieces = recv.split_with_sizes(plan.in_el)
        out = [None] * n_t
        for t in range(n_t):
            if not ctx.needs_input_grad[3 + t]:
                continue
            g = pieces[t] if k == 1 else torch.cat(pieces[t::n_t])
            ix = ctx.ids[t] if k == 1 else torch.cat(ctx.ids[t::n_t])
            # the op F.embedding's backward runs: the same sums as the unsharded lookup at one rank
            out[t] = torch.ops.aten.embedding_dense_backward(g.view(ix.numel(), dims[t]), ix, ctx.rows[t], -1, False)
        return (None, None, None, *out)


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
        volumes = [ex.volume() for ex in exchanges]
        sent = {key: sum(v[key] for v in volumes) * cfg.grad_accum for key in volumes[0]}
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
