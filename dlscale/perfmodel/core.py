"""The physical terms of a data-parallel step: cluster shapes, links, the all-reduce, buckets, overlap
and the compute split of a measured 1-device step (docs/metrics.md "Performance model")."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from dlscale import ConfigError

GRAD_BYTES_PER_PARAM = 4  # fp32 gradients (DDP all-reduces the fp32 .grad even under AMP)
DDP_BUCKET_CAP_MB = 25.0  # DDP's bucket_cap_mb default (MiB: torch multiplies by 1024 x 1024)
MIB = 1024 * 1024
# Without a measured breakdown the 1-device step is split into forward and backward by FLOPs:
# backward computes the gradients of activations and of weights, ~2x the forward's FLOPs.
BACKWARD_SHARE = 2.0 / 3.0
INTER_ALGORITHMS = ("auto", "ring", "tree")


def positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def non_negative(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def gradient_bytes(params: int | float, bytes_per_param: int | float = GRAD_BYTES_PER_PARAM) -> float:
    """Bytes all-reduced per step: parameters x bytes per gradient element (4: fp32)."""
    return positive("params", params) * positive("bytes per gradient element", bytes_per_param)


def error_pct(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured x 100."""
    return (predicted - measured) / positive("measured value", measured) * 100.0


# ----------------------------------------------------------------------------- cluster shape

@dataclass(frozen=True, order=True)
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


ONE = Shape(1, 1)


def parse_shape(text: str) -> Shape:
    """``"8"`` -> 1 node x 8 GPUs; ``"4x8"`` -> 4 nodes x 8 GPUs per node."""
    parts = str(text).strip().lower().split("x")
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


# ----------------------------------------------------------------------------- links and the all-reduce

@dataclass(frozen=True)
class Link:
    """A link class for the alpha-beta model: bus bandwidth (nccl-tests busbw, B/s) and latency per step (s).

    For the inter-node link ``busbw`` is per *node*: all GPUs of a node share the node's NICs.
    """

    busbw_bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        positive("bus bandwidth", self.busbw_bps)
        non_negative("latency", self.latency_s)


@dataclass
class Links:
    """The intra-node link by number of GPUs it spans (0: any count) and the inter-node link, with where
    each figure came from. ``inter_algorithm``: ring, tree, or auto (the faster, as NCCL picks)."""

    intra: dict[int, Link] = field(default_factory=dict)
    inter: Link | None = None
    sources: dict[str, str] = field(default_factory=dict)
    inter_algorithm: str = "auto"

    def __post_init__(self) -> None:
        if self.inter_algorithm not in INTER_ALGORITHMS:
            raise ConfigError(f"inter-node algorithm must be one of {', '.join(INTER_ALGORITHMS)}, "
                              f"got {self.inter_algorithm!r}")

    def key(self) -> tuple:
        """A hashable stand-in for these links (what a cache of results priced on them is keyed by); the
        sources are descriptions and left out."""
        return tuple(sorted(self.intra.items())), self.inter, self.inter_algorithm

    def intra_for(self, gpus: int) -> Link | None:
        """The intra-node figure for ``gpus`` GPUs: stated for that count, else the smallest stated count
        above it, else the largest stated (a ring's busbw changes little with its length)."""
        if not self.intra:
            return None
        if gpus in self.intra:
            return self.intra[gpus]
        counts = sorted(k for k in self.intra if k > 0)
        above = [k for k in counts if k >= gpus]
        if above:
            return self.intra[above[0]]
        return self.intra[0] if 0 in self.intra else self.intra[counts[-1]]


def ring_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """Flat ring all-reduce of ``nbytes`` over ``n`` ranks: 2(n-1) alpha + nbytes x 2(n-1)/n / busbw."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"rank count must be a positive integer, got {n!r}")
    nbytes = non_negative("bytes", nbytes)
    if n == 1 or nbytes == 0:
        return 0.0
    return 2 * (n - 1) * link.latency_s + nbytes * 2.0 * (n - 1) / n / link.busbw_bps


def tree_allreduce_s(nbytes: float, n: int, link: Link) -> float:
    """NCCL's double binary tree across ``n`` nodes: 2 ceil(log2 n) alpha + nbytes / busbw (each node sends
    and receives the gradient once per direction, whatever n)."""
    nbytes = non_negative("bytes", nbytes)
    if n <= 1 or nbytes == 0:
        return 0.0
    return 2 * math.ceil(math.log2(n)) * link.latency_s + nbytes / link.busbw_bps


def allreduce_phases_s(nbytes: float, shape: Shape, links: Links) -> tuple[float, float]:
    """(intra-node, inter-node) seconds of one hierarchical all-reduce of ``nbytes`` on ``shape``.

    Intra: reduce-scatter then all-gather inside each node, each (g-1) a + S (g-1)/g / B_intra(g).
    Inter: the nodes all-reduce the gradient over their NICs: a ring (2(M-1) a + 2S(M-1)/M / B_inter) or
    NCCL's tree (2 ceil(log2 M) a + S / B_inter); ``auto`` takes the faster, as NCCL's tuner does.
    """
    nbytes = non_negative("bytes", nbytes)
    g, m = shape.gpus_per_node, shape.nodes
    t_intra = t_inter = 0.0
    if g > 1 and nbytes > 0:
        intra = links.intra_for(g)
        if intra is None:
            raise ConfigError(f"shape {shape.label} needs the intra-node link: give --intra-busbw GBPS")
        t_intra = ring_allreduce_s(nbytes, g, intra)  # reduce-scatter + all-gather: a ring's volume
    if m > 1 and nbytes > 0:
        if links.inter is None:
            raise ConfigError(f"shape {shape.label} spans {m} nodes: give the inter-node bandwidth "
                              f"--inter-busbw GBPS (per node)")
        t_inter = inter_allreduce_s(nbytes, m, links)
    return t_intra, t_inter


def inter_allreduce_s(nbytes: float, m: int, links: Links) -> float:
    """The nodes' all-reduce of ``nbytes`` over the inter-node link, by ``links.inter_algorithm`` (ring,
    tree, or auto: the faster, as NCCL's tuner picks)."""
    ring = ring_allreduce_s(nbytes, m, links.inter)
    tree = tree_allreduce_s(nbytes, m, links.inter)
    return {"ring": ring, "tree": tree, "auto": min(ring, tree)}[links.inter_algorithm]


