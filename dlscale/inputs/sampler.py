"""Which samples each rank reads: its slice of every global micro-batch.

DistributedSampler's semantics (each rank reads a disjoint shard of every epoch, the epoch's
permutation seeded the same on every rank, a last partial batch dropped), arranged so that the
rule of the synthetic batches holds for real data too: global micro-batch ``m`` is the ``m``-th
block of ``global_batch`` samples of the epoch's permutation, and the rank with data-parallel
rank ``r`` reads rows ``[r*b, (r+1)*b)`` of it. So any strategy, any number of processes, sees the
same samples in the same order as one process with the whole global batch (DistributedSampler
proper interleaves ranks: same samples per global batch, other row order).
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from dlscale import ConfigError


class GlobalBatchSampler:
    """Yields, forever, this rank's micro-batches as lists of (epoch, sample index)."""

    def __init__(self, n_samples: int, global_batch: int, offset: int, local_batch: int, seed: int,
                 what: str = "data set"):
        if n_samples < global_batch:
            raise ConfigError(f"{what} has {n_samples} samples, fewer than one global batch of {global_batch}")
        if not (0 <= offset and offset + local_batch <= global_batch):
            raise ValueError(f"rank slice [{offset}, {offset + local_batch}) outside the global batch {global_batch}")
        self.n, self.g, self.offset, self.b, self.seed = n_samples, global_batch, offset, local_batch, seed
        self.per_epoch = n_samples // global_batch

    def permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((int(self.seed) % 2**63, int(epoch))).permutation(self.n)

    def micro_batch(self, m: int, perm: np.ndarray | None = None) -> list[tuple[int, int]]:
        """This rank's keys of global micro-batch ``m``."""
        epoch, k = divmod(m, self.per_epoch)
        perm = self.permutation(epoch) if perm is None else perm
        start = k * self.g + self.offset
        return [(epoch, int(i)) for i in perm[start:start + self.b]]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        m, epoch, perm = 0, -1, None
        while True:
            e = m // self.per_epoch
            if e != epoch:
                epoch, perm = e, self.permutation(e)
            yield self.micro_batch(m, perm)
            m += 1
