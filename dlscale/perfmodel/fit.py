"""Fitting the overhead law on measured or published points, and choosing its form.

Residuals are relative to the measured step (so a 400 ms V100 step and a 40 ms H200 step weigh the
same) and the fit minimises their mean absolute value with non-negative coefficients (a few tables
limited by their input pipeline must not drag the law for everyone): iteratively reweighted least
squares over an exact non-negative least-squares solve of the few terms.

Node terms are fitted on single-node points: r = (t_meas - t_1 - exposed(1 x g)) / t_meas against
t_1 f(g) / t_meas. Network terms are fitted on multi-node points whose node (1 x g) is measured:
r = (t_meas - t_node - (exposed(M x g) - exposed(1 x g))) / t_meas against t_node h(M) / t_meas, with
t_node the measured node step.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dlscale import ConfigError
from dlscale.perfmodel.core import Shape
from dlscale.perfmodel.inputs import ModelOptions, Query, build_model, group_workloads, measured_point, usable
from dlscale.perfmodel.law import NET_TERMS, NODE_TERMS, PROTOCOLS, OverheadLaw
from dlscale.perfmodel.validate import Validation, group_of, validate


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Exact non-negative least squares for a few columns: the best unconstrained solve over every subset
    of columns whose solution is non-negative."""
    n = a.shape[1]
    best, best_c = math.inf, np.zeros(n)
    for k in range(n + 1):
        for sub in itertools.combinations(range(n), k):
            c = np.zeros(n)
            if sub:
                cs, *_ = np.linalg.lstsq(a[:, sub], y, rcond=None)
                if (cs < 0).any():
                    continue
                c[list(sub)] = cs
            err = float(((a @ c - y) ** 2).sum())
            if err < best - 1e-15:
                best, best_c = err, c
    return best_c


def l1_nnls(a: Sequence[Sequence[float]], y: Sequence[float], weights: Sequence[float] | None = None,
            iters: int = 100) -> np.ndarray:
    """min sum w |a c - y| over c >= 0 (IRLS)."""
    A, Y = np.asarray(a, dtype=float), np.asarray(y, dtype=float)
    W = np.ones(len(Y)) if weights is None else np.asarray(weights, dtype=float)
    if A.size == 0:
        return np.zeros(A.shape[1] if A.ndim == 2 else 0)
    c = nnls(A * np.sqrt(W)[:, None], Y * np.sqrt(W))
    for _ in range(iters):
        w = np.sqrt(W / np.maximum(np.abs(A @ c - Y), 1e-4))
        c_new = nnls(A * w[:, None], Y * w)
        if np.allclose(c_new, c, atol=1e-9):
            break
        c = c_new
    return c


@dataclass
class FitRows:
    """Residual rows (coefficients of the terms, relative residual, group) of the node and network fits."""

    node: list[tuple[list[float], float, str]]
    net: list[tuple[list[float], float, str]]

    @staticmethod
    def weights(rows: list[tuple[list[float], float, str]]) -> list[float]:
        """Each group (a table, or the measured store) weighs the same, whatever its number of rows."""
        count: dict[str, int] = {}
        for *_, g in rows:
            count[g] = count.get(g, 0) + 1
        return [1.0 / count[g] for *_, g in rows]


Datasets = Mapping[str, list[dict[str, Any]]]  # name (a table, a store) -> its records


def datasets_by_source(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Imported records split by the table they came from; everything else is one set."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(group_of(r), []).append(r)
    return out


def fit_rows(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str], net_terms: Sequence[str],
             exclude: Iterable[str] = ()) -> FitRows:
    skip = set(exclude)
    node: list[tuple[list[float], float, str]] = []
    net: list[tuple[list[float], float, str]] = []
    for grp, records in datasets.items():
        if grp in skip:
            continue
        for w in group_workloads(usable(records, Query())).values():
            measured = w.measured(opts.strategy)
            if w.baseline is None or not measured:
                continue
            try:
                m = build_model(w, records, opts, calibrate_on=[]).model
            except ConfigError:  # a workload the model cannot describe adds nothing to the fit
                continue
            t1 = m.t1_s
            for sh, row in measured.items():
                p = measured_point(row)
                try:
                    if sh.nodes == 1:
                        r = (p.step_s - t1 - m.exposed(sh).exposed_s) / p.step_s
                        node.append(([t1 * NODE_TERMS[k](sh.gpus_per_node) / p.step_s for k in node_terms], r, grp))
                    elif Shape(1, sh.gpus_per_node) in measured or sh.gpus_per_node == 1:
                        t_node = (measured_point(measured[Shape(1, sh.gpus_per_node)]).step_s
                                  if sh.gpus_per_node > 1 else t1)
                        node_ex = m.exposed(Shape(1, sh.gpus_per_node)).exposed_s
                        r = (p.step_s - t_node - (m.exposed(sh).exposed_s - node_ex)) / p.step_s
                        net.append(([t_node * NET_TERMS[k](sh.nodes) / p.step_s for k in net_terms], r, grp))
                except ConfigError:  # a missing link: the point adds nothing
                    continue
    return FitRows(node, net)


def fit_law(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str] = ("ln_gpus",),
            net_terms: Sequence[str] = ("ln_nodes",), exclude: Iterable[str] = (),
            band: dict[str, float] | None = None, source: str = "") -> OverheadLaw:
    rows = fit_rows(datasets, opts, node_terms, net_terms, exclude)
    cn = (l1_nnls([r[0] for r in rows.node], [r[1] for r in rows.node], FitRows.weights(rows.node))
          if rows.node else np.zeros(len(node_terms)))
    cm = (l1_nnls([r[0] for r in rows.net], [r[1] for r in rows.net], FitRows.weights(rows.net))
          if rows.net else np.zeros(len(net_terms)))
    return OverheadLaw({k: round(float(c), 5) for k, c in zip(node_terms, cn)},
                       {k: round(float(c), 5) for k, c in zip(net_terms, cm)}, band or {}, source)


def leave_one_out(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str], net_terms: Sequence[str],
                  band: dict[str, float] | None = None) -> Validation:
    """Each dataset (a table, a store) predicted with the law fitted on every other one."""
    val = Validation(law=f"terms {', '.join(node_terms)}; {', '.join(net_terms)}, refitted without the predicted set")
    for name, records in datasets.items():
        law = fit_law(datasets, opts, node_terms, net_terms, exclude=[name], band=band)
        try:
            v = validate(records, Query(), replace(opts, law=law))
        except ConfigError as e:
            val.skipped.append(f"{name}: {e}")
            continue
        for r in v.rows:
            r.group = name
        val.rows += v.rows
        val.skipped += v.skipped
    return val


def band_from(val: Validation) -> dict[str, float]:
    """The band's fit part per protocol: the 80th percentile of the held-out |error| (a fraction)."""
    out = {}
    for p in PROTOCOLS:
        s = val.summary(p)
        if s.p80_abs_error_pct is not None:
            out[p] = round(s.p80_abs_error_pct / 100.0, 4)
    return out


CANDIDATE_FORMS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("onset",), ("node_onset",)),
    (("ln_gpus",), ("ln_nodes",)),
    (("onset", "ln_gpus"), ("ln_nodes",)),
    (("ln_gpus",), ("node_onset", "ln_nodes")),
    (("onset", "ln_gpus"), ("node_onset", "ln_nodes")),
]
