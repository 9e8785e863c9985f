"""`dlscale plan`: which strategy and degrees fit a model on a set of GPUs, and how fast (dlscale/planner/plan.py)."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

from dlscale import ConfigError
from dlscale.case.config import PRECISIONS
from dlscale.cli import deprecated_alias
from dlscale.commands.perf_args import (
    device_memory, non_negative_float, positive_float, positive_int,
)
from dlscale.micro.peaks import bandwidth_bps
from dlscale.perfmodel.evidence import evidence_from_records
from dlscale.perfmodel.inputs import _comm_micro, _micro_link
from dlscale.perfmodel.strategies import Evidence
from dlscale.report.cli import _warn
from dlscale.report.data import load_records
from dlscale.results import metrics
from dlscale.train.checkpoint_timing import STATE_BYTES_PER_PARAM, plan_estimate
from dlscale.train.checkpointing import MODES

_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def memory_size(text: str) -> float:
    """'80GiB', '141GB', '8e10' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"memory size must look like 80GiB, 141GB or 8e10 (bytes), got {text!r}")

    return device_memory(float(m.group(1)) * _UNITS[m.group(2).lower()], text)


def _link_args(p) -> None:
    """The links' options, named as dlscale predict's."""
    p.add_argument("--intra-busbw", type=positive_float, default=None,
                   help="GB/s bus bandwidth within a node (default: the newest micro comm all_reduce record of "
                        "--store, else an assumed 300, NVLink class; the header says which)")
    p.add_argument("--inter-busbw", type=positive_float, default=None,
                   help="GB/s bus bandwidth per node across nodes (all its GPUs share it, as dlscale predict's); "
                        "required with --nodes > 1")
    p.add_argument("--intra-latency-us", type=non_negative_float, default=None, metavar="US",
                   help="intra-node latency per ring step (default: the micro comm record's, 0 with --intra-busbw)")
    p.add_argument("--inter-latency-us", type=non_negative_float, default=0.0, metavar="US",
                   help="inter-node latency per step, as dlscale predict's")


def _check_args(p) -> None:
    """--check STORE and its --tolerance."""
    p.add_argument("--check", metavar="STORE", default=None,
                   help="instead of planning a job: for each ok run record of STORE (a directory of .jsonl files or "
                        "one file) with a transformer model, the plan's peak per device beside the measured peak, "
                        "with the error (dlscale/planner/plancheck.py; default: off)")
    p.add_argument("--tolerance", type=positive_float, default=None,
                   help="with --check: the largest |predicted - measured| / measured that passes (default: 0.10)")


def register(sub) -> None:
    p = sub.add_parser("plan", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       help="predict memory per device, fit, largest batch and throughput of every strategy",
                       description="For each strategy and degree the job allows (ddp, zero1, fsdp zero2/zero3, "
                       "hsdp, tensor, pipeline, hybrid dp x tp x pp), the predicted memory per device (parameters, "
                       "gradients, optimizer state, activations, weight copies, head), whether it fits, the largest "
                       "batch that fits and the throughput of the performance model (docs/perfmodel.md: compute from the "
                       "store's measurements where --store has them, else the assumed --mfu; each row says which). "
                       "Formulas: docs/plan.md. With --check STORE "
                       "instead: the plan of each stored case beside its measured peak (exit 1 when one is outside "
                       "--tolerance).")
    p.add_argument("--model", default=None,
                   help="registered model with a transformer architecture (gpt2, llama...); required without --check")
    p.add_argument("--flavor", default=None, help="the model's size (default: its first flavour)")
    p.add_argument("--nproc-per-node", type=positive_int, default=None, metavar="G",
                   help="GPUs per node, as dlscale run's; required without --check")
    p.add_argument("--nnodes", type=positive_int, default=1, help="nodes, as dlscale run's")
    deprecated_alias(p, "--gpus", "--nproc-per-node and --nnodes (--gpus was the job's total)", dest="gpus_total",
                     type=positive_int)
    deprecated_alias(p, "--nodes", "--nnodes", dest="nnodes", type=positive_int)
    p.add_argument("--gpu-memory", type=memory_size, default=None,
                   help="memory of one GPU, e.g. 80GiB, 141GB; required without --check")
    p.add_argument("--batch-size", type=positive_int, default=4,
                   help="per-device micro-batch as in dlscale run (pipelines: the batch their micro-batches share)")
    p.add_argument("--precision", default="amp-bf16", choices=PRECISIONS, help="as dlscale run's --precision")
    p.add_argument("--activation-checkpointing", default="none", choices=MODES, help="as dlscale run's")
    p.add_argument("--eager", action="store_true", help="plan an eager model (default: compiled, --compile)")
    p.add_argument("--microbatches", type=positive_int, default=4, help="pipeline micro-batches per step")
    p.add_argument("--schedule", default="1f1b", choices=("1f1b", "gpipe"), help="pipeline schedule")
    p.add_argument("--sequence-parallel", action="store_true", help="tensor parallel with sequence parallelism")
    p.add_argument("--strategy", action="append", default=None, help="only these strategies (repeatable)")
    p.add_argument("--gpu", default="H100", help="device name for the peak FLOP/s table (dlscale/results/metrics.py)")
    p.add_argument("--peak-tflops", type=positive_float, default=None, help="peak dense TFLOP/s (overrides --gpu)")
    p.add_argument("--mfu", type=positive_float, default=0.40,
                   help="compute rate (fraction of the peak) assumed where the store has no measurement of the model")
    p.add_argument("--store", default=None, metavar="STORE",
                   help="result store whose measured records of the model (any strategy, any device count) and "
                        "micro layer records set the compute rate (default: none, the assumed --mfu)")
    _link_args(p)
    p.add_argument("--headroom", type=float, default=0.10,
                   help="fraction of the GPU memory left free (CUDA context, allocator cache, fragmentation)")
    p.add_argument("--checkpoint-write-gbps", type=positive_float, default=None, metavar="GB/S",
                   help="a node's measured durable write bandwidth (dlscale micro io --write-dir): estimate how "
                        "long a synchronous checkpoint of the state blocks (default: its size only)")
    p.add_argument("--format", default="md", choices=("md", "json"), help="table or JSON rows")
    _check_args(p)
    p.set_defaults(func=cmd_plan)


