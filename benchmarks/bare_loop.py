"""A bare hand-written training loop over dlscale's models: the yardstick for dlscale's overhead.

What a user writes with a few lines of plain PyTorch: build the model, (DDP), (torch.compile),
AdamW/SGD, bf16 autocast, synthetic batch, W warm-up steps, then N steps between two
synchronisations. No dlscale worker, launcher, events or records. Run it alone (one device) or
under torchrun (DDP):

    python benchmarks/bare_loop.py --model gpt2 --batch-size 16
    torchrun --standalone --nproc-per-node 2 benchmarks/bare_loop.py --model gpt2 --batch-size 16

Rank 0 prints one JSON line: {"model", "world", "compile", "samples_per_s", ...}. With --out DIR
every rank also writes DIR/rank<R>.json with its window, in the shape dlscale's own worker
writes, so that benchmarks/run.py stores the run as a record beside dlscale's (same case key).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale.train.compiling import COMPILE_MODES
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


def _option(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: CUDA when a GPU is visible")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights (the data: seed + rank)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                    help="torch.compile's mode (reduce-overhead and max-autotune add CUDA graphs)")
    ap.add_argument("--inductor-option", action="append", type=_option, default=[], metavar="KEY=VALUE",
                    help="set torch._inductor.config.KEY = VALUE before compiling (repeatable)")
    ap.add_argument("--sgd", default="auto", choices=("auto", "foreach", "fused"),
                    help="resnet50's SGD implementation: auto is what dlscale uses (fused on CUDA, foreach "
                         "on the CPU)")
    ap.add_argument("--torchvision", action="store_true",
                    help="resnet50 only: train torchvision's resnet50 instead of dlscale's (same loss, "
                         "optimizer and data), to tell the model definition from the runner")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None, metavar="DIR", help="also write DIR/rank<R>.json (default: none)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)

    spec = get_model(args.model, args.flavor)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = spec.build() if not args.torchvision else _torchvision_resnet50()
    params = sum(p.numel() for p in model.parameters())
    if spec.channels_last and cuda:
        model = model.to(memory_format=torch.channels_last)
    if world > 1:
        model = DDP(model, device_ids=[local] if cuda else None, gradient_as_bucket_view=True)
    options = dict(args.inductor_option)
    if args.compile:
        import torch._inductor.config as inductor_config

        for key, value in options.items():
            setattr(inductor_config, key, value)
        model = torch.compile(model, mode=None if args.compile_mode == "default" else args.compile_mode)
    if spec.optimizer == "sgd":
        fused = args.sgd == "fused" or (args.sgd == "auto" and cuda)
        opt = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay,
                              fused=fused or None, foreach=None if fused else True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=spec.weight_decay,
                                fused=cuda or None, foreach=None if cuda else True)
    batch = spec.make_batch(args.batch_size, device, torch.Generator().manual_seed(args.seed + rank))
    dtype = torch.bfloat16 if args.precision == "amp-bf16" else None

    graphs = args.compile and (args.compile_mode in ("reduce-overhead", "max-autotune")
                               or bool(options.get("triton.cudagraphs")))

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
    peak = torch.cuda.max_memory_allocated() if cuda else None
    device_name = torch.cuda.get_device_name(device) if cuda else None
    if args.out:
        result = {"rank": rank, "local_rank": local, "status": "ok", "error": None, "window_s": dt,
                  "step_times_ms": [], "dp_size": world, "device": str(device), "device_name": device_name,
                  "pid": os.getpid(), "threads": torch.get_num_threads(), "params": params,
                  "peak_mem_allocated_bytes": peak,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB
        path = Path(args.out) / f"rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(result))
        os.replace(path.with_suffix(".tmp"), path)
    if rank == 0:
        print(json.dumps({"bench": "bare_loop", "model": args.model + ("-torchvision" if args.torchvision else ""),
                          "world": world, "compile": args.compile, "compile_mode": args.compile_mode,
                          "inductor_options": options, "sgd": args.sgd,
                          "inductor_env": {k: v for k, v in os.environ.items() if k.startswith("TORCHINDUCTOR_")},
                          "precision": args.precision, "batch_size": args.batch_size, "steps": args.steps,
                          "samples_per_s": args.steps * args.batch_size * world / dt,
                          "peak_mem_gib": peak / 2**30 if peak is not None else None}),
              flush=True)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
