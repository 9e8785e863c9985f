"""``dlscale predict`` (data-parallel scaling model) and ``dlscale cost`` (time and money of a run).

Both read a result store; the arithmetic is in :mod:`dlscale.perfmodel`, docs/perfmodel.md
explains the model. Inputs are picked the way reports pick them (dlscale.report.data): the newest
ok record per case; a *workload* is everything in the config except strategy, device counts and
how it was run (the report's baseline identity).
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from typing import Any

from dlscale import ConfigError
from dlscale.perfmodel import GRAD_BYTES_PER_PARAM, gradient_bytes, predict_scaling, training_cost
from dlscale.report.data import (BASELINE_STRATEGY_PREFERENCE, Row, _baseline_fields, _freeze, load_records, num,
                                 rec_config, rec_created, rec_device_type, select_cases)

DEFAULT_DEVICES = "2,4,8,16,32"


# ----------------------------------------------------------------------------- argument types

def _device_list(text: str) -> list[int]:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"device counts must be positive integers, got {part!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"device counts must be positive integers, got {n}")
        out.append(n)
    if not out:
        raise argparse.ArgumentTypeError("give at least one device count, e.g. 2,4,8")
    return out


def _overlap(text: str) -> str | float:
    if str(text).lower() == "auto":
        return "auto"
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--overlap is auto or a number in 0..1, got {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"--overlap must be in 0..1, got {text}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return v


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return v


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="result store directory (or one .jsonl file)")
    p.add_argument("--model", required=True, help="model name as recorded (config.model)")
    p.add_argument("--precision", default=None, help="only records of this precision (e.g. amp-bf16)")
    p.add_argument("--batch-size", type=_positive_int, default=None, help="only records of this per-device batch")
    p.add_argument("--compile", dest="compile", action="store_const", const=True, default=None,
                   help="only torch.compile'd records")
    p.add_argument("--eager", dest="compile", action="store_const", const=False, help="only eager records")
    p.add_argument("--label", default=None, help="only records with this label")
    p.add_argument("--busbw", type=_positive_float, default=None, metavar="GBPS",
                   help="all-reduce bus bandwidth in GB/s (1e9 B/s, nccl-tests busbw); default: the largest-size "
                        "all_reduce row of the newest 'dlscale micro comm' record in the store")
    p.add_argument("--overlap", type=_overlap, default="auto", metavar="auto|0..1",
                   help="share of the all-reduce hidden behind backward; auto: overlap_ratio of a measured "
                        "breakdown of this workload at >1 device, else 0")
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format")


def register(sub) -> None:
    p = sub.add_parser(
        "predict", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="predict data-parallel scaling from a 1-device record and all-reduce bandwidth",
        description="Performance model (Shi & Chu, arXiv 1711.05979): t(N) = t_compute + (1 - overlap) x "
                    "G x 2(N-1)/N / busbw, with t_compute the measured 1-device step time and G = params x 4 "
                    "bytes (fp32 gradients). Measured multi-device records are shown next to the prediction. "
                    "See docs/perfmodel.md.")
    _workload_args(p)
    p.add_argument("--devices", type=_device_list, default=_device_list(DEFAULT_DEVICES),
                   help="device counts to predict (comma list); 1 is always shown as the reference")
    p.add_argument("--strategy", default="ddp",
                   help="strategy of the measured multi-device records compared with the prediction")
    p.set_defaults(func=cmd_predict)

    c = sub.add_parser(
        "cost", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="time, GPU-hours and money of a training run from a measured (or predicted) throughput",
        description="hours = samples / samples_per_s / 3600 (samples = tokens / seq_len for language models, "
                    "or epochs x dataset size), GPU-hours = hours x N, cost = GPU-hours x price. The throughput "
                    "is the newest ok record of the workload at N devices, or the prediction with --predicted.")
    _workload_args(c)
    c.add_argument("--devices", type=_positive_int, required=True, help="number of GPUs N")
    c.add_argument("--strategy", default=None, help="only records of this strategy (default: any; the "
                                                    "prediction compares with ddp)")
    amount = c.add_mutually_exclusive_group(required=True)
    amount.add_argument("--tokens", type=_positive_float, help="tokens to train on (language models)")
    amount.add_argument("--samples", type=_positive_float, help="samples to train on")
    amount.add_argument("--epochs", type=_positive_float, help="epochs over --dataset-size samples")
    c.add_argument("--dataset-size", type=_positive_float, default=None, help="samples per epoch (with --epochs)")
    c.add_argument("--price-per-gpu-hour", type=_positive_float, required=True, metavar="USD",
                   help="price of one GPU for one hour")
    c.add_argument("--predicted", action="store_true",
                   help="use the model's predicted throughput at N instead of a measured record")
    c.set_defaults(func=cmd_cost)


# ----------------------------------------------------------------------------- picking inputs

def _matching_runs(loaded, args) -> list[dict[str, Any]]:
    out = []
    for rec in loaded.records:
        if rec.get("kind") != "run":
            continue
        cfg = rec_config(rec)
        if cfg.get("model") != args.model:
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
        raise ConfigError(f"no run records of model {args.model!r} matching the filters in {loaded.store} "
                          f"(models there: {', '.join(models) or 'none'})")
    return out


def _workloads(runs: list[dict[str, Any]]) -> dict[str, list[Row]]:
    """Selected rows (newest ok per case) grouped by workload (the report's baseline identity)."""
    out: dict[str, list[Row]] = defaultdict(list)
    for row in select_cases(runs):
        out[_freeze(_baseline_fields(row.record))].append(row)
    return out


def _only_one(keys: list[str], what: str) -> str:
    if len(keys) == 1:
        return keys[0]
    dicts = [json.loads(k) for k in keys]
    varying = sorted({k for d in dicts for k in d if len({_freeze(x.get(k)) for x in dicts}) > 1})
    options = "; ".join(", ".join(f"{k}={d.get(k)}" for k in varying) for d in dicts)
    raise ConfigError(f"{len(keys)} workloads have {what} ({options}): narrow with --precision, --batch-size, "
                      f"--compile/--eager or --label")


def _newest(rows: list[Row]) -> Row:
    return max(rows, key=lambda r: rec_created(r.record))


def _pick_baseline(workloads: dict[str, list[Row]], args) -> tuple[str, Row]:
    have = [k for k, rows in workloads.items() if any(r.ok and r.devices == 1 for r in rows)]
    if not have:
        raise ConfigError(f"no ok 1-device record of model {args.model!r} matching the filters: the model needs "
                          f"the measured 1-device step time (dlscale run --model {args.model} --nproc-per-node 1)")
    key = _only_one(have, "a 1-device ok record")
    cands = [r for r in workloads[key] if r.ok and r.devices == 1]
    prefs = BASELINE_STRATEGY_PREFERENCE

    def rank(r: Row) -> tuple:
        return (prefs.index(r.strategy) if r.strategy in prefs else len(prefs), -rec_created(r.record))

    return key, min(cands, key=rank)


def _step_ms(row: Row) -> tuple[float, str]:
    v = num(row.summary("step_ms_p50"))
    if v is not None and v > 0:
        return v, "summary.step_ms_p50"
    gb = num(row.record.get("global_batch"))
    if gb and row.median:
        return 1000.0 * gb / row.median, "1000 x global_batch / median samples/s"
    raise ConfigError(f"1-device record {str(row.record.get('id'))[:8]} has no step time or throughput")


def _busbw(loaded, args, device_type: str) -> tuple[float, str]:
    """Bus bandwidth in B/s and where it came from."""
    if args.busbw is not None:
        return args.busbw * 1e9, f"--busbw {args.busbw:g} GB/s"
    best = None
    for rec in loaded.records:
        if rec.get("kind") != "micro" or rec.get("micro") != "comm":
            continue
        dev = rec.get("device")
        if device_type not in ("unknown", "auto") and dev and dev != device_type:
            continue
        for row in rec.get("results") or []:
            if not isinstance(row, dict) or row.get("op") != "all_reduce" or row.get("status", "ok") != "ok":
                continue
            bw, nbytes = num(row.get("busbw_gbps")), num(row.get("bytes"))
            if bw is None or bw <= 0 or nbytes is None:
                continue
            key = (nbytes, rec_created(rec), num(row.get("nranks")) or 0)
            if best is None or key > best[0]:
                best = (key, bw, rec, row)
    if best is None:
        raise ConfigError(f"no all_reduce bus bandwidth for {device_type}: give --busbw GBPS, or measure it into "
                          f"the store with 'dlscale micro comm --op all_reduce --nproc-per-node N --store {args.store}'")
    _, bw, rec, row = best
    return bw * 1e9, (f"micro comm record {str(rec.get('id'))[:8]}: all_reduce {int(row['bytes'])} B on "
                      f"{row.get('nranks', rec.get('nranks', '?'))} rank(s) of {rec.get('device_name') or '?'}: "
                      f"{bw:.1f} GB/s")


def _overlap_value(runs: list[dict[str, Any]], key: str, args) -> tuple[float, str]:
    if args.overlap != "auto":
        return float(args.overlap), f"--overlap {args.overlap:g}"
    cands = []
    for rec in runs:  # every ok record of the workload, superseded ones too: a breakdown is a breakdown
        if rec.get("status") != "ok" or _freeze(_baseline_fields(rec)) != key:
            continue
        row = Row(rec)
        r = num(row.breakdown.get("overlap_ratio")) if row.breakdown else None
        if row.devices > 1 and r is not None and 0.0 <= r <= 1.0:
            cands.append((row.strategy == (args.strategy or "ddp"), row.devices, rec_created(rec), r, row))
    if not cands:
        return 0.0, "no measured breakdown at >1 device: 0 assumed (no overlap, pessimistic); give --overlap"
    *_, r, row = max(cands, key=lambda c: c[:3])
    return r, (f"overlap_ratio of the {row.devices}-device {row.strategy} breakdown, record "
               f"{str(row.record.get('id'))[:8]}")


def _model_info(row: Row) -> dict[str, Any]:
    m = row.record.get("model")
    return m if isinstance(m, dict) else {}


def build_prediction(loaded, args, devices: list[int]) -> dict[str, Any]:
    """Everything ``predict`` prints: inputs with their sources, rows, notes."""
    runs = _matching_runs(loaded, args)
    workloads = _workloads(runs)
    key, base = _pick_baseline(workloads, args)
    info = _model_info(base)
    params = num(info.get("params"))
    if not params or params <= 0:
        raise ConfigError(f"1-device record {str(base.record.get('id'))[:8]} has no model.params")
    step_ms, step_src = _step_ms(base)
    cfg = rec_config(base.record)
    batch, accum = int(cfg.get("batch_size") or 1), int(cfg.get("grad_accum") or 1)
    device_type = rec_device_type(base.record)
    busbw, bw_src = _busbw(loaded, args, device_type)
    overlap, ov_src = _overlap_value(runs, key, args)
    strategy = args.strategy or "ddp"
    measured_rows: dict[int, Row] = {}
    for r in workloads[key]:
        if r.ok and r.devices > 1 and r.strategy == strategy:
            if r.devices not in measured_rows or rec_created(r.record) > rec_created(measured_rows[r.devices].record):
                measured_rows[r.devices] = r
    measured = {n: r.median for n, r in measured_rows.items()}
    measured[1] = base.median
    ns = sorted(set([1] + list(devices)))
    rows = predict_scaling(step_ms, params, batch, ns, busbw, overlap, accum, measured)
    for row in rows:
        mr = measured_rows.get(row["devices"]) if row["devices"] > 1 else base
        row["measured_record"] = str(mr.record.get("id")) if mr is not None else None
    notes = [f"gradient bytes G = params x {GRAD_BYTES_PER_PARAM} (fp32 gradients) = {params:.0f} x "
             f"{GRAD_BYTES_PER_PARAM} = {gradient_bytes(params):.4g} B",
             "ring all-reduce t_ar = G x 2(N-1)/N / busbw; exposed = (1 - overlap) x t_ar; compute time is the "
             "1-device step time at every N; overlap is the same at every N",
             "busbw of one node does not hold across nodes: give --busbw from a multi-node comm measurement",
             f"measured column: newest ok {strategy} record per device count (1: the baseline record)"]
    return {
        "model": args.model, "unit": str(info.get("unit") or "sample"),
        "workload": json.loads(key),
        "inputs": {
            "baseline_record": str(base.record.get("id")), "baseline_strategy": base.strategy,
            "compute_ms": step_ms, "compute_source": step_src,
            "batch_size": batch, "grad_accum": accum, "params": params,
            "gradient_bytes": gradient_bytes(params), "bytes_per_gradient": GRAD_BYTES_PER_PARAM,
            "busbw_gbps": busbw / 1e9, "busbw_source": bw_src, "overlap": overlap, "overlap_source": ov_src,
        },
        "rows": rows, "notes": notes,
    }


# ----------------------------------------------------------------------------- output

def _f(v: Any, digits: int = 2, suffix: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.{digits}f}{suffix}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" ---: " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render_prediction(pred: dict[str, Any]) -> str:
    inp, unit = pred["inputs"], pred["unit"]
    w = pred["workload"]
    out = [f"# Predicted data-parallel scaling: {pred['model']} ({w.get('precision')}, "
           f"{'compiled' if w.get('compile') else 'eager'}, batch {inp['batch_size']}/device"
           + (f", grad_accum {inp['grad_accum']}" if inp["grad_accum"] > 1 else "") + ")",
           "",
           f"* compute: {inp['compute_ms']:.2f} ms per step ({inp['compute_source']} of 1-device "
           f"{inp['baseline_strategy']} record {inp['baseline_record'][:8]})",
           f"* gradients: {inp['params']:.0f} params x {inp['bytes_per_gradient']} B (fp32) = "
           f"{inp['gradient_bytes'] / 1e6:.1f} MB all-reduced per step",
           f"* busbw: {inp['busbw_gbps']:.1f} GB/s ({inp['busbw_source']})",
           f"* overlap: {inp['overlap']:.2f} ({inp['overlap_source']})",
           ""]
    body = []
    for r in pred["rows"]:
        body.append([str(r["devices"]), _f(r["compute_ms"]), _f(r["allreduce_ms"]), _f(r["exposed_ms"]),
                     _f(r["step_ms"]), _f(r["samples_per_s"], 1), _f(r["efficiency"] * 100, 1, "%"),
                     _f(r["measured_samples_per_s"], 1),
                     _f(r["measured_efficiency"] * 100 if r["measured_efficiency"] is not None else None, 1, "%"),
                     _f(r["error_pct"], 1, "%") if r["error_pct"] is not None else "-"])
    out.append(_table(["N", "compute (ms)", "all-reduce (ms)", "exposed comm (ms)", "step (ms)",
                       f"predicted {unit}/s", "efficiency", f"measured {unit}/s", "measured eff.", "error"], body))
    out.append("")
    worst = pred["rows"][-1]
    out.append(f"Where scaling is lost: at N={worst['devices']} exposed communication is "
               f"{worst['comm_share'] * 100:.1f}% of the predicted step time "
               f"({worst['exposed_ms']:.2f} of {worst['step_ms']:.2f} ms); efficiency = compute / step. "
               f"error = (predicted - measured) / measured.")
    out += ["", "Assumptions:"] + [f"* {n}" for n in pred["notes"]]
    return "\n".join(out)


def cmd_predict(args) -> int:
    loaded = load_records(args.store)
    pred = build_prediction(loaded, args, args.devices)
    print(json.dumps(pred, indent=2, sort_keys=True) if args.format == "json" else render_prediction(pred))
    return 0


def cmd_cost(args) -> int:
    if args.dataset_size is not None and args.epochs is None:
        raise ConfigError("--dataset-size goes with --epochs")
    loaded = load_records(args.store)
    n = args.devices
    if args.predicted:
        pred = build_prediction(loaded, args, [n])
        row = next(r for r in pred["rows"] if r["devices"] == n)
        sps, source = row["samples_per_s"], f"predicted at N={n} (dlscale predict; busbw {pred['inputs']['busbw_source']})"
        unit = pred["unit"]
        base_rec = next(r for r in loaded.records if str(r.get("id")) == pred["inputs"]["baseline_record"])
        seq_len = num((base_rec.get("model") or {}).get("seq_len"))
        record_id = pred["inputs"]["baseline_record"]
    else:
        runs = _matching_runs(loaded, args)
        workloads = _workloads(runs)
        at_n = {k: [r for r in rows if r.ok and r.devices == n and (args.strategy is None or r.strategy == args.strategy)]
                for k, rows in workloads.items()}
        have = [k for k, rows in at_n.items() if rows]
        if not have:
            counts = sorted({r.devices for rows in workloads.values() for r in rows if r.ok})
            raise ConfigError(f"no ok record of model {args.model!r} at {n} device(s) matching the filters "
                              f"(measured device counts: {', '.join(map(str, counts)) or 'none'}); "
                              f"use --predicted for a modelled throughput")
        chosen = _newest(at_n[_only_one(have, f"an ok record at {n} device(s)")])
        sps = chosen.median
        info = _model_info(chosen)
        unit, seq_len = str(info.get("unit") or "sample"), num(info.get("seq_len"))
        record_id = str(chosen.record.get("id"))
        source = f"measured: median of {chosen.strategy} record {record_id[:8]} at N={n}"
    if args.tokens is not None and not seq_len:
        raise ConfigError(f"model {args.model!r} has no sequence length in its record; give --samples or --epochs")
    cost = training_cost(sps, n, args.price_per_gpu_hour, samples=args.samples, tokens=args.tokens,
                         seq_len=int(seq_len) if (args.tokens is not None and seq_len) else None,
                         epochs=args.epochs, dataset_size=args.dataset_size)
    cost.update(model=args.model, unit=unit, throughput_source=source, record=record_id, predicted=args.predicted)
    if args.format == "json":
        print(json.dumps(cost, indent=2, sort_keys=True))
        return 0
    rows = [["throughput", f"{sps:,.1f} {unit}/s ({source})"],
            ["samples", f"{cost['samples']:,.0f} {unit}"
             + (f" (= {cost['tokens']:,.0f} tokens / {cost['seq_len']} per {unit})" if cost["tokens"] else "")],
            ["GPUs", str(n)],
            ["wall time", f"{cost['hours']:,.2f} h ({cost['hours'] / 24:,.2f} days)"],
            ["GPU-hours", f"{cost['gpu_hours']:,.1f} GPU-h"],
            ["price", f"${cost['price_per_gpu_hour']:,.2f} per GPU-hour"],
            ["cost", f"${cost['cost']:,.2f}"]]
    print(f"# Training cost: {args.model} on {n} GPU(s)\n")
    print("| quantity | value |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\nhours = samples / samples_per_s / 3600; GPU-hours = hours x GPUs; cost = GPU-hours x price "
          "(compute time only: no checkpointing, evaluation, restarts or idle time)")
    return 0