def _store_records(args) -> list:
    """The records of --store (none without it)."""
    if args.store is None:
        return []

    loaded = load_records(args.store)
    _warn(loaded.warnings())
    return loaded.records


def _intra_link(args, records) -> tuple[float, float, str]:
    """(bus bandwidth B/s, latency s, where it came from) of the intra-node link."""
    if args.intra_busbw is not None:
        return args.intra_busbw * 1e9, 0.0, f"--intra-busbw {args.intra_busbw:g} GB/s"

    micro = _comm_micro(records, "cuda")
    if micro is not None:
        _, link, src = _micro_link(micro, None)
        return link.busbw_bps, link.latency_s, src
    return 300e9, 0.0, "assumed 300 GB/s (no --intra-busbw, no micro comm record in --store)"


def _machine(args, records=()):
    from dlscale.planner.plan import Machine  # keeps the CLI start-up light

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
    bw, lat, src = _intra_link(args, list(records))
    lat = lat if args.intra_latency_us is None else args.intra_latency_us * 1e-6
    return Machine(gpus=args.gpus, nodes=args.nodes, memory_bytes=args.gpu_memory, peak_flops=peak,
                   efficiency=args.mfu, intra_busbw=bw, intra_latency_s=lat,
                   inter_busbw=args.inter_busbw * 1e9 if args.inter_busbw else None,
                   inter_latency_s=args.inter_latency_us * 1e-6, headroom=args.headroom,
                   intra_source=src, mem_bw_bps=bandwidth_bps(args.gpu))


def _evidence(args, spec, machine, records):
    """The store's measurements of the model (--store), or only the assumed MFU."""
    if args.store is None:
        return Evidence(assumed_mfu=args.mfu)

    return evidence_from_records(records, spec.name, spec.flavor, machine.peak_flops, machine.links,
                                 args.batch_size, args.mfu)


def _visible_gpus() -> int:
    """NVIDIA GPUs this machine has (the driver's list, narrowed by CUDA_VISIBLE_DEVICES): which rows dlscale can
    run here. Read without importing torch, so that planning stays quick."""
    try:
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        n = min(n, len([v for v in vis.split(",") if v.strip() and not v.strip().startswith("-")]))
    return n


