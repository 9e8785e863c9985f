"""The overhead law: what a data-parallel step loses beyond its exposed all-reduce, as N grows.

    o(M x g) = t_1 x sum_k a_k f_k(g)              (inside a node, relative to the 1-GPU step t_1)
             + t_node(g) x sum_k b_k h_k(M)          (across nodes, relative to the node's step)

with non-negative coefficients (so the law never speeds a step up). The terms are named, so the
fit (dlscale/perfmodel/fit.py) can compare forms; ``DEFAULT_LAW`` is the form and the coefficients
that fitted the published tables best (docs/perfmodel.md, "Validation", gives the comparison and
``benchmarks/perfmodel_validate.py`` reproduces it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from dlscale import ConfigError

# Node terms: functions of the GPUs per node g (g > 1), multiplied by t_1.
NODE_TERMS: dict[str, Callable[[int], float]] = {
    "onset": lambda g: 1.0 if g > 1 else 0.0,       # a fixed cost of running distributed at all
    "ln_gpus": lambda g: math.log(g),                # stragglers / synchronisation growing with log g
}
# Network terms: functions of the node count M (M > 1), multiplied by the node's step t_node(g).
NET_TERMS: dict[str, Callable[[int], float]] = {
    "node_onset": lambda m: 1.0 if m > 1 else 0.0,  # a fixed cost of leaving the node
    "ln_nodes": lambda m: math.log(m),               # stragglers / synchronisation growing with log M
}
PROTOCOLS = ("from-1-gpu", "from-node")


@dataclass(frozen=True)
class OverheadLaw:
    """Coefficients of the named terms and, per protocol, the 80th percentile of |error| of the law's
    held-out predictions (the band's fit part): ``from-1-gpu`` (only the 1-GPU step measured) and
    ``from-node`` (the node measured at the target's GPUs per node)."""

    node: dict[str, float] = field(default_factory=dict)
    net: dict[str, float] = field(default_factory=dict)
    band: dict[str, float] = field(default_factory=dict)
    source: str = ""

    def __post_init__(self) -> None:
        for terms, known in ((self.node, NODE_TERMS), (self.net, NET_TERMS)):
            for k, v in terms.items():
                if k not in known:
                    raise ConfigError(f"unknown overhead term {k!r}; known: {', '.join(known)}")
                if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                    raise ConfigError(f"overhead coefficient {k} must be >= 0, got {v!r}")

    def node_s(self, t1_s: float, gpus: int) -> float:
        return t1_s * sum(c * NODE_TERMS[k](gpus) for k, c in self.node.items()) if gpus > 1 else 0.0

    def net_factor(self, nodes: int) -> float:
        """sum_k b_k h_k(M): the network overhead as a share of the node's step."""
        return sum(c * NET_TERMS[k](nodes) for k, c in self.net.items()) if nodes > 1 else 0.0

    def describe(self) -> str:
        node = " + ".join(f"{c:.4g} {k}" for k, c in self.node.items()) or "0"
        net = " + ".join(f"{c:.4g} {k}" for k, c in self.net.items()) or "0"
        return f"o = t_1 x ({node}) + t_node x ({net})"


# The form that fitted best (ln GPUs per node inside the node, ln nodes across them; docs/perfmodel.md
# compares the candidates) and its coefficients fitted on every published table in
# tests/fixtures/tables and the project's H200 pair stores in docs/bench-data, each table or store
# weighing the same; the band is the 80th percentile of the leave-one-out |error| on the published
# tables. ``python benchmarks/perfmodel_validate.py --fit`` reproduces the figures;
# tests/test_perfmodel_fit.py checks that it does.
DEFAULT_LAW = OverheadLaw(
    node={"ln_gpus": 0.03342},
    net={"ln_nodes": 0.06888},
    band={"from-1-gpu": 0.1981, "from-node": 0.1398},
    source="benchmarks/perfmodel_validate.py --fit: published tables (tests/fixtures/tables) and the H200 "
           "pair stores (docs/bench-data)",
)
