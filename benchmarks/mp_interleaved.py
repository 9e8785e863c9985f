"""dlscale's training step of one-device cases against the plain loop of the same model, interleaved in one process.

A host-bound step (wide-deep at one GPU: ~4.4 ms, bound by its kernel launches) moves by 5-10 %
from one process to the next on the same machine (docs/results/h200.md): more than
the 2 % a sharded path at degree 1 must stay within of the plain loop, so separate processes
cannot show it. Here every side lives in one process and they take turns: R rounds, each a window
of N steps of each side (the order rotating between rounds, so each side takes each place as often),
so a slow or fast phase of the host falls on all of them. Per round and case the ratio case / plain
of samples/s; per case the median ratio with a bootstrap 95 % interval over the rounds.

* a case (``--case STRATEGY[:KEY=VALUE,...]``, repeatable): the model built as dlscale's worker
  builds it, parallelised by its strategy on a process group of one rank (NCCL on CUDA, gloo on the
  CPU), its batches from ``worker.make_batches`` and its step from ``worker.build_step``: the
  worker's timed step.
* plain: benchmarks/bare_mp.py's model, optimizer and step (the same model, no strategy).

All are built from the same seed and batch: their losses (printed; the first step with dropout off,
the second with it on) agree where a strategy computes what the plain model does.

    python benchmarks/mp_interleaved.py --model wide-deep \
        --case single --case embedding-shard:shard=table --case embedding-shard:shard=row

Prints the rounds, then one JSON line: {"bench": "mp_interleaved", "plain_samples_per_s",
"cases": {CASE: {"ratio_median", "ratio_ci95", "samples_per_s", "first_loss_no_dropout",
"second_loss"}}, "plain_loss": {...}, "rounds": [...], ...}.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

import bare_mp
from dlscale import ConfigError
from dlscale.case.benchsuite import mp_knobs
from dlscale.case.config import RunConfig
from dlscale.models import get_model
from dlscale.report.stats import bootstrap_median_ci
from dlscale.strategies import DistEnv, resolve_spec
from dlscale.strategies._sharding import resized
from dlscale.train.worker import build_parallel, build_step, make_batches


DEFAULT_CASES = ("single", "embedding-shard:shard=table", "embedding-shard:shard=row")


def _case(text: str) -> tuple[str, dict]:
    """``STRATEGY[:KEY=VALUE,...]`` -> (strategy, options)."""
    strategy, _, rest = text.partition(":")
    if not strategy:
        raise argparse.ArgumentTypeError(f"expected STRATEGY[:KEY=VALUE,...], got {text!r}")
    return strategy, dict(bare_mp._knob(kv) for kv in rest.split(",") if kv)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="wide-deep")
    ap.add_argument("--flavor", default="full")
    ap.add_argument("--case", action="append", type=_case, default=None, metavar="STRATEGY[:KEY=VALUE,...]",
                    help="a dlscale case beside the plain loop (repeatable), e.g. embedding-shard:shard=row; "
                         f"default: {', '.join(DEFAULT_CASES)}")
    ap.add_argument("--batch-size", type=int, default=16384)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: CUDA when a GPU is visible")
    ap.add_argument("--warmup", type=int, default=300, help="warm-up steps of each side before the rounds")
    ap.add_argument("--steps", type=int, default=100, help="steps per window")
    ap.add_argument("--rounds", type=int, default=30, help="windows of each side")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.case is None:
        args.case = [_case(c) for c in DEFAULT_CASES]
    for name in ("warmup", "steps", "rounds", "batch_size"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            ap.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'warmup' else 1}")
    return args


def case_name(strategy: str, options: dict) -> str:
    return strategy + "".join(f" {k}={v}" for k, v in sorted(options.items()))


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
    cfgs, specs = [], []
    try:  # every case checked before anything is built
        for strategy, options in args.case:
            cfgs.append(RunConfig(model=args.model, flavor=args.flavor, strategy=strategy, device=device.type,
                                  precision=args.precision, batch_size=args.batch_size, seed=args.seed,
                                  strategy_options=dict(options)))
            specs.append(resolve_spec(cfgs[-1]))
        knobs = {tuple(sorted(mp_knobs(cfg).items())) for cfg in cfgs}
    except ConfigError as e:
        print(f"mp_interleaved.py: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if len(knobs) > 1:
        print(f"mp_interleaved.py: error: the cases size the model differently ({sorted(knobs)}); "
              "one plain loop cannot match them all", file=sys.stderr)
        raise SystemExit(2)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    dist.init_process_group(backend, rank=0, world_size=1)
    try:
        sides, modules = {}, []
        for (strategy, options), cfg, spec in zip(args.case, cfgs, specs):  # each as dlscale's worker builds it
            par, _params = build_parallel(spec, cfg, DistEnv(0, 1, 0, 1, device, backend))
            sides[case_name(strategy, options)] = build_step(par, cfg, device,
                                                             make_batches(spec, cfg, par, par.dp_rank, device))
            modules.append(par.module)
        # the plain side: the same model (resized by the options that size it, as benchmarks/run.py
        # passes them to bare_mp.py), seed and batch
        plain_spec = resized(get_model(args.model, args.flavor), dict(knobs.pop()))
        plain_model, plain_opt = bare_mp.build(plain_spec, device, args.seed)
        batch = plain_spec.make_batch(args.batch_size, torch.device("cpu"),
                                      torch.Generator().manual_seed(args.seed + 12345))
        batch = tuple(t.to(device) for t in batch)
        sides["plain"] = bare_mp.make_step(plain_model, plain_opt, batch, device, args.precision)
        modules.append(plain_model)

        # the first step with dropout off (the same forward numerics, whatever each side's random
        # stream), the second with it on: where the sides part, and whether dropout's masks do it
        losses = {name: {} for name in sides}
        for key, train in (("first_loss_no_dropout", False), ("second_loss", True)):
            for m in modules:
                m.train(train)
            for name, step in sides.items():
                torch.manual_seed(args.seed + 1)  # each side's dropout draws the same masks
                losses[name][key] = float(step().detach().float())
        for _ in range(args.warmup):
            for step in sides.values():
                step()
        names, rounds = list(sides), []
        for r in range(args.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            rate = {name: args.steps * args.batch_size / _window(sides[name], args.steps, cuda) for name in order}
            rounds.append({"round": r, "order": order, "samples_per_s": rate,
                           "ratio": {n: rate[n] / rate["plain"] for n in names if n != "plain"}})
            print(f"round {r:2d}: plain {rate['plain']:>14,.1f} samples/s; "
                  + ", ".join(f"{n} {v:.4f}" for n, v in rounds[-1]["ratio"].items()), flush=True)
    finally:
        dist.destroy_process_group()
    cases = {}
    for name in names[:-1]:
        ratios = [x["ratio"][name] for x in rounds]
        lo, hi = bootstrap_median_ci(ratios)
        cases[name] = {"ratio_median": statistics.median(ratios), "ratio_ci95": [lo, hi],
                       "samples_per_s": statistics.median(x["samples_per_s"][name] for x in rounds), **losses[name]}
        print(f"{name} / plain: median {cases[name]['ratio_median']:.4f} over {len(ratios)} rounds "
              f"(95 % CI {lo:.4f}-{hi:.4f}); losses: first (no dropout) {losses[name]['first_loss_no_dropout']:.8g}, "
              f"second {losses[name]['second_loss']:.8g}")
    print(f"plain: losses: first (no dropout) {losses['plain']['first_loss_no_dropout']:.8g}, "
          f"second {losses['plain']['second_loss']:.8g}")
    out = {"bench": "mp_interleaved", "model": args.model, "flavor": args.flavor, "precision": args.precision,
           "batch_size": args.batch_size, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
           "warmup": args.warmup, "steps": args.steps,
           "plain_samples_per_s": statistics.median(x["samples_per_s"]["plain"] for x in rounds),
           "plain_loss": losses["plain"], "cases": cases, "rounds": rounds}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main()
