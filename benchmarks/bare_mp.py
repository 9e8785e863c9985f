"""A bare single-process loop over dlscale's wide-deep and face models: the yardstick for the sharded paths.

What a user writes with a few lines of plain PyTorch on one GPU: the model as defined in
dlscale/models (whole tables, the whole classifier, no sharding, no collectives), its optimizer as
dlscale's ``make_optimizer`` builds it (fused AdamW betas (0.9, 0.95) / fused SGD momentum 0.9 on
CUDA), bf16 autocast, one synthetic batch drawn as dlscale draws it, W warm-up steps, then N
steps between two synchronisations (CUDA events per step for the latency percentiles). No
dlscale worker, launcher, records.

    python benchmarks/bare_mp.py --model wide-deep --batch-size 16384
    python benchmarks/bare_mp.py --model face --batch-size 128 --classes 1000000

Prints one JSON line: {"bench": "bare_mp", "model", "batch_size", "knobs", "samples_per_s",
"step_ms_p50", "step_ms_p90", "peak_mem_bytes", ...}.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from dlscale.metrics import percentile
from dlscale.models import get_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="wide-deep", choices=("wide-deep", "face"))
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--classes", type=int, default=None, help="face: classes of the head (default: the flavour's)")
    ap.add_argument("--vocab-scale", type=int, default=None, help="wide-deep: every table's rows times this")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    knobs = {k: v for k, v in (("classes", args.classes), ("vocab_scale", args.vocab_scale)) if v is not None}
    spec = get_model(args.model, args.flavor)
    if knobs:
        spec = spec.resize(**knobs)
    torch.manual_seed(args.seed)
    with torch.device(device):
        model = spec.build()
    if spec.channels_last and cuda:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay, fused=cuda or None)
    else:
        opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95),
                                fused=cuda or None)
    if cuda:  # as dlscale's worker: the peak from here on (training), not the construction's
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    batch = spec.make_batch(args.batch_size, torch.device("cpu"), torch.Generator().manual_seed(args.seed + 12345))
    batch = tuple(t.to(device) for t in batch)
    dtype = torch.bfloat16 if args.precision == "amp-bf16" else None

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        loss = step()
    if cuda:
        torch.cuda.synchronize()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)]
        events[0].record()
    marks = [time.perf_counter()]
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step()
        if cuda:
            events[i + 1].record()
        else:
            marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    ms = ([events[i].elapsed_time(events[i + 1]) for i in range(args.steps)] if cuda
          else [(marks[i + 1] - marks[i]) * 1e3 for i in range(args.steps)])
    print(json.dumps({"bench": "bare_mp", "model": args.model, "flavor": args.flavor, "knobs": knobs,
                      "precision": args.precision, "batch_size": args.batch_size, "steps": args.steps,
                      "samples_per_s": args.steps * args.batch_size / dt, "step_ms_p50": percentile(ms, 50),
                      "step_ms_p90": percentile(ms, 90), "loss_last": float(loss.detach().float()),
                      "peak_mem_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                      "device": torch.cuda.get_device_name(0) if cuda else "cpu"}), flush=True)


if __name__ == "__main__":
    main()
