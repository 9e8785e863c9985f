"""Data-parallel performance model and run cost (docs/metrics.md "Performance model" has every formula).

Per optimizer step on a cluster shape of M nodes x g GPUs (N = M x g devices)::

    t(N)       = t_data + t_fwd + t_bwd + t_upd + t_overhead + t_exposed(N)      (N > 1)
    t_ar(S)    = 2(g-1) a_intra + 2 S (g-1)/g / B_intra                          intra reduce-scatter + all-gather
               + 2(M-1) a_inter + 2 S (M-1)/M / B_inter                          inter-node ring, B_inter per node
    t_exposed  = end of the last bucket's all-reduce - t_bwd  (buckets pipelined behind backward)
    samples/s  = N x samples per device and step / t(N)

The compute terms come from a measured 1-device step; bandwidths are nccl-tests bus bandwidths
(``Link``); ``t_overhead`` is the one fitted number (``calibrate_overhead``: on the 2-device point
only). Everything here is pure: the ``predict`` and ``cost`` verbs (dlscale/commands/predict.py)
pick the inputs from a store.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from dlscale import ConfigError

GRAD_BYTES_PER_PARAM = 4  # fp32 gradients (DDP all-reduces the fp32 .grad even under AMP)
DDP_BUCKET_CAP_MB = 25.0  # DDP's bucket_cap_mb default (MiB: torch multiplies by 1024 x 1024)
MIB = 1024 * 1024
# Without a measured breakdown the 1-device step is split into forward and backward by FLOPs:
# backward computes the gradients of activations and of weights, ~2x the forward's FLOPs.
BACKWARD_SHARE = 2.0 / 3.0
OVERLAP_MODES = ("buckets", "none")


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def gradient_bytes(params: int | float, bytes_per_param: int | float = GRAD_BYTES_PER_PARAM) -> float:
    """Bytes all-reduced per step: parameters x bytes per gradient element (4: fp32)."""
    return _positive("params", params) * _positive("bytes per gradient element", bytes_per_param)


# ----------------------------------------------------------------------------- cluster shape and links

@dataclass(frozen=True)
class Shape:
    """M nodes x g GPUs per node, one data-parallel rank per GPU."""

    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        for name, v in (("nodes", self.nodes), ("GPUs per node", self.gpus_per_node)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}")

    @property
    def devices(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def label(self) -> str:
        return f"{self.nodes}x{self.gpus_per_node}"


def parse_shape(text: str) -> Shape:
    """``"8"`` -> 1 node x 8 GPUs; ``"4x8"`` -> 4 nodes x 8 GPUs per node."""
    s = str(text).strip().lower()
    parts = s.split("x")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"cluster shape must be N (GPUs on one node) or NODESxGPUS, e.g. 4x8; got {text!r}") from None
    if len(nums) == 1:
        nums = [1, nums[0]]
    if len(nums) != 2 or min(nums) < 1:
        raise ConfigError(f"cluster shape must be N (GPUs on one node) or NODESxGPUS with positive numbers, "
                          f"e.g. 4x8; got {text!r}")
    return Shape(nums[0], nums[1])


def parse_shapes(text: str) -> list[Shape]:
    """Comma list of shapes (``1x2,1x8,4x8,125x8``); duplicates dropped, order kept."""
    out: list[Shape] = []
    for part in str(text).split(","):
        if part.strip():
            sh = parse_shape(part)
            if sh not in out:
                out.append(sh)
    if not out:
        raise ConfigError("give at least one cluster shape, e.g. 1x2,1x8,4x8")
    return out


@dataclass(frozen=True)
class Link:
    """A link class for the alpha-beta model: bus bandwidth (nccl-tests busbw, B/s) and latency (s).

    ``busbw`` is the rate at which the ring formula holds: t = 2(n-1) latency + S x 2(n-1)/n / busbw.
    For the inter-node link it is per *node* (all GPUs of a node share the node's NICs).
    """

    busbw_bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("bus bandwidth", self.busbw_bps)
        _non_negative("latency", self.latency_s)


def ring_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """Flat ring all-reduce of ``nbytes`` over ``n`` ranks: 2(n-1) alpha + nbytes x 2(n-1)/n / busbw."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"rank count must be a positive integer, got {n!r}")
    nbytes = _non_negative("bytes", nbytes)
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + nbytes * 2.0 * (n - 1) / n / link.busbw_bps


def allreduce_phases_s(nbytes: float, shape: Shape, intra: Link | None, inter: Link | None) -> tuple[float, float]:
    """(intra-node, inter-node) seconds of one hierarchical all-reduce of ``nbytes`` on ``shape``.

    Intra: reduce-scatter then all-gather inside each node, each (g-1) a_intra + S (g-1)/g / B_intra.
    Inter: after the reduce-scatter each GPU holds S/g; g rings (one per local rank) all-reduce their
    shards across the M nodes over the shared NICs, so a node carries S x 2(M-1)/M at B_inter:
    2(M-1) a_inter + S x 2(M-1)/M / B_inter. One node: the flat ring; one GPU per node: the ring of nodes.
    """
    nbytes = _non_negative("bytes", nbytes)
    g, m = shape.gpus_per_node, shape.nodes
    t_intra = t_inter = 0.0
    if g > 1 and nbytes > 0:
        if intra is None:
            raise ConfigError(f"shape {shape.label} needs the intra-node link: give --intra-busbw GBPS")
        t_intra = 2 * (g - 1) * intra.latency_s + 2.0 * nbytes * (g - 1) / g / intra.busbw_bps
    if m > 1 and nbytes > 0:
        if inter is None:
            raise ConfigError(f"shape {shape.label} spans {m} nodes: give the inter-node bandwidth "
                              f"--inter-busbw GBPS (per node)")
        t_inter = 2 * (m - 1) * inter.latency_s + 2.0 * nbytes * (m - 1) / m / inter.busbw_bps
    return t_intra, t_inter


def allreduce_s(nbytes: float, shape: Shape, intra: Link | None, inter: Link | None = None) -> float:
    """Seconds of one all-reduce of ``nbytes`` on ``shape`` (sum of ``allreduce_phases_s``)."""
    return sum(allreduce_phases_s(nbytes, shape, intra, inter))


def allreduce_time_s(nbytes: float, n: int, busbw_bps: float) -> float:
    """Ring all-reduce on one node without latency: nbytes x 2(n-1)/n / busbw (kept for callers of v1)."""
    return ring_allreduce_s(nbytes, n, Link(_positive("busbw", busbw_bps)))


# ----------------------------------------------------------------------------- DDP buckets and overlap

def bucket_sizes(total_bytes: float, cap_bytes: float, param_bytes: Sequence[float] | None = None,
                 first_cap_bytes: float | None = None) -> list[float]:
    """Gradient buckets in the order they become ready in backward (last layers first).

    With ``param_bytes`` (each parameter's gradient bytes in the order backward produces them,
    i.e. the reverse of registration): DDP's rule (reducer.cpp ``compute_bucket_assignment_by_size``)
    -- add parameters to the open bucket and close it once it holds >= its cap; the first bucket's
    cap is ``first_cap_bytes`` (default: ``cap_bytes``). A parameter larger than the cap thus
    closes its bucket at once. Without ``param_bytes`` the gradients are a stream of bytes cut into
    full buckets (the last one holds the remainder).
    """
    total = _non_negative("gradient bytes", total_bytes)
    cap = _positive("bucket size", cap_bytes)
    first = _positive("first bucket size", first_cap_bytes) if first_cap_bytes is not None else cap
    if total == 0:
        return []
    out: list[float] = []
    if param_bytes is None:
        left = total
        limit = first
        while left > 1e-9 * total:
            take = min(limit, left)
            out.append(take)
            left -= take
            limit = cap
        return out
    size, limit = 0.0, first
    for b in param_bytes:
        size += _non_negative("parameter bytes", b)
        if size >= limit:
            out.append(size)
            size, limit = 0.0, cap
    if size > 0:
        out.append(size)
    return out


@dataclass
class Overlap:
    """Result of the overlap model: all-reduce time (sum over buckets) and the part not hidden."""

    allreduce_s: float
    exposed_s: float
    intra_s: float
    inter_s: float


def overlap_model(buckets: Sequence[float], backward_s: float, shape: Shape, intra: Link | None,
                  inter: Link | None, mode: str | float = "buckets") -> Overlap:
    """Exposed all-reduce time of one step.

    ``buckets`` (bytes, in ready order): bucket i is ready at t_bwd x (bytes up to and including i)
    / total -- gradients are assumed to be produced at a uniform byte rate over backward; its
    all-reduce starts when it is ready and the previous bucket's has finished (one stream).
    ``mode``: ``"buckets"`` exposed = max(0, end of last all-reduce - t_bwd); ``"none"`` all-reduce
    after backward (exposed = total); a number f in 0..1: exposed = (1 - f) x total.
    """
    if not isinstance(mode, str):
        if isinstance(mode, bool) or not isinstance(mode, (int, float)) or not 0.0 <= mode <= 1.0:
            raise ConfigError(f"overlap must be buckets, none or a fraction in 0..1, got {mode!r}")
    elif mode not in OVERLAP_MODES:
        raise ConfigError(f"overlap must be buckets, none or a fraction in 0..1, got {mode!r}")
    t_bwd = _non_negative("backward time", backward_s)
    total = float(sum(buckets))
    intra_sum = inter_sum = 0.0
    finish, done = 0.0, 0.0
    for b in buckets:
        ti, te = allreduce_phases_s(b, shape, intra, inter)
        intra_sum += ti
        inter_sum += te
        done += b
        ready = t_bwd * done / total if total > 0 else t_bwd
        finish = max(ready, finish) + ti + te
    ar = intra_sum + inter_sum
    if mode == "buckets":
        exposed = max(0.0, finish - t_bwd) if buckets else 0.0
    elif mode == "none":
        exposed = ar
    else:
        exposed = (1.0 - float(mode)) * ar
    return Overlap(ar, exposed, intra_sum, inter_sum)


# ----------------------------------------------------------------------------- compute terms and a step

@dataclass
class Compute:
    """The 1-device step split into its terms (seconds); ``split`` says where the split came from."""

    data_s: float
    forward_s: float
    backward_s: float
    update_s: float
    split: str

    @property
    def total_s(self) -> float:
        return self.data_s + self.forward_s + self.backward_s + self.update_s


def compute_terms(step_s: float, breakdown: Mapping[str, Any] | None = None) -> Compute:
    """Split the measured 1-device step time ``step_s`` into data, forward, backward and update.

    With a 1-device breakdown (dlscale/breakdown.py: data_ms, forward_ms, backward_ms, optimizer_ms)
    its four phases are scaled so that they sum to ``step_s`` (the breakdown is measured in separate
    steps with events between phases; the timed window's step time is the reference). Without one:
    data = update = 0 and backward = 2/3 of the step (FLOPs ratio), forward the rest.
    """
    t = _positive("1-device step time", step_s)
    if breakdown:
        keys = ("data_ms", "forward_ms", "backward_ms", "optimizer_ms")
        vals = [breakdown.get(k) for k in keys]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in vals) and sum(vals) > 0 and vals[2] > 0:
            k = t / sum(vals)
            return Compute(vals[0] * k, vals[1] * k, vals[2] * k, vals[3] * k,
                           "1-device breakdown, scaled to the step time")
    return Compute(0.0, t * (1 - BACKWARD_SHARE), t * BACKWARD_SHARE, 0.0,
                   "no 1-device breakdown: backward = 2/3 of the step (FLOPs ratio), data and update in it")


