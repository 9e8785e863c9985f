"""A plain script for torchrun (no dlscale inside), its ranks told apart by torchrun's RANK and
WORLD_SIZE: a little arithmetic per step and one 'samples/sec: X' line per step on rank 0 -- what
`dlscale run --command ... --parser regex` reads. It imports no torch: what the test checks is how
dlscale runs, logs, samples and parses a torchrun command, and two workers importing torch would
only add seconds of imports to it (torchrun's own agent is a real one)."""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=30)
p.add_argument("--batch-size", type=int, default=4)
args = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if rank == 0:
    print(f"pid {os.getpid()} world {world}", flush=True)
w = [0.01 * i for i in range(64)]
for step in range(args.steps):
    t = time.perf_counter()
    for _ in range(200):  # a step's worth of work: about a millisecond
        w = [x - 0.001 * (x - 0.5) for x in w]
    dt = time.perf_counter() - t
    if rank == 0:
        print(f"step {step} loss {sum(w) / len(w):.4f} samples/sec: {args.batch_size * world / dt:.3f}", flush=True)
