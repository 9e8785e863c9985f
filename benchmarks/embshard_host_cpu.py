"""embedding-shard's collectives and host time per training step, on the CPU.

On one H100 wide-deep's sharded path at degree 1 ran at 0.86-0.87 of the plain loop: ~0.7 ms of
host work per ~4.7 ms step (collectives over one rank cost tens of µs each, plus their
bookkeeping). Host work does not depend on tensor sizes, so this counts and times it here:

* per training step (forward, backward, optimizer step) of the full flavour at a small batch
  (``--count-flavor``, ``--count-batch``), at degree 1 (this process, gloo, one rank) and at
  degree 2 (two spawned gloo processes), for the plain loop (``bare``: benchmarks/bare_mp.py's
  model and optimizer, nothing else), ``single`` and shard=table and row: the collectives as
  dispatched (c10d ops, DDP's bucket all-reduces and buffer broadcasts included), every aten op (a
  dispatch mode, views included), the "compute" ops among them (neither views, allocations nor
  collectives: on a GPU about the kernels launched), and the host reads of device values in
  forward and backward (``.tolist()``, ``.item()``, ``nonzero``, ``unique``, ...: on a GPU each
  one waits for the queue to drain);
* the step time at degree 1 against ``single`` (ms: the median over interleaved repeats of each
  repeat's median, the fastest repeat's median, and the process's CPU time per step, which a
  busy machine inflates less), one thread, for the tiny flavour and a "medium" one (the full
  flavour's 26 + 2 fields at 1,000 rows each, deep width 16, MLP 3 x 256: host work shows, the
  optimizer over the tables does not swamp it);
* the lookups alone (µs, fastest repeat): forward and backward of ``model.embed`` (``single``: the
  plain table modules; ``embedding-shard``: its exchange), the steadiest view of the overhead.

    python benchmarks/embshard_host_cpu.py [--steps 30] [--repeats 5] [--batch 512] [--no-timing]

Prints one JSON line per (flavour, strategy) and the tables.

Measured on the CPU (op counts, torch 2.13 CPU, gloo; not GPU timings), full flavour, batch 64 per
rank, per training step, before and after the sharded path's bookkeeping was cut (at
degree 1 the step is bound by the host's launches on an H100). Degree 1 is this process alone,
degree 2 two gloo processes. "ops": every aten op; "compute": those neither views, allocations nor
collectives; "reads": host reads of device values in forward and backward (row-wise at degree 2:
the one ``tolist`` of the split sizes, which the all-to-all needs on the host):

    case (degree)              collectives   ops before/after          compute before/after   reads
    plain loop (bare_mp)            0            239                        138                  0
    single                          0            239                        138                  0
    embedding-shard table (1)   3 -> 0     264 -> 242 -> 239            140 -> 138              0
    embedding-shard row (1)     3 -> 0     264 -> 242 -> 239            140 -> 138              0
    embedding-shard table (2)   6 -> 5     334 -> 326 -> 331     175 -> 172 -> 174              0
    embedding-shard row (2)     7 -> 6     365 -> 353 -> 356     192 -> 189 -> 191              1

At degree 1 the sharded step is the plain loop's ops: this rank's own ids never go through a
collective (at any degree), each table's ids plus its fields' offsets go through ``F.embedding``
as the unsharded module's do, and nothing else runs: no collective (over a group of one it would
move nothing) and, since the exchange became native autograd ops around one all-to-all function,
no autograd function either (its Python forward and backward cost ~60 us of host time per step on
this CPU at a tiny batch: the "tables us" column, +62 us before, ~0 after). At degree 2 the
native ops cost 3-5 ops more per step (concatenations and splits the autograd function did in
place) and one collective less than at first: DDP broadcast the shards' layout buffers
(constants, the same on every rank) every forward; they are now ignored by DDP. On one H100 one
all-to-all over one rank costs about 30-40 us of host time (the equal split ~8 us less than
explicit splits), whatever the bytes: ~2.4 % of wide-deep's 4.4 ms step for the three.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import tempfile
import time
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "broadcast", "all_gather_object", "barrier")
CASES = [("bare", {}), ("single", {}), ("embedding-shard", {"shard": "table"}), ("embedding-shard", {"shard": "row"})]
# aten ops that read a device value on the host (on a GPU each one waits for the queue to drain)
SYNC_OPS = ("_local_scalar_dense", "nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive", "bincount",
            "masked_select", "repeat_interleave", "equal", "is_nonzero")


def _medium():
    """Register the "medium" flavour in this process only (not a flavour of the model)."""
    import dlscale.models as models
    from dlscale.models import wide_deep as wd

    factory, flavors = models._MODELS.get("wide-deep")
    if "medium" not in flavors:
        models._MODELS.replace("wide-deep", (factory, flavors + ("medium",)))
    wd._CONFIGS.setdefault("medium", wd.WideDeepConfig(deep_rows=(1000,) * 26, wide_rows=(1000,) * 2, dense=13,
                                                         dim=16, hidden=256, layers=3, dropout=0.0))


@contextlib.contextmanager
def counting(calls: collections.Counter):
    """Count calls of torch.distributed's collectives (the strategy calls them as ``dist.X``)."""
    saved = {n: getattr(dist, n) for n in COLLECTIVES}

    def wrap(name, fn):
        def counted(*a, **kw):
            calls[name] += 1
            return fn(*a, **kw)
        return counted

    for n, fn in saved.items():
        setattr(dist, n, wrap(n, fn))
    try:
        yield calls
    finally:
        for n, fn in saved.items():
            setattr(dist, n, fn)