@dataclass
class StepModel:
    """Everything the model needs for one workload; ``predict`` gives one shape's terms."""

    compute: Compute
    samples_per_device_step: float  # per-device batch x gradient accumulation
    buckets: list[float]  # gradient bytes per bucket, in ready order
    intra: Link | None
    inter: Link | None = None
    overlap: str | float = "buckets"
    overhead_s: float = 0.0

    @property
    def grad_bytes(self) -> float:
        return float(sum(self.buckets))

    def step_s(self, shape: Shape, overhead_s: float | None = None) -> float:
        return self.predict(shape, overhead_s)["step_ms"] / 1000.0

    def predict(self, shape: Shape, overhead_s: float | None = None) -> dict[str, Any]:
        """One row: each term (ms), step time, throughput, speedup against 1 device, limiting term."""
        c = self.compute
        o = self.overhead_s if overhead_s is None else overhead_s
        if shape.devices == 1:
            ov = Overlap(0.0, 0.0, 0.0, 0.0)
            o = 0.0
        else:
            ov = overlap_model(self.buckets, c.backward_s, shape, self.intra, self.inter, self.overlap)
        t = c.total_s + o + ov.exposed_s
        if t <= 0:
            raise ConfigError(f"predicted step time at {shape.label} is not positive ({t * 1e3:.3f} ms): "
                              f"the calibrated overhead {o * 1e3:.3f} ms is more negative than the step")
        sps = shape.devices * self.samples_per_device_step / t
        sps_1 = self.samples_per_device_step / c.total_s
        speedup = sps / sps_1
        return {
            "shape": shape.label, "nodes": shape.nodes, "gpus_per_node": shape.gpus_per_node,
            "devices": shape.devices,
            "data_ms": c.data_s * 1e3, "forward_ms": c.forward_s * 1e3, "backward_ms": c.backward_s * 1e3,
            "update_ms": c.update_s * 1e3, "overhead_ms": o * 1e3,
            "allreduce_ms": ov.allreduce_s * 1e3, "allreduce_intra_ms": ov.intra_s * 1e3,
            "allreduce_inter_ms": ov.inter_s * 1e3, "exposed_ms": ov.exposed_s * 1e3,
            "buckets": len(self.buckets) if shape.devices > 1 else 0,
            "step_ms": t * 1e3, "samples_per_s": sps, "speedup": speedup, "ideal_speedup": float(shape.devices),
            "efficiency": speedup / shape.devices, "comm_share": ov.exposed_s / t,
            "limiting": limiting_term(o, ov, t),
        }


