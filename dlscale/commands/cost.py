"""``dlscale cost``: time, money and energy of a training run, and the cheapest configuration
that meets a deadline, over stored or predicted throughput.

Inputs are picked as ``dlscale predict`` picks them (commands/predict.py); prices come from
``--price-per-gpu-hour`` or a price file (the shipped one: dlscale/data/prices.yaml); the
arithmetic is :func:`dlscale.perfmodel.training_cost` and ``cheapest_meeting_deadline``.
"""
from __future__ import annotations

import argparse
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.commands.predict import (add_workload_args, arg_type, build_prediction, filtered_runs, fmt,
                                      md_table, model_info, newest, only_one, positive_float, shape_of,
                                      single_shape, workloads_of)
from dlscale.perfmodel import Shape, cheapest_meeting_deadline, parse_shapes, training_cost
from dlscale.report.data import Row, load_records, median_repeat_entry, num

BUILTIN_PRICES = Path(__file__).resolve().parent.parent / "data" / "prices.yaml"


def register(sub) -> None:
    c = sub.add_parser(
        "cost", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="time, money and energy of a training run; the cheapest configuration meeting a deadline",
        description="hours = samples / samples_per_s / 3600 (samples = tokens / seq_len for language models, "
                    "or epochs x dataset size), GPU-hours = hours x N, cost = GPU-hours x price, cost per "
                    "million samples = 1e6 x N x price / (samples/s x 3600), energy per sample = summed mean GPU "
                    "power / samples/s. Throughput: the newest ok record of the workload, or the model's "
                    "prediction with --predicted.")
    add_workload_args(c, store_optional=False)
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--devices", type=single_shape, default=None, metavar="N|NODESxGPUS",
                       help="the configuration: N GPUs (any shape measured; one node when predicted) or a shape")
    which.add_argument("--deadline-hours", type=positive_float, default=None, metavar="H",
                       help="list every stored (and with --predicted, predicted) configuration, which finish "
                            "within H hours, and the cheapest of them")
    c.add_argument("--shapes", type=arg_type(parse_shapes), default=None, metavar="LIST",
                   help="shapes predicted with --predicted --deadline-hours (default as in predict)")
    c.add_argument("--strategy", default=None, help="only records of this strategy (default: any; the "
                                                    "prediction compares with ddp)")
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
                   help="use the model's predicted throughput instead of (with --deadline-hours: as well as) "
                        "measured records")
    c.set_defaults(func=cmd_cost)


@dataclass
class Price:
    usd_per_gpu_hour: float
    source: str
    entry: dict[str, Any] = field(default_factory=dict)


def load_prices(path: str) -> list[dict[str, Any]]:
    """Entries of a price file: each with name, gpu (a regular expression matched against the GPU
    name, case-insensitive), usd_per_gpu_hour > 0 and source. Bad file -> ConfigError."""
    import yaml

    p = BUILTIN_PRICES if path == "builtin" else Path(path)
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read price file {p}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot parse price file {p}: {str(e).splitlines()[0]}") from None
    entries = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"price file {p} has no 'prices' list")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not e.get("name") or not e.get("gpu") or not e.get("source"):
            raise ConfigError(f"price file {p}: entry {i + 1} needs name, gpu, usd_per_gpu_hour and source")
        v = e.get("usd_per_gpu_hour")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ConfigError(f"price file {p}: entry {e['name']!r} has usd_per_gpu_hour {v!r}; it must be positive")
        try:
            re.compile(str(e["gpu"]))
        except re.error as err:
            raise ConfigError(f"price file {p}: entry {e['name']!r} has a bad gpu pattern: {err}") from None
    return entries


def _gpu_name(rec: dict[str, Any]) -> str | None:
    for r in rec.get("ranks") or []:
        if isinstance(r, dict) and r.get("device_name"):
            return str(r["device_name"])
    env = rec.get("env")
    gpus = env.get("gpus") if isinstance(env, dict) else None
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    return None


