"""embedding-shard's collectives and host time per training step, on the CPU (issue 25).

On one H100 wide-deep's sharded path at degree 1 ran at 0.86-0.87 of the plain loop: ~0.7 ms of
host work per ~4.7 ms step (collectives over one rank cost tens of µs each, plus their
bookkeeping). Host work does not depend on tensor sizes, so this counts and times it here:

* torch.distributed calls per training step (forward, backward, optimizer step) at degree 1 (this
  process, gloo, one rank) and at degree 2 (two spawned gloo processes), for shard=table and row;
  DDP's bucket all-reduces run in C++ and are not counted (none at degree 1);
* aten ops per step (a dispatch mode counting every op, views included) against ``single``;
* the step time at degree 1 against ``single`` (ms: the median over interleaved repeats of each
  repeat's median, the fastest repeat's median, and the process's CPU time per step, which a
  busy machine inflates less), one thread, for the tiny flavour and a "medium" one (the full
  flavour's 26 + 2 fields at 1,000 rows each, deep width 16, MLP 3 x 256: host work shows, the
  optimizer over the tables does not swamp it);
* the lookups alone (µs, fastest repeat): forward and backward of ``model.embed`` (``single``: the
  plain table modules; ``embedding-shard``: its exchange), the steadiest view of the overhead.

    python benchmarks/embshard_host_cpu.py [--steps 30] [--repeats 5] [--batch 512]

Prints one JSON line per (flavour, strategy) and a table.
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

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

COLLECTIVES = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
               "reduce_scatter_tensor", "broadcast", "all_gather_object", "barrier")
CASES = [("single", {}), ("embedding-shard", {"shard": "table"}), ("embedding-shard", {"shard": "row"})]


def _medium():
    """Register the "medium" flavour in this process only (not a flavour of the model)."""
    import dlscale.models as models
    from dlscale.models import wide_deep as wd

    models._load_all()
    if "medium" not in models._FLAVORS["wide-deep"]:
        models._FLAVORS["wide-deep"] += ("medium",)
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


class OpCount(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def build(strategy: str, opts: dict, flavor: str, batch: int, rank: int = 0, world: int = 1):
    """(step function, parallelized) of one case, on this process's group."""
    from dlscale.config import RunConfig
    from dlscale.strategies import DistEnv, get_strategy, resolve_spec

    cfg = RunConfig(model="wide-deep", flavor=flavor, strategy=strategy, strategy_options=opts, device="cpu",
                    precision="fp32", batch_size=batch, nproc_per_node=world, monitor=False)
    spec = resolve_spec(cfg)
    torch.manual_seed(0)
    model = spec.build()
    par = get_strategy(strategy).fn(model, spec, cfg, DistEnv(rank, world, rank, world, torch.device("cpu"), "gloo"))
    full = spec.make_batch(batch * world, torch.device("cpu"), torch.Generator().manual_seed(1))
    mine = tuple(t[rank * batch:(rank + 1) * batch] for t in full)

    def step():
        par.module(*mine).backward()
        par.optimizer.step()
        par.optimizer.zero_grad(set_to_none=True)

    def tables():  # the lookups alone: the model's embed (single: the plain modules), forward and backward
        sum(o.sum() for o in model.embed(mine[1], mine[2])).backward()

    step.tables = tables
    return step, par


def per_step(step, steps: int = 3) -> tuple[dict, int]:
    """(collective calls, aten ops) per step, after a warm-up step (the first forward records the volume)."""
    step()
    calls: collections.Counter = collections.Counter()
    with counting(calls), OpCount() as ops:
        for _ in range(steps):
            step()
    return {k: v / steps for k, v in sorted(calls.items())}, ops.n / steps


def _degree2(rank: int, path: str, flavor: str, batch: int, out: str) -> None:
    _medium()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    res = {}
    for strategy, opts in CASES[1:]:
        step, _ = build(strategy, opts, flavor, batch, rank, 2)
        res[opts["shard"]] = per_step(step)[0]
    if rank == 0:
        with open(out, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per repeat (default 30)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per case, interleaved (default 5)")
    ap.add_argument("--batch", type=int, default=512, help="batch per rank (default 512)")
    ap.add_argument("--no-degree2", action="store_true", help="skip the 2-process count")
    args = ap.parse_args()
    _medium()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    dist.init_process_group("gloo", init_method=f"file://{tmp}/pg", rank=0, world_size=1)
    rows = []
    for flavor in ("tiny", "medium"):
        built = [(s, o, *build(s, o, flavor, args.batch)) for s, o in CASES]
        counts = [per_step(step) for _, _, step, _ in built]
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
            row = {"flavor": flavor, "strategy": s, **o, "batch": args.batch, "collectives_deg1": counts[i][0],
                   "ops_per_step": counts[i][1], "step_ms": round(statistics.median(times[i]), 3),
                   "step_ms_min": round(min(times[i]), 3), "cpu_ms": round(statistics.median(cpu[i]), 3),
                   "tables_us_min": round(min(lookups[i]), 1),
                   "step_ms_repeats": [round(t, 3) for t in times[i]]}
            if s != "single":
                row["exchange"] = par.info.get("exchange_bytes_per_step")
            rows.append(row)
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()
    deg2 = {}
    if not args.no_degree2:
        out = f"{tmp}/deg2.json"
        mp.spawn(_degree2, args=(f"{tmp}/pg2", "tiny", 16, out), nprocs=2)
        with open(out) as f:
            deg2 = json.load(f)
        print(json.dumps({"degree2_tiny": deg2}), flush=True)
    print(f"\ntorch {torch.__version__}, 1 thread, fp32, batch {args.batch}, "
          f"median of {args.repeats} x {args.steps} steps")
    print(f"{'flavor':7s} {'case':22s} {'collectives/step (deg 1)':>26s} {'deg 2':>6s} {'ops/step':>9s} "
          f"{'step ms':>8s} {'min':>7s} {'cpu ms':>7s} {'tables us':>9s}")
    for r in rows:
        name = r["strategy"] + (f" {r['shard']}" if "shard" in r else "")
        c1 = sum(r["collectives_deg1"].values())
        c2 = sum(deg2.get(r.get("shard"), {}).values()) if "shard" in r and deg2 else ""
        print(f"{r['flavor']:7s} {name:22s} {c1:26g} {c2!s:>6s} {r['ops_per_step']:9g} {r['step_ms']:8.3f} "
              f"{r['step_ms_min']:7.3f} {r['cpu_ms']:7.3f} {r['tables_us_min']:9.1f}")


if __name__ == "__main__":
    sys.exit(main())
