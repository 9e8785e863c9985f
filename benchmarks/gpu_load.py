"""A competing load: matrix products in a loop on one device, until killed or --seconds pass.

The ``during`` command of benchmarks/suites/validity-competitor.yaml: the driver starts it before
the measurements and ends its process tree after them, so that the case runs beside a process it
does not own and its record's validity section must say so (docs/metrics.md, validity).

    python benchmarks/gpu_load.py --device cuda:0 --seconds 600
"""
import argparse
import time

import torch

p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
p.add_argument("--device", default="cuda:0", help="cuda:N, or cpu (a CPU load, for tests)")
p.add_argument("--size", type=int, default=8192, help="the square matrices' side")
p.add_argument("--seconds", type=float, default=600.0, help="end by itself after this long")
args = p.parse_args()

dev = torch.device(args.device)
dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
a = torch.randn(args.size, args.size, device=dev, dtype=dtype)
print(f"load running on {dev} ({args.size}x{args.size} {dtype} products)", flush=True)
end = time.monotonic() + args.seconds
n = 0
while time.monotonic() < end:
    a = (a @ a).clamp_(-1, 1)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    n += 1
print(f"load done: {n} products", flush=True)
