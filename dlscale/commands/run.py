"""`dlscale run` (one case, repeated) and `dlscale env` (a paste-ready environment report)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dlscale import ConfigError, envinfo
from dlscale.compiling import COMPILE_MODES
from dlscale.config import PRECISIONS, RunConfig

DEFAULTS = RunConfig()


def parse_options(items: list[str] | None, flag: str = "--option") -> dict[str, Any]:
    """--option KEY=VALUE pairs -> dict, values parsed as JSON where they parse (ints, bools)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} must look like KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def option_args(flag: str, options: dict[str, Any]) -> list[str]:
    """The inverse of parse_options: ``[flag, "KEY=VALUE", ...]`` that parse back to ``options``."""
    out: list[str] = []
    for k, v in options.items():
        text = v if isinstance(v, str) and not _parses_as_json(v) else json.dumps(v)
        out += [flag, f"{k}={text}"]
    return out


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def add_case_arguments(p: argparse.ArgumentParser) -> None:
    """The options that describe one case (shared by run and the multi-node verbs)."""
    from dlscale.models import all_flavors

    p.add_argument("--model", default=DEFAULTS.model, help="registered model name (see `dlscale run --list`)")
    p.add_argument("--flavor", default=None, choices=all_flavors(),
                   help="default: the model's first flavour (full where it has one; llama: 1b). The model's size: "
                   "full (its standard size), tiny (a few layers; trains on a CPU in well "
                   "under a second a step), or a size of its family (gpt2: medium, large, xl; llama: 1b, 3b, 8b; "
                   "`dlscale run --list` shows each model's)")
    p.add_argument("--strategy", default=DEFAULTS.strategy, help="registered parallel strategy name")
    p.add_argument("--nproc-per-node", type=int, default=DEFAULTS.nproc_per_node,
                   help="processes (devices) per machine")
    from dlscale.batchsearch import batch_size_arg
    p.add_argument("--batch-size", type=batch_size_arg, default=DEFAULTS.batch_size,
                   help="per-device micro-batch size, or max: the largest that fits (run only; docs/sweeps.md)")
    p.add_argument("--precision", default=DEFAULTS.precision, help=f"one of {', '.join(PRECISIONS)} "
                   "(fp32 uses TF32 tensor cores on GPUs, recorded as such; fp8: torchao float8 training of the "
                   "blocks' Linears under bf16 autocast, GPUs of compute capability >= 8.9)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (the analogue of XLA)")
    p.add_argument("--compile-mode", default=DEFAULTS.compile_mode, choices=COMPILE_MODES,
                   help="with --compile: torch.compile's mode (reduce-overhead: CUDA graphs; max-autotune: "
                   "also autotuned matmul/convolution templates and coordinate-descent tuning, a long compile); "
                   "CUDA graphs with strategies single and ddp only")
    p.add_argument("--inductor-option", action="append", metavar="KEY=VALUE",
                   help="with --compile: a torch._inductor.config setting over the mode's, repeatable "
                   "(e.g. coordinate_descent_tuning=true); default: none")
    p.add_argument("--clip-grad-norm", type=float, default=None, help="clip gradients to this global norm")
    from dlscale.checkpointing import MODES as AC_MODES
    p.add_argument("--activation-checkpointing", default=DEFAULTS.activation_checkpointing, choices=AC_MODES,
                   help="recompute activations in the backward, per block: selective (torchtitan's op-level "
                   "policy: keep attention and every other matmul output) or full (keep only each block's input); "
                   "docs/models.md")
    p.add_argument("--grad-accum", type=int, default=DEFAULTS.grad_accum,
                   help="micro-batches accumulated per optimizer step")
    p.add_argument("--warmup", type=int, default=DEFAULTS.warmup, help="untimed steps before the window")
    p.add_argument("--steps", type=int, default=DEFAULTS.steps, help="timed optimizer steps per repeat")
    p.add_argument("--repeats", type=int, default=DEFAULTS.repeats,
                   help="independent runs (fresh processes) of the case; the median is reported")
    p.add_argument("--device", default=DEFAULTS.device, choices=("auto", "cuda", "cpu"),
                   help="auto picks CUDA when a GPU is visible, else the CPU with gloo")
    p.add_argument("--seed", type=int, default=DEFAULTS.seed, help="seed of weights and synthetic data")
    p.add_argument("--time-limit", type=float, default=DEFAULTS.time_limit,
                   help="wall-clock seconds for each repeat; a case past it is killed and recorded timeout")
    p.add_argument("--collective-timeout", type=float, default=DEFAULTS.collective_timeout,
                   help="seconds before a stalled collective raises in the workers")
    p.add_argument("--option", "-o", action="append", metavar="KEY=VALUE",
                   help="strategy option, repeatable (e.g. -o bucket_cap_mb=50)")
    p.add_argument("--label", default=None, help="free-form label stored with the record (for compare)")
    p.add_argument("--no-monitor", dest="monitor", action="store_false",
                   help="do not sample GPU/CPU/memory/disk/network utilisation during the repeats")
    p.add_argument("--sample-interval", type=float, default=DEFAULTS.sample_interval,
                   help="seconds between utilisation samples (0.01 to 10)")
    p.add_argument("--breakdown", action="store_true",
                   help="after the window, time data/forward/backward/optimizer and exposed communication "
                   "(a no_sync comparison run); see docs/metrics.md")
    p.add_argument("--profile", action="store_true",
                   help="record a torch.profiler trace (Chrome/Perfetto JSON) of a few steps after the window; "
                   "the median repeat's trace is kept in STORE/traces/")
    p.add_argument("--inject-failure", default=None, metavar="KIND@STEP[:RANK]",
                   help="testing: make a rank crash, oom or hang at a step (crash|oom|hang), or "
                   "oom-above@N: run out of memory whenever the batch size exceeds N")


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    from dlscale.models import default_flavor

    fields = dict(model=args.model, flavor=args.flavor or default_flavor(args.model), strategy=args.strategy,
                  nproc_per_node=args.nproc_per_node, batch_size=args.batch_size, precision=args.precision,
                  compile=args.compile, compile_mode=args.compile_mode,
                  inductor_options=parse_options(args.inductor_option, "--inductor-option"),
                  clip_grad_norm=args.clip_grad_norm, grad_accum=args.grad_accum,
                  activation_checkpointing=args.activation_checkpointing,
                  warmup=args.warmup, steps=args.steps, repeats=args.repeats, device=args.device, seed=args.seed,
                  time_limit=args.time_limit, collective_timeout=args.collective_timeout,
                  strategy_options=parse_options(args.option), label=args.label, monitor=args.monitor,
                  sample_interval=args.sample_interval, breakdown=args.breakdown, profile=args.profile,
                  inject_failure=args.inject_failure)
    fields.update(overrides)
    return RunConfig(**fields)


