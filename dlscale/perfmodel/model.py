"""One workload's step model: the 1-device step, its gradients and links, the overhead law and the
measured multi-device points it is calibrated on; ``predict(shape)`` gives one shape's terms with a band.

    t(M x g) = t_1 + exposed all-reduce(M x g) + o_node(g) + o_net(M, g)
    t_node(g) = t_1 + exposed all-reduce(1 x g) + o_node(g)

A host input floor bounds the step from below where the 1-device record read real data through CPU loaders:
the g ranks of a node need g x b x (loader core-seconds per sample) of CPU a step, spread over the cores
the ranks leave (one each for its own loop), t >= g b c_s / (cores - g).

o_node(g): measured where the workload has a 1 x g point (t_meas - t_1 - exposed), else the law's growth
with g scaled to the overhead of the nearest measured node size, else the law. o_net: the law's network terms, scaled to
the workload's measured multi-node points where it has any; where those are shorter than the node's step and the
modelled inter-node all-reduce, o_net is 0 and the inter-node all-reduce is scaled down to them instead (a faster
link than the figure given, or overlap the model does not assume). Every overhead is clamped at 0 (with a note):
the model never predicts more than ideal scaling.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from dlscale import ConfigError
from dlscale.perfmodel.core import (NO_COMM, Compute, Links, Overlap, Shape, compute_terms, overlap_model,
                                   positive)
from dlscale.perfmodel.law import DEFAULT_LAW, NET_TERMS, PROTOCOLS, OverheadLaw


@dataclass(frozen=True)
class Measured:
    """A measured point: its shape, seconds per optimizer step (N x b / median samples/s), the relative
    spread of its repeats (stdev / median; None: one figure) and what it is (record id, label)."""

    shape: Shape
    step_s: float
    rel_spread: float | None = None
    ref: str = ""


# How far below and above the floor the measured throughput of floor-bound runs fell: the 80th percentile of
# each side over 37 floor-bound predictions of ResNet-50 CPU-decode runs on one H200 under `taskset` (16 to 4
# cores; docs/results/h200.md). The floor's error is the host's per-core decode rate, not the law's, so a
# floor-bound row takes this band instead of the law's.
# `python benchmarks/host_floor_check.py` over docs/results/stores/h200-2026-11-29/host-floor reproduces it.
HOST_FLOOR_BAND = (0.1279, 0.1598)


@dataclass(frozen=True)
class HostInput:
    """The host's input pipeline as the 1-device record measured it: the CPU core-seconds its data loaders
    spent per sample, and the cores of each predicted node's host."""

    core_s_per_sample: float
    cores: int
    source: str
    record_cores: int | None = None  # the cores the 1-device record's process could use (None: unknown)
    record_input_bound: bool = False  # its loaders used (nearly) every core its loop left them

    @property
    def other_host(self) -> bool:
        """The predicted host has a different core count from the one the 1-device record ran on: the floor
        then bounds the 1-device step too."""
        return self.record_cores is not None and self.cores != self.record_cores

    def free_cores(self, gpus: int) -> int:
        """The cores ``gpus`` ranks on one host leave to the loaders (one each for its own training loop;
        at least one)."""
        return max(self.cores - gpus, 1)

    def floor_s(self, gpus: int, samples_per_device_step: float) -> float:
        """The shortest step ``gpus`` ranks on one host can have: their samples' loader work over the cores
        they leave."""
        return gpus * samples_per_device_step * self.core_s_per_sample / self.free_cores(gpus)


@dataclass(frozen=True)
class NetCalibration:
    """The network side of the measured multi-node points (none: the law as it is): the scale of the law's network
    term and the share of the modelled inter-node all-reduce the steps pay (1: as modelled)."""

    points: tuple[Measured, ...] = ()
    scale: float = 0.0
    inter_factor: float = 1.0
    how: str = ""
    notes: tuple[str, ...] = ()


