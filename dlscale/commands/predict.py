"""``dlscale predict``: the data-parallel scaling model over cluster shapes, and ``--validate``.

It reads a result store (``dlscale cost``, in commands/cost.py, picks its inputs with the
functions here); the arithmetic is in :mod:`dlscale.perfmodel`, docs/metrics.md
("Performance model") gives the formulas and docs/perfmodel.md the usage. Inputs are picked the
way reports pick them (dlscale.report.data): the newest ok record per case; a *workload* is
everything in the config except strategy, device counts and how it was run (the report's
baseline identity).
"""
from __future__ import annotations

import argparse
import functools
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.perfmodel import (DDP_BUCKET_CAP_MB, GRAD_BYTES_PER_PARAM, MIB, Compute, Link, Shape, StepModel,
                               bucket_sizes, calibrate_overhead, compute_terms, error_pct,
                               gradient_bytes, parse_shapes, validate_published)
from dlscale.report.data import (BASELINE_STRATEGY_PREFERENCE, Row, baseline_fields, freeze, load_records,
                                 num, rec_config, rec_created, rec_device_type, select_cases)

NODE_COUNTS = (2, 4, 8, 16, 32, 64, 128)  # default multi-node shapes (with --inter-busbw): these x node size


# ----------------------------------------------------------------------------- argument types

