"""dlscale's training step of a one-device case against the plain loop of the same model, interleaved in one process.

A host-bound step (wide-deep at one GPU: ~4.4 ms, bound by its kernel launches) moves by 5-10 %
from one process to the next on the same machine (docs/benchmarks.md, sixth session): more than
the 2 % a sharded path at degree 1 must stay within of the plain loop, so separate processes
cannot show it. Here both sides live in one process and take turns: R rounds, each a window of N
steps of each side (the order alternating between rounds), so a slow or fast phase of the host
falls on both. Per round the ratio dlscale / plain of samples/s; the median ratio with a bootstrap
95 % interval over the rounds.

* dlscale side: the case's model built as dlscale's worker builds it, parallelised by its
  strategy on a process group of one rank (NCCL on CUDA, gloo on the CPU), its batches from
  ``worker.make_batches`` and its step from ``worker.build_step``: the worker's timed step.
* plain side: benchmarks/bare_mp.py's model, optimizer and step (the same model, no strategy).

Both are built from the same seed and batch: their first losses (printed; the first step with
dropout off, the second with it on) agree where the strategy computes what the plain model does.

    python benchmarks/mp_interleaved.py --model wide-deep --strategy embedding-shard --option shard=row

Prints the rounds, then one JSON line: {"bench": "mp_interleaved", "ratio_median", "ratio_ci95",
"plain_samples_per_s", "dlscale_samples_per_s", "rounds": [...], ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

import bare_mp
from dlscale.benchsuite import mp_knobs
from dlscale.config import RunConfig
from dlscale.models import get_model
from dlscale.strategies import DistEnv, resolve_spec
from dlscale.strategies._sharding import resized
from dlscale.worker import build_parallel, build_step, make_batches


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="wide-deep")
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--strategy", default="embedding-shard", help="dlscale's strategy for its side")
    ap.add_argument("--option", action="append", type=bare_mp._knob, default=[], metavar="KEY=VALUE",
                    help="a strategy option (repeatable), e.g. shard=row")
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: CUDA when a GPU is visible")
    ap.add_argument("--warmup", type=int, default=300, help="warm-up steps of each side before the rounds")
    ap.add_argument("--steps", type=int, default=200, help="steps per window")
    ap.add_argument("--rounds", type=int, default=10, help="windows of each side")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for name in ("warmup", "steps", "rounds", "batch_size"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            ap.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'warmup' else 1}")
    return args


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _window(step, steps: int, cuda: bool) -> float:
    """Seconds for ``steps`` steps, between two synchronisations."""
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bootstrap_ci(values: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of ``values``."""
    rng = np.random.default_rng(seed)
    arr = np.asarray(values, dtype=float)
    meds = np.median(rng.choice(arr, size=(n, arr.size), replace=True), axis=1)
    return float(np.percentile(meds, 2.5)), float(np.percentile(meds, 97.5))


def main(argv=None) -> dict:
    args = parse_args(argv)
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:  # as dlscale's worker and the plain loop
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    backend = "nccl" if cuda else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        cfg = RunConfig(model=args.model, flavor=args.flavor, strategy=args.strategy, device=device.type,
                        precision=args.precision, batch_size=args.batch_size, seed=args.seed,
                        strategy_options=dict(args.option))
        spec = resolve_spec(cfg)
        # dlscale's side, as its worker builds it
        par, _params = build_parallel(spec, cfg, DistEnv(0, 1, 0, 1, device, backend))
        batches = make_batches(spec, cfg, par, par.dp_rank, device)
        ours = build_step(par, cfg, device, batches)
        # the plain side: the same model (resized by the options that size it, as benchmarks/run.py
        # passes them to bare_mp.py), seed and batch
        plain_spec = resized(get_model(args.model, args.flavor), mp_knobs(cfg))
        plain_model, plain_opt = bare_mp.build(plain_spec, device, args.seed)
        batch = plain_spec.make_batch(args.batch_size, torch.device("cpu"),
                                torch.Generator().manual_seed(args.seed + 12345))
        batch = tuple(t.to(device) for t in batch)
        plain = bare_mp.make_step(plain_model, plain_opt, batch, device, args.precision)

        # the first step with dropout off (the same forward numerics, whatever each side's random
        # stream), the second with it on: where the sides part, and whether dropout's masks do it
        for m in (par.module, plain_model):
            m.eval()
        first = {"dlscale": float(ours().detach().float()), "plain": float(plain().detach().float())}
        for m in (par.module, plain_model):
            m.train()
        second = {"dlscale": float(ours().detach().float()), "plain": float(plain().detach().float())}
        for _ in range(args.warmup):
            ours()
            plain()
        sides = {"dlscale": ours, "plain": plain}
        rounds = []
        for r in range(args.rounds):
            order = ("plain", "dlscale") if r % 2 == 0 else ("dlscale", "plain")
            rate = {name: args.steps * args.batch_size / _window(sides[name], args.steps, cuda) for name in order}
            rounds.append({"round": r, "first": order[0], **{f"{k}_samples_per_s": v for k, v in rate.items()},
                           "ratio": rate["dlscale"] / rate["plain"]})
            print(f"round {r:2d}: plain {rate['plain']:>14,.1f}  dlscale {rate['dlscale']:>14,.1f} samples/s  "
                  f"ratio {rate['dlscale'] / rate['plain']:.4f}  ({order[0]} first)", flush=True)
    finally:
        dist.destroy_process_group()
    ratios = [x["ratio"] for x in rounds]
    lo, hi = bootstrap_ci(ratios)
    out = {"bench": "mp_interleaved", "model": args.model, "flavor": args.flavor, "strategy": args.strategy,
           "options": dict(args.option), "precision": args.precision, "batch_size": args.batch_size,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu", "warmup": args.warmup,
           "steps": args.steps, "first_loss_no_dropout": first, "second_loss": second,
           "plain_samples_per_s": statistics.median(x["plain_samples_per_s"] for x in rounds),
           "dlscale_samples_per_s": statistics.median(x["dlscale_samples_per_s"] for x in rounds),
           "ratio_median": statistics.median(ratios), "ratio_ci95": [lo, hi], "rounds": rounds}
    print(f"dlscale / plain: median {out['ratio_median']:.4f} over {len(ratios)} rounds "
          f"(95 % CI {lo:.4f}-{hi:.4f}); losses dlscale / plain: first (no dropout) {first['dlscale']:.8g} / "
          f"{first['plain']:.8g}, second {second['dlscale']:.8g} / {second['plain']:.8g}")
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
