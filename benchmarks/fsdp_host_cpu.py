"""FSDP2's host time per training step, on the CPU: the part of issue 4 a CPU can measure.

On lent H200s (docs/benchmarks.md, fourth session) fsdp ran GPT-2 and BERT at 0.95-0.96 of
`single` on a steady host, but 18-27 % slower while the VM's host ran slow: FSDP's host work
(hooks per unit, the optimizer's DTensor dispatch) sits just under the GPU's step, so every
millisecond of it removed is headroom. Host time does not depend on tensor
sizes, so GPT-2's exact structure (12 blocks, 148 parameter tensors) at a tiny width (64) trains
on the CPU in a few milliseconds a step, almost all of it host work, and shows what each
variant costs: the plain model (no FSDP), FSDP with torch's optimizer on the DTensors (the old
default), the optimizer on the local shards (``optimizer_on_shards``, the new default), and
``blocks_per_unit`` 2, 4 and 12. One process, gloo, world size 1.

    python benchmarks/fsdp_host_cpu.py [--steps 40] [--repeats 5]

Prints one line per variant: median step time (ms) over repeats, and the optimizer's share.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist

from dlscale.models import get_model
from dlscale.models.gpt2 import GPT, GPTConfig
from dlscale.strategies import make_optimizer
from dlscale.strategies.fsdp import apply_fsdp, fsdp_optimizer

VARIANTS = [  # name, fsdp?, optimizer on shards?, blocks per unit
    ("plain model (no FSDP)", False, None, None),
    ("fsdp, optimizer on DTensors (old default)", True, False, 1),
    ("fsdp, optimizer on shards (new default)", True, True, 1),
    ("fsdp, on shards, blocks_per_unit=2", True, True, 2),
    ("fsdp, on shards, blocks_per_unit=4", True, True, 4),
    ("fsdp, on shards, blocks_per_unit=12", True, True, 12),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per repeat (default 40)")
    ap.add_argument("--repeats", type=int, default=5, help="repeats per variant, interleaved (default 5)")
    args = ap.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(1)
    spec = get_model("gpt2", "tiny")
    gcfg = GPTConfig(vocab=500, padded_vocab=500, block_size=64, n_layers=12, n_heads=4, hidden=64)
    cfg = SimpleNamespace(precision="fp32", strategy_options={})
    dev = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, gcfg.vocab, (2, gcfg.block_size + 1), generator=gen)
    batch = (idx[:, :-1].contiguous(), idx[:, 1:].contiguous())

    def build(fsdp, on_shards, bpu):
        torch.manual_seed(0)
        model = GPT(gcfg)
        if not fsdp:
            return model, make_optimizer(model.parameters(), spec, cfg, dev)
        apply_fsdp(model, spec, cfg, None, "zero2", mixed_precision=False, blocks_per_unit=bpu)
        return model, fsdp_optimizer(model, spec, cfg, dev, on_shards)

    def run(model, opt, n):
        step, optim = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            model(*batch).backward()
            t1 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t2 = time.perf_counter()
            step.append((t2 - t0) * 1e3)
            optim.append((t2 - t1) * 1e3)
        return statistics.median(step), statistics.median(optim)

    built = [build(*v[1:]) for v in VARIANTS]
    for model, opt in built:
        run(model, opt, 5)  # warm-up: lazy init, optimizer state
    results = {v[0]: [] for v in VARIANTS}
    for _ in range(args.repeats):  # interleaved, so a slow spell of the machine hits every variant
        for v, (model, opt) in zip(VARIANTS, built):
            results[v[0]].append(run(model, opt, args.steps))
    print(f"torch {torch.__version__}, 1 thread, GPT-2 structure (12 blocks) at width 64, batch 2 x 64 tokens")
    print(f"{'variant':45s} {'step ms':>8s} {'optimizer ms':>13s}")
    for name, rs in results.items():
        print(f"{name:45s} {statistics.median(r[0] for r in rs):8.2f} {statistics.median(r[1] for r in rs):13.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
