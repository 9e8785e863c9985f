"""Time, money and energy of a training run, and the cheapest configuration that meets a deadline.

Throughput per configuration: measured beats imported beats predicted. Where a measured (or imported)
record exists for a shape it is used and the prediction is shown only beside it; a shape without one
is predicted (with its band) when asked for.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from dlscale import ConfigError
from dlscale.perfmodel.core import Shape, positive
from dlscale.perfmodel.inputs import (
    ModelOptions, Query, Workload, build_model, group_workloads, model_info, only_one, shape_of,
    usable,
)
from dlscale.perfmodel.predict import Prediction, predict_workload
from dlscale.report.data import Row, median_repeat_entry, num, rec_created

BUILTIN_PRICES = Path(__file__).resolve().parent.parent / "data" / "prices.yaml"
KIND_RANK = {"run": 0, "imported": 1}  # measured beats imported


@dataclass(frozen=True)
class Amount:
    """How much training a cost is for: exactly one of ``samples``; ``tokens`` (samples = tokens / ``seq_len``);
    or ``epochs`` of ``dataset_size`` samples."""

    samples: float | None = None
    tokens: float | None = None
    seq_len: int | None = None
    epochs: float | None = None
    dataset_size: float | None = None

    def n_samples(self) -> float:
        """The samples it amounts to; ConfigError (one line) for none or several amounts, or a missing part."""
        given = [k for k, v in (("samples", self.samples), ("tokens", self.tokens), ("epochs", self.epochs))
                 if v is not None]
        if len(given) != 1:
            raise ConfigError("give exactly one of --samples, --tokens, --epochs (with --dataset-size)"
                              + (f"; got {', '.join('--' + k for k in given)}" if given else ""))
        if self.tokens is not None:
            tokens = positive("tokens", self.tokens)
            if not self.seq_len:
                raise ConfigError("--tokens needs a language model with a sequence length; give --samples instead")
            return tokens / positive("sequence length", self.seq_len)
        if self.epochs is not None:
            if self.dataset_size is None:
                raise ConfigError("--epochs needs --dataset-size (samples per epoch)")
            return positive("epochs", self.epochs) * positive("dataset size", self.dataset_size)
        return positive("samples", self.samples)


def training_cost(samples_per_s: float, devices: int, price_per_gpu_hour: float, amount: Amount,
                  power_w: float | None = None) -> dict[str, Any]:
    """Wall time, GPU-hours, money (and energy when ``power_w``, the GPUs' summed mean power, is given) of
    ``amount`` of training.

    hours = samples / samples_per_s / 3600, gpu_hours = hours x devices, cost = gpu_hours x price, cost per
    million samples = 1e6 x devices x price / (samples_per_s x 3600), energy per sample (J) = power_w /
    samples_per_s, energy (kWh) = power_w x hours / 1000.
    """
    sps = positive("samples/s", samples_per_s)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"device count must be a positive integer, got {devices!r}")
    price = positive("price per GPU-hour", price_per_gpu_hour)
    n_samples = amount.n_samples()
    tokens, seq_len = (None if amount.tokens is None else float(amount.tokens)), amount.seq_len
    hours = n_samples / sps / 3600.0
    gpu_hours = hours * devices
    out = {"samples": n_samples, "tokens": tokens, "seq_len": seq_len, "samples_per_s": sps,
           "devices": devices, "hours": hours, "gpu_hours": gpu_hours,
           "price_per_gpu_hour": price, "cost": gpu_hours * price,
           "cost_per_million_samples": 1e6 * devices * price / (sps * 3600.0),
           "power_w": None, "energy_j_per_sample": None, "energy_kwh": None}
    if power_w is not None:
        pw = positive("power", power_w)
        out.update(power_w=pw, energy_j_per_sample=pw / sps, energy_kwh=pw * hours / 1000.0)
    return out


def cheapest_meeting_deadline(options: Iterable[Mapping[str, Any]], deadline_hours: float
                              ) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """(options whose ``hours`` <= the deadline, the cheapest of them by ``cost`` -- fewer GPUs, then
    shorter time on ties -- or None)."""
    dl = positive("deadline hours", deadline_hours)
    meet = [o for o in options if o["hours"] <= dl]
    best = min(meet, key=lambda o: (o["cost"], o["devices"], o["hours"])) if meet else None
    return meet, best


# ----------------------------------------------------------------------------- prices

@dataclass
class Price:
    usd_per_gpu_hour: float
    source: str
    entry: dict[str, Any] = field(default_factory=dict)


def load_prices(path: str) -> list[dict[str, Any]]:
    """Entries of a price file: each with name, gpu (a regular expression matched against the GPU name,
    case-insensitive), usd_per_gpu_hour > 0 and source. Bad file -> ConfigError."""
    import yaml  # yaml: keeps the CLI start-up light

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


def pick_price(gpu: str | None, per_gpu_hour: float | None = None, price_file: str | None = None,
               name: str | None = None) -> Price:
    if per_gpu_hour is not None:
        return Price(per_gpu_hour, "--price-per-gpu-hour")
    if price_file is None:
        raise ConfigError("give --price-per-gpu-hour USD, or --price-file PATH (builtin: the shipped price list)")
    entries = load_prices(price_file)
    if name is not None:
        hit = [e for e in entries if str(e["name"]) == name]
        if not hit:
            raise ConfigError(f"no price named {name!r} in {price_file} (names: "
                              f"{', '.join(str(e['name']) for e in entries)})")
    else:
        hit = [e for e in entries if gpu and re.search(str(e["gpu"]), gpu, re.IGNORECASE)]
        if not hit:
            raise ConfigError(f"no price in {price_file} matches GPU {gpu or 'unknown'!r}: pick one with --price "
                              f"NAME or give --price-per-gpu-hour")
    e = hit[0]
    src = f"{e['name']}: {e['source']}" + (f", as of {e['as_of']}" if e.get("as_of") else "")
    return Price(float(e["usd_per_gpu_hour"]), src, e)


def gpu_name(rec: dict[str, Any]) -> str | None:
    for r in rec.get("ranks") or []:
        if isinstance(r, dict) and r.get("device_name"):
            return str(r["device_name"])
    env = rec.get("env")
    gpus = env.get("gpus") if isinstance(env, dict) else None
    if isinstance(gpus, list) and gpus and isinstance(gpus[0], dict) and gpus[0].get("name"):
        return str(gpus[0]["name"])
    summ = rec.get("summary")
    return str(summ["device_name"]) if isinstance(summ, dict) and summ.get("device_name") else None


def record_power_w(row: Row) -> tuple[float | None, str]:
    """Summed mean GPU power (W) of a record's GPUs over its timed window, and how it was obtained.

    Per node: the mean power of each sampled GPU (``utilisation.per_gpu[].power_w_mean``); of a node
    running g ranks the g highest are taken (idle GPUs of the node are not the job's). Nodes:
    ``utilisation_per_node`` of the median repeat when stored, else node 0 x number of nodes.
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


# ----------------------------------------------------------------------------- configurations

@dataclass
class CostOption:
    """One configuration's throughput: measured (run), imported, or predicted (with its band)."""

    shape: Shape
    strategy: str
    samples_per_s: float
    kind: str  # run | imported | predicted
    record: str
    power_w: float | None
    power_source: str
    predicted_samples_per_s: float | None = None  # the model's figure beside a measured one
    low: float | None = None
    high: float | None = None

    @property
    def label(self) -> str:
        tag = {"run": "", "imported": " (imported)", "predicted": " (predicted)"}[self.kind]
        return f"{self.strategy} {self.shape.label}{tag}"

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.label, "shape": self.shape.label, "devices": self.shape.devices,
                "strategy": self.strategy, "samples_per_s": self.samples_per_s, "kind": self.kind,
                "predicted": self.kind == "predicted", "record": self.record, "power_w": self.power_w,
                "power_source": self.power_source, "predicted_samples_per_s": self.predicted_samples_per_s,
                "samples_per_s_low": self.low, "samples_per_s_high": self.high}


def pick_workload_any(records: list[dict[str, Any]], query: Query) -> Workload:
    """The one workload with ok records matching ``query`` (cost does not need a 1-device record)."""
    recs = usable(records, query)
    workloads = group_workloads(recs)
    have = [k for k, w in workloads.items() if any(r.ok for r in w.rows)]
    if not have:
        raise ConfigError(f"no ok record of model {query.model!r} matching the filters")
    return workloads[only_one(have, "ok records")]


def measured_options(w: Workload, strategy: str | None) -> dict[Shape, CostOption]:
    """Per shape the best record: measured before imported, then newest (any strategy unless given)."""
    best: dict[Shape, Row] = {}
    for r in w.rows:
        if not r.ok or (strategy is not None and r.strategy != strategy):
            continue
        sh = shape_of(r)
        rank = (KIND_RANK.get(str(r.record.get("kind")), 9), -rec_created(r.record))
        cur = best.get(sh)
        if cur is None or rank < (KIND_RANK.get(str(cur.record.get("kind")), 9), -rec_created(cur.record)):
            best[sh] = r
    out = {}
    for sh, r in best.items():
        p, src = record_power_w(r)
        out[sh] = CostOption(sh, r.strategy, float(r.median), str(r.record.get("kind")),  # type: ignore[arg-type]
                             str(r.record.get("id")), p, src)
    return out


def plan_options(records: list[dict[str, Any]], query: Query, opts: ModelOptions, strategy: str | None,
                 shapes: list[Shape] | None, predicted: bool) -> tuple[list[CostOption], Workload,
                                                                       Prediction | None]:
    """Every configuration of the workload: measured/imported per shape, and (``predicted``) the model's
    prediction for the asked shapes -- beside a measured figure where one exists, as its own option
    only where none does."""
    w = pick_workload_any(records, query)
    opts_by_shape = measured_options(w, strategy)
    pred = None
    if predicted:
        pred = predict_workload(records, query, opts, shapes)
        p1 = None
        if pred.built is not None:  # per device: the base is a node's record where t_1 was inferred from it
            p1, _ = record_power_w(pred.built.base)
            p1 = p1 / pred.built.base.devices if p1 is not None else None
        for sh, o in opts_by_shape.items():
            if sh.devices > 1 and pred.built is not None:  # what the model says there without that record
                held = held_out_prediction(records, pred, opts, sh)
                if held is not None:
                    o.predicted_samples_per_s, o.low, o.high = held.samples_per_s, held.low, held.high
        for r in pred.rows:
            sp = r.prediction
            if sp.shape not in opts_by_shape and sp.shape.devices > 1 and (shapes is None or sp.shape in shapes):
                opts_by_shape[sp.shape] = CostOption(
                    sp.shape, opts.strategy, sp.samples_per_s, "predicted", pred.inputs["baseline_record"],
                    p1 * sp.shape.devices if p1 is not None else None,
                    "estimate: 1-device power x GPUs" if p1 is not None else "no utilisation", sp.samples_per_s,
                    sp.low, sp.high)
    options = sorted(opts_by_shape.values(), key=lambda o: (o.shape.devices, o.shape.nodes, KIND_RANK.get(o.kind, 2)))
    if not options:
        raise ConfigError(f"no ok record of model {query.model!r}"
                          + (f" with strategy {strategy!r}" if strategy else ""))
    return options, w, pred


def held_out_prediction(records: list[dict[str, Any]], pred: Prediction, opts: ModelOptions, shape: Shape):
    """The model's figure for ``shape`` fitted on every measured point but that shape's own record (None when
    the model cannot describe the shape, e.g. no inter-node link)."""
    built = pred.built
    measured = built.workload.measured(opts.strategy)  # type: ignore[union-attr]
    try:
        m = build_model(built.workload, records, opts, calibrate_on=[s for s in measured if s != shape],  # type: ignore[union-attr]
                        exclude=measured.get(shape)).model
        return m.predict(shape)
    except ConfigError:
        return None


def workload_seq_len(w: Workload) -> float | None:
    for r in w.rows:
        s = num(model_info(r.record).get("seq_len"))
        if s:
            return s
    return None


def workload_unit(w: Workload) -> str:
    for r in w.rows:
        u = model_info(r.record).get("unit")
        if u:
            return str(u)
    return "sample"
