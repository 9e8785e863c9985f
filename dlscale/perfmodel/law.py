"""The overhead law: what a data-parallel step loses beyond its exposed all-reduce, as N grows.

    o_node(g)   = sum_k a_k x scale_k x f_k(g)     inside a node of g GPUs
    o_net(M, g) = sum_k b_k x scale_k x h_k(M)     across M nodes

Each term has a shape (a function of g or M) and a scale, which is what makes it physical:

* ``t1``: a share of the 1-GPU step (work that grows with the step: stragglers, host work per sample);
* ``tc``: a share of the 1-GPU step of a torch.compile'd torch workload, 0 for any other (work that
  only its data-parallel graph adds);
* ``node``: a share of the node's own step t_node(g) (the same, one level up);
* ``s``: seconds, whatever the step (a fixed synchronisation or straggler time per step);
* ``inter``: a share of the modelled exposed inter-node all-reduce (1/efficiency - 1: the link delivers
  less than the stated figure at these message sizes).

Coefficients are non-negative (the law never speeds a step up). ``DEFAULT_LAW`` is the form and the
coefficients that predicted the published tables best when each table was left out of the fit
(docs/perfmodel.md, "Validation"; ``benchmarks/perfmodel_validate.py`` reproduces it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from dlscale import ConfigError


@dataclass(frozen=True)
class Term:
    """One term of the law: its scale (t1 | node | s | inter) and its shape in g (node terms) or M (net terms)."""

    scale: str
    shape: Callable[[int], float]
    what: str


NODE_TERMS: dict[str, Term] = {
    "onset": Term("t1", lambda g: 1.0 if g > 1 else 0.0, "a fixed share of t_1 for running distributed at all"),
    "ln_gpus": Term("t1", lambda g: math.log(g), "stragglers / synchronisation growing with ln g, a share of t_1"),
    "abs_ln_gpus": Term("s", lambda g: math.log(g), "a per-step synchronisation time growing with ln g (seconds)"),
    # torch.compile of a DDP model cuts the graph at the gradient buckets (DDPOptimizer) so that each
    # bucket's all-reduce can start: fusions across the cuts are lost, and the data-parallel graph runs
    # more, smaller kernels than the 1-GPU graph (compiled GPT-2 on two H200s: 1,000 against 826
    # kernels, +1.21 ms on a 32.5 ms step; docs/perfmodel.md, "The compiled graph's split")
    "graph_split": Term("tc", lambda g: 1.0 if g > 1 else 0.0, "torch.compile's data-parallel graph cut at the "
                                                               "gradient buckets, a share of a compiled t_1"),
}
NET_TERMS: dict[str, Term] = {
    "node_onset": Term("node", lambda m: 1.0 if m > 1 else 0.0, "a fixed share of the node's step for leaving it"),
    "ln_nodes": Term("node", lambda m: math.log(m), "stragglers / synchronisation growing with ln M, a share "
                                                    "of the node's step"),
    # a synchronous step waits for the slowest of M nodes: with node steps spread normally (sigma), the
    # expected maximum of M of them grows as sigma x sqrt(2 ln M) (extreme-value statistics)
    "sqrt_ln_nodes": Term("node", lambda m: math.sqrt(math.log(m)), "the slowest of M nodes (stragglers): "
                                                                    "sqrt(ln M), a share of the node's step"),
    "abs_ln_nodes": Term("s", lambda m: math.log(m), "a per-step synchronisation time growing with ln M (seconds)"),
    "node_loss_ln_nodes": Term("onode", lambda m: math.log(m), "the node's own losses (its overhead o_node: "
                                                               "stragglers, host) growing with ln M"),
    "node_loss_sqrt_ln_nodes": Term("onode", lambda m: math.sqrt(math.log(m)), "the node's own losses as the "
                                                                             "spread of the slowest of M nodes"),
    "inter_bw": Term("inter", lambda m: 1.0 if m > 1 else 0.0, "the inter-node all-reduce slower than the stated "
                                                               "link (1/efficiency - 1)"),
}
# what a prediction rests on: only the 1-GPU step; the node measured at the target's GPUs per node; the node and
# a multi-node shape measured (the network term's amplitude is the workload's own, the law gives its growth)
PROTOCOLS = ("from-1-gpu", "from-node", "from-multinode")


def _scaled(term: Term, x: int, scales: Mapping[str, float]) -> float:
    return scales[term.scale] * term.shape(x)


def node_features(keys: Sequence[str], t1_s: float, gpus: int, compiled: bool = False) -> list[float]:
    """Each node term's value (seconds, before its coefficient) at g GPUs per node (``compiled``: a
    torch.compile'd torch workload)."""
    if gpus <= 1:
        return [0.0] * len(keys)
    return [_scaled(NODE_TERMS[k], gpus, {"t1": t1_s, "s": 1.0, "tc": t1_s if compiled else 0.0}) for k in keys]