@dataclass
class ShapePrediction:
    """Every term of one shape's predicted step (seconds), the throughput with its band, and why."""

    shape: Shape
    compute: Compute
    overlap: Overlap
    node_overhead_s: float
    net_overhead_s: float
    step_s: float
    samples_per_s: float
    low: float
    high: float
    ideal_samples_per_s: float
    basis: str  # measured | from-multinode | from-node | from-1-gpu | fixed overhead
    band_pct: float  # the wider side of the band, % of the prediction
    limiting: str
    evidence: str
    notes: list[str] = field(default_factory=list)
    band_below_pct: float = 0.0  # how far below the prediction the band reaches, %
    band_above_pct: float = 0.0  # how far above (before the cap at ideal), %
    host_floor_s: float = 0.0  # the host input floor of the step (0: none known)

    @property
    def overhead_s(self) -> float:
        return self.node_overhead_s + self.net_overhead_s

    @property
    def speedup(self) -> float:
        return self.samples_per_s / (self.ideal_samples_per_s / self.shape.devices)

    def to_dict(self) -> dict[str, Any]:
        c, ov, n = self.compute, self.overlap, self.shape.devices
        sps1 = self.ideal_samples_per_s / n
        return {
            "shape": self.shape.label, "nodes": self.shape.nodes, "gpus_per_node": self.shape.gpus_per_node,
            "devices": n, "data_ms": c.data_s * 1e3, "forward_ms": c.forward_s * 1e3,
            "backward_ms": c.backward_s * 1e3, "update_ms": c.update_s * 1e3,
            "overhead_ms": self.overhead_s * 1e3, "node_overhead_ms": self.node_overhead_s * 1e3,
            "net_overhead_ms": self.net_overhead_s * 1e3, "allreduce_ms": ov.allreduce_s * 1e3,
            "allreduce_intra_ms": ov.intra_s * 1e3, "allreduce_inter_ms": ov.inter_s * 1e3,
            "exposed_ms": ov.exposed_s * 1e3, "step_ms": self.step_s * 1e3, "samples_per_s": self.samples_per_s,
            "samples_per_s_low": self.low, "samples_per_s_high": self.high, "band_pct": self.band_pct,
            "band_below_pct": self.band_below_pct, "band_above_pct": self.band_above_pct,
            "speedup": self.speedup, "speedup_low": self.low / sps1, "speedup_high": self.high / sps1,
            "ideal_speedup": float(n), "efficiency": self.speedup / n, "comm_share": ov.exposed_s / self.step_s,
            "basis": self.basis, "limiting": self.limiting, "evidence": self.evidence, "notes": list(self.notes),
            "host_floor_ms": self.host_floor_s * 1e3,
        }


def _rel(x: float | None) -> float:
    return x if x is not None and math.isfinite(x) and x > 0 else 0.0


@dataclass(frozen=True)
class _Overheads:
    """What ``WorkloadModel.predict`` adds to the 1-device step at one shape, and on what it rests."""

    node_s: float
    net_s: float
    basis: str
    how: str
    rel_in: float
    anchor: Measured | None = None
    notes: tuple[str, ...] = ()