def cmd_check(args) -> int:
    """--check STORE: the plan beside the measured peaks; exit 1 when a measured case is outside."""
    from dlscale.planner import plancheck  # keeps the CLI start-up light

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
    from dlscale.planner.memplan import Workload  # keeps the CLI start-up light
    from dlscale.models import default_flavor, get_model  # torch: keeps start-up light
    from dlscale.planner.plan import Grid, plan_rows  # keeps the CLI start-up light
    from dlscale.strategies import strategy_names  # torch: keeps start-up light

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
    records = _store_records(args)
    machine = _machine(args, records)
    grid = Grid(args.microbatches, args.schedule, args.sequence_parallel,
                frozenset(args.strategy) if args.strategy else None)
    rows = plan_rows(work, machine, args.batch_size, grid, _evidence(args, spec, machine, records), _visible_gpus())
    ckpt = plan_estimate(spec.arch.param_count(), args.nodes,
                         args.checkpoint_write_gbps * 1e9 if args.checkpoint_write_gbps else None)
    if args.format == "json":
        print(json.dumps({"model": spec.name, "flavor": spec.flavor, "params": spec.arch.param_count(),
                          "precision": args.precision, "activation_checkpointing": args.activation_checkpointing,
                          "compiled": not args.eager, "gpus": args.gpus, "nodes": args.nodes,
                          "gpu_memory_bytes": args.gpu_memory, "peak_flops": machine.peak_flops,
                          "intra_busbw": machine.intra_busbw, "intra_source": machine.intra_source,
                          "inter_busbw": machine.inter_busbw, "rows": rows, "checkpoint": ckpt}, indent=1,
                         default=str))
        return 0
    print(render(spec, args, machine, rows) + "\n" + checkpoint_line(ckpt))
    return 0


def checkpoint_line(c: dict) -> str:
    """The plan's checkpoint estimate in one line (dlscale/train/checkpoint_timing.py)."""
    size = (f"# checkpoint: {c['state_bytes'] / 1e9:.3g} GB of state ({STATE_BYTES_PER_PARAM} B per parameter: fp32 "
            f"weights and AdamW's two moments), {c['bytes_per_node'] / 1e9:.3g} GB per node")
    if c["sync_save_s"] is None:
        return size + "; give --checkpoint-write-gbps (micro io --write-dir) for the time a save blocks"
    return size + (f"; at {c['write_bytes_per_s'] / 1e9:g} GB/s per node a synchronous save blocks about "
                   f"{c['sync_save_s']:.3g} s (measure it: run --checkpoint-every)")


def render(spec, args, machine, rows) -> str:
    from dlscale.planner.plan import gib  # keeps the CLI start-up light

    assumed = any(r["basis"] == "assumed-mfu" for r in rows)
    head = (f"# plan: {spec.name} {spec.flavor} ({spec.arch.param_count() / 1e9:.2f} B parameters), {args.gpus} GPU(s) "
            f"on {args.nodes} node(s), {gib(machine.memory_bytes):.0f} GiB each ({gib(machine.capacity):.1f} GiB usable), "
            f"{args.precision}, {'eager' if args.eager else 'compiled'}, checkpointing {args.activation_checkpointing}, "
            f"--batch-size {args.batch_size}\n# throughput: the strategy model (docs/perfmodel.md) at "
            f"{machine.peak_flops / 1e12:.0f} TFLOP/s peak per GPU, in a node {machine.intra_busbw / 1e9:.0f} GB/s "
            f"({machine.intra_source})"
            + (f", {machine.inter_busbw / 1e9:g} GB/s per node across" if machine.inter_busbw else "")
            + (f"; basis 'assumed-mfu': compute at an assumed {args.mfu:.0%} of peak, nothing of this model measured"
               + (" in the store" if args.store else " (give --store)") if assumed else "") + "\n")
    cols = ("strategy", "options", "dp x tp x pp", "params GiB", "grads GiB", "optim GiB", "activ GiB", "copies GiB",
            "head GiB", "peak GiB", "fits", "max batch", "tokens/s/GPU", "band", "MFU %", "limited by", "basis",
            "runs here")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        opts = " ".join(f"{k}={v}" for k, v in r["options"].items()) or "-"
        band = f"{r['tokens_per_s_per_gpu_low']:,.0f}-{r['tokens_per_s_per_gpu_high']:,.0f}"
        lines.append("| " + " | ".join([
            r["strategy"], opts, r["layout"], f"{gib(r['params_bytes']):.2f}", f"{gib(r['grads_bytes']):.2f}",
            f"{gib(r['optimizer_bytes']):.2f}", f"{gib(r['activations_bytes']):.2f}",
            f"{gib(r['weight_copies_bytes']):.2f}", f"{gib(r['head_bytes']):.2f}", f"{gib(r['peak_bytes']):.2f}",
            "yes" if r["fits"] else "no", str(r["max_batch_size"] or "-"),
            f"{r['tokens_per_s_per_gpu']:,.0f}", band, f"{100 * r['mfu']:.1f}", r["limited_by"], r["basis"],
            r["runs_here"]]) + " |")
    return head + "\n".join(lines)
