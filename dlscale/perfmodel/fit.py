"""Fitting the overhead law on measured or published points, and choosing its form.

Residuals are relative to the measured step (so a 400 ms V100 step and a 40 ms H200 step weigh the
same) and the fit minimises their mean absolute value with non-negative coefficients (a few tables
limited by their input pipeline must not drag the law for everyone): iteratively reweighted least
squares over an exact non-negative least-squares solve of the few terms.

A series with a point above ideal scaling (``validate.series_flags``) is left out. Node terms are fitted on
single-node points: r = (t_meas - t_1 - exposed(1 x g)) / t_meas against each
term's value (law.node_features) / t_meas. Network terms are fitted on multi-node points whose node (1 x g)
is measured: r = (t_meas - t_node - (exposed(M x g) - exposed(1 x g))) / t_meas against each term's value
(law.net_features, on the measured node step t_node) / t_meas.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from dlscale import ConfigError
from dlscale.perfmodel.core import Shape
from dlscale.perfmodel.inputs import (ModelOptions, Query, build_model, group_workloads, measured_point, source_of,
                                      usable)
from dlscale.perfmodel.law import PROTOCOLS, OverheadLaw, net_features, node_features
from dlscale.perfmodel.validate import Validation, group_of, series_flags, validate
from dlscale.report.data import rec_config


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
        """Each group (a source page, or a measured store) weighs the same, whatever its number of rows."""
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


def page_of(name: str, records: list[dict[str, Any]]) -> str:
    """The source page a dataset's records cite (the address in their provenance source), else its name: the
    tables of one page (one campaign on one setup: its precisions, its systems) are not independent, so they
    weigh as one in the fit and are left out together."""
    pages = set()
    for src in filter(None, (source_of(r) for r in records)):
        m = re.search(r"https?://[^\s,;)]+", src)
        pages.add(m.group(0) if m else name)
    return pages.pop() if len(pages) == 1 else name


def page_folds(datasets: Datasets) -> dict[str, str]:
    return {name: page_of(name, records) for name, records in datasets.items()}


def dataset_rows(name: str, records: list[dict[str, Any]], opts: ModelOptions, node_terms: Sequence[str],
                 net_terms: Sequence[str]) -> FitRows:
    """One dataset's residual rows: they do not depend on which other datasets a fit leaves out."""
    grp = page_of(name, records)
    node: list[tuple[list[float], float, str]] = []
    net: list[tuple[list[float], float, str]] = []
    for w in group_workloads(usable(records, Query())).values():
        measured = w.measured(opts.strategy)
        inferred = w.baseline is None  # t_1 inferred from the node: its node point says nothing of the law
        if ((inferred and w.node_reference(opts.strategy) is None) or not measured
                or series_flags(w, opts.strategy)):
            continue  # a series above ideal scaling is a measurement problem, not evidence for the law
        try:
            m = build_model(w, records, opts, calibrate_on=[]).model
        except ConfigError:  # a workload the model cannot describe adds nothing to the fit
            continue
        t1 = m.t1_s
        for sh, row in measured.items():
            p = measured_point(row)
            try:
                if sh.nodes == 1:
                    if inferred:
                        continue
                    r = m.node_loss_s(p.step_s, sh.gpus_per_node) / p.step_s
                    feats = node_features(node_terms, t1, sh.gpus_per_node, m.compiled)
                    node.append(([f / p.step_s for f in feats], r, grp))
                elif Shape(1, sh.gpus_per_node) in measured or sh.gpus_per_node == 1:
                    t_node = (measured_point(measured[Shape(1, sh.gpus_per_node)]).step_s
                              if sh.gpus_per_node > 1 else t1)
                    node_ex = m.exposed(Shape(1, sh.gpus_per_node)).exposed_s
                    r = (p.step_s - t_node - (m.exposed(sh).exposed_s - node_ex)) / p.step_s
                    feats = net_features(net_terms, t_node, sh.nodes, m.inter_exposed_s(sh),
                                         m.node_loss_s(t_node, sh.gpus_per_node))
                    net.append(([f / p.step_s for f in feats], r, grp))
            except ConfigError:  # a missing link: the point adds nothing
                continue
    return FitRows(node, net)


def joined(rows: Iterable[FitRows]) -> FitRows:
    out = FitRows([], [])
    for r in rows:
        out.node += r.node
        out.net += r.net
    return out


def fit_rows(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str], net_terms: Sequence[str],
             exclude: Iterable[str] = ()) -> FitRows:
    skip = set(exclude)
    return joined(dataset_rows(name, records, opts, node_terms, net_terms)
                  for name, records in datasets.items() if name not in skip)


def law_from_rows(rows: FitRows, node_terms: Sequence[str], net_terms: Sequence[str],
                  band: Mapping[str, object] | None = None, source: str = "") -> OverheadLaw:
    cn = (l1_nnls([r[0] for r in rows.node], [r[1] for r in rows.node], FitRows.weights(rows.node))
          if rows.node else np.zeros(len(node_terms)))
    cm = (l1_nnls([r[0] for r in rows.net], [r[1] for r in rows.net], FitRows.weights(rows.net))
          if rows.net else np.zeros(len(net_terms)))
    return OverheadLaw({k: round(float(c), 5) for k, c in zip(node_terms, cn)},
                       {k: round(float(c), 5) for k, c in zip(net_terms, cm)}, dict(band or {}), source)


