"""A bare single-process loop over dlscale's models, sized by their knobs: the yardstick of the sharded paths.

What a user writes with a few lines of plain PyTorch on one device for a model-parallel workload
(wide-deep, face): the model as defined in dlscale/models, resized by its knobs (``--resize
classes=N`` for face's classes, ``vocab_scale``/``fields``/``dim`` for wide-deep's tables; whole
tables, the whole classifier, no sharding, no collectives), its optimizer as dlscale's
``make_optimizer`` builds it (fused AdamW betas (0.9, 0.95) / fused SGD momentum 0.9 on CUDA,
foreach on the CPU), bf16 autocast, one synthetic batch drawn as dlscale draws it, W warm-up
steps, then N steps between two synchronisations (CUDA events per step for the latency
percentiles). No dlscale worker, launcher, records.

    python benchmarks/bare_mp.py --model wide-deep --batch-size 16384
    python benchmarks/bare_mp.py --model face --batch-size 128 --resize classes=1000000

Prints one JSON line: {"bench": "bare_mp", "model", "batch_size", "knobs", "samples_per_s",
"step_ms_p50", "step_ms_p90", "peak_mem_bytes", ...}. With --out DIR it also writes DIR/rank0.json
in the shape dlscale's worker writes, so that benchmarks/run.py stores the run as a record of its
dlscale case (a suite's ``bare`` entry with ``loop: mp``: the case's strategy options that size
the model become --resize).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path

import torch

from dlscale.results.metrics import percentile
from dlscale.models import get_model


def _knob(text: str) -> tuple[str, object]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="wide-deep")
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: CUDA when a GPU is visible")
    ap.add_argument("--resize", action="append", type=_knob, default=[], metavar="KEY=VALUE",
                    help="a size knob of the model (spec.resize): face classes=N, wide-deep vocab_scale=K, "
                         "fields=K, dim=D (repeatable; default: the flavour's sizes)")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights (the batch: seed + 12345, as dlscale)")
    ap.add_argument("--out", default=None, metavar="DIR", help="also write DIR/rank0.json (default: none)")
    return ap.parse_args()


def _write(out: str | None, result: dict) -> None:
    if out:
        path = Path(out) / "rank0.json"
        path.with_suffix(".tmp").write_text(json.dumps(result))
        os.replace(path.with_suffix(".tmp"), path)


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    knobs = dict(args.resize)
    spec = get_model(args.model, args.flavor)
    if knobs:
        spec = spec.resize(**knobs)
    base = {"rank": 0, "local_rank": 0, "dp_size": 1, "device": str(device), "pid": os.getpid(),
            "device_name": torch.cuda.get_device_name(0) if cuda else None, "threads": torch.get_num_threads()}
    try:
        model, opt = build(spec, device, args.seed)
        if cuda:  # as dlscale's worker: the peak from here on (training), not the construction's
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        batch = spec.make_batch(args.batch_size, torch.device("cpu"), torch.Generator().manual_seed(args.seed + 12345))
        batch = tuple(t.to(device) for t in batch)
        ms, dt, loss = _train(model, opt, batch, device, args)
    except torch.OutOfMemoryError as e:  # recorded oom, as dlscale's worker does
        _write(args.out, {**base, "status": "oom", "error": " ".join(str(e).split())[:300]})
        raise SystemExit(3) from None
    peak = torch.cuda.max_memory_allocated() if cuda else None
    _write(args.out, {**base, "status": "ok", "error": None, "window_s": dt, "step_times_ms": ms,
                      "params": sum(p.numel() for p in model.parameters()), "loss_last": loss,
                      "peak_mem_allocated_bytes": peak,
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})  # Linux: KiB
    print(json.dumps({"bench": "bare_mp", "model": args.model, "flavor": args.flavor, "knobs": knobs,
                      "precision": args.precision, "batch_size": args.batch_size, "steps": args.steps,
                      "samples_per_s": args.steps * args.batch_size / dt, "step_ms_p50": percentile(ms, 50),
                      "step_ms_p90": percentile(ms, 90), "loss_last": loss, "peak_mem_bytes": peak,
                      "device": base["device_name"] or "cpu"}), flush=True)


def build(spec, device: torch.device, seed: int):
    """The model on ``device`` (weights from ``seed``) and its optimizer, as a user writes them."""
    cuda = device.type == "cuda"
    torch.manual_seed(seed)
    with torch.device(device):
        model = spec.build()
    if spec.channels_last and cuda:
        model = model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    if spec.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=spec.lr, momentum=0.9, weight_decay=spec.weight_decay,
                              fused=cuda or None, foreach=None if cuda else True)
    else:
        opt = torch.optim.AdamW(params, lr=spec.lr, weight_decay=spec.weight_decay, betas=(0.9, 0.95),
                                fused=cuda or None, foreach=None if cuda else True)
    return model, opt


def make_step(model, opt, batch, device: torch.device, precision: str):
    """The plain training step: forward under autocast, backward, optimizer step; returns the loss."""
    dtype = torch.bfloat16 if precision == "amp-bf16" else None

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def _train(model, opt, batch, device: torch.device, args: argparse.Namespace) -> tuple[list[float], float, float]:
    """W warm-up steps, then the window: (step times in ms, window seconds, last loss)."""
    cuda = device.type == "cuda"
    step = make_step(model, opt, batch, device, args.precision)
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
    return ms, dt, float(loss.detach().float())


if __name__ == "__main__":
    main()
