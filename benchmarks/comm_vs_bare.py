"""dlscale micro comm vs a bare ``dist.all_reduce`` loop, under torchrun.

    torchrun --standalone --nproc-per-node 8 benchmarks/comm_vs_bare.py            # GPU, 1 GiB
    torchrun --standalone --nproc-per-node 2 benchmarks/comm_vs_bare.py --bytes 64M  # CPU / gloo

Both run in the same process group: first ``dlscale.micro.comm_worker.run_collectives``
(all_reduce, one size: correctness check, then the median of per-call times, slowest rank),
then a bare loop: warm-up, barrier, one pair of CUDA events (perf_counter on CPU) around
``iters`` back-to-back in-place all-reduces, mean per call, slowest rank. algbw = S / time,
busbw = algbw x 2(n-1)/n (nccl-tests). Rank 0 prints a table and one JSON object (also to
--json FILE).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from dlscale.micro import common
from dlscale.micro.comm import algbw_busbw
from dlscale.micro.comm_worker import run_collectives


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--bytes", default="auto", help="all-reduce size S; auto = 1G on GPU, 64M on CPU")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", default=None, metavar="FILE", help="rank 0 also writes the JSON here")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    nbytes = common.parse_bytes(("1G" if cuda else "64M") if args.bytes == "auto" else args.bytes)
    nbytes -= nbytes % 4

    row = run_collectives(["all_reduce"], [nbytes], "fp32", dev, args.warmup, args.iters)[0]

    buf = torch.randn(nbytes // 4, device=dev)
    for _ in range(args.warmup):
        dist.all_reduce(buf)
    if cuda:
        torch.cuda.synchronize(dev)
        dist.barrier(device_ids=[local_rank])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        end.record()
        end.synchronize()
        secs = start.elapsed_time(end) / 1e3 / args.iters
    else:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buf)
        secs = (time.perf_counter() - t0) / args.iters
    t = torch.tensor([secs], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    secs = float(t.item())
    alg, bus = algbw_busbw("all_reduce", nbytes, secs, n)
    if rank == 0:
        out = {"device": common.device_name(dev), "backend": dist.get_backend(), "world_size": n,
               "bytes": nbytes, "warmup": args.warmup, "iters": args.iters, "torch": torch.__version__,
               "dlscale": {"time_us": row["time_us"], "algbw_gbps": row["algbw_gbps"],
                           "busbw_gbps": row["busbw_gbps"], "correct": row["correct"], "status": row["status"]},
               "bare": {"time_us": secs * 1e6, "algbw_gbps": alg, "busbw_gbps": bus}}
        out["busbw_ratio"] = (row["busbw_gbps"] / bus) if row["busbw_gbps"] and bus else None
        print(f"all_reduce {nbytes} B on {n} rank(s), {out['backend']} on {out['device']}")
        print(f"{'':<8} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
        for k in ("dlscale", "bare"):
            v = out[k]
            if v["time_us"] is None:
                print(f"{k:<8} {v.get('status')}")
                continue
            print(f"{k:<8} {v['time_us']:>12.1f} {v['algbw_gbps']:>13.2f} {v['busbw_gbps']:>13.2f}")
        text = json.dumps(out, indent=2)
        print(text)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text + "\n")
    dist.barrier(device_ids=[local_rank]) if cuda else dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
