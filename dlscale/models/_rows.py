"""Row-block initialisation of large tables, identical whether a table is whole or sharded.

A model whose tables (CTR embeddings, a face classifier over millions of identities) may be
sharded by rows across ranks initialises them here: the rows are cut into fixed blocks of
``BLOCK_ROWS``, and block b of table t is drawn from its own generator seeded from
(model seed, t, b). A shard owning rows [a, z) draws only the blocks it overlaps and keeps its
rows, so every row holds the same value as in the unsharded table, and no rank ever
materialises a table it does not own. Values depend on the device type (CPU and CUDA
generators differ), never on the sharding.
"""
from __future__ import annotations

import torch

BLOCK_ROWS = 65536
_MASK = 2**63 - 1


def block_seed(seed: int, table: int, block: int) -> int:
    """A 63-bit generator seed for one block of one table (an odd-multiplier mix of the three)."""
    return (seed * 0x9E3779B97F4A7C15 + (table + 1) * 0xBF58476D1CE4E5B9 + (block + 1) * 0x94D049BB133111EB) & _MASK


@torch.no_grad()
def fill_rows(out: torch.Tensor, row_start: int, total_rows: int, seed: int, table: int,
              kind: str, scale: float) -> torch.Tensor:
    """Fill ``out`` (rows [row_start, row_start + len(out)) of a (total_rows, dim) table) in place.

    kind ``uniform``: U(-scale, scale); ``normal``: N(0, scale^2). Returns ``out``.
    """
    n = out.shape[0]
    if n == 0:
        return out
    end = row_start + n
    if row_start < 0 or end > total_rows:
        raise ValueError(f"rows [{row_start}, {end}) outside a table of {total_rows} rows")
    dim = out.shape[1]
    for b in range(row_start // BLOCK_ROWS, (end - 1) // BLOCK_ROWS + 1):
        lo_b = b * BLOCK_ROWS
        rows_b = min(BLOCK_ROWS, total_rows - lo_b)
        gen = torch.Generator(device=out.device).manual_seed(block_seed(seed, table, b))
        block = torch.empty(rows_b, dim, device=out.device, dtype=torch.float32)
        if kind == "uniform":
            block.uniform_(-scale, scale, generator=gen)
        elif kind == "normal":
            block.normal_(0.0, scale, generator=gen)
        else:
            raise ValueError(f"unknown init kind {kind!r}")
        lo, hi = max(row_start, lo_b), min(end, lo_b + rows_b)
        out[lo - row_start:hi - row_start].copy_(block[lo - lo_b:hi - lo_b])
    return out


def draw_seed() -> int:
    """A model seed, drawn from torch's (seeded) global CPU generator at the start of construction."""
    return int(torch.randint(0, 2**62, (1,), device="cpu").item())


def settle_rng(seed: int) -> None:
    """Re-seed torch's global generators from the model seed at the end of construction.

    So that what follows the construction (dropout masks) does not depend on how the model was
    built: whole on its device (the layers' default initialisers draw random numbers), or on the
    meta device with its tables left to a sharding strategy (nothing drawn).
    """
    torch.manual_seed(block_seed(seed, -2, -2))