def _price(args, gpu: str | None) -> Price:
    if args.price_per_gpu_hour is not None:
        return Price(args.price_per_gpu_hour, "--price-per-gpu-hour")
    if args.price_file is None:
        raise ConfigError("give --price-per-gpu-hour USD, or --price-file PATH (builtin: the shipped price list)")
    entries = load_prices(args.price_file)
    if args.price_name is not None:
        hit = [e for e in entries if str(e["name"]) == args.price_name]
        if not hit:
            raise ConfigError(f"no price named {args.price_name!r} in {args.price_file} (names: "
                              f"{', '.join(str(e['name']) for e in entries)})")
    else:
        hit = [e for e in entries if gpu and re.search(str(e["gpu"]), gpu, re.IGNORECASE)]
        if not hit:
            raise ConfigError(f"no price in {args.price_file} matches GPU {gpu or 'unknown'!r}: pick one with --price "
                              f"NAME or give --price-per-gpu-hour")
    e = hit[0]
    src = f"{e['name']}: {e['source']}" + (f", as of {e['as_of']}" if e.get("as_of") else "")
    return Price(float(e["usd_per_gpu_hour"]), src, e)


def record_power_w(row: Row) -> tuple[float | None, str]:
    """Summed mean GPU power (W) of a record's GPUs over its timed window, and how it was obtained.

    Per node: the mean power of each sampled GPU (``utilisation.per_gpu[].power_w_mean``); the
    sampler sees every GPU of a node, so of a node running g ranks the g highest are taken (idle
    GPUs of the node are not the job's). Nodes: ``utilisation_per_node`` of the median repeat when
    stored, else node 0 x number of nodes.
    """
    rep = median_repeat_entry(row.record)
    nodes = rep.get("utilisation_per_node") if isinstance(rep, dict) else None
    utils = [u for u in nodes if isinstance(u, dict)] if isinstance(nodes, list) else []
    how = "per node"
    if not utils:
        u = row.record.get("utilisation")
        if not isinstance(u, dict):
            return None, "no utilisation sampled"
        utils = [u] * row.nnodes
        how = "node 0" + (f" x {row.nnodes} nodes" if row.nnodes > 1 else "")
    g = row.nproc_per_node
    total = 0.0
    for u in utils:
        per = sorted((num(x.get("power_w_mean")) for x in u.get("per_gpu") or [] if isinstance(x, dict)),
                     key=lambda v: -(v or 0.0))
        per = [v for v in per if v is not None]
        if per:
            total += sum(per[:g])
        elif num(u.get("gpu_power_w_mean")) is not None:
            total += num(u.get("gpu_power_w_mean")) * g  # type: ignore[operator]
        else:
            return None, "no GPU power sampled"
    return (total, f"mean GPU power, {how}") if total > 0 else (None, "no GPU power sampled")


def _amount(args) -> dict[str, Any]:
    return {"samples": args.samples, "tokens": args.tokens, "epochs": args.epochs, "dataset_size": args.dataset_size}