def allreduce_s(nbytes: float, shape: Shape, links: Links) -> float:
    """Seconds of one all-reduce of ``nbytes`` on ``shape`` (sum of ``allreduce_phases_s``)."""
    return sum(allreduce_phases_s(nbytes, shape, links))


# ----------------------------------------------------------------------------- buckets and overlap

def bucket_sizes(total_bytes: float, cap_bytes: float, param_bytes: Sequence[float] | None = None,
                 first_cap_bytes: float | None = None) -> list[float]:
    """Gradient buckets in the order they become ready in backward (last layers first).

    With ``param_bytes`` (each parameter's gradient bytes in the order backward produces them): DDP's rule
    (reducer.cpp ``compute_bucket_assignment_by_size``) -- add parameters to the open bucket and close it
    once it holds >= its cap; the first bucket's cap is ``first_cap_bytes`` (default: ``cap_bytes``).
    Without ``param_bytes`` the gradients are a stream of bytes cut into full buckets.
    """
    total = non_negative("gradient bytes", total_bytes)
    cap = positive("bucket size", cap_bytes)
    first = positive("first bucket size", first_cap_bytes) if first_cap_bytes is not None else cap
    if total == 0:
        return []
    out: list[float] = []
    if param_bytes is None:
        left, limit = total, first
        while left > 1e-9 * total:
            take = min(limit, left)
            out.append(take)
            left -= take
            limit = cap
        return out
    size, limit = 0.0, first
    for b in param_bytes:
        size += non_negative("parameter bytes", b)
        if size >= limit:
            out.append(size)
            size, limit = 0.0, cap
    if size > 0:
        out.append(size)
    return out


def check_overlap(mode: Any) -> str | float:
    """``none`` (all-reduce after backward), ``buckets`` (pipelined behind backward) or a hidden share 0..1."""
    if isinstance(mode, str) and mode in ("none", "buckets"):
        return mode
    if isinstance(mode, bool) or not isinstance(mode, (int, float)) or not 0.0 <= mode <= 1.0:
        raise ConfigError(f"overlap must be none, buckets or a fraction in 0..1, got {mode!r}")
    return float(mode)


@dataclass
class Overlap:
    """All-reduce time of one step (sum over buckets, by phase) and the part not hidden behind backward."""

    allreduce_s: float
    exposed_s: float
    intra_s: float
    inter_s: float


NO_COMM = Overlap(0.0, 0.0, 0.0, 0.0)


def overlap_model(buckets: Sequence[float], backward_s: float, shape: Shape, links: Links,
                  mode: str | float = "none") -> Overlap:
    """Exposed all-reduce time of one step on ``shape``.

    ``none``: exposed = the whole all-reduce. ``buckets``: bucket i is ready at t_bwd x (bytes up to i) /
    total (uniform byte rate over backward) and starts when ready and the previous one is done (one
    stream); exposed = max(0, end of the last - t_bwd). A number f: exposed = (1 - f) x all-reduce.
    """
    mode = check_overlap(mode)
    if shape.devices == 1:
        return NO_COMM
    t_bwd = non_negative("backward time", backward_s)
    total = float(sum(buckets))
    intra_sum = inter_sum = finish = done = 0.0
    for b in buckets:
        ti, te = allreduce_phases_s(b, shape, links)
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


# ----------------------------------------------------------------------------- compute terms

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

    With a 1-device breakdown (data_ms, forward_ms, backward_ms, optimizer_ms) its phases are scaled to sum
    to ``step_s``. Without one: data = update = 0, backward = 2/3 of the step (FLOPs ratio).
    """
    t = positive("1-device step time", step_s)
    if breakdown:
        vals = [breakdown.get(k) for k in ("data_ms", "forward_ms", "backward_ms", "optimizer_ms")]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in vals) and sum(vals) > 0 and vals[2] > 0:
            k = t / sum(vals)
            return Compute(vals[0] * k, vals[1] * k, vals[2] * k, vals[3] * k,
                           "1-device breakdown, scaled to the step time")
    return Compute(0.0, t * (1 - BACKWARD_SHARE), t * BACKWARD_SHARE, 0.0,
                   "no 1-device breakdown: backward = 2/3 of the step (FLOPs ratio), data and update in it")


def step_time_from_throughput(samples_per_s: float, devices: int, samples_per_device_step: float) -> float:
    """Seconds per optimizer step of a measured throughput: N x samples per device and step / samples/s."""
    return devices * positive("samples per step", samples_per_device_step) / positive("samples/s", samples_per_s)
