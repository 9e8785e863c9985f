"""Fitting the overhead law: the solvers against hand-made data, and the shipped DEFAULT_LAW reproduced from
the published tables and the project's H200 pair stores (benchmarks/perfmodel_validate.py --fit)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from dlscale.perfmodel.fit import FitRows, l1_nnls, nnls
from dlscale.perfmodel.law import DEFAULT_LAW, PROTOCOLS

ROOT = Path(__file__).resolve().parent.parent


def test_nnls_keeps_coefficients_non_negative():
    a = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    assert nnls(a, np.array([2.0, 4.0, 6.0])) == pytest.approx([0.0, 2.0])
    # the unconstrained fit wants a negative slope: the constrained one sets it to 0
    c = nnls(a, np.array([3.0, 2.0, 1.0]))
    assert c[1] == 0.0 and c[0] == pytest.approx(2.0)


def test_l1_fit_ignores_an_outlier():
    """y = 0.05 x on four points and one wild point: least absolute deviation keeps 0.05."""
    a = [[1.0], [2.0], [3.0], [4.0], [5.0]]
    y = [0.05, 0.10, 0.15, 0.20, 3.0]
    assert l1_nnls(a, y)[0] == pytest.approx(0.05, rel=1e-3)
    assert nnls(np.array(a), np.array(y))[0] > 0.2                     # least squares is dragged
    # each group weighs the same: ten rows of one table do not outvote one row of another
    rows = [([1.0], 0.1, "big")] * 10 + [([1.0], 0.3, "small")]
    assert FitRows.weights(rows) == pytest.approx([0.1] * 10 + [1.0])


@pytest.mark.slow  # builds three registered models on the meta device: ~20 s on a 2-core machine
def test_default_law_is_what_the_fit_gives():
    """Refitting on the shipped tables and stores reproduces DEFAULT_LAW's coefficients."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import perfmodel_validate as pv

    from dlscale.perfmodel.fit import datasets_by_source, fit_law
    from dlscale.perfmodel.inputs import ModelOptions

    everything = {**datasets_by_source(pv.published_records()), **pv.own_stores()}
    law = fit_law(everything, ModelOptions(), tuple(DEFAULT_LAW.node), tuple(DEFAULT_LAW.net))
    assert law.node == pytest.approx(DEFAULT_LAW.node, abs=2e-5) and law.net == pytest.approx(DEFAULT_LAW.net, abs=2e-5)
    assert set(DEFAULT_LAW.band) == set(PROTOCOLS) and all(0 < v < 1 for v in DEFAULT_LAW.band.values())