def cmd_cost(args) -> int:
    if args.dataset_size is not None and args.epochs is None:
        raise ConfigError("--dataset-size goes with --epochs")
    if args.model is None:
        raise ConfigError("cost needs --model")
    if args.price_name is not None and args.price_file is None:
        raise ConfigError("--price NAME picks an entry of --price-file")
    loaded = load_records(args.store)
    runs = filtered_runs(loaded, args)
    workloads = workloads_of(runs)
    if args.deadline_hours is not None:
        return _cost_deadline(loaded, args, workloads)
    shape: Shape = args.devices
    n = shape.devices
    explicit_shape = shape.nodes > 1
    power, power_src = None, "no utilisation sampled"
    if args.predicted:
        pred = build_prediction(loaded, args, [shape])
        row = next(r for r in pred["rows"] if r["shape"] == shape.label)
        sps, unit = row["samples_per_s"], pred["unit"]
        base = next(r for rows in workloads.values() for r in rows
                    if str(r.record.get("id")) == pred["inputs"]["baseline_record"])
        source = f"predicted at {shape.label} (dlscale predict)"
        record = base.record
        p1, src1 = record_power_w(base)
        if p1 is not None:
            power, power_src = p1 * n, f"estimate: the 1-device record's {src1} x {n} GPUs"
    else:
        at_n = {k: [r for r in rows if r.ok and r.devices == n
                    and (args.strategy is None or r.strategy == args.strategy)
                    and (not explicit_shape or shape_of(r) == shape)] for k, rows in workloads.items()}
        have = [k for k, rows in at_n.items() if rows]
        if not have:
            counts = sorted({r.devices for rows in workloads.values() for r in rows if r.ok})
            raise ConfigError(f"no ok record of model {args.model!r} at {shape.label if explicit_shape else n} "
                              f"device(s) matching the filters (measured device counts: "
                              f"{', '.join(map(str, counts)) or 'none'}); use --predicted for a modelled throughput")
        chosen = newest(at_n[only_one(have, f"an ok record at {n} device(s)")])
        sps, unit = chosen.median, str(model_info(chosen).get("unit") or "sample")
        record = chosen.record
        source = (f"measured: median of {chosen.strategy} record {str(record.get('id'))[:8]} at "
                  f"{shape_of(chosen).label}")
        power, power_src = record_power_w(chosen)
    seq_len = num(model_info(Row(record)).get("seq_len"))
    if args.tokens is not None and not seq_len:
        raise ConfigError(f"model {args.model!r} has no sequence length in its record; give --samples or --epochs")
    price = _price(args, _gpu_name(record))
    cost = training_cost(sps, n, price.usd_per_gpu_hour,  # type: ignore[arg-type]
                         seq_len=int(seq_len) if (args.tokens is not None and seq_len) else None,
                         power_w=power, **_amount(args))
    cost.update(model=args.model, unit=unit, throughput_source=source, record=str(record.get("id")),
                predicted=args.predicted, price_source=price.source, power_source=power_src, shape=shape.label)
    if args.format == "json":
        print(json.dumps(cost, indent=2, sort_keys=True))
        return 0
    rows = [["throughput", f"{sps:,.1f} {unit}/s ({source})"],
            ["samples", f"{cost['samples']:,.0f} {unit}"
             + (f" (= {cost['tokens']:,.0f} tokens / {cost['seq_len']} per {unit})" if cost["tokens"] else "")],
            ["GPUs", str(n)],
            ["wall time", f"{cost['hours']:,.2f} h ({cost['hours'] / 24:,.2f} days)"],
            ["GPU-hours", f"{cost['gpu_hours']:,.1f} GPU-h"],
            ["price", f"${cost['price_per_gpu_hour']:,.2f} per GPU-hour ({price.source})"],
            ["cost", f"${cost['cost']:,.2f}"],
            [f"cost per million {unit}", f"${cost['cost_per_million_samples']:,.2f}"]]
    if cost["energy_j_per_sample"] is not None:
        rows += [["GPU power", f"{cost['power_w']:,.0f} W ({power_src})"],
                 [f"energy per {unit}", f"{cost['energy_j_per_sample']:,.3f} J"],
                 ["energy", f"{cost['energy_kwh']:,.2f} kWh (GPUs only)"]]
    else:
        rows.append(["energy", f"- ({power_src})"])
    print(f"# Training cost: {args.model} on {shape.label if explicit_shape else n} GPU(s)\n")
    print("| quantity | value |\n| --- | --- |")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\nhours = samples / samples_per_s / 3600; GPU-hours = hours x GPUs; cost = GPU-hours x price "
          "(compute time only: no checkpointing, evaluation, restarts or idle time)")
    return 0


