"""Noise tests for compare: bootstrap CIs of a median and of a ratio of medians, and an exact Mann-Whitney U test.

numpy only (no scipy). Both are deterministic: the bootstrap takes a fixed seed.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

EXACT_MAX_N = 60  # total sample size up to which the Mann-Whitney p-value is exact


def _percentile_ci(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return float(lo), float(hi)


def bootstrap_median_ci(values: Sequence[float], resamples: int = 2000, confidence: float = 0.95,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(values) (e.g. per-round ratios of paired windows)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap needs samples")
    rng = np.random.default_rng(seed)
    return _percentile_ci(np.median(x[rng.integers(0, x.size, size=(resamples, x.size))], axis=1), confidence)


def bootstrap_ratio_ci(a: Sequence[float], b: Sequence[float], resamples: int = 2000,
                       confidence: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(b) / median(a), resampling each side independently."""
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    if xa.size == 0 or xb.size == 0:
        raise ValueError("bootstrap needs samples on both sides")
    rng = np.random.default_rng(seed)
    ma = np.median(xa[rng.integers(0, xa.size, size=(resamples, xa.size))], axis=1)
    mb = np.median(xb[rng.integers(0, xb.size, size=(resamples, xb.size))], axis=1)
    return _percentile_ci(mb / ma, confidence)


def _midranks(x: np.ndarray) -> np.ndarray:
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(x.size, dtype=float)
    sx = x[order]
    i = 0
    while i < x.size:
        j = i
        while j + 1 < x.size and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, str]:
    """Two-sided Mann-Whitney U test. Returns (U of a, p-value, "exact" | "normal").

    Exact: the permutation distribution of a's rank sum (midranks for ties), counted by a
    subset-sum recurrence, for up to EXACT_MAX_N samples in all; beyond that the normal
    approximation with tie and continuity corrections.
    """
    xa = np.asarray(a, dtype=float)
    xb = np.asarray(b, dtype=float)
    na, nb = xa.size, xb.size
    if na == 0 or nb == 0:
        raise ValueError("Mann-Whitney needs samples on both sides")
    n = na + nb
    ranks = _midranks(np.concatenate([xa, xb]))
    rank_sum = float(ranks[:na].sum())
    u = rank_sum - na * (na + 1) / 2.0
    if n <= EXACT_MAX_N:
        r2 = np.rint(ranks * 2).astype(np.int64)  # midranks are multiples of 1/2
        total = int(r2.sum())
        dp = np.zeros((na + 1, total + 1))
        dp[0, 0] = 1.0
        for r in r2:
            dp[1:, r:] += dp[:-1, :total + 1 - r]  # numpy buffers the overlapping operands
        dist = dp[na]
        mean2 = na * (n + 1)  # twice the expected rank sum
        obs = abs(int(round(rank_sum * 2)) - mean2)
        sums = np.arange(total + 1)
        p = float(dist[np.abs(sums - mean2) >= obs].sum() / dist.sum())
        return u, min(1.0, p), "exact"
    _, counts = np.unique(ranks, return_counts=True)
    tie = float((counts ** 3 - counts).sum()) / (n * (n - 1))
    sigma = math.sqrt(na * nb / 12.0 * ((n + 1) - tie))
    if sigma == 0:
        return u, 1.0, "normal"
    z = (abs(u - na * nb / 2.0) - 0.5) / sigma
    return u, min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0))), "normal"


def min_two_sided_p(na: int, nb: int) -> float:
    """Smallest two-sided exact Mann-Whitney p-value reachable with na and nb samples."""
    if na < 1 or nb < 1:
        return 1.0
    return min(1.0, 2.0 / math.comb(na + nb, na))


def repeats_for(alpha: float, na: int, nb: int, most: int = 1000) -> int | None:
    """The fewest repeats per side (at least those there are) whose exact test can reach p < alpha;
    None past ``most``."""
    for n in range(max(na, nb, 2), most + 1):
        if min_two_sided_p(n, n) < alpha:
            return n
    return None