def register(sub) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("run", help="measure one training case (repeated) and store the record",
                       formatter_class=fmt, description="Train a model under a parallel strategy with "
                       "synthetic data: W warm-up steps, N timed steps, R repeats; report the median.")
    add_case_arguments(p)
    p.add_argument("--store", default="results", help="result store directory (JSONL files)")
    p.add_argument("--json", action="store_true", help="print the record as JSON instead of the table")
    p.add_argument("--verbose", "-v", action="store_true", help="stream the workers' output")
    p.add_argument("--list", action="store_true", help="list models and strategies, then exit")
    p.add_argument("--max-batch-start", type=int, default=None, help="--batch-size max: first probe (default 8)")
    p.add_argument("--max-batch-cap", type=int, default=None,
                   help="--batch-size max: largest batch tried (default 4096 on GPUs, 64 on the CPU)")
    from dlscale.multinode import add_rendezvous_arguments
    add_rendezvous_arguments(p)  # --nnodes --node-rank --master-addr/-port --rdzv-endpoint --max-restarts
    p.set_defaults(func=cmd_run)

    e = sub.add_parser("env", help="print a paste-ready environment report", formatter_class=fmt)
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    e.set_defaults(func=cmd_env)


def cmd_env(args) -> int:
    env = envinfo.capture()
    print(json.dumps(env, indent=2) if args.json else envinfo.format_env(env))
    return 0


def cmd_run(args) -> int:
    from dlscale import console
    from dlscale.cli import STATUS_EXIT
    from dlscale.multinode import rendezvous_from_args, run_case, was_recorded
    from dlscale.models import default_flavor, get_model, model_flavors, model_names
    from dlscale.store import ResultStore
    from dlscale.strategies import get_strategy, strategy_names

    if args.list:
        for m in model_names():
            spec = get_model(m, default_flavor(m))
            print(f"model     {m:12s} unit {spec.unit:4s} seq {spec.seq_len or '-'}  flavors {', '.join(model_flavors(m))}")
        for s in strategy_names():
            print(f"strategy  {s:12s} {get_strategy(s).description}")
        return 0
    search = args.batch_size == "max"  # largest batch that fits: probes, then the case (batchsearch.py)
    cfg = config_from_args(args, nnodes=args.nnodes, **({"batch_size": args.max_batch_start or 8} if search else {}))
    rdzv = rendezvous_from_args(args, cfg.nproc_per_node)
    store = ResultStore(args.store)
    quiet = args.json
    if not quiet:
        console.print_header(cfg)
    if search:
        from dlscale.batchsearch import run_case_max_batch
        rec = run_case_max_batch(cfg, store, start=args.max_batch_start, cap=args.max_batch_cap, verbose=args.verbose,
                                 on_event=None if quiet else console.progress_printer(cfg),
                                 on_probe=None if quiet else lambda e: print(
                                     f"#   probe batch {e['batch_size']}: {e['status']} ({e['seconds']:.1f} s)", flush=True))
    else:
        rec = run_case(cfg, store, rdzv=rdzv, verbose=args.verbose,
                       on_event=None if quiet else console.progress_printer(cfg))
    if quiet:
        print(json.dumps(rec, indent=1, default=str))
    else:
        console.print_result(rec)
        if was_recorded(rec):
            print(f"record {rec['id'][:12]} appended to {store.file}")
    if rec["status"] != "ok":
        print(f"dlscale: case {rec['status']}: {rec['error']}", file=sys.stderr)
    return STATUS_EXIT[rec["status"]]
