"""dlscale micro vs bare torch loops, in one process on one device.

    python benchmarks/micro_vs_bare.py                      # GPU: bf16 8192^3 matmul, 1 GiB copy
    python benchmarks/micro_vs_bare.py --device cpu --n 1024 --copy-bytes 64M   # quick CPU check

Compares ``dlscale.micro.matmul.run_matmul`` (bf16, N x N x N) with a bare ``torch.matmul``
timing loop, and ``dlscale.micro.bandwidth.run_bandwidth`` (copy) with a bare ``dst.copy_(src)``
loop. Bare loops: warm-up, then one pair of CUDA events (perf_counter on CPU) around ``iters``
back-to-back calls, mean per call. Prints a table and one JSON object (also to --json FILE).
The two should agree within a few percent; dlscale reports the median of per-sample times.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from dlscale.micro import common
from dlscale.micro.bandwidth import run_bandwidth
from dlscale.micro.matmul import matmul_flops, run_matmul


def bare_loop(fn, dev: torch.device, warmup: int, iters: int) -> float:
    """Mean seconds per call over ``iters`` back-to-back calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"))
    ap.add_argument("--n", type=int, default=8192, help="matmul size N (N x N x N)")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "tf32", "fp16", "bf16"))
    ap.add_argument("--copy-bytes", default="1G", help="copy buffer size (binary suffixes)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=4,
                    help="matmul rounds, alternating which goes first; medians are compared")
    ap.add_argument("--json", default=None, metavar="FILE", help="also write the JSON here")
    args = ap.parse_args(argv)
    device = common.resolve_device(args.device)
    dev = common.torch_device(device)
    copy_bytes = common.parse_bytes(args.copy_bytes)
    name = common.device_name(dev)
    out: dict = {"device": name, "torch": torch.__version__, "warmup": args.warmup, "iters": args.iters,
                 "results": []}

    # matmul ----------------------------------------------------------------------------------
    # Rounds alternate which of the two goes first: a sustained bf16 matmul heats the card toward
    # its power limit, so whichever runs second would otherwise be handicapped.
    n = args.n
    from dlscale.micro.matmul import float32_precision, torch_dtype

    with float32_precision(args.dtype):
        tdt = torch_dtype(args.dtype)
        a = torch.randn(n, n, device=dev).to(tdt)
        b = torch.randn(n, n, device=dev).to(tdt)
        c = torch.empty(n, n, device=dev, dtype=tdt)
        ours, bare, row = [], [], None

        def run_ours():
            nonlocal row
            row = run_matmul([(n, n, n)], [args.dtype], device, args.warmup, args.iters)[0]
            ours.append(row["tflops"])

        def run_bare():
            t = bare_loop(lambda: torch.matmul(a, b, out=c), dev, args.warmup, args.iters)
            bare.append(matmul_flops(n, n, n) / t / 1e12)

        for r in range(args.rounds):
            for fn in ((run_ours, run_bare) if r % 2 == 0 else (run_bare, run_ours)):
                fn()
    del a, b, c
    out["results"].append({"case": f"matmul {args.dtype} {n}x{n}x{n}", "unit": "TFLOPS",
                           "dlscale": statistics.median(ours), "bare": statistics.median(bare),
                           "dlscale_rounds": ours, "bare_rounds": bare,
                           "dlscale_status": row["status"], "buffer_sets": row["buffer_sets"]})
    common.free_memory(dev)

    # copy ------------------------------------------------------------------------------------
    brow = run_bandwidth([copy_bytes], ["copy"], device, args.warmup, args.iters)[0]
    src = torch.randn(copy_bytes // 4, device=dev)
    dst = torch.empty_like(src)
    t_copy = bare_loop(lambda: dst.copy_(src), dev, args.warmup, args.iters)
    del src, dst
    bare_gbps = 2 * (copy_bytes // 4 * 4) / t_copy / 1e9
    out["results"].append({"case": f"copy {common.fmt_bytes(copy_bytes)}", "unit": "GB/s (read + written)",
                           "dlscale": brow["gbps"], "bare": bare_gbps, "dlscale_status": brow["status"],
                           "dlscale_time_us": brow["time_us"], "bare_time_us": t_copy * 1e6})

    for r in out["results"]:
        r["ratio"] = (r["dlscale"] / r["bare"]) if r["dlscale"] and r["bare"] else None
    print(f"device: {name} ({device}), warmup {args.warmup}, iters {args.iters}")
    print(f"{'case':<28} {'unit':<22} {'dlscale':>12} {'bare':>12} {'ratio':>7}")
    for r in out["results"]:
        d = f"{r['dlscale']:.2f}" if r["dlscale"] else r["dlscale_status"]
        ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
        print(f"{r['case']:<28} {r['unit']:<22} {d:>12} {r['bare']:>12.2f} {ratio:>7}")
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