def arg_type(fn):
    """An argparse type from a function raising ConfigError (argparse then prints one line, exit 2)."""

    def wrapped(text: str):
        try:
            return fn(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    wrapped.__name__ = fn.__name__
    return wrapped


def _overlap(text: str) -> str | float:
    t = str(text).strip().lower()
    if t in ("auto", "buckets", "none"):
        return t
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overlap is buckets, none, auto or a fraction in 0..1, "
                                         f"got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"--overlap fraction must be in 0..1, got {text}")
    return v


def _number(text: str, positive: bool) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or (v <= 0 if positive else v < 0):
        raise argparse.ArgumentTypeError(f"expected a {'positive' if positive else 'non-negative'} number, got {text}")
    return v


def positive_float(text: str) -> float:
    return _number(text, True)


def _non_negative_float(text: str) -> float:
    return _number(text, False)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def _overhead(text: str) -> str | float:
    if str(text).strip().lower() == "auto":
        return "auto"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overhead-ms is auto or a number of ms, got {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"--overhead-ms must be finite, got {text}")
    return v


def single_shape(text: str) -> Shape:
    shapes = arg_type(parse_shapes)(text)
    if len(shapes) != 1:
        raise argparse.ArgumentTypeError(f"give one cluster shape (N or NODESxGPUS), got {text!r}")
    return shapes[0]


def add_workload_args(p: argparse.ArgumentParser, store_optional: bool) -> None:
    p.add_argument("store", metavar="STORE", nargs="?" if store_optional else None,
                   help="result store directory (or one .jsonl file)")
    p.add_argument("--model", default=None, help="model name as recorded (config.model)")
    p.add_argument("--precision", default=None, help="only records of this precision (e.g. amp-bf16)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="only records of this per-device batch")
    p.add_argument("--compile", dest="compile", action="store_const", const=True, default=None,
                   help="only torch.compile'd records")
    p.add_argument("--eager", dest="compile", action="store_const", const=False, help="only eager records")
    p.add_argument("--label", default=None, help="only records with this label")
    g = p.add_argument_group("links (alpha-beta model; GB/s = 1e9 B/s, nccl-tests bus bandwidth)")
    g.add_argument("--intra-busbw", "--busbw", dest="intra_busbw", type=positive_float, default=None,
                   metavar="GBPS", help="intra-node all-reduce busbw; default: the largest-size all_reduce row "
                                        "of the newest 'dlscale micro comm' record in the store")
    g.add_argument("--intra-latency-us", type=_non_negative_float, default=None, metavar="US",
                   help="intra-node latency per ring step; default: from the smallest all_reduce row of that "
                        "micro comm record (0 with --intra-busbw)")
    g.add_argument("--inter-busbw", type=positive_float, default=None, metavar="GBPS",
                   help="inter-node bus bandwidth per node (all its GPUs share it; 100 Gb/s InfiniBand = 12.5); "
                        "required for shapes of more than one node")
    g.add_argument("--inter-latency-us", type=_non_negative_float, default=0.0, metavar="US",
                   help="inter-node latency per ring step")
    g.add_argument("--gpus-per-node-max", type=_positive_int, default=None, metavar="G",
                   help="GPUs in one node; default: the GPUs the records' environment saw (no limit when the "
                        "intra-node link is given with --intra-busbw)")
    m = p.add_argument_group("model")
    m.add_argument("--overlap", type=_overlap, default="auto", metavar="buckets|none|auto|0..1",
                   help="auto: the overlap ratio of a measured >1-device breakdown of the workload (a record "
                        "run with --breakdown), else buckets; buckets: DDP buckets pipelined behind backward; "
                        "none: all-reduce after backward (Horovod-style); a number: that share of the "
                        "all-reduce hidden")
    m.add_argument("--bucket-mb", type=positive_float, default=None, metavar="MIB",
                   help=f"gradient bucket size (DDP bucket_cap_mb); default: the ddp record's option, else "
                        f"{DDP_BUCKET_CAP_MB:g}")
    m.add_argument("--param-sizes", choices=("auto", "uniform"), default="auto",
                   help="auto: bucket the registered model's parameters as DDP does (built on the meta device); "
                        "uniform: gradients as a stream of bytes (also for models dlscale does not know)")
    m.add_argument("--grad-bytes", type=positive_float, default=float(GRAD_BYTES_PER_PARAM), metavar="B",
                   help="bytes per gradient element (4: fp32 .grad, as DDP under AMP; 2: a model cast to fp16/bf16)")
    m.add_argument("--overhead-ms", type=_overhead, default="auto", metavar="auto|MS",
                   help="fixed per-step overhead at N > 1; auto: calibrated on the measured 2-device ddp record "
                        "(o = measured - model), 0 without one")
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format")


def register(sub) -> None:
    p = sub.add_parser(
        "predict", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="predict data-parallel scaling over cluster shapes from a 1-device record and link bandwidths",
        description="t(N) = data + forward + backward + update (the measured 1-device step) + a fixed overhead "
                    "(calibrated on 2 devices) + the part of the gradient all-reduce not hidden behind backward. "
                    "All-reduce: alpha-beta ring, hierarchical across nodes. --validate STORE predicts every "
                    "multi-device case of a store (or a published-figures .yaml) and prints the error. "
                    "See docs/perfmodel.md and docs/metrics.md.")
    add_workload_args(p, store_optional=True)
    p.add_argument("--shapes", "--devices", dest="shapes", type=arg_type(parse_shapes), default=None,
                   metavar="LIST", help="cluster shapes NODESxGPUS (or N: one node of N GPUs), comma list, e.g. "
                                        "1x2,1x8,4x8,125x8; default: powers of two up to the node, and with "
                                        "--inter-busbw 2..128 nodes")
    p.add_argument("--strategy", default="ddp",
                   help="strategy of the measured multi-device records compared with (and validated against)")
    p.add_argument("--plot", default=None, metavar="PATH", help="write predicted vs ideal speedup (PNG/SVG/PDF)")
    p.add_argument("--validate", default=None, metavar="STORE",
                   help="predict every multi-device ok record of STORE from its 1-device record and print the "
                        "error; a .yaml/.json of published figures (tests/fixtures/published_*.yaml) works too")
    p.set_defaults(func=cmd_predict)


# ----------------------------------------------------------------------------- picking inputs

def filtered_runs(loaded, args) -> list[dict[str, Any]]:
    out = []
    for rec in loaded.records:
        if rec.get("kind") != "run":
            continue
        cfg = rec_config(rec)
        if args.model is not None and cfg.get("model") != args.model:
            continue
        if args.precision is not None and cfg.get("precision") != args.precision:
            continue
        if args.batch_size is not None and cfg.get("batch_size") != args.batch_size:
            continue
        if args.compile is not None and bool(cfg.get("compile")) != args.compile:
            continue
        if args.label is not None and str(rec.get("label", cfg.get("label"))) != args.label:
            continue
        out.append(rec)
    if not out:
        models = sorted({str(rec_config(r).get("model")) for r in loaded.records if r.get("kind") == "run"})
        what = f"of model {args.model!r} " if args.model else ""
        raise ConfigError(f"no run records {what}matching the filters in {loaded.store} "
                          f"(models there: {', '.join(models) or 'none'})")
    return out


def workloads_of(runs: list[dict[str, Any]]) -> dict[str, list[Row]]:
    """Selected rows (newest ok per case) grouped by workload (the report's baseline identity)."""
    out: dict[str, list[Row]] = defaultdict(list)
    for row in select_cases(runs):
        out[freeze(baseline_fields(row.record))].append(row)
    return out


def only_one(keys: list[str], what: str) -> str:
    if len(keys) == 1:
        return keys[0]
    dicts = [json.loads(k) for k in keys]
    varying = sorted({k for d in dicts for k in d if len({freeze(x.get(k)) for x in dicts}) > 1})
    options = "; ".join(", ".join(f"{k}={d.get(k)}" for k in varying) for d in dicts)
    raise ConfigError(f"{len(keys)} workloads have {what} ({options}): narrow with --precision, --batch-size, "
                      f"--compile/--eager or --label")


def newest(rows: list[Row]) -> Row:
    return max(rows, key=lambda r: rec_created(r.record))


def _baseline_of(rows: list[Row]) -> Row | None:
    """The 1-device ok row of a workload: single, then ddp, then newest."""
    cands = [r for r in rows if r.ok and r.devices == 1]
    if not cands:
        return None
    prefs = BASELINE_STRATEGY_PREFERENCE
    return min(cands, key=lambda r: (prefs.index(r.strategy) if r.strategy in prefs else len(prefs),
                                     -rec_created(r.record)))


def _pick_workload(workloads: dict[str, list[Row]], args) -> tuple[str, Row]:
    have = [k for k, rows in workloads.items() if _baseline_of(rows) is not None]
    if not have:
        raise ConfigError(f"no ok 1-device record of model {args.model!r} matching the filters: the model needs "
                          f"the measured 1-device step time (dlscale run --model {args.model} --nproc-per-node 1)")
    key = only_one(have, "a 1-device ok record")
    return key, _baseline_of(workloads[key])  # type: ignore[return-value]


def shape_of(row: Row) -> Shape:
    return Shape(row.nnodes, row.nproc_per_node)


def _samples_per_device_step(row: Row) -> float:
    cfg = rec_config(row.record)
    return float(int(cfg.get("batch_size") or 1) * int(cfg.get("grad_accum") or 1))


def _step_s(row: Row) -> tuple[float, str]:
    """Seconds per step of a 1-device record: its median throughput (what speedups are relative to)."""
    spd = _samples_per_device_step(row)
    if row.median and row.median > 0:
        return spd / row.median, f"{spd:g} samples / median {row.median:,.2f} samples/s"
    v = num(row.summary("step_ms_p50"))
    if v is not None and v > 0:
        return v / 1000.0, "summary.step_ms_p50"
    raise ConfigError(f"1-device record {str(row.record.get('id'))[:8]} has no throughput or step time")


def _case_name(row: Row) -> str:
    cfg = rec_config(row.record)
    parts = [str(cfg.get("model")), str(cfg.get("precision")), f"b{cfg.get('batch_size')}",
             "compile" if cfg.get("compile") else "eager", row.strategy, shape_of(row).label]
    if cfg.get("flavor") not in (None, "full"):
        parts.insert(1, str(cfg.get("flavor")))
    if row.record.get("label") is not None:
        parts.append(f"label {row.record.get('label')}")
    return " ".join(parts)


def _comm_micro(loaded, device_type: str) -> dict[str, Any] | None:
    """The newest ok micro comm record with all_reduce rows (busbw > 0) of ``device_type``."""
    best = None
    for rec in loaded.records:
        if rec.get("kind") != "micro" or rec.get("micro") != "comm":
            continue
        dev = rec.get("device")
        if device_type not in ("unknown", "auto") and dev and dev != device_type:
            continue
        rows = _ar_rows(rec)
        if rows and (best is None or rec_created(rec) > rec_created(best)):
            best = rec
    return best


def _ar_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in rec.get("results") or []:
        if not isinstance(row, dict) or row.get("op") != "all_reduce" or row.get("status", "ok") != "ok":
            continue
        bw, nbytes = num(row.get("busbw_gbps")), num(row.get("bytes"))
        if bw is not None and bw > 0 and nbytes is not None and nbytes > 0:
            out.append(row)
    return sorted(out, key=lambda r: r["bytes"])


@dataclass
class Links:
    intra: Link | None
    inter: Link | None
    sources: dict[str, str]
    micro: dict[str, Any] | None = None
    intra_given: bool = False


def _links(loaded, args, device_type: str) -> Links:
    src: dict[str, str] = {}
    micro = None
    intra = None
    if args.intra_busbw is not None:
        lat = args.intra_latency_us or 0.0
        intra = Link(args.intra_busbw * 1e9, lat * 1e-6)
        src["intra"] = f"--intra-busbw {args.intra_busbw:g} GB/s, latency {lat:g} us"
    else:
        micro = _comm_micro(loaded, device_type)
        if micro is not None:
            rows = _ar_rows(micro)
            big, small = rows[-1], rows[0]
            n = int(num(big.get("nranks")) or num(micro.get("nranks")) or 2)
            bw = float(big["busbw_gbps"]) * 1e9
            if args.intra_latency_us is not None:
                lat, how = args.intra_latency_us * 1e-6, "--intra-latency-us"
            else:
                # the smallest message is latency-bound: t = 2(n-1) alpha + S 2(n-1)/n / busbw
                t_small = (num(small.get("time_us")) or 0.0) * 1e-6
                bw_part = small["bytes"] * 2.0 * (n - 1) / n / bw
                lat = max(0.0, t_small - bw_part) / (2 * (n - 1)) if n > 1 else 0.0
                how = f"{small['time_us']:.1f} us for {int(small['bytes'])} B"
            intra = Link(bw, lat)
            src["intra"] = (f"micro comm record {str(micro.get('id'))[:8]} ({n} rank(s) of "
                            f"{micro.get('device_name') or '?'}): busbw {big['busbw_gbps']:.1f} GB/s at "
                            f"{int(big['bytes'])} B; latency {lat * 1e6:.2f} us ({how})")
    inter = None
    if args.inter_busbw is not None:
        inter = Link(args.inter_busbw * 1e9, args.inter_latency_us * 1e-6)
        src["inter"] = f"--inter-busbw {args.inter_busbw:g} GB/s per node, latency {args.inter_latency_us:g} us"
    return Links(intra, inter, src, micro, args.intra_busbw is not None)


def _env_gpu_count(rec: dict[str, Any] | None) -> int | None:
    env = rec.get("env") if isinstance(rec, dict) else None
    gpus = env.get("gpus") if isinstance(env, dict) else None
    return len(gpus) if isinstance(gpus, list) and gpus else None


def _node_limit(args, links: Links, records: list[dict[str, Any]]) -> tuple[int | None, str]:
    """GPUs per node the model may use, and why (None: no limit)."""
    if args.gpus_per_node_max is not None:
        return args.gpus_per_node_max, "--gpus-per-node-max"
    if links.intra_given:
        return None, "intra-node link given with --intra-busbw: no limit"
    counts = [c for c in (_env_gpu_count(r) for r in records + ([links.micro] if links.micro else [])) if c]
    if counts:
        return max(counts), "GPUs the records' environment saw"
    if links.micro is not None:
        n = int(num(links.micro.get("nranks")) or 1)
        return n, "ranks of the micro comm measurement"
    return None, "unknown (no environment in the records)"


def _check_shapes(shapes: list[Shape], links: Links, limit: int | None, why: str) -> None:
    for sh in shapes:
        if limit is not None and sh.gpus_per_node > limit:
            raise ConfigError(f"shape {sh.label} has {sh.gpus_per_node} GPUs per node, more than the {limit} of the "
                              f"measured node ({why}); give --gpus-per-node-max, or the intra-node link with "
                              f"--intra-busbw GBPS for a larger node")
        if sh.gpus_per_node > 1 and links.intra is None:
            raise ConfigError(f"no intra-node all-reduce bandwidth for shape {sh.label}: give --intra-busbw GBPS, "
                              f"or measure it into the store with 'dlscale micro comm --op all_reduce "
                              f"--nproc-per-node N --store STORE'")
        if sh.nodes > 1 and links.inter is None:
            raise ConfigError(f"shape {sh.label} spans {sh.nodes} nodes: give --inter-busbw GBPS (the network bus "
                              f"bandwidth per node, e.g. 12.5 for 100 Gb/s InfiniBand)")


def _default_shapes(limit: int | None, links: Links) -> list[Shape]:
    g0 = limit or 8
    out = ([Shape(1, n) for n in (2, 4, 8, 16, 32) if n < g0] + [Shape(1, g0)]) if g0 > 1 else []
    if links.inter is not None:
        out += [Shape(m, g0) for m in NODE_COUNTS]
    return out or [Shape(1, 1)]


@functools.lru_cache(maxsize=16)
def _registry_param_numels(model: str, flavor: str) -> tuple[int, ...] | None:
    """Parameter sizes (elements) of a registered model in registration order, built on the meta device
    (no memory, no weights); None when dlscale does not know the model or it cannot be built so."""
    try:
        import torch

        from dlscale.models import get_model

        spec = get_model(model, flavor)
        with torch.device("meta"):
            module = spec.build()
        seen, out = set(), []
        for p in module.parameters():
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                out.append(int(p.numel()))
        return tuple(out)
    except Exception:  # noqa: BLE001 - any failure means: fall back to uniform buckets
        return None


def _buckets(args, base: Row, params: float, cap_mb: float) -> tuple[list[float], str]:
    g = gradient_bytes(params, args.grad_bytes)
    cap = cap_mb * MIB
    if args.param_sizes == "auto":
        cfg = rec_config(base.record)
        numels = _registry_param_numels(str(cfg.get("model")), str(cfg.get("flavor") or "full"))
        if numels and sum(numels) == int(params):
            # DDP rebuilds its buckets in the order gradients became ready: about the reverse of registration
            sizes = [n * args.grad_bytes for n in reversed(numels)]
            b = bucket_sizes(g, cap, sizes)
            return b, (f"{len(b)} bucket(s) of <= {cap_mb:g} MiB over the {len(numels)} parameters of the registered "
                       f"model, in reverse registration order (largest {max(b) / 1e6:.1f} MB)")
    b = bucket_sizes(g, cap)
    return b, f"{len(b)} bucket(s) of {cap_mb:g} MiB cut from the gradient bytes (uniform)"


def _bucket_mb(args, rows: list[Row]) -> tuple[float, str]:
    if args.bucket_mb is not None:
        return args.bucket_mb, "--bucket-mb"
    caps = {num((rec_config(r.record).get("strategy_options") or {}).get("bucket_cap_mb"))
            for r in rows if r.strategy == "ddp" and r.devices > 1}
    caps.discard(None)
    if len(caps) == 1:
        return float(caps.pop()), "bucket_cap_mb of the workload's ddp records"  # type: ignore[arg-type]
    return DDP_BUCKET_CAP_MB, "DDP default"


def _measured_overlap(rows: list[Row], strategy: str, exclude: Row | None = None,
                      devices: int | None = None) -> tuple[float, Row] | None:
    cands = []
    for row in rows:
        if row is exclude or not row.ok or row.devices < 2 or (devices is not None and row.devices != devices):
            continue
        r = num(row.breakdown.get("overlap_ratio")) if row.breakdown else None
        if r is not None and 0.0 <= r <= 1.0:
            cands.append((row.strategy == strategy, row.devices, rec_created(row.record), r, row))
    if not cands:
        return None
    *_, r, row = max(cands, key=lambda c: c[:3])
    return r, row


def _two_device_row(rows: list[Row], strategy: str) -> Row | None:
    twos = [r for r in rows if r.ok and r.devices == 2 and r.strategy == strategy]
    if not twos:
        return None
    return max(twos, key=lambda r: (r.nnodes == 1, rec_created(r.record)))


def model_info(row: Row) -> dict[str, Any]:
    m = row.record.get("model")
    return m if isinstance(m, dict) else {}


def _params(base: Row) -> float:
    params = num(model_info(base).get("params"))
    if not params or params <= 0:
        raise ConfigError(f"1-device record {str(base.record.get('id'))[:8]} has no model.params")
    return params


@dataclass
class _BaseInputs:
    """What the model takes from a workload's 1-device record and the links (predict and --validate)."""

    params: float
    step_s: float
    step_src: str
    compute: Compute
    spd: float  # samples per device and optimizer step
    links: Links
    limit: int | None  # GPUs per node the model may use
    limit_why: str


def _base_inputs(loaded, args, base: Row, rows: list[Row]) -> _BaseInputs:
    step_s, step_src = _step_s(base)
    links = _links(loaded, args, rec_device_type(base.record))
    limit, why = _node_limit(args, links, [r.record for r in rows])
    return _BaseInputs(_params(base), step_s, step_src, compute_terms(step_s, base.breakdown),
                       _samples_per_device_step(base), links, limit, why)


# ----------------------------------------------------------------------------- predict

def build_prediction(loaded, args, shapes: list[Shape] | None) -> dict[str, Any]:
    """Everything ``predict`` prints: inputs with their sources, one row per shape, notes."""
    runs = filtered_runs(loaded, args)
    workloads = workloads_of(runs)
    key, base = _pick_workload(workloads, args)
    rows = workloads[key]
    info = model_info(base)
    b = _base_inputs(loaded, args, base, rows)
    params, step_s, step_src, compute, spd, links = b.params, b.step_s, b.step_src, b.compute, b.spd, b.links
    limit, limit_why = b.limit, b.limit_why
    shapes = list(shapes) if shapes else _default_shapes(limit, links)
    _check_shapes(shapes, links, limit, limit_why)
    strategy = args.strategy or "ddp"
    cap_mb, cap_src = _bucket_mb(args, rows)
    buckets, bucket_src = _buckets(args, base, params, cap_mb)

    overlap: str | float = args.overlap
    ov_src = {"buckets": "DDP buckets pipelined behind backward", "none": "--overlap none: all-reduce after backward"
              }.get(str(overlap), f"--overlap {overlap}: that share of the all-reduce hidden")
    if overlap == "auto":
        got = _measured_overlap(rows, strategy)
        if got is None:
            overlap, ov_src = "buckets", "auto: no measured breakdown at >1 device, so the DDP bucket pipeline"
        else:
            overlap, r = got[0], got[1]
            ov_src = (f"auto: overlap_ratio of the {r.devices}-device {r.strategy} breakdown, record "
                      f"{str(r.record.get('id'))[:8]}")
    model = StepModel(compute, spd, buckets, links.intra, links.inter, overlap)

    measured: dict[Shape, Row] = {}
    for r in rows:
        if r.ok and r.devices > 1 and r.strategy == strategy:
            sh = shape_of(r)
            if sh not in measured or rec_created(r.record) > rec_created(measured[sh].record):
                measured[sh] = r
    two = _two_device_row(rows, strategy)
    calibrated_on = None
    if args.overhead_ms == "auto":
        if two is not None and (shape_of(two).nodes == 1 or links.inter is not None) and (
                links.intra is not None or shape_of(two).gpus_per_node == 1):
            model.overhead_s = calibrate_overhead(model, shape_of(two), two.median)  # type: ignore[arg-type]
            calibrated_on = two
            oh_src = (f"calibrated on the measured {shape_of(two).label} {two.strategy} record "
                      f"{str(two.record.get('id'))[:8]}: o = measured step - model step")
        elif two is None:
            oh_src = f"no measured 2-device {strategy} record: 0"
        else:
            oh_src = f"the 2-device record's shape {shape_of(two).label} needs a link figure not given: 0"
    else:
        model.overhead_s = float(args.overhead_ms) / 1000.0
        oh_src = f"--overhead-ms {args.overhead_ms:g}"

    out_rows = []
    for sh in [Shape(1, 1)] + [s for s in shapes if s != Shape(1, 1)]:
        row = model.predict(sh)
        mr = base if sh.devices == 1 else measured.get(sh)
        meas = mr.median if mr is not None else None
        row.update(measured_samples_per_s=meas, measured_record=str(mr.record.get("id")) if mr else None,
                   measured_speedup=meas / base.median if meas and base.median else None,
                   error_pct=error_pct(row["samples_per_s"], meas) if meas else None,
                   calibration_point=mr is not None and mr is calibrated_on)
        out_rows.append(row)
    g = model.grad_bytes
    notes = [f"compute split: {compute.split}",
             f"gradient bytes G = {params:,.0f} params x {args.grad_bytes:g} B = {g / 1e6:,.1f} MB; {bucket_src}",
             "all-reduce of S bytes on M nodes x g GPUs: 2(g-1) a_intra + 2S(g-1)/g / B_intra (reduce-scatter + "
             "all-gather in the node) + 2(M-1) a_inter + 2S(M-1)/M / B_inter (ring across nodes; B_inter per node)",
             "buckets: bucket i is ready at t_bwd x (gradient bytes up to i) / G (uniform rate over backward) and "
             "starts when ready and the previous bucket is done; exposed = end of the last - t_bwd",
             "overhead: one fixed number for every N > 1, fitted on the 2-device point only",
             f"measured column: newest ok {strategy} record of each shape (1x1: the baseline record)"]
    return {
        "model": str(rec_config(base.record).get("model")), "unit": str(info.get("unit") or "sample"),
        "workload": json.loads(key),
        "inputs": {
            "baseline_record": str(base.record.get("id")), "baseline_strategy": base.strategy,
            "step_ms": step_s * 1e3, "step_source": step_src, "compute_split": compute.split,
            "data_ms": compute.data_s * 1e3, "forward_ms": compute.forward_s * 1e3,
            "backward_ms": compute.backward_s * 1e3, "update_ms": compute.update_s * 1e3,
            "samples_per_device_step": spd, "params": params, "bytes_per_gradient": args.grad_bytes,
            "gradient_bytes": g, "buckets": len(buckets), "bucket_mb": cap_mb, "bucket_source": cap_src,
            "bucket_layout": bucket_src,
            "intra_busbw_gbps": links.intra.busbw_bps / 1e9 if links.intra else None,
            "intra_latency_us": links.intra.latency_s * 1e6 if links.intra else None,
            "inter_busbw_gbps": links.inter.busbw_bps / 1e9 if links.inter else None,
            "inter_latency_us": links.inter.latency_s * 1e6 if links.inter else None,
            "link_sources": links.sources, "gpus_per_node_max": limit, "gpus_per_node_source": limit_why,
            "overlap": overlap, "overlap_source": ov_src,
            "overhead_ms": model.overhead_s * 1e3, "overhead_source": oh_src,
        },
        "rows": out_rows, "notes": notes,
    }


def fmt(v: Any, digits: int = 2, suffix: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{suffix}"


def md_table(header: list[str], rows: list[list[str]], align: str = "---:") -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(f" {align} " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_prediction(pred: dict[str, Any]) -> str:
    inp, unit = pred["inputs"], pred["unit"]
    w = pred["workload"]
    spd = inp["samples_per_device_step"]
    out = [f"# Predicted data-parallel scaling: {pred['model']} ({w.get('precision')}, "
           f"{'compiled' if w.get('compile') else 'eager'}, {spd:g} {unit}/device/step)",
           "",
           f"* 1-device step: {inp['step_ms']:.2f} ms ({inp['step_source']}; {inp['baseline_strategy']} record "
           f"{inp['baseline_record'][:8]}); split: {inp['compute_split']}",
           f"* gradients: {inp['gradient_bytes'] / 1e6:,.1f} MB per step ({inp['params']:,.0f} params x "
           f"{inp['bytes_per_gradient']:g} B), {inp['bucket_layout']}",
           f"* intra-node link: {_link_text(inp['intra_busbw_gbps'], inp['intra_latency_us'])}"
           + (f" ({inp['link_sources']['intra']})" if "intra" in inp["link_sources"] else ""),
           f"* inter-node link: {_link_text(inp['inter_busbw_gbps'], inp['inter_latency_us'])}"
           + (f" ({inp['link_sources']['inter']})" if "inter" in inp["link_sources"] else " (--inter-busbw)"),
           f"* overlap: {inp['overlap']} ({inp['overlap_source']})",
           f"* fixed overhead at N > 1: {inp['overhead_ms']:.2f} ms ({inp['overhead_source']})",
           ""]
    body = []
    for r in pred["rows"]:
        meas = r["measured_samples_per_s"]
        err = ("baseline" if r["devices"] == 1 else "calibrated" if r["calibration_point"]
               else fmt(r["error_pct"], 1, "%")) if meas else "-"
        body.append([r["shape"], str(r["devices"]), fmt(r["data_ms"]), fmt(r["forward_ms"]), fmt(r["backward_ms"]),
                     fmt(r["update_ms"]), fmt(r["overhead_ms"]), fmt(r["allreduce_ms"]), fmt(r["exposed_ms"]),
                     fmt(r["step_ms"]), fmt(r["samples_per_s"], 1), fmt(r["speedup"], 2), f"{r['ideal_speedup']:g}",
                     fmt(r["efficiency"] * 100, 1, "%"), r["limiting"], fmt(meas, 1), err])
    out.append(md_table(["shape", "GPUs", "data (ms)", "fwd (ms)", "bwd (ms)", "upd (ms)", "overhead (ms)",
                       "all-reduce (ms)", "exposed (ms)", "step (ms)", f"{unit}/s", "speedup", "ideal",
                       "efficiency", "limited by", f"measured {unit}/s", "error"], body))
    out.append("")
    worst = pred["rows"][-1]
    out.append(f"At {worst['shape']} ({worst['devices']} GPUs) scaling is limited by {worst['limiting']}: exposed "
               f"all-reduce {worst['exposed_ms']:.2f} ms (of {worst['allreduce_ms']:.2f} ms: intra "
               f"{worst['allreduce_intra_ms']:.2f}, inter {worst['allreduce_inter_ms']:.2f}) and overhead "
               f"{worst['overhead_ms']:.2f} ms in a {worst['step_ms']:.2f} ms step. "
               f"error = (predicted - measured) / measured.")
    out += ["", "Model:"] + [f"* {n}" for n in pred["notes"]]
    return "\n".join(out)


def _link_text(bw: float | None, lat: float | None) -> str:
    return "not given" if bw is None else f"{bw:,.1f} GB/s busbw, {lat:.2f} us latency"


def write_plot(path: str, series: list[tuple[str, list[tuple[int, float]]]],
               measured: list[tuple[int, float]], title: str) -> None:
    """Speedup against GPUs: predicted lines, the ideal line, measured points (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401 - used through matplotlib.ticker

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs_all = sorted({x for _, pts in series for x, _ in pts} | {x for x, _ in measured})
    ax.plot(xs_all, xs_all, "--", color="grey", label="ideal")
    for name, pts in series:
        pts = sorted(pts)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
    if measured:
        ax.plot([p[0] for p in measured], [p[1] for p in measured], "ks", label="measured", markerfacecolor="none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    for axis in (ax.xaxis, ax.yaxis):  # 1, 2, 4 ... rather than 2^n
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup over 1 GPU")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot write plot {path}: {e}") from None
    finally:
        plt.close(fig)


def cmd_predict(args) -> int:
    if args.validate is not None:
        if args.store is not None:
            raise ConfigError("give the store once: either STORE or --validate STORE")
        return cmd_validate(args)
    if args.store is None or args.model is None:
        raise ConfigError("predict needs STORE and --model (or --validate STORE)")
    loaded = load_records(args.store)
    pred = build_prediction(loaded, args, args.shapes)
    if args.plot:
        pts = [(r["devices"], r["speedup"]) for r in pred["rows"]]
        meas = [(r["devices"], r["measured_speedup"]) for r in pred["rows"] if r["measured_speedup"]]
        write_plot(args.plot, [("predicted", pts)], meas, f"{pred['model']}: predicted vs ideal speedup")
        pred["plot"] = args.plot
    print(json.dumps(pred, indent=2, sort_keys=True) if args.format == "json" else render_prediction(pred))
    return 0


# ----------------------------------------------------------------------------- validate

def _is_published(path: str) -> bool:
    return Path(path).suffix.lower() in (".yaml", ".yml", ".json") and Path(path).is_file()


def load_published(path: str) -> dict[str, Any]:
    """A published-figures fixture (YAML or JSON); ConfigError when unreadable or without series."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict) or not data.get("series"):
        raise ConfigError(f"{path} is not a published-figures file (no 'series')")
    return data


def validate_store(loaded, args) -> dict[str, Any]:
    """Predict every multi-device ok ``--strategy`` record of the store from its 1-device record."""
    strategy = args.strategy or "ddp"
    runs = filtered_runs(loaded, args)
    workloads = workloads_of(runs)
    results, skipped = [], []
    targets_total = 0
    for key, rows in sorted(workloads.items()):
        targets = sorted((r for r in rows if r.ok and r.devices > 1 and r.strategy == strategy),
                         key=lambda r: (r.devices, r.nnodes))
        if not targets:
            continue
        targets_total += len(targets)
        base = _baseline_of(rows)
        if base is None:
            skipped += [f"no 1-device baseline for {_case_name(t)}; skipped" for t in targets]
            continue
        b = _base_inputs(loaded, args, base, rows)
        params, compute, spd, links, limit, why = b.params, b.compute, b.spd, b.links, b.limit, b.limit_why
        two = _two_device_row(rows, strategy)
        for t in targets:
            sh = shape_of(t)
            if sh.nodes > 1 and links.inter is None:
                skipped.append(f"{_case_name(t)} spans {sh.nodes} nodes: needs --inter-busbw; skipped")
                continue
            _check_shapes([sh], links, limit, why)
            cap = num((rec_config(t.record).get("strategy_options") or {}).get("bucket_cap_mb"))
            cap_mb = args.bucket_mb or cap or DDP_BUCKET_CAP_MB
            buckets, _ = _buckets(args, base, params, cap_mb)
            overlap: str | float = args.overlap
            if overlap == "auto":
                # never the predicted record's own breakdown: the 2-device one, for N > 2 only
                got = _measured_overlap(rows, strategy, exclude=t, devices=2) if t.devices > 2 else None
                overlap = got[0] if got else "buckets"
            model = StepModel(compute, spd, buckets, links.intra, links.inter, overlap)
            if args.overhead_ms != "auto":
                model.overhead_s, calib = float(args.overhead_ms) / 1000.0, f"--overhead-ms {args.overhead_ms:g}"
            elif t.devices == 2:
                calib = "none (N=2: nothing calibrated)"
            elif two is not None and two is not t:
                model.overhead_s = calibrate_overhead(model, shape_of(two), two.median)  # type: ignore[arg-type]
                calib = f"o from {shape_of(two).label} record {str(two.record.get('id'))[:8]}"
            else:
                calib = "none (no 2-device record)"
            row = model.predict(sh)
            results.append({"case": _case_name(t), "record": str(t.record.get("id")), "shape": sh.label,
                            "devices": sh.devices, "measured": t.median, "predicted": row["samples_per_s"],
                            "error_pct": error_pct(row["samples_per_s"], t.median),  # type: ignore[arg-type]
                            "overhead_ms": row["overhead_ms"], "calibration": calib,
                            "exposed_ms": row["exposed_ms"], "allreduce_ms": row["allreduce_ms"],
                            "step_ms": row["step_ms"], "limiting": row["limiting"],
                            "intra_source": links.sources.get("intra"), "overlap": overlap})
    if targets_total == 0:
        raise ConfigError(f"no multi-device ok {strategy} record in {loaded.store} to validate")
    errs = [abs(r["error_pct"]) for r in results]
    return {"store": loaded.store, "strategy": strategy, "rows": results, "skipped": skipped,
            "mean_abs_error_pct": sum(errs) / len(errs) if errs else None,
            "max_abs_error_pct": max(errs) if errs else None}


def render_validation(val: dict[str, Any]) -> str:
    out = [f"# Model validation: {val['store']} ({val['strategy']} records predicted from their 1-device record)", ""]
    if val["rows"]:
        body = [[r["case"], r["shape"], fmt(r["measured"], 1), fmt(r["predicted"], 1), fmt(r["error_pct"], 1, "%"),
                 fmt(r["overhead_ms"]), r["calibration"], fmt(r["exposed_ms"]), r["limiting"]] for r in val["rows"]]
        out.append(md_table(["case", "shape", "measured samples/s", "predicted samples/s", "error", "overhead (ms)",
                           "calibration", "exposed (ms)", "limited by"], body))
        out += ["", f"{len(val['rows'])} case(s): mean |error| {val['mean_abs_error_pct']:.1f}%, "
                    f"max |error| {val['max_abs_error_pct']:.1f}%. error = (predicted - measured) / measured."]
        srcs = sorted({r["intra_source"] for r in val["rows"] if r["intra_source"]})
        out += [f"intra-node link: {s}" for s in srcs]
    else:
        out.append("Nothing could be predicted.")
    if val["skipped"]:
        out += ["", "Skipped:"] + [f"* {s}" for s in val["skipped"]]
    return "\n".join(out)


def render_published(fixture: dict[str, Any], rows: list[dict[str, Any]], path: str) -> str:
    links = fixture.get("links") or {}
    out = [f"# Model validation against published figures: {path}", "",
           f"source: {fixture.get('source')}",
           f"intra-node: {links.get('intra', {}).get('busbw_gbps')} GB/s ({links.get('intra', {}).get('source')}); "
           f"inter-node: {links.get('inter', {}).get('busbw_gbps')} GB/s per node "
           f"({links.get('inter', {}).get('source')}); overlap {fixture.get('overlap')}", ""]
    body = [[r["series"], r["shape"], str(r["devices"]), r["role"], fmt(r["published"], 1), fmt(r["samples_per_s"], 1),
             fmt(r["error_pct"], 1, "%") if r["role"] == "predicted" else "-", fmt(r["overhead_ms"]),
             fmt(r["allreduce_ms"]), r["limiting"]] for r in rows]
    out.append(md_table(["series", "shape", "GPUs", "role", "published samples/s", "predicted samples/s", "error",
                       "overhead (ms)", "all-reduce (ms)", "limited by"], body))
    errs = [abs(r["error_pct"]) for r in rows if r["role"] == "predicted"]
    if errs:
        out += ["", f"{len(errs)} predicted point(s): mean |error| {sum(errs) / len(errs):.1f}%, max {max(errs):.1f}%;"
                    " the 1x2 point calibrates the fixed overhead only."]
    return "\n".join(out)


def cmd_validate(args) -> int:
    path = args.validate
    if _is_published(path):
        fixture = load_published(path)
        rows = validate_published(fixture, args.intra_busbw)
        if args.format == "json":
            print(json.dumps({"source": fixture.get("source"), "rows": rows}, indent=2, sort_keys=True))
        else:
            print(render_published(fixture, rows, path))
        if args.plot:
            series = defaultdict(list)
            for r in rows:
                series[r["series"]].append((r["devices"], r["speedup"]))
            write_plot(args.plot, list(series.items()), [], "predicted speedup (published-figure validation)")
        return 0
    loaded = load_records(path)
    val = validate_store(loaded, args)
    if args.plot and val["rows"]:
        by_case: dict[str, list] = defaultdict(list)
        meas = []
        for r in val["rows"]:
            by_case[r["case"].rsplit(" ", 1)[0]].append((r["devices"], r["predicted"]))
            meas.append((r["devices"], r["measured"]))
        write_plot(args.plot, list(by_case.items()), meas, "predicted vs measured samples/s")
    print(json.dumps(val, indent=2, sort_keys=True) if args.format == "json" else render_validation(val))
    return 0