@dataclass
class WorkloadModel:
    """Everything the model needs for one workload (see the module docstring)."""

    compute: Compute
    samples_per_device_step: float
    buckets: list[float]
    links: Links
    overlap: str | float = "none"
    law: OverheadLaw = DEFAULT_LAW
    base_rel_spread: float | None = None
    measured: list[Measured] = field(default_factory=list)
    fixed_overhead_s: float | None = None  # --overhead-ms: replaces the law and the calibration
    overhead_source: str = ""
    compiled: bool = False  # a torch.compile'd torch workload (the law's graph_split term)
    host: HostInput | None = None  # the host input floor; None: synthetic data, or no core count
    t1_inferred: bool = False  # no 1-device record: t_1 inferred from a measured node step (``infer_t1_s``)

    def __post_init__(self) -> None:
        positive("samples per device and step", self.samples_per_device_step)
        if self.fixed_overhead_s is not None and (not math.isfinite(self.fixed_overhead_s)
                                                  or self.fixed_overhead_s < 0):
            raise ConfigError(f"a fixed overhead must be >= 0 ms (a negative one would predict more than "
                              f"ideal scaling), got {self.fixed_overhead_s * 1e3:g} ms")

    @property
    def t1_s(self) -> float:
        return self.compute.total_s

    @property
    def grad_bytes(self) -> float:
        return float(sum(self.buckets))

    def modelled(self, shape: Shape) -> Overlap:
        """The all-reduce of ``shape`` as the links and the overlap mode give it."""
        if shape.devices == 1:
            return NO_COMM
        return overlap_model(self.buckets, self.compute.backward_s, shape, self.links, self.overlap)

    def exposed(self, shape: Shape) -> Overlap:
        """The all-reduce of ``shape`` the step pays: the modelled one, its inter-node part scaled to measured
        multi-node points that are shorter than it (``network``)."""
        ov = self.modelled(shape)
        if shape.nodes == 1 or ov.allreduce_s <= 0:
            return ov
        f = self.network.inter_factor
        if f == 1.0:
            return ov
        ar = ov.intra_s + f * ov.inter_s  # the exposed share stays what the overlap mode made it
        return replace(ov, allreduce_s=ar, exposed_s=min(ar, ov.exposed_s * ar / ov.allreduce_s),
                       inter_s=f * ov.inter_s)

    # ------------------------------------------------------------------ calibration

    def _single_node(self) -> dict[int, Measured]:
        return {m.shape.gpus_per_node: m for m in self.measured if m.shape.nodes == 1 and m.shape.devices > 1}

    def node_loss_s(self, node_step_s: float, gpus: int) -> float:
        """What a node step of ``gpus`` GPUs loses beyond t_1 and its exposed all-reduce (s; may be < 0)."""
        return node_step_s - self.t1_s - self.exposed(Shape(1, gpus)).exposed_s

    def _node_shape_s(self, gpus: int) -> float:
        """The law's node overhead at g GPUs as the shape measured points scale (t_1 x ln g when it has none)."""
        if sum(self.law.node.values()) > 0:
            return self.law.node_s(self.t1_s, gpus, self.compiled)
        return self.t1_s * math.log(gpus)

    def node_overhead(self, gpus: int) -> tuple[float, str, Measured | None, list[str]]:
        """(o_node(g) in s, how it was obtained, the measured point it rests on, notes).

        Measured at g: that overhead. Measured at other node sizes: the law's growth with g scaled to the
        nearest one (the workload's own amplitude, the law's shape). Else the law."""
        if gpus == 1:
            return 0.0, "one GPU per node: none", None, []
        nodes = self._single_node()
        notes: list[str] = []
        if gpus in nodes:
            anchor: Measured | None = nodes[gpus]
            g0, how = gpus, f"measured at 1x{gpus} ({nodes[gpus].ref})"
        elif nodes:
            g0 = min(nodes, key=lambda g: (abs(math.log(g / gpus)), -g))
            anchor = nodes[g0]
            how = f"the law's growth with GPUs scaled to the overhead measured at 1x{g0} ({anchor.ref})"
        else:
            return (self.law.node_s(self.t1_s, gpus, self.compiled), "default law (no measured multi-GPU point)",
                    None, notes)
        o = self.node_loss_s(anchor.step_s, g0)
        if o < 0:
            notes.append(f"node overhead at 1x{g0} came out {o * 1e3:.2f} ms (the measured step is shorter than the "
                         f"modelled communication: a link figure too low, or overlap the model does not assume); "
                         f"clamped at 0")
            o = 0.0
        if g0 != gpus:
            o *= self._node_shape_s(gpus) / self._node_shape_s(g0)
        return o, how, anchor, notes

    def node_step_s(self, gpus: int) -> float:
        return self.t1_s + self.exposed(Shape(1, gpus)).exposed_s + self.node_overhead(gpus)[0]

    def inter_exposed_s(self, shape: Shape) -> float:
        """The exposed part of the modelled inter-node all-reduce at ``shape`` (s)."""
        ov = self.modelled(shape)
        return ov.inter_s * ov.exposed_s / ov.allreduce_s if ov.allreduce_s > 0 else 0.0

    def _law_net_s(self, shape: Shape, node_step_s: float) -> float:
        """The law's network overhead (s) at ``shape`` on a node step of ``node_step_s``."""
        return self.law.net_s(node_step_s, shape.nodes, self.inter_exposed_s(shape),
                              self.node_loss_s(node_step_s, shape.gpus_per_node))

    def _net_shape_s(self, shape: Shape, node_step_s: float) -> float:
        """The law's network overhead as the shape measured points scale (where it is nothing for this workload,
        the default's shape: t_node x sqrt(ln M))."""
        law = self._law_net_s(shape, node_step_s) if self.law.has_net else 0.0
        # a rounding residue of a zero node overhead is nothing too
        return law if law > 1e-9 * node_step_s else node_step_s * NET_TERMS["sqrt_ln_nodes"].shape(shape.nodes)

    @cached_property
    def network(self) -> NetCalibration:
        """What the measured multi-node points say of the network: the law's network term scaled to them (least
        squares, >= 0); where they are shorter than the node's step and the modelled inter-node all-reduce (the
        scale would be negative), no network term and the inter-node all-reduce scaled to them (least squares,
        0..1) instead."""
        pts = tuple(m for m in self.measured if m.shape.nodes > 1)
        if not pts:
            return NetCalibration()
        num = den = 0.0
        rows = []
        for m in pts:
            g = m.shape.gpus_per_node
            t_node = self.node_step_s(g)
            inter = self.modelled(m.shape).exposed_s - self.modelled(Shape(1, g)).exposed_s
            x = self._net_shape_s(m.shape, t_node)
            num, den = num + x * (m.step_s - t_node - inter), den + x * x
            rows.append((m.step_s - t_node, inter))
        refs = ", ".join(f"{m.shape.label} ({m.ref})" for m in pts)
        if den <= 0 or num >= 0:
            return NetCalibration(pts, num / den if den > 0 else 0.0, 1.0, f"fitted on measured {refs}")
        dd = sum(d * d for _, d in rows)
        f = min(1.0, max(0.0, sum(y * d for y, d in rows) / dd)) if dd > 0 else 1.0
        note = (f"the measured {refs} {'is' if len(pts) == 1 else 'are'} shorter than the node's step and the modelled "
                f"inter-node all-reduce (a faster link than the figure given, or overlap the model does not assume): "
                f"no network overhead, and the inter-node all-reduce scaled to {f:.2f} of the modelled one")
        return NetCalibration(pts, 0.0, f, f"fitted on measured {refs}: none, the inter-node all-reduce x {f:.2f}",
                              (note,))

    def net_overhead(self, shape: Shape, node_step_s: float) -> tuple[float, str, list[str]]:
        """The network overhead at ``shape`` (s) on a node step of ``node_step_s``, how it was obtained (the law
        scaled to the workload's measured multi-node points, ``network``; else the law as it is) and notes."""
        cal = self.network
        if not cal.points:
            return self._law_net_s(shape, node_step_s), "default law", []
        return cal.scale * self._net_shape_s(shape, node_step_s), cal.how, list(cal.notes)

    # ------------------------------------------------------------------ prediction

    def _overheads(self, shape: Shape) -> _Overheads:
        """The node and network overhead of ``shape``, its basis, how it was found, the measured node it rests
        on and the input spread the band carries."""
        n = shape.devices
        rel_in = _rel(self.base_rel_spread)
        if n == 1:
            # on a host of other cores the 1-device row is a prediction from the 1-device record
            basis = "from-1-gpu" if self.host is not None and self.host.other_host else "measured"
            if self.t1_inferred:
                return _Overheads(0.0, 0.0, "from-node", "1-device step inferred from the measured node step",
                                  rel_in)
            return _Overheads(0.0, 0.0, basis, "1-device step", rel_in)
        if self.fixed_overhead_s is not None:
            return _Overheads(self.fixed_overhead_s, 0.0, "fixed overhead", self.overhead_source or "fixed overhead",
                              rel_in)
        o_node, how_node, anchor, notes = self.node_overhead(shape.gpus_per_node)
        o_net, how = 0.0, how_node
        if shape.nodes > 1:
            t_node = self.t1_s + self.exposed(Shape(1, shape.gpus_per_node)).exposed_s + o_node
            o_net, how_net, net_notes = self.net_overhead(shape, t_node)
            how, notes = f"node: {how_node}; network: {how_net}", notes + net_notes
        measured_here = any(m.shape == shape for m in self.measured)
        if anchor is not None and anchor.shape.gpus_per_node == shape.gpus_per_node:
            rel_in = math.hypot(rel_in, _rel(anchor.rel_spread))
            basis = "measured" if (shape.nodes == 1 or measured_here) else "from-node"
            net_pts = self.network.points
            if basis == "from-node" and net_pts:  # the network term's amplitude is the workload's own
                basis = "from-multinode"
                rel_in = math.hypot(rel_in, max(_rel(m.rel_spread) for m in net_pts))
        else:  # another node size: from the 1-device step, or from the node that step was inferred from
            basis = "from-node" if self.t1_inferred else "from-1-gpu"
        return _Overheads(o_node, o_net, basis, how, rel_in, anchor, tuple(notes))

    def predict(self, shape: Shape) -> ShapePrediction:
        c = self.compute
        n = shape.devices
        sps1 = self.samples_per_device_step / self.t1_s
        ideal = n * sps1
        ov = self.exposed(shape)
        o = self._overheads(shape)
        o_node, o_net, basis, how, rel_in, anchor, notes = (o.node_s, o.net_s, o.basis, o.how, o.rel_in, o.anchor,
                                                            list(o.notes))
        t = self.t1_s + ov.exposed_s + o_node + o_net
        floor = (self.host.floor_s(shape.gpus_per_node, self.samples_per_device_step)
                 if self.host and (n > 1 or self.host.other_host) else 0.0)
        host_bound, t_model = floor > t, t
        if host_bound:
            notes = notes + [f"{shape.label}: the host input floor ({floor * 1e3:.1f} ms) is above the modelled "
                             f"step ({t * 1e3:.1f} ms): the step is the floor"]
            t = floor
        sps = n * self.samples_per_device_step / t
        cap = ideal
        if anchor is not None and anchor.shape.gpus_per_node == shape.gpus_per_node:
            # resting on a measured node, nothing beats that node's throughput times the nodes (t >= t_node by
            # construction), the band's upper edge neither; where t_1 is inferred this is below n x sps1
            cap = min(ideal, n * self.samples_per_device_step / anchor.step_s)
        sps = min(sps, cap)  # t >= t_1 and t >= t_node hold by construction; this guards rounding only
        fit_basis = "from-1-gpu" if basis == "fixed overhead" else basis
        below, above = self.law.band_for(fit_basis) if fit_basis in PROTOCOLS else (0.0, 0.0)
        if host_bound:
            below, above = HOST_FLOOR_BAND
        down, up = math.hypot(rel_in, below), math.hypot(rel_in, above)
        low, high = sps * (1.0 - down), min(cap, sps * (1.0 + up))
        limiting, evidence = self._limiting(shape, ov, o_node + o_net, t, how, basis)
        if host_bound and self.host is not None:
            g = shape.gpus_per_node
            limiting = "host input"
            evidence = (f"{self.host.source}; {g} rank(s) a node need "
                        f"{g * self.samples_per_device_step * self.host.core_s_per_sample / t_model:.1f} cores at "
                        f"the modelled rate, of the {self.host.free_cores(g)} the host leaves them "
                        f"({self.host.cores} cores, one per rank for its own loop)")
        return ShapePrediction(shape, c, ov, o_node, o_net, t, sps, max(0.0, low), high, ideal, basis,
                               100.0 * max(down, up), limiting, evidence, notes, 100.0 * down, 100.0 * up, floor)

    def _limiting(self, shape: Shape, ov: Overlap, overhead_s: float, step_s: float, how: str,
                  basis: str) -> tuple[str, str]:
        """The largest loss against the 1-device step, named only with evidence for it."""
        if shape.devices == 1:
            return "-", ""
        share = ov.exposed_s / ov.allreduce_s if ov.allreduce_s > 0 else 0.0
        losses = {"intra-node all-reduce": ov.intra_s * share, "inter-node all-reduce": ov.inter_s * share,
                  "overhead": overhead_s}
        name, loss = max(losses.items(), key=lambda kv: kv[1])
        if loss < 0.01 * step_s:
            return "compute", "every loss term is under 1 % of the step"
        if name == "overhead":
            if basis == "from-1-gpu" and self.fixed_overhead_s is None and not self.measured:
                return "unknown", ("the largest term is the default overhead law; no multi-device point of this "
                                   "workload is measured, so nothing shows what it is")
            return "overhead", how
        src = self.links.sources.get("intra" if name.startswith("intra") else "inter", "")
        return name, src


def infer_t1_s(node_step_s: float, gpus: int, model: WorkloadModel) -> float:
    """The 1-device step that the model (its links, buckets, overlap and law) turns into the measured step of one
    node of ``gpus`` GPUs: t_node = t_1 + exposed all-reduce(1 x g) + o_node(t_1, g) (the law's, or a fixed one),
    solved for t_1 by bisection (the right side grows with t_1: the exposed all-reduce shrinks by at most the
    backward's growth). 0 where the modelled all-reduce alone takes the node's whole step."""
    def node_step(t1: float) -> float:
        m = replace(model, compute=compute_terms(t1), measured=[])  # no breakdown: the FLOPs split
        o = (model.fixed_overhead_s if model.fixed_overhead_s is not None
             else model.law.node_s(t1, gpus, model.compiled))
        return t1 + m.modelled(Shape(1, gpus)).exposed_s + o

    lo, hi = 0.0, node_step_s
    if node_step(1e-9 * node_step_s) >= node_step_s:
        return 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if node_step(mid) < node_step_s else (lo, mid)
    return 0.5 * (lo + hi)