def _cost_deadline(loaded, args, workloads: dict[str, list[Row]]) -> int:
    have = [k for k, rows in workloads.items() if any(r.ok for r in rows)]
    if not have:
        raise ConfigError(f"no ok record of model {args.model!r} matching the filters")
    key = only_one(have, "ok records")
    rows = workloads[key]
    options: list[dict[str, Any]] = []
    unit = "sample"
    seq_len = None
    ref = None
    for r in sorted((r for r in rows if r.ok and (args.strategy is None or r.strategy == args.strategy)),
                    key=lambda r: (r.devices, r.nnodes, r.strategy)):
        p, psrc = record_power_w(r)
        options.append({"config": f"{r.strategy} {shape_of(r).label}", "shape": shape_of(r).label,
                        "devices": r.devices, "samples_per_s": r.median, "predicted": False,
                        "record": str(r.record.get("id")), "power_w": p, "power_source": psrc})
        ref = ref or r.record
        unit = str(model_info(r).get("unit") or unit)
        seq_len = seq_len or num(model_info(r).get("seq_len"))
    if args.predicted:
        pred = build_prediction(loaded, args, args.shapes)
        base = next(r for rs in workloads.values() for r in rs
                    if str(r.record.get("id")) == pred["inputs"]["baseline_record"])
        p1, _ = record_power_w(base)
        for pr in pred["rows"]:
            if pr["devices"] == 1:
                continue
            options.append({"config": f"ddp {pr['shape']} (predicted)", "shape": pr["shape"],
                            "devices": pr["devices"], "samples_per_s": pr["samples_per_s"], "predicted": True,
                            "record": pred["inputs"]["baseline_record"],
                            "power_w": p1 * pr["devices"] if p1 is not None else None,
                            "power_source": "estimate: 1-device power x GPUs" if p1 is not None else "no utilisation"})
        ref = ref or base.record
        unit = pred["unit"]
        seq_len = seq_len or num(model_info(base).get("seq_len"))
    if not options:
        raise ConfigError(f"no ok record of model {args.model!r} with strategy {args.strategy!r}")
    if args.tokens is not None and not seq_len:
        raise ConfigError(f"model {args.model!r} has no sequence length in its records; give --samples or --epochs")
    price = _price(args, _gpu_name(ref) if ref else None)
    for o in options:
        o.update(training_cost(o["samples_per_s"], o["devices"], price.usd_per_gpu_hour,
                               seq_len=int(seq_len) if (args.tokens is not None and seq_len) else None,
                               power_w=o["power_w"], **_amount(args)))
    meet, best = cheapest_meeting_deadline(options, args.deadline_hours)
    for o in options:
        o["meets_deadline"] = o in meet
    fastest = min(options, key=lambda o: o["hours"])
    out = {"model": args.model, "unit": unit, "deadline_hours": args.deadline_hours, "price_source": price.source,
           "price_per_gpu_hour": price.usd_per_gpu_hour, "options": options,
           "cheapest": best["config"] if best else None, "fastest": fastest["config"]}
    if args.format == "json":
        print(json.dumps(out, indent=2, sort_keys=True))
        return 0
    print(f"# Cheapest configuration within {args.deadline_hours:g} h: {args.model}\n")
    print(f"price: ${price.usd_per_gpu_hour:,.2f} per GPU-hour ({price.source}); amount: "
          f"{options[0]['samples']:,.0f} {unit}\n")
    body = [[o["config"], str(o["devices"]), fmt(o["samples_per_s"], 1), fmt(o["hours"], 2), f"${o['cost']:,.2f}",
             f"${o['cost_per_million_samples']:,.2f}", fmt(o["energy_j_per_sample"], 3), fmt(o["energy_kwh"], 1),
             "yes" if o["meets_deadline"] else "no"] for o in options]
    print(md_table(["configuration", "GPUs", f"{unit}/s", "hours", "cost", f"$ per M {unit}", f"J/{unit}", "kWh",
                  "meets deadline"], body, align="---"))
    print()
    if best:
        print(f"Cheapest within the deadline: {best['config']} -- {best['hours']:,.2f} h, ${best['cost']:,.2f}.")
    else:
        print(f"No configuration finishes within {args.deadline_hours:g} h; the fastest is {fastest['config']} "
              f"({fastest['hours']:,.2f} h, ${fastest['cost']:,.2f}).")
    return 0