# ops that launch no kernel on a GPU (views, allocations, the profiler's markers); the rest compute or copy
NO_KERNEL = ("view", "_unsafe_view", "as_strided", "slice", "split_with_sizes", "split", "select", "t", "transpose",
             "expand", "permute", "unsqueeze", "squeeze", "alias", "detach", "empty", "new_empty", "empty_like",
             "empty_strided", "_record_function_enter_new", "_record_function_exit")


class OpCount(TorchDispatchMode):
    """Counts every aten op, and those of them that read a device value on the host (``syncs``,
    counted while ``self.watch`` is on) plus ``Tensor.tolist`` calls (no aten op of their own)."""

    def __init__(self):
        super().__init__()
        self.n, self.syncs, self.watch, self.kernels = 0, 0, False, 0
        self.c10d: collections.Counter = collections.Counter()  # collectives as dispatched, DDP's C++ ones too

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        if func.overloadpacket.__name__ not in NO_KERNEL and func.namespace != "c10d":
            self.kernels += 1
        if func.namespace == "c10d":
            self.c10d[func.overloadpacket.__name__] += 1
        if self.watch and func.overloadpacket.__name__ in SYNC_OPS:
            self.syncs += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        mode = self

        def tolist(t, *a):
            if mode.watch:
                mode.syncs += 1
            return mode._tolist(t, *a)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


def build(strategy: str, opts: dict, flavor: str, batch: int, rank: int = 0, world: int = 1):
    """(step function, parallelized) of one case, on this process's group."""
    from dlscale.case.config import RunConfig
    from dlscale.strategies import DistEnv, get_strategy, resolve_spec

    cfg = RunConfig(model="wide-deep", flavor=flavor, strategy="single" if strategy == "bare" else strategy,
                    strategy_options=opts, device="cpu", precision="fp32", batch_size=batch, nproc_per_node=world,
                    monitor=False)
    spec = resolve_spec(cfg)
    torch.manual_seed(0)
    model = spec.build()
    if strategy == "bare":  # benchmarks/bare_mp.py's loop: the model and its optimizer, nothing else
        module = model
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay,
                                      betas=(0.9, 0.95), foreach=True)
        par = types.SimpleNamespace(module=model, optimizer=optimizer, info={})
    else:
        par = get_strategy(strategy).fn(model, spec, cfg,
                                        DistEnv(rank, world, rank, world, torch.device("cpu"), "gloo"))
        module, optimizer = par.module, par.optimizer
    full = spec.make_batch(batch * world, torch.device("cpu"), torch.Generator().manual_seed(1))
    mine = tuple(t[rank * batch:(rank + 1) * batch] for t in full)

    def step(ops: OpCount | None = None):
        if ops is not None:
            ops.watch = True  # host reads of forward and backward (the CPU optimizer's .item()s are not the path's)
        module(*mine).backward()
        if ops is not None:
            ops.watch = False
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def tables():  # the lookups alone: the model's embed (single: the plain modules), forward and backward
        sum(o.sum() for o in model.embed(mine[1], mine[2])).backward()

    step.tables = tables
    return step, par


def per_step(step, steps: int = 3) -> tuple[dict, float, float, dict, float]:
    """(torch.distributed calls, aten ops, host reads in forward and backward, c10d ops dispatched:
    DDP's included, ops that are neither views nor allocations nor collectives) per step, after two
    warm-up steps (the first forward records the volume)."""
    step()
    step()  # DDP (degree 2) rebuilds its buckets after its first step
    calls: collections.Counter = collections.Counter()
    with counting(calls), OpCount() as ops:
        for _ in range(steps):
            step(ops)
    return ({k: v / steps for k, v in sorted(calls.items())}, ops.n / steps, ops.syncs / steps,
            {k: v / steps for k, v in sorted(ops.c10d.items())}, ops.kernels / steps)


