"""`dlscale plan`: which strategy and degrees fit a model on a set of GPUs, and how fast (dlscale/plan.py)."""
from __future__ import annotations

import argparse
import json
import re

from dlscale import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def memory_size(text: str) -> float:
    """'80GiB', '141GB', '8e10' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"memory size must look like 80GiB, 141GB or 8e10 (bytes), got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def _positive(kind):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {kind.__name__}, got {text!r}")
        return v
    return parse


def register(sub) -> None:
    from dlscale.checkpointing import MODES
    from dlscale.cli import deprecated_alias
    from dlscale.config import PRECISIONS

    p = sub.add_parser("plan", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="predict memory per device, fit, largest batch and throughput of every strategy",
                       description="For each strategy and degree the job allows (ddp, zero1, fsdp zero2/zero3, "
                       "hsdp, tensor, pipeline, hybrid dp x tp x pp), the predicted memory per device (parameters, "
                       "gradients, optimizer state, activations, weight copies, head), whether it fits, the largest "
                       "batch that fits and a first-order throughput. Formulas: docs/plan.md. With --check STORE "
                       "instead: the plan of each stored case beside its measured peak (exit 1 when one is outside "
                       "--tolerance).")
    p.add_argument("--model", default=None,
                   help="registered model with a transformer architecture (gpt2, llama...); required without --check")
    p.add_argument("--flavor", default=None, help="the model's size (default: its first flavour)")
    p.add_argument("--nproc-per-node", type=_positive(int), default=None, metavar="G",
                   help="GPUs per node, as dlscale run's; required without --check")
    p.add_argument("--nnodes", type=_positive(int), default=1, help="nodes, as dlscale run's")
    deprecated_alias(p, "--gpus", "--nproc-per-node and --nnodes (--gpus was the job's total)", dest="gpus_total",
                     type=_positive(int))
    deprecated_alias(p, "--nodes", "--nnodes", dest="nnodes", type=_positive(int))
    p.add_argument("--gpu-memory", type=memory_size, default=None,
                   help="memory of one GPU, e.g. 80GiB, 141GB; required without --check")
    p.add_argument("--batch-size", type=_positive(int), default=4,
                   help="per-device micro-batch as in dlscale run (pipelines: the batch their micro-batches share)")
    p.add_argument("--precision", default="amp-bf16", choices=PRECISIONS, help="as dlscale run's --precision")
    p.add_argument("--activation-checkpointing", default="none", choices=MODES, help="as dlscale run's")
    p.add_argument("--eager", action="store_true", help="plan an eager model (default: compiled, --compile)")
    p.add_argument("--microbatches", type=_positive(int), default=4, help="pipeline micro-batches per step")
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"), help="pipeline schedule")
    p.add_argument("--sequence-parallel", action="store_true", help="tensor parallel with sequence parallelism")
    p.add_argument("--strategy", action="append", default=None, help="only these strategies (repeatable)")
    p.add_argument("--gpu", default="H100", help="device name for the peak FLOP/s table (dlscale/metrics.py)")
    p.add_argument("--peak-tflops", type=_positive(float), default=None, help="peak dense TFLOP/s (overrides --gpu)")
    p.add_argument("--mfu", type=_positive(float), default=0.40,
                   help="fraction of the peak one device reaches on this model (measure it with dlscale run)")
    p.add_argument("--intra-busbw", type=_positive(float), default=300.0, help="GB/s bus bandwidth within a node")
    p.add_argument("--inter-busbw", type=_positive(float), default=50.0, help="GB/s bus bandwidth per GPU across nodes")
    p.add_argument("--headroom", type=float, default=0.10,
                   help="fraction of the GPU memory left free (CUDA context, allocator cache, fragmentation)")
    p.add_argument("--format", default="md", choices=("md", "json"), help="table or JSON rows")
    p.add_argument("--check", metavar="STORE", default=None,
                   help="instead of planning a job: for each ok run record of STORE (a directory of .jsonl files or "
                        "one file) with a transformer model, the plan's peak per device beside the measured peak, "
                        "with the error (dlscale/plancheck.py; default: off)")
    p.add_argument("--tolerance", type=_positive(float), default=None,
                   help="with --check: the largest |predicted - measured| / measured that passes (default: 0.10)")
    p.set_defaults(func=cmd_plan)


def _machine(args):
    from dlscale import metrics
    from dlscale.plan import Machine

    if args.gpus % args.nodes:
        raise ConfigError(f"--nnodes {args.nodes} must divide the job's {args.gpus} GPUs")
    if not 0 <= args.headroom < 1:
        raise ConfigError(f"--headroom must be in [0, 1), got {args.headroom}")
    if args.mfu > 1:
        raise ConfigError(f"--mfu is a fraction of the peak (0..1], got {args.mfu}")
    if args.peak_tflops:
        peak = args.peak_tflops * 1e12
    else:
        peak, _ = metrics.peak_flops(args.gpu, metrics.precision_dtype(args.precision, "cuda", args.gpu))
        if not peak:
            raise ConfigError(f"no peak FLOP/s known for --gpu {args.gpu!r}; give --peak-tflops")
    return Machine(gpus=args.gpus, nodes=args.nodes, memory_bytes=args.gpu_memory, peak_flops=peak,
                   efficiency=args.mfu, intra_busbw=args.intra_busbw * 1e9, inter_busbw=args.inter_busbw * 1e9,
                   headroom=args.headroom)


def cmd_check(args) -> int:
    """--check STORE: the plan beside the measured peaks; exit 1 when a measured case is outside."""
    import sys

    from dlscale import plancheck
    from dlscale.report.cli import _warn
    from dlscale.report.data import load_records

    given = [f for f, v in (("--model", args.model), ("--nproc-per-node", args.gpus), ("--gpu-memory", args.gpu_memory),
                            ("--strategy", args.strategy)) if v is not None]
    if given:
        raise ConfigError(f"--check reads the cases from the store; not with {', '.join(given)}")
    tolerance = plancheck.TOLERANCE if args.tolerance is None else args.tolerance
    loaded = load_records(args.check)
    _warn(loaded.warnings())
    rep = plancheck.check(loaded.records, args.check, tolerance)
    print(plancheck.to_json(rep) if args.format == "json" else plancheck.to_markdown(rep))
    if rep.outside:
        names = ", ".join(f"{r.case} ({100 * r.error:+.1f} %)" for r in rep.outside)
        print(f"dlscale: plan --check: {len(rep.outside)} case(s) outside {tolerance:.0%}: {names}", file=sys.stderr)
        return 1
    return 0


def job_shape(args) -> None:
    """args.gpus (the job's GPUs) and args.nodes from --nproc-per-node x --nnodes, or from the
    deprecated --gpus (total) and --nodes."""
    total = getattr(args, "gpus_total", None)
    if total is not None:
        if args.nproc_per_node is not None:
            raise ConfigError("give --nproc-per-node and --nnodes, not the deprecated --gpus as well")
        if total % args.nnodes:
            raise ConfigError(f"--nnodes {args.nnodes} must divide --gpus {total}")
        args.nproc_per_node = total // args.nnodes
    args.gpus = args.nproc_per_node * args.nnodes if args.nproc_per_node is not None else None
    args.nodes = args.nnodes


def cmd_plan(args) -> int:
    from dlscale.memplan import Workload
    from dlscale.models import default_flavor, get_model
    from dlscale.plan import plan_rows
    from dlscale.strategies import strategy_names

    job_shape(args)
    if args.check is not None:
        return cmd_check(args)
    if args.tolerance is not None:
        raise ConfigError("--tolerance applies to --check only")
    missing = [f for f, v in (("--model", args.model), ("--nproc-per-node", args.gpus), ("--gpu-memory", args.gpu_memory))
               if v is None]
    if missing:
        raise ConfigError(f"plan needs {', '.join(missing)} (or --check STORE: the plan against stored peaks)")
    for s in args.strategy or []:
        if s not in strategy_names():
            raise ConfigError(f"unknown strategy {s!r}; choose one of: {', '.join(strategy_names())}")
    spec = get_model(args.model, args.flavor or default_flavor(args.model))
    work = Workload(spec, args.precision, args.activation_checkpointing, compiled=not args.eager)
    machine = _machine(args)
    rows = plan_rows(work, machine, args.batch_size, args.microbatches, args.schedule, args.sequence_parallel,
                     set(args.strategy) if args.strategy else None)
    if args.format == "json":
        print(json.dumps({"model": spec.name, "flavor": spec.flavor, "params": spec.arch.param_count(),
                          "precision": args.precision, "activation_checkpointing": args.activation_checkpointing,
                          "compiled": not args.eager, "gpus": args.gpus, "nodes": args.nodes,
                          "gpu_memory_bytes": args.gpu_memory, "rows": rows}, indent=1, default=str))
        return 0
    print(render(spec, args, machine, rows))
    return 0


def render(spec, args, machine, rows) -> str:
    from dlscale.plan import gib

    head = (f"# plan: {spec.name} {spec.flavor} ({spec.arch.param_count() / 1e9:.2f} B parameters), {args.gpus} GPU(s) "
            f"on {args.nodes} node(s), {gib(machine.memory_bytes):.0f} GiB each ({gib(machine.capacity):.1f} GiB usable), "
            f"{args.precision}, {'eager' if args.eager else 'compiled'}, checkpointing {args.activation_checkpointing}, "
            f"--batch-size {args.batch_size}\n# throughput: first-order model at {args.mfu:.0%} of "
            f"{machine.peak_flops / 1e12:.0f} TFLOP/s per GPU (docs/plan.md)\n")
    cols = ("strategy", "options", "dp x tp x pp", "params GiB", "grads GiB", "optim GiB", "activ GiB", "copies GiB",
            "head GiB", "peak GiB", "fits", "max batch", "tokens/s/GPU", "MFU %")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        opts = " ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        lines.append("| " + " | ".join([
            r["strategy"], opts, r["layout"], f"{gib(r['params_bytes']):.2f}", f"{gib(r['grads_bytes']):.2f}",
            f"{gib(r['optimizer_bytes']):.2f}", f"{gib(r['activations_bytes']):.2f}",
            f"{gib(r['weight_copies_bytes']):.2f}", f"{gib(r['head_bytes']):.2f}", f"{gib(r['peak_bytes']):.2f}",
            "yes" if r["fits"] else "no", str(r["max_batch_size"] or "-"),
            f"{r['tokens_per_s_per_gpu']:,.0f}", f"{100 * r['mfu']:.1f}"]) + " |")
    return head + "\n".join(lines)