def fit_law(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str] = ("ln_gpus",),
            net_terms: Sequence[str] = ("ln_nodes",), exclude: Iterable[str] = (),
            band: Mapping[str, object] | None = None, source: str = "") -> OverheadLaw:
    return law_from_rows(fit_rows(datasets, opts, node_terms, net_terms, exclude), node_terms, net_terms, band,
                         source)


def leave_one_out(datasets: Datasets, opts: ModelOptions, node_terms: Sequence[str], net_terms: Sequence[str],
                  band: Mapping[str, object] | None = None, folds: Mapping[str, str] | None = None) -> Validation:
    """Each dataset (a table, a store) predicted with the law fitted without it and without every dataset of its
    fold (``folds``: dataset -> fold; default: its source page, ``page_folds``; or its framework)."""
    fold_of = dict(folds) if folds is not None else page_folds(datasets)
    val = Validation(law=f"terms {', '.join(node_terms)}; {', '.join(net_terms)}, refitted without the predicted set")
    laws: dict[str, OverheadLaw] = {}
    # each dataset's rows once: a fold's fit joins those of the datasets outside it
    rows = {name: dataset_rows(name, records, opts, node_terms, net_terms) for name, records in datasets.items()}
    for name, records in datasets.items():
        fold = fold_of.get(name, name)
        if fold not in laws:
            kept = (r for n, r in rows.items() if fold_of.get(n, n) != fold)
            laws[fold] = law_from_rows(joined(kept), node_terms, net_terms, dict(band or {}))
        try:
            v = validate(records, Query(), replace(opts, law=laws[fold]))
        except ConfigError as e:
            val.skipped.append(f"{name}: {e}")
            continue
        for r in v.rows:
            r.group = name
        val.rows += v.rows
        val.skipped += v.skipped
    return val


def framework_folds(datasets: Datasets) -> dict[str, str]:
    """Each dataset's framework (its records' config.framework; measured stores: the project's own runs)."""
    out = {}
    for name, records in datasets.items():
        fws = {str(rec_config(r).get("framework") or "") for r in records if r.get("kind") == "imported"}
        out[name] = fws.pop() if len(fws) == 1 else "dlscale (own runs)"
    return out


def band_from(val: Validation, q: float = 0.8) -> dict[str, list[float]]:
    """The band's fit part per protocol: [below, above], the ``q`` quantile of how far below the prediction the
    over-predicted held-out points fell (1 - measured / predicted) and of how far above it the under-predicted
    ones fell (measured / predicted - 1). The sides differ: a limit the model cannot see only slows a step."""
    out = {}
    for p in PROTOCOLS:
        rows = val.select(p)
        if rows:
            out[p] = band_sides([(r.predicted, r.measured) for r in rows], q)
    return out


def band_sides(points: Iterable[tuple[float, float]], q: float = 0.8) -> list[float]:
    """[below, above] over (predicted, measured) pairs: the ``q`` quantile of 1 - measured / predicted over the
    over-predicted ones and of measured / predicted - 1 over the under-predicted ones."""
    pts = list(points)
    below = sorted(1.0 - m / p for p, m in pts if p > m)
    above = sorted(m / p - 1.0 for p, m in pts if p < m)
    return [round(_quantile(below, q), 4), round(_quantile(above, q), 4)]


def _quantile(sorted_values: list[float], q: float) -> float:
    """The smallest value with at least a share ``q`` of the values at or below it (0 for none)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


# Candidate forms (node terms, network terms), compared by their held-out errors in docs/perfmodel.md.
CANDIDATE_FORMS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (("ln_gpus",), ("ln_nodes",)),
    (("onset",), ("node_onset",)),
    (("onset", "ln_gpus"), ("ln_nodes",)),
    (("ln_gpus",), ("node_onset", "ln_nodes")),
    (("abs_ln_gpus",), ("abs_ln_nodes",)),
    (("ln_gpus", "abs_ln_gpus"), ("ln_nodes",)),
    (("ln_gpus",), ("abs_ln_nodes",)),
    (("ln_gpus",), ("ln_nodes", "abs_ln_nodes")),
    (("ln_gpus",), ("inter_bw",)),
    (("ln_gpus",), ("inter_bw", "ln_nodes")),
    (("ln_gpus",), ("inter_bw", "abs_ln_nodes")),
    (("ln_gpus", "graph_split"), ("ln_nodes",)),
    (("ln_gpus", "graph_split"), ("abs_ln_nodes",)),
    (("ln_gpus", "graph_split"), ("node_loss_ln_nodes",)),
    (("ln_gpus", "graph_split"), ("ln_nodes", "node_loss_ln_nodes")),
    (("ln_gpus", "graph_split"), ("sqrt_ln_nodes",)),
    (("ln_gpus", "graph_split"), ("sqrt_ln_nodes", "ln_nodes")),
    (("ln_gpus", "graph_split"), ("node_loss_sqrt_ln_nodes",)),
]
