"""Command-line options shared by ``dlscale predict`` and ``dlscale cost``, turned into the performance
model's typed options (dlscale.perfmodel.inputs); nothing below the commands sees ``args``."""
from __future__ import annotations

import argparse
import math
import sys

from dlscale import ConfigError
from dlscale.results.storeargs import add_store_arguments
from dlscale.perfmodel.core import DDP_BUCKET_CAP_MB, INTER_ALGORITHMS, parse_shapes
from dlscale.perfmodel.inputs import ModelOptions, Query


def arg_type(fn):
    """An argparse type from a function raising ConfigError (argparse then prints one line, exit 2)."""

    def wrapped(text: str):
        try:
            return fn(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = fn.__name__
    return wrapped


# what no option of predict, cost and plan reaches (tokens of the largest training runs are ~1e14; links,
# hours, prices and batch sizes far less): a bigger figure is a typo that would overflow the model
MAX_FIGURE = 1e18
MAX_DEVICES = 10**6  # GPUs in one predicted cluster (the largest built hold a few 10^5)
MIN_DEVICE_MEMORY, MAX_DEVICE_MEMORY = 2.0**20, 2.0**50  # bytes of one device: 1 MiB .. 1 PiB


def _number(text: str, positive: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        raise argparse.ArgumentTypeError(f"expected a {'positive' if positive else 'non-negative'} number, got {text}")
    if v > MAX_FIGURE:
        raise argparse.ArgumentTypeError(f"expected a number up to {MAX_FIGURE:.0e}, got {text}")
    return v


def device_memory(n_bytes: float, text: str) -> float:
    """One device's memory in bytes, refused when no device could have it (1 byte, 1e300)."""
    if not MIN_DEVICE_MEMORY <= n_bytes <= MAX_DEVICE_MEMORY:
        raise argparse.ArgumentTypeError(f"memory of one device must be 1 MiB .. 1 PiB, got {text!r}")
    return n_bytes


def positive_float(text: str) -> float:
    return _number(text, True)


def non_negative_float(text: str) -> float:
    return _number(text, False)


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected a comma list of positive integers, got {text!r}")
    return out


def overlap_arg(text: str) -> str | float:
    t = str(text).strip().lower()
    if t in ("auto", "buckets", "none"):
        return t
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overlap is auto, none, buckets or a fraction in 0..1, "
                                         f"got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"--overlap fraction must be in 0..1, got {text}")
    return v


def overhead_arg(text: str) -> str | float:
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overhead-ms is auto or a number of ms >= 0, got {text!r}") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"--overhead-ms must be >= 0 (a negative overhead would predict more than "
                                         f"ideal scaling), got {text}")
    return v


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores into the new one's dest and warns once per process."""

    warned: set[str] = set()

    def __init__(self, option_strings, dest, new: str, convert=None, **kw):
        self.new = new
        self.convert = convert
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string not in DeprecatedAlias.warned:
            DeprecatedAlias.warned.add(option_string)
            print(f"warning: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, self.convert(values) if self.convert else values)


def add_workload_args(p: argparse.ArgumentParser, store_optional: bool) -> None:
    add_store_arguments(p, None, required=not store_optional,
                        help="result store directory (or one .jsonl file); imported records count as measured ones")
    p.add_argument("--model", default=None, help="model name as recorded (config.model)")
    p.add_argument("--flavor", default=None, help="only records of this model flavour (full, tiny)")
    p.add_argument("--precision", default=None, help="only records of this precision (e.g. amp-bf16)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="only records of this per-device batch")
    p.add_argument("--compile", dest="compile", action="store_const", const=True, default=None,
                   help="only torch.compile'd records")
    p.add_argument("--eager", dest="compile", action="store_const", const=False, help="only eager records")
    p.add_argument("--data", default=None, metavar="SPEC",
                   help="only records of this data source: synthetic, a source as `dlscale run --data` takes it, "
                        "or its kind alone (imagefolder, tokens, ...)")
    p.add_argument("--label", default=None, help="only records with this label")
    p.add_argument("--source", default=None, metavar="TEXT",
                   help="only imported records whose source contains TEXT (measured records beat imported ones "
                        "of the same workload anyway)")
    g = p.add_argument_group("links (alpha-beta model; GB/s = 1e9 B/s, nccl-tests bus bandwidth)")
    g.add_argument("--intra-busbw", dest="intra_busbw", type=positive_float, default=None, metavar="GBPS",
                   help="intra-node all-reduce busbw; default: the source's stated figure (imported records), else "
                        "the largest all_reduce row of the newest 'dlscale micro comm' record in the store")
    g.add_argument("--busbw", dest="intra_busbw", type=positive_float, action=DeprecatedAlias, new="--intra-busbw",
                   help=argparse.SUPPRESS)
    g.add_argument("--intra-latency-us", type=non_negative_float, default=None, metavar="US",
                   help="intra-node latency per ring step; default: from the smallest all_reduce row of that "
                        "micro comm record (0 with --intra-busbw)")
    g.add_argument("--inter-busbw", type=positive_float, default=None, metavar="GBPS",
                   help="inter-node bus bandwidth per node (all its GPUs share it; 100 Gb/s InfiniBand = 12.5); "
                        "default: the source's stated figure; required for shapes of more than one node")
    g.add_argument("--inter-latency-us", type=non_negative_float, default=None, metavar="US",
                   help="inter-node latency per step (default 0, or the source's figure)")
    g.add_argument("--inter-algorithm", choices=INTER_ALGORITHMS, default="auto",
                   help="inter-node all-reduce: ring, NCCL's tree, or auto (the faster, as NCCL picks)")
    g.add_argument("--nproc-per-node", dest="gpus_per_node_max", type=positive_int, default=None, metavar="G",
                   help="GPUs (processes) per node of the predicted cluster; default: the GPUs the records' "
                        "environment saw (no limit when --intra-busbw is given)")
    g.add_argument("--gpus-per-node-max", dest="gpus_per_node_max", type=positive_int, action=DeprecatedAlias,
                   new="--nproc-per-node", help=argparse.SUPPRESS)
    m = p.add_argument_group("model")
    m.add_argument("--overlap", type=overlap_arg, default="auto", metavar="auto|none|buckets|0..1",
                   help="auto: the source's statement, else the overlap ratio of a measured >1-device breakdown of "
                        "the workload (a record run with --breakdown), else none; none: all-reduce after backward; "
                        "buckets: DDP buckets pipelined behind backward; a number: that share hidden")
    m.add_argument("--bucket-mb", type=positive_float, default=None, metavar="MIB",
                   help=f"gradient bucket size; default: the source's, else the ddp records' bucket_cap_mb, else "
                        f"{DDP_BUCKET_CAP_MB:g}")
    m.add_argument("--param-sizes", choices=("auto", "uniform"), default="auto",
                   help="auto: bucket the registered model's parameters as DDP does (built on the meta device); "
                        "uniform: gradients as a stream of bytes (also for models dlscale does not know)")
    m.add_argument("--grad-bytes", type=positive_float, default=None, metavar="B",
                   help="bytes per gradient element; default: the source's, else 4 (fp32 .grad, as DDP under AMP)")
    m.add_argument("--host-cores", type=positive_int, default=None, metavar="N",
                   help="CPU cores of each predicted node's host, for the host input floor (the CPU its data "
                        "loaders need, from a real-data 1-device record); default: the cores the 1-device "
                        "record's process could use")
    m.add_argument("--overhead-ms", type=overhead_arg, default="auto", metavar="auto|MS",
                   help="overhead per step at N > 1; auto: fitted on the workload's measured multi-device points, "
                        "the default law elsewhere; MS: that fixed figure at every N > 1")
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format")


def query_from_args(args) -> Query:
    return Query(model=args.model, precision=args.precision, batch_size=args.batch_size, compile=args.compile,
                 label=args.label, flavor=args.flavor, source=args.source, data=args.data)


def options_from_args(args, strategy: str | None = None) -> ModelOptions:
    return ModelOptions(
        intra_busbw_gbps=args.intra_busbw, intra_latency_us=args.intra_latency_us,
        inter_busbw_gbps=args.inter_busbw, inter_latency_us=args.inter_latency_us,
        inter_algorithm=args.inter_algorithm, overlap=args.overlap, bucket_mb=args.bucket_mb,
        param_sizes=args.param_sizes, grad_bytes=args.grad_bytes,
        overhead_ms=None if args.overhead_ms == "auto" else float(args.overhead_ms),
        strategy=strategy or "ddp", gpus_per_node_max=args.gpus_per_node_max, host_cores=args.host_cores)


def plausible_shapes(text: str) -> list:
    """parse_shapes, refusing a cluster larger than any built (``--shapes 1000000x8``)."""
    shapes = parse_shapes(text)
    big = [s for s in shapes if s.nodes * s.gpus_per_node > MAX_DEVICES]
    if big:
        raise ConfigError(f"cluster shape {big[0].nodes}x{big[0].gpus_per_node} has "
                          f"{big[0].nodes * big[0].gpus_per_node:,} GPUs, more than {MAX_DEVICES:,}")
    return shapes


def shapes_type():
    return arg_type(plausible_shapes)
