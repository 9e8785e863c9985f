"""A bare hand-written training loop over dlscale's models: the yardstick for dlscale's overhead.

What a user writes with a few lines of plain PyTorch: build the model, (DDP), (torch.compile),
AdamW/SGD, bf16 autocast, synthetic batch, W warm-up steps, then N steps between two
synchronisations. No dlscale worker, launcher, events or records. Run it alone (1 GPU) or under
torchrun (DDP):

    python benchmarks/bare_loop.py --model gpt2 --batch-size 16
    torchrun --standalone --nproc-per-node 2 benchmarks/bare_loop.py --model gpt2 --batch-size 16

Prints one JSON line: {"model", "world", "compile", "samples_per_s", ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale.compiling import COMPILE_MODES
from dlscale.models import get_model


def _torchvision_resnet50() -> torch.nn.Module:
    import torchvision

    class WithLoss(torch.nn.Module):  # dlscale's models return the loss; so must this one
        def __init__(self):
            super().__init__()
            self.net = torchvision.models.resnet50()

        def forward(self, x, y):
            return torch.nn.functional.cross_entropy(self.net(x), y)

    return WithLoss()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                    help="torch.compile's mode (reduce-overhead and max-autotune add CUDA graphs)")
    ap.add_argument("--sgd", default="foreach", choices=("foreach", "fused"),
                    help="resnet50's SGD implementation: foreach (torch's default on CUDA) or fused")
    ap.add_argument("--torchvision", action="store_true",
                    help="resnet50 only: train torchvision's resnet50 instead of dlscale's (same loss, "
                         "optimizer and data), to tell the model definition from the runner")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)

    spec = get_model(args.model, args.flavor)
    torch.manual_seed(0)
    with torch.device(device):
        model = spec.build() if not args.torchvision else _torchvision_resnet50()
    if spec.channels_last and cuda:
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True)
    if args.compile:
        model = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    if spec.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay,
                              fused=args.sgd == "fused" or None)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay,
                                fused=cuda or None)
    batch = spec.make_batch(args.batch_size, device, torch.Generator().manual_seed(rank))
    dtype = torch.bfloat16 if args.precision == "amp-bf16" else None

    graphs = args.compile and args.compile_mode in ("reduce-overhead", "max-autotune")

    def step():
        if graphs:  # a new step for cudagraph trees: last step's graph outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        print(json.dumps({"bench": "bare_loop", "model": args.model + ("-torchvision" if args.torchvision else ""), "world": world, "compile": args.compile,
                          "compile_mode": args.compile_mode, "sgd": args.sgd,
                          "inductor_env": {k: v for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR_")},
                          "precision": args.precision, "batch_size": args.batch_size, "steps": args.steps,
                          "samples_per_s": args.steps * args.batch_size * world / dt,
                          "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