def net_features(keys: Sequence[str], node_step_s: float, nodes: int, inter_exposed_s: float,
                 node_overhead_s: float = 0.0) -> list[float]:
    """Each network term's value (seconds, before its coefficient) at M nodes."""
    if nodes <= 1:
        return [0.0] * len(keys)
    scales = {"node": node_step_s, "s": 1.0, "inter": inter_exposed_s, "onode": max(node_overhead_s, 0.0)}
    return [_scaled(NET_TERMS[k], nodes, scales) for k in keys]


def _band_pair(protocol: str, v: object) -> tuple[float, float]:
    """A band entry: one fraction (symmetric) or [below, above] fractions, each in [0, 1)."""
    pair = (v, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    if (not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < 1 for x in pair)):
        raise ConfigError(f"band for {protocol} must be a fraction in 0..1 or a pair [below, above] of them, got {v!r}")
    return float(pair[0]), float(pair[1])


@dataclass(frozen=True)
class OverheadLaw:
    """Coefficients of the named terms and, per protocol, the band's fit part: how far below and above the
    prediction the held-out measured points fell (80th percentile of each side): ``from-1-gpu`` (only the
    1-GPU step measured), ``from-node`` (the node measured at the target's GPUs per node) and
    ``from-multinode`` (the node and a multi-node shape measured)."""

    node: dict[str, float] = field(default_factory=dict)
    net: dict[str, float] = field(default_factory=dict)
    band: dict[str, object] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        for terms, known in ((self.node, NODE_TERMS), (self.net, NET_TERMS)):
            for k, v in terms.items():
                if k not in known:
                    raise ConfigError(f"unknown overhead term {k!r}; known: {', '.join(known)}")
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise ConfigError(f"overhead coefficient {k} must be >= 0, got {v!r}")
        for p, v in self.band.items():
            _band_pair(p, v)

    def band_for(self, protocol: str) -> tuple[float, float]:
        """(below, above): the fractions of the prediction the measured point fell below / above it."""
        return _band_pair(protocol, self.band[protocol]) if protocol in self.band else (0.0, 0.0)

    def node_s(self, t1_s: float, gpus: int, compiled: bool = False) -> float:
        feats = node_features(list(self.node), t1_s, gpus, compiled)
        return sum(c * f for c, f in zip(self.node.values(), feats))

    def net_s(self, node_step_s: float, nodes: int, inter_exposed_s: float, node_overhead_s: float = 0.0) -> float:
        """The network overhead at M nodes (seconds)."""
        feats = net_features(list(self.net), node_step_s, nodes, inter_exposed_s, node_overhead_s)
        return sum(c * f for c, f in zip(self.net.values(), feats))

    @property
    def has_net(self) -> bool:
        return sum(self.net.values()) > 0

    def describe(self) -> str:
        unit = {"t1": "t_1", "node": "t_node", "s": "s", "inter": "inter-node all-reduce", "tc": "compiled t_1",
                "onode": "o_node"}

        def part(terms: dict[str, float], known: dict[str, Term]) -> str:
            return " + ".join(f"{c:.4g} x {unit[known[k].scale]} x {k}" for k, c in terms.items()) or "0"

        return f"o_node = {part(self.node, NODE_TERMS)}; o_net = {part(self.net, NET_TERMS)}"


# The form that predicted the held-out tables best (docs/perfmodel.md compares the candidates) and its
# coefficients fitted on every published table in tests/fixtures/tables and the project's H200 pair stores
# in docs/results/stores, each source page (its tables) or store weighing the same; the band is, per protocol,
# the 80th percentile of how far below / above their prediction the held-out published points fell.
# ``python benchmarks/perfmodel_validate.py --fit`` reproduces the figures; tests/test_perfmodel_fit.py
# checks that it does.
DEFAULT_LAW = OverheadLaw(
    node={"ln_gpus": 0.02448, "graph_split": 0.0285},
    net={"sqrt_ln_nodes": 0.03959},
    band={"from-1-gpu": [0.1861, 0.076], "from-node": [0.1566, 0.1118], "from-multinode": [0.035, 0.0859]},
    source="benchmarks/perfmodel_validate.py --fit: published tables (tests/fixtures/tables) and the H200 "
           "pair stores (docs/results/stores/manifest.json, its fit list)",
)
