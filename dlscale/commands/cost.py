"""``dlscale cost``: time, money and energy of a training run, and the cheapest configuration that meets a
deadline, over measured (or imported) throughput -- and predicted throughput where nothing is measured.

The arithmetic and the choice of inputs are in :mod:`dlscale.perfmodel.cost`; this module parses and prints.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from dlscale import ConfigError
from dlscale.results import goodput
from dlscale.train import energy
from dlscale.commands.perf_args import (DeprecatedAlias, add_workload_args, arg_type, options_from_args,
                                        positive_float, positive_int, query_from_args, shapes_type)
from dlscale.perfmodel.core import Shape, parse_shapes
from dlscale.perfmodel.cost import (BUILTIN_PRICES, Amount, CostOption, cheapest_meeting_deadline, gpu_name, pick_price,
                                    plan_options, training_cost, workload_seq_len, workload_unit)
from dlscale.perfmodel.render import fmt, md_table
from dlscale.report.data import load_records, rec_config, rec_device_type


def _one_shape(text: str) -> Shape:
    shapes = parse_shapes(text)
    if len(shapes) != 1:
        raise ConfigError(f"give one cluster shape (N or NODESxGPUS), got {text!r}")
    return shapes[0]


def register(sub) -> None:
    c = sub.add_parser(
        "cost", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="time, money and energy of a training run; the cheapest configuration meeting a deadline",
        description="hours = samples / samples_per_s / 3600 (samples = tokens / seq_len for language models, "
                    "or epochs x dataset size), GPU-hours = hours x N, cost = GPU-hours x price. Throughput: the "
                    "measured (else imported) record of the shape; with --predicted the model's figure is shown "
                    "beside it, and used (with its band) only for shapes nothing was measured at.")
    add_workload_args(c, store_optional=False)
    c.add_argument("--strategy", default=None, help="only records of this strategy (default: any; the "
                                                    "prediction is fitted on ddp records)")
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--shape", type=arg_type(_one_shape), default=None, metavar="N|NODESxGPUS",
                       help="the configuration: N GPUs on one node, or NODESxGPUS")
    which.add_argument("--devices", dest="shape", type=arg_type(_one_shape), action=DeprecatedAlias, new="--shape",
                       help=argparse.SUPPRESS)
    which.add_argument("--nnodes", type=positive_int, default=None, metavar="M",
                       help="the configuration: M nodes of --nproc-per-node GPUs")
    which.add_argument("--deadline-hours", type=positive_float, default=None, metavar="H",
                       help="list every measured (and with --predicted, predicted) configuration, which finish "
                            "within H hours, and the cheapest of them")
    c.add_argument("--shapes", type=shapes_type(), default=None, metavar="LIST",
                   help="shapes predicted with --predicted --deadline-hours (default as in predict)")
    amount = c.add_mutually_exclusive_group(required=True)
    amount.add_argument("--tokens", type=positive_float, help="tokens to train on (language models)")
    amount.add_argument("--samples", type=positive_float, help="samples to train on")
    amount.add_argument("--epochs", type=positive_float, help="epochs over --dataset-size samples")
    c.add_argument("--dataset-size", type=positive_float, default=None, help="samples per epoch (with --epochs)")
    price = c.add_mutually_exclusive_group()
    price.add_argument("--price-per-gpu-hour", type=positive_float, default=None, metavar="USD",
                       help="price of one GPU for one hour")
    price.add_argument("--price-file", default=None, metavar="PATH|builtin",
                       help="YAML price list (entries: name, gpu pattern, usd_per_gpu_hour, source, as_of); "
                            f"builtin: the shipped {BUILTIN_PRICES.relative_to(BUILTIN_PRICES.parents[2])}")
    c.add_argument("--price", dest="price_name", default=None, metavar="NAME",
                   help="the entry of --price-file to use (default: the first whose gpu pattern matches the GPU)")
    c.add_argument("--predicted", action="store_true",
                   help="add the model's prediction: beside measured configurations, and as the throughput of "
                        "configurations nothing was measured at")
    c.add_argument("--checkpoint-interval-min", type=positive_float, default=None, metavar="MIN",
                   help="count a checkpoint every MIN minutes of training, each blocking as long as the record's "
                        "checkpoint phase measured (--checkpoint-every); the start-up is counted either way")
    c.set_defaults(func=cmd_cost)


def _amount(args, seq_len: int | None = None) -> Amount:
    return Amount(args.samples, args.tokens, seq_len, args.epochs, args.dataset_size)


def _qualifier(rec: dict[str, Any]) -> str:
    bits = []
    if rec_device_type(rec) == "cpu":
        bits.append("CPU records")
    flavor = str(rec_config(rec).get("flavor") or "full")
    if flavor != "full":
        bits.append(f"{flavor} flavour")
    return ", ".join(bits)


def _cost_of(o: CostOption, price, seq_len, args) -> dict[str, Any]:
    d = training_cost(o.samples_per_s, o.shape.devices, price.usd_per_gpu_hour,
                      _amount(args, int(seq_len) if (args.tokens is not None and seq_len) else None), o.power_w)
    d.update(o.to_dict())
    d["overheads"] = goodput.long_run(d["hours"], getattr(args, "records_by_id", {}).get(o.record) if o.kind == "run"
                                      else None, args.checkpoint_interval_min)
    if o.low and o.kind == "predicted":
        d["hours_range"] = [d["samples"] / o.high / 3600.0, d["samples"] / o.low / 3600.0]  # type: ignore[operator]
    if o.predicted_samples_per_s is not None and o.kind != "predicted":
        d["predicted_hours"] = d["samples"] / o.predicted_samples_per_s / 3600.0
    return d


def cmd_cost(args) -> int:
    if args.dataset_size is not None and args.epochs is None:
        raise ConfigError("--dataset-size goes with --epochs")
    if args.model is None:
        raise ConfigError("cost needs --model")
    if args.price_name is not None and args.price_file is None:
        raise ConfigError("--price NAME picks an entry of --price-file")
    if args.nnodes is not None and args.gpus_per_node_max is None:
        raise ConfigError("--nnodes M needs --nproc-per-node G (GPUs per node)")
    query, opts = query_from_args(args), options_from_args(args)
    loaded = load_records(args.store)
    shape = args.shape or (Shape(args.nnodes, args.gpus_per_node_max) if args.nnodes else None)
    shapes = args.shapes if args.deadline_hours is not None else ([shape] if shape else None)
    options, w, pred = plan_options(loaded.records, query, opts, args.strategy, shapes, args.predicted)
    options = energy.prefer_measured(options, loaded.records)  # the energy counter's power where a record read it
    args.records_by_id = {str(r.get("id")): r for r in loaded.records}  # for the start-up and checkpoint overheads
    ref = (w.baseline or w.rows[0]).record
    unit, seq_len, qual = workload_unit(w), workload_seq_len(w), _qualifier(ref)
    if unit == "tok":  # the throughput counts tokens already: --tokens is the amount as it is
        seq_len = 1
    if args.tokens is not None and not seq_len:
        raise ConfigError(f"model {args.model!r} has no sequence length in its records; give --samples or --epochs")
    price = pick_price(gpu_name(ref), args.price_per_gpu_hour, args.price_file, args.price_name)
    if args.deadline_hours is None:
        return _single(args, shape, options, price, seq_len, unit, qual)  # type: ignore[arg-type]
    return _deadline(args, options, price, seq_len, unit, qual)


def _single(args, shape: Shape, options: list[CostOption], price, seq_len, unit: str, qual: str) -> int:
    hit = [o for o in options if o.shape == shape] or [o for o in options if o.shape.devices == shape.devices
                                                       and shape.nodes == 1 and o.kind != "predicted"]
    if not hit:
        counts = sorted({o.shape.label for o in options if o.kind != "predicted"})
        raise ConfigError(f"no ok record of model {args.model!r} at {shape.label} matching the filters (measured "
                          f"shapes: {', '.join(counts) or 'none'}); add --predicted for a modelled throughput")
    o = hit[0]
    cost = _cost_of(o, price, seq_len, args)
    cost.update(model=args.model, unit=unit, price_source=price.source, qualifier=qual or None)
    if args.format == "json":
        print(json.dumps(cost, indent=2, sort_keys=True))
        return 0
    src = {"run": "measured", "imported": "imported", "predicted": "predicted"}[o.kind]
    rows = [["throughput", f"{o.samples_per_s:,.1f} {unit}/s ({src}, record {o.record[:8]}, {o.label})"]]
    if o.kind == "predicted" and o.low:
        rows.append(["band", f"{o.low:,.1f} .. {o.high:,.1f} {unit}/s -> {cost['hours_range'][0]:,.2f} .. "
                             f"{cost['hours_range'][1]:,.2f} h"])
    if o.predicted_samples_per_s is not None and o.kind != "predicted":
        rows.append(["predicted (beside)", f"{o.predicted_samples_per_s:,.1f} {unit}/s "
                                           f"({cost['predicted_hours']:,.2f} h); the measured figure is used"])
    rows += [["samples", f"{cost['samples']:,.0f} {unit}"
              + (f" (= {cost['tokens']:,.0f} tokens / {cost['seq_len']} per {unit})"
                 if cost["tokens"] and unit != "tok" else "")],
             ["GPUs", f"{o.shape.devices} ({o.shape.label})"],
             ["wall time", f"{cost['hours']:,.2f} h ({cost['hours'] / 24:,.2f} days)"],
             ["GPU-hours", f"{cost['gpu_hours']:,.1f} GPU-h"],
             ["price", f"${cost['price_per_gpu_hour']:,.2f} per GPU-hour ({price.source})"],
             ["cost", f"${cost['cost']:,.2f}"],
             [f"cost per million {unit}", f"${cost['cost_per_million_samples']:,.2f}"]]
    rows.append(["with start-up and checkpoints", goodput.long_run_line(cost["overheads"])])
    if cost["energy_j_per_sample"] is not None:
        rows += [["GPU power", f"{cost['power_w']:,.0f} W ({o.power_source})"],
                 [f"energy per {unit}", f"{cost['energy_j_per_sample']:,.3f} J"],
                 ["energy", f"{cost['energy_kwh']:,.2f} kWh (GPUs only)"]]
    else:
        rows.append(["energy", f"- ({o.power_source})"])
    print(f"# Training cost: {args.model} on {o.shape.label}" + (f" -- from {qual}" if qual else "") + "\n")
    print(md_table(["quantity", "value"], rows, align="---"))
    print("\nhours = samples / samples_per_s / 3600; GPU-hours = hours x GPUs; cost = GPU-hours x price "
          "(compute time only: no checkpointing, evaluation, restarts or idle time)")
    return 0


def _deadline(args, options: list[CostOption], price, seq_len, unit: str, qual: str) -> int:
    rows = [_cost_of(o, price, seq_len, args) for o in options]
    meet, best = cheapest_meeting_deadline(rows, args.deadline_hours)
    for r in rows:
        r["meets_deadline"] = r in meet
    fastest = min(rows, key=lambda r: r["hours"])
    out = {"model": args.model, "unit": unit, "deadline_hours": args.deadline_hours, "price_source": price.source,
           "price_per_gpu_hour": price.usd_per_gpu_hour, "options": rows, "qualifier": qual or None,
           "cheapest": best["config"] if best else None, "fastest": fastest["config"],
           "rule": "measured beats imported beats predicted: a shape with a record uses it; the prediction is "
                   "shown beside it and used only where nothing was measured"}
    if args.format == "json":
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"# Cheapest configuration within {args.deadline_hours:g} h: {args.model}"
          + (f" -- from {qual}" if qual else "") + "\n")
    print(f"price: ${price.usd_per_gpu_hour:,.2f} per GPU-hour ({price.source}); amount: "
          f"{rows[0]['samples']:,.0f} {unit}\n")
    body = []
    for r in rows:
        pred = ("-" if r.get("predicted_hours") is None else fmt(r["predicted_hours"], 2))
        hrs = fmt(r["hours"], 2) + (f" ({fmt(r['hours_range'][0], 2)}..{fmt(r['hours_range'][1], 2)})"
                                    if r.get("hours_range") else "")
        body.append([r["config"], str(r["devices"]), fmt(r["samples_per_s"], 1), hrs, pred, f"${r['cost']:,.2f}",
                     f"${r['cost_per_million_samples']:,.2f}", fmt(r["energy_j_per_sample"], 3),
                     fmt(r["energy_kwh"], 1), "yes" if r["meets_deadline"] else "no"])
    print(md_table(["configuration", "GPUs", f"{unit}/s", "hours (band)", "predicted hours", "cost",
                    f"$ per M {unit}", f"J/{unit}", "kWh", "meets deadline"], body, align="---"))
    print("\nA shape with a measured or imported record uses it; 'predicted hours' is the model beside it. "
          "Predicted configurations (only where nothing was measured) show their band.\n")
    if best:
        print(f"Cheapest within the deadline: {best['config']} -- {best['hours']:,.2f} h, ${best['cost']:,.2f}.")
    else:
        print(f"No configuration finishes within {args.deadline_hours:g} h; the fastest is {fastest['config']} "
              f"({fastest['hours']:,.2f} h, ${fastest['cost']:,.2f}).")
    return 0