def limiting_term(overhead_s: float, ov: Overlap, step_s: float) -> str:
    """What separates t(N) from the 1-device step: the larger of the overhead and the exposed
    all-reduce (named by its larger phase); below 1 % of the step: compute (scaling is near-ideal)."""
    loss = max(overhead_s, ov.exposed_s)
    if loss < 0.01 * step_s:
        return "compute"
    if overhead_s > ov.exposed_s:
        return "overhead"
    return "inter-node all-reduce" if ov.inter_s > ov.intra_s else "intra-node all-reduce"


def step_time_from_throughput(samples_per_s: float, devices: int, samples_per_device_step: float) -> float:
    """Seconds per optimizer step of a measured throughput: N x samples per device and step / samples/s."""
    return devices * _positive("samples per step", samples_per_device_step) / _positive("samples/s", samples_per_s)


def calibrate_overhead(model: StepModel, shape: Shape, measured_samples_per_s: float) -> float:
    """The fixed per-step overhead o (seconds) that makes the model meet one measured point:
    o = t_measured - model(o = 0). Used on the 2-device point only; may be negative (the model's
    communication is then longer than what the 2-device run shows)."""
    if shape.devices < 2:
        raise ConfigError("the overhead is calibrated on a point with more than one device")
    t_meas = step_time_from_throughput(measured_samples_per_s, shape.devices, model.samples_per_device_step)
    return t_meas - model.step_s(shape, overhead_s=0.0)


