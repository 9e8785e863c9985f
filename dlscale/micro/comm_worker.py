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

from dlscale.case import procs
from dlscale.micro import common
from dlscale.micro.comm import (DTYPE_BYTES, IN_PLACE_OPS, OPS, algbw_busbw, busbw_factor, op_layout,
                                size_sweep)

if __name__ == "__main__":  # end with torchrun's agent even when it is SIGKILLed (procs.py)
    procs.die_with_parent()

# exactly representable consecutive integers per dtype (2**(mantissa bits + 1))
EXACT_INT_LIMIT = {"fp32": 2**24, "fp16": 2**11, "bf16": 2**8}
PATTERN_MAX = 3  # fill pattern p = 1, 2, 3, 1, 2, 3, ...


def _torch_dtype(dtype: str):
    import torch  # torch: keeps start-up light

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]


def _pattern(count: int, tdt, dev):
    import torch  # torch: keeps start-up light

    tile = torch.tensor([1.0, 2.0, 3.0], dtype=tdt, device=dev)
    return tile.repeat((count + 2) // 3)[:count]


def _gather_single(dist):
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Case:
    """Buffers, the collective call and the check of one (op, chunk count)."""

    def __init__(self, op: str, count: int, n: int, rank: int, dtype: str, dev):
        import torch  # torch: keeps start-up light
        import torch.distributed as dist  # torch: keeps start-up light

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
        import torch  # torch: keeps start-up light

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


class _Ranks:
    """What the ranks agree on together: any rank out of memory, every rank correct, the slowest time."""

    def __init__(self, dev):
        import torch  # torch: keeps start-up light
        import torch.distributed as dist  # torch: keeps start-up light

        self.dist, self.dev = dist, dev
        self.n, self.rank = dist.get_world_size(), dist.get_rank()
        self._flag = torch.zeros(1, dtype=torch.int32, device=dev)
        self._time = torch.zeros(1, dtype=torch.float64, device=dev)

    def barrier(self) -> None:
        if self.dev.type == "cuda":
            self.dist.barrier(device_ids=[self.dev.index])
        else:
            self.dist.barrier()

    def any(self, value: bool) -> bool:
        self._flag.fill_(1 if value else 0)
        self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MAX)
        return bool(self._flag.item())

    def all(self, value: bool) -> bool:
        self._flag.fill_(1 if value else 0)
        self.dist.all_reduce(self._flag, op=self.dist.ReduceOp.MIN)
        return bool(self._flag.item())

    def slowest(self, seconds: float) -> float:
        self._time.fill_(seconds)
        self.dist.all_reduce(self._time, op=self.dist.ReduceOp.MAX)
        return float(self._time.item())


