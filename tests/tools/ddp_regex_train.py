"""A plain torchrun training script (no dlscale inside): DDP over gloo on the CPU, a tiny MLP, and one
'samples/sec: X' line per step on rank 0 -- what `dlscale run --command ... --parser regex` reads."""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch-size", type=int, default=4)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(args.batch_size, 32), torch.randn(args.batch_size, 1)
if rank == 0:
    print(f"pid {os.getpid()} world {world}", flush=True)
for step in range(args.steps):
    t = time.perf_counter()
    opt.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    dist.barrier()
    dt = time.perf_counter() - t
    if rank == 0:
        print(f"step {step} loss 1.0 samples/sec: {args.batch_size * world / dt:.3f}", flush=True)
dist.destroy_process_group()