def error_pct(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured x 100."""
    return (predicted - measured) / _positive("measured value", measured) * 100.0


# ----------------------------------------------------------------------------- published figures

def validate_published(fixture: Mapping[str, Any], intra_busbw_gbps: float | None = None) -> list[dict[str, Any]]:
    """Predict every point of a published-figures fixture (tests/fixtures/published_*.yaml).

    Per series: t_1 from the 1-GPU throughput; o calibrated on the 1x2 point; every other point
    predicted with nothing else fitted. Rows: series, shape, devices, role (baseline | calibration
    | predicted), published and predicted samples/s, error %, overhead (ms), the step's terms.
    ``intra_busbw_gbps`` overrides the fixture's intra-node figure (sensitivity checks).
    """
    links = fixture.get("links") or {}

    def link(name: str, override: float | None = None) -> Link | None:
        d = links.get(name)
        if not d:
            return None
        return Link(float(override if override is not None else d["busbw_gbps"]) * 1e9,
                    float(d.get("latency_us") or 0.0) * 1e-6)

    intra, inter = link("intra", intra_busbw_gbps), link("inter")
    params = _positive("params", fixture.get("params"))
    cap = _positive("bucket_mb", fixture.get("bucket_mb", DDP_BUCKET_CAP_MB)) * MIB
    overlap = fixture.get("overlap", "buckets")
    rows = []
    for series in fixture.get("series") or []:
        pts = {Shape(int(p[0]), int(p[1])): float(p[2]) for p in series["points"]}
        if Shape(1, 1) not in pts:
            raise ConfigError(f"series {series.get('name')!r} has no 1-GPU point")
        batch = _positive("batch_size", series.get("batch_size"))
        g = gradient_bytes(params, series.get("grad_bytes_per_param", GRAD_BYTES_PER_PARAM))
        model = StepModel(compute_terms(batch / pts[Shape(1, 1)]), batch, bucket_sizes(g, cap), intra, inter, overlap)
        two = Shape(1, 2)
        if two in pts:
            model.overhead_s = calibrate_overhead(model, two, pts[two])
        for sh in sorted(pts, key=lambda s: (s.devices, s.nodes)):
            row = model.predict(sh)
            role = "baseline" if sh.devices == 1 else "calibration" if sh == two else "predicted"
            row.update(series=str(series.get("name")), role=role, published=pts[sh],
                       error_pct=error_pct(row["samples_per_s"], pts[sh]))
            rows.append(row)
    return rows


# ----------------------------------------------------------------------------- cost

def training_cost(samples_per_s: float, devices: int, price_per_gpu_hour: float, *,
                  samples: float | None = None, tokens: float | None = None, seq_len: int | None = None,
                  epochs: float | None = None, dataset_size: float | None = None,
                  power_w: float | None = None) -> dict[str, Any]:
    """Wall time, GPU-hours, money (and energy when ``power_w``, the GPUs' summed mean power, is given).

    Exactly one amount: ``samples``; ``tokens`` (samples = tokens / ``seq_len``); or ``epochs``
    with ``dataset_size``. hours = samples / samples_per_s / 3600, gpu_hours = hours x devices,
    cost = gpu_hours x price, cost per million samples = 1e6 x devices x price / (samples_per_s x 3600),
    energy per sample (J) = power_w / samples_per_s, energy (kWh) = power_w x hours / 1000.
    """
    sps = _positive("samples/s", samples_per_s)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"device count must be a positive integer, got {devices!r}")
    price = _positive("price per GPU-hour", price_per_gpu_hour)
    given = [k for k, v in (("samples", samples), ("tokens", tokens), ("epochs", epochs)) if v is not None]
    if len(given) != 1:
        raise ConfigError("give exactly one of --samples, --tokens, --epochs (with --dataset-size)"
                          + (f"; got {', '.join('--' + k for k in given)}" if given else ""))
    if tokens is not None:
        tokens = _positive("tokens", tokens)
        if not seq_len:
            raise ConfigError("--tokens needs a language model with a sequence length; give --samples instead")
        n_samples = tokens / _positive("sequence length", seq_len)
    elif epochs is not None:
        if dataset_size is None:
            raise ConfigError("--epochs needs --dataset-size (samples per epoch)")
        n_samples = _positive("epochs", epochs) * _positive("dataset size", dataset_size)
    else:
        n_samples = _positive("samples", samples)
    hours = n_samples / sps / 3600.0
    gpu_hours = hours * devices
    out = {"samples": n_samples, "tokens": tokens, "seq_len": seq_len, "samples_per_s": sps,
           "devices": devices, "hours": hours, "gpu_hours": gpu_hours,
           "price_per_gpu_hour": price, "cost": gpu_hours * price,
           "cost_per_million_samples": 1e6 * devices * price / (sps * 3600.0),
           "power_w": None, "energy_j_per_sample": None, "energy_kwh": None}
    if power_w is not None:
        pw = _positive("power", power_w)
        out.update(power_w=pw, energy_j_per_sample=pw / sps, energy_kwh=pw * hours / 1000.0)
    return out


def cheapest_meeting_deadline(options: Iterable[Mapping[str, Any]], deadline_hours: float
                              ) -> tuple[list[Mapping[str, Any]], Mapping[str, Any] | None]:
    """(options whose ``hours`` <= the deadline, the cheapest of them by ``cost`` -- fewer GPUs, then
    shorter time on ties -- or None)."""
    dl = _positive("deadline hours", deadline_hours)
    meet = [o for o in options if o["hours"] <= dl]
    best = min(meet, key=lambda o: (o["cost"], o["devices"], o["hours"])) if meet else None
    return meet, best