def run_collectives(ops: Sequence[str], sizes: Sequence[int], dtype: str = "fp32", device=None,
                    warmup: int = 5, iters: int = 20,
                    on_row: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Measure ``ops`` at each requested size S (bytes) in the initialised default process group.

    Every rank must call it with the same arguments; every rank gets the same rows. ``device``:
    the torch device of this rank (default: the current CUDA device for NCCL, else CPU).
    """
    import torch  # torch: keeps start-up light
    import torch.distributed as dist  # torch: keeps start-up light

    if device is None:
        nccl = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    ranks = _Ranks(torch.device(device))
    timing = common.Timing(warmup, iters, min_sample_s=0.0)  # every rank makes the same number of calls
    elt = DTYPE_BYTES[dtype]
    rows: list[dict[str, Any]] = []
    for op in ops:
        seen: set[int] = set()
        for req in sizes:
            count, nbytes = op_layout(op, req, ranks.n, elt)
            if nbytes in seen:  # rounding made two requested sizes the same
                continue
            seen.add(nbytes)
            row: dict[str, Any] = {"op": op, "dtype": dtype, "requested_bytes": req, "bytes": nbytes,
                                   "count": nbytes // elt, "nranks": ranks.n, "in_place": op in IN_PLACE_OPS,
                                   "status": "ok", "reason": None, "correct": None, "time_us": None,
                                   "algbw_gbps": None, "busbw_gbps": None, "busbw_factor": busbw_factor(op, ranks.n),
                                   "samples": None}
            _measure(row, count, ranks, timing)
            rows.append(row)
            if on_row:
                on_row(row)
    return rows


def _measure(row: dict[str, Any], count: int, ranks: _Ranks, timing: common.Timing) -> None:
    """Allocate, check and time one row's collective, every rank together; fills ``row``."""
    dev = ranks.dev
    reason = None
    try:
        case = _Case(row["op"], count, ranks.n, ranks.rank, row["dtype"], dev)
        common.synchronize(dev)
    except Exception as e:  # noqa: BLE001
        if common.classify_error(e) != "oom":
            raise
        case, reason = None, common.error_reason(e)
    if ranks.any(case is None):  # every rank skips if any rank ran out
        row.update(status="oom", reason=reason or "out of memory on another rank")
        del case
        common.free_memory(dev)
        return
    ranks.barrier()
    case.fn()
    common.synchronize(dev)
    correct = case.check()
    case.drop_reference()
    row["correct"] = ranks.all(correct)  # correct on every rank
    ranks.barrier()
    t = timing.measure(case.fn, dev)
    secs = ranks.slowest(t["median_s"])
    alg, bus = algbw_busbw(row["op"], row["bytes"], secs, ranks.n)
    row.update(time_us=secs * 1e6, algbw_gbps=alg, busbw_gbps=bus, samples=t["samples"])


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
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
    args.ops = [o for o in args.ops.split(",") if o]
    for op in args.ops:
        if op not in OPS:
            ap.error(f"unknown op {op!r}")
    return args


def _meta(backend: str, n: int, dev) -> dict[str, Any]:
    """What the record says of the run: backend, world size, device, torch and NCCL versions."""
    import torch  # torch: keeps start-up light

    meta: dict[str, Any] = {"backend": backend, "world_size": n, "device_name": common.device_name(dev),
                            "torch": torch.__version__, "nccl": None}
    if backend == "nccl":
        try:
            meta["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001
            pass
    return meta


class _Output:
    """Rank 0's rows so far in the ``--out`` JSON file (rewritten after every row, so that a run killed
    half-way keeps what it did) and its progress lines; the failure-injection hook of the tests."""

    def __init__(self, path: str, meta: dict[str, Any], rank: int):
        self.path, self.meta, self.rank = path, meta, rank
        self.rows: list[dict[str, Any]] = []
        # testing hook: DLSCALE_MICRO_COMM_INJECT_FAILURE=RANK makes that rank raise after its first row
        self.inject = os.environ.get("DLSCALE_MICRO_COMM_INJECT_FAILURE")

    def write(self, done: bool) -> None:
        if self.rank != 0:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"meta": self.meta, "rows": self.rows, "done": done}, f)
        os.replace(tmp, self.path)

    def after_row(self, row: dict[str, Any]) -> None:
        if self.rank == 0:
            self.rows.append(row)
            self.write(False)
            if row["status"] == "ok":
                print(f"[comm] {row['op']:>14} {row['bytes']:>12} B {row['time_us']:>12.2f} us "
                      f"algbw {row['algbw_gbps']:8.3f} GB/s busbw {row['busbw_gbps']:8.3f} GB/s "
                      f"correct={row['correct']}", flush=True)
            else:
                print(f"[comm] {row['op']:>14} {row['bytes']:>12} B {row['status']}: {row['reason']}", flush=True)
        if self.inject is not None and self.inject.strip() == str(self.rank):
            raise RuntimeError(f"injected failure on rank {self.rank} (DLSCALE_MICRO_COMM_INJECT_FAILURE)")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    sizes = size_sweep(args.min_bytes, args.max_bytes, args.factor)

    import torch.distributed as dist  # torch: keeps start-up light

    from dlscale.train.worker import dist_env_from_environ  # torch: keeps start-up light

    denv = dist_env_from_environ(args.device)  # the training worker's rank/device/backend rules
    dev, backend = denv.device, denv.backend
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    out = _Output(args.out, _meta(backend, dist.get_world_size(), dev), rank)
    out.write(False)
    try:
        run_collectives(args.ops, sizes, args.dtype, dev, args.warmup, args.iters, on_row=out.after_row)
    except Exception as e:
        # one line the parent puts first in the record's error; torchrun prints the traceback
        # one write (under PIPE_BUF): the line cannot interleave with a peer's output in torchrun's pipe
        sys.stdout.write(f"[comm-error] rank {rank}: {common.error_reason(e, 500)}\n")
        sys.stdout.flush()
        raise
    out.write(True)
    dist.barrier(device_ids=[denv.local_rank]) if backend == "nccl" else dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