def _degree2(rank: int, path: str, flavor: str, batch: int, out: str) -> None:
    _medium()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    res = {}
    for strategy, opts in CASES[2:]:
        step, _ = build(strategy, opts, flavor, batch, rank, 2)
        res[opts["shard"]] = per_step(step)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def _name(strategy: str, opts: dict) -> str:
    return strategy + (f" {opts['shard']}" if "shard" in opts else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per repeat (default 30)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per case, interleaved (default 5)")
    ap.add_argument("--batch", type=int, default=512, help="batch per rank of the timed cases (default 512)")
    ap.add_argument("--count-flavor", default="full", help="flavour of the op counts (default full)")
    ap.add_argument("--count-batch", type=int, default=64, help="batch per rank of the op counts (default 64)")
    ap.add_argument("--no-degree2", action="store_true", help="skip the 2-process count")
    ap.add_argument("--no-timing", action="store_true", help="only the op counts")
    args = ap.parse_args()
    _medium()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
    counted = {}
    for s, o in CASES:  # the counts: one case built at a time (the full flavour's tables are large)
        step, _ = build(s, o, args.count_flavor, args.count_batch)
        counted[_name(s, o)] = per_step(step)
        del step
    rows = []
    for flavor in () if args.no_timing else ("tiny", "medium"):
        built = [(s, o, *build(s, o, flavor, args.batch)) for s, o in CASES]
        times = {i: [] for i in range(len(built))}
        cpu = {i: [] for i in range(len(built))}
        lookups = {i: [] for i in range(len(built))}
        for _ in range(args.repeats):  # interleaved: a slow spell of the machine hits every case
            for i, (_, _, step, _) in enumerate(built):
                ms = []
                c0 = time.process_time()
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step()
                    ms.append((time.perf_counter() - t0) * 1e3)
                cpu[i].append((time.process_time() - c0) * 1e3 / args.steps)
                times[i].append(statistics.median(ms))
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    step.tables()
                lookups[i].append((time.perf_counter() - t0) * 1e6 / args.steps)
        for i, (s, o, _, par) in enumerate(built):
            row = {"flavor": flavor, "strategy": s, **o, "batch": args.batch,
                   "step_ms": round(statistics.median(times[i]), 3), "step_ms_min": round(min(times[i]), 3),
                   "cpu_ms": round(statistics.median(cpu[i]), 3), "tables_us_min": round(min(lookups[i]), 1),
                   "step_ms_repeats": [round(t, 3) for t in times[i]]}
            if s == "embedding-shard":
                row["exchange"] = par.info.get("exchange_bytes_per_step")
            rows.append(row)
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    deg2 = {}
    if not args.no_degree2:
        out = f"{tmp}/deg2.json"
        mp.spawn(_degree2, args=(f"{tmp}/pg2", args.count_flavor, args.count_batch, out), nprocs=2)
        with open(out) as f:
            deg2 = {f"embedding-shard {k}": v for k, v in json.load(f).items()}
    print(json.dumps({"counts": {"flavor": args.count_flavor, "batch": args.count_batch, "degree1": counted,
                                 "degree2": deg2}}), flush=True)
    print(f"\ntorch {torch.__version__}; per training step of {args.count_flavor} at batch {args.count_batch} "
          f"per rank, at degree 1 and 2: collectives (c10d ops, DDP's too), aten ops (all, those included), compute "
          f"(ops neither views, allocations nor collectives), host reads (forward and backward)")
    print(f"{'case':22s} {'coll (1)':>9s} {'ops (1)':>8s} {'compute (1)':>11s} {'reads (1)':>9s} {'coll (2)':>9s} "
          f"{'ops (2)':>8s} {'compute (2)':>11s} {'reads (2)':>9s}")
    for name, (_, ops, reads, coll, kernels) in counted.items():
        c2 = deg2.get(name)
        tail = (f"{sum(c2[3].values()):9g} {c2[1]:8g} {c2[4]:11g} {c2[2]:9g}" if c2 else "")
        print(f"{name:22s} {sum(coll.values()):9g} {ops:8g} {kernels:11g} {reads:9g} {tail}")
    if rows:
        print(f"\n1 thread, fp32, batch {args.batch}, median of {args.repeats} x {args.steps} steps")
        print(f"{'flavor':7s} {'case':22s} {'step ms':>8s} {'min':>7s} {'cpu ms':>7s} {'tables us':>9s}")
    for r in rows:
        print(f"{r['flavor']:7s} {_name(r['strategy'], r):22s} {r['step_ms']:8.3f} {r['step_ms_min']:7.3f} "
              f"{r['cpu_ms']:7.3f} {r['tables_us_min']:9.1f}")


if __name__ == "__main__":
    sys.exit(main())
