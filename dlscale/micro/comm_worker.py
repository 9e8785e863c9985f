"""Worker of ``dlscale micro comm``: one rank under torchrun (``python -m dlscale.micro.comm_worker``).

Every rank runs the same sequence of collectives. For each op and size: allocate (all ranks agree
on an out-of-memory skip), fill with rank-dependent values, run the collective once and check the
result exactly, barrier, then time ``warmup`` + ``iters`` calls (CUDA events per call on GPU,
``perf_counter`` on CPU). A row's time is the largest of the ranks' medians. Rank 0 rewrites
its rows to ``--out`` (JSON) after every row, so that a run killed half-way keeps what it did.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from typing import Any, Callable, Sequence

from dlscale import procs
from dlscale.micro import common
from dlscale.micro.comm import (DTYPE_BYTES, IN_PLACE_OPS, OPS, algbw_busbw, busbw_factor, op_layout,
                                size_sweep)

if __name__ == "__main__":  # end with torchrun's agent even when it is SIGKILLed (procs.py)
    procs.die_with_parent()

# exactly representable consecutive integers per dtype (2**(mantissa bits + 1))
EXACT_INT_LIMIT = {"fp32": 2**24, "fp16": 2**11, "bf16": 2**8}
PATTERN_MAX = 3  # fill pattern p = 1, 2, 3, 1, 2, 3, ...


def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def _pattern(count: int, tdt, dev):
    import torch

    tile = torch.tensor([1.0, 2.0, 3.0], dtype=tdt, device=dev)
    return tile.repeat((count + 2) // 3)[:count]


def _gather_single(dist):
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Case:
    """Buffers, the collective call and the check of one (op, chunk count)."""

    def __init__(self, op: str, count: int, n: int, rank: int, dtype: str, dev):
        import torch
        import torch.distributed as dist

        tdt = _torch_dtype(dtype)
        self.op, self.n, self.rank, self.count = op, n, rank, count
        p = _pattern(count, tdt, dev)
        tri = n * (n + 1) // 2
        if op in IN_PLACE_OPS:
            self.buf = p * (rank + 1)
            self.fn: Callable[[], Any] = {
                "all_reduce": lambda: dist.all_reduce(self.buf),
                "broadcast": lambda: dist.broadcast(self.buf, src=0),
                "reduce": lambda: dist.reduce(self.buf, dst=0),
            }[op]
            scale = {"all_reduce": tri, "broadcast": 1, "reduce": tri}[op]
            self.expected = [(self.buf, p, scale)] if (op != "reduce" or rank == 0) else []
            self.max_value = PATTERN_MAX * scale
        else:
            self.inp = torch.empty(count * (1 if op == "all_gather" else n), dtype=tdt, device=dev)
            self.out = torch.empty(count * (1 if op == "reduce_scatter" else n), dtype=tdt, device=dev)
            if op == "all_gather":
                self.inp.copy_(p).mul_(rank + 1)
                self.fn = lambda: _gather_single(dist)(self.out, self.inp)
                outv = self.out.view(n, count)
                self.expected = [(outv[j], p, j + 1) for j in range(n)]
                self.max_value = PATTERN_MAX * n
            elif op == "reduce_scatter":
                inv = self.inp.view(n, count)
                for j in range(n):  # this rank's contribution to rank j's chunk
                    inv[j].copy_(p).mul_((rank + 1) * (j + 1))
                self.fn = lambda: _reduce_scatter_single(dist)(self.out, self.inp)
                self.expected = [(self.out, p, (rank + 1) * tri)]
                self.max_value = PATTERN_MAX * n * tri
            else:  # all_to_all: chunk j of rank r goes to rank j as its chunk r
                inv = self.inp.view(n, count)
                for j in range(n):
                    inv[j].copy_(p).mul_(rank * n + j + 1)
                self.fn = lambda: dist.all_to_all_single(self.out, self.inp)
                outv = self.out.view(n, count)
                self.expected = [(outv[j], p, j * n + rank + 1) for j in range(n)]
                self.max_value = PATTERN_MAX * n * n
        self.exact = self.max_value <= EXACT_INT_LIMIT[dtype]

    def check(self) -> bool:
        import torch

        for actual, p, scale in self.expected:
            want = p * scale
            if self.exact:
                if not torch.equal(actual, want):
                    return False
            elif not torch.allclose(actual.float(), want.float(), rtol=1e-2, atol=0.0):
                return False
        return True

    def drop_reference(self) -> None:
        self.expected = []


def run_collectives(ops: Sequence[str], sizes: Sequence[int], dtype: str = "fp32", device=None,
                    warmup: int = 5, iters: int = 20,
                    on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Measure ``ops`` at each requested size S (bytes) in the initialised default process group.

    Every rank must call it with the same arguments; every rank gets the same rows. ``device``:
    the torch device of this rank (default: the current CUDA device for NCCL, else CPU).
    """
    import torch
    import torch.distributed as dist

    n, rank = dist.get_world_size(), dist.get_rank()
    backend = dist.get_backend()
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    dev = torch.device(device)
    elt = DTYPE_BYTES[dtype]
    flag = torch.zeros(1, dtype=torch.int32, device=dev)
    timing = torch.zeros(1, dtype=torch.float64, device=dev)

    def barrier() -> None:
        if dev.type == "cuda":
            dist.barrier(device_ids=[dev.index])
        else:
            dist.barrier()

    rows: list[dict[str, Any]] = []
    for op in ops:
        seen: set[int] = set()
        for req in sizes:
            count, nbytes = op_layout(op, req, n, elt)
            if nbytes in seen:  # rounding made two requested sizes the same
                continue
            seen.add(nbytes)
            row: dict[str, Any] = {"op": op, "dtype": dtype, "requested_bytes": req, "bytes": nbytes,
                                   "count": nbytes // elt, "nranks": n, "in_place": op in IN_PLACE_OPS,
                                   "status": "ok", "reason": None, "correct": None, "time_us": None,
                                   "algbw_gbps": None, "busbw_gbps": None, "busbw_factor": busbw_factor(op, n),
                                   "samples": None}
            case = None
            reason = None
            try:
                case = _Case(op, count, n, rank, dtype, dev)
                common.synchronize(dev)
            except Exception as e:  # noqa: BLE001
                if common.classify_error(e) != "oom":
                    raise
                case, reason = None, common.error_reason(e)
            flag.fill_(0 if case is not None else 1)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank skips if any rank ran out
            if int(flag.item()):
                row.update(status="oom", reason=reason or "out of memory on another rank")
                case = None
                common.free_memory(dev)
                rows.append(row)
                if on_row:
                    on_row(row)
                continue
            barrier()
            case.fn()
            common.synchronize(dev)
            flag.fill_(1 if case.check() else 0)
            case.drop_reference()
            dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # correct on every rank
            row["correct"] = bool(flag.item())
            barrier()
            t = common.measure(case.fn, dev, warmup, iters, min_sample_s=0.0)
            timing.fill_(t["median_s"])
            dist.all_reduce(timing, op=dist.ReduceOp.MAX)
            secs = float(timing.item())
            alg, bus = algbw_busbw(op, nbytes, secs, n)
            row.update(time_us=secs * 1e6, algbw_gbps=alg, busbw_gbps=bus, samples=t["samples"])
            case = None
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlscale.micro.comm_worker")
    ap.add_argument("--ops", required=True)
    ap.add_argument("--min-bytes", type=int, required=True)
    ap.add_argument("--max-bytes", type=int, required=True)
    ap.add_argument("--factor", type=float, default=2.0)
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    ops = [o for o in args.ops.split(",") if o]
    for op in ops:
        if op not in OPS:
            ap.error(f"unknown op {op!r}")
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)

    import torch
    import torch.distributed as dist

    from dlscale.worker import dist_env_from_environ

    denv = dist_env_from_environ(args.device)  # the training worker's rank/device/backend rules
    dev, backend = denv.device, denv.backend
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank, n = dist.get_rank(), dist.get_world_size()
    meta: dict[str, Any] = {"backend": backend, "world_size": n, "device_name": common.device_name(dev),
                            "torch": torch.__version__, "nccl": None}
    if backend == "nccl":
        try:
            meta["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001
            pass
    rows: list[dict[str, Any]] = []

    def write(done: bool) -> None:
        tmp = args.out + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"meta": meta, "rows": rows, "done": done}, f)
        os.replace(tmp, args.out)

    def on_row(row: dict[str, Any]) -> None:
        rows.append(row)
        write(False)
        if row["status"] == "ok":
            print(f"[comm] {row['op']:>14} {row['bytes']:>12} B {row['time_us']:>12.2f} us "
                  f"algbw {row['algbw_gbps']:8.3f} GB/s busbw {row['busbw_gbps']:8.3f} GB/s "
                  f"correct={row['correct']}", flush=True)
        else:
            print(f"[comm] {row['op']:>14} {row['bytes']:>12} B {row['status']}: {row['reason']}", flush=True)

    # testing hook: DLSCALE_MICRO_COMM_INJECT_FAILURE=RANK makes that rank raise after its first row
    inject = os.environ.get("DLSCALE_MICRO_COMM_INJECT_FAILURE")

    def after_row(row: dict[str, Any]) -> None:
        if rank == 0:
            on_row(row)
        if inject is not None and inject.strip() == str(rank):
            raise RuntimeError(f"injected failure on rank {rank} (DLSCALE_MICRO_COMM_INJECT_FAILURE)")

    if rank == 0:
        write(False)
    try:
        run_collectives(ops, sizes, args.dtype, dev, args.warmup, args.iters, on_row=after_row)
    except Exception as e:
        # one line the parent puts first in the record's error; torchrun prints the traceback
        # one write (under PIPE_BUF): the line cannot interleave with a peer's output in torchrun's pipe
        sys.stdout.write(f"[comm-error] rank {rank}: {common.error_reason(e, 500)}\n")
        sys.stdout.flush()
        raise
    if rank == 0:
        write(True)
    dist.barrier(device_ids=[denv.local_rank]) if backend == "nccl" else dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
