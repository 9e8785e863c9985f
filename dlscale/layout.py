"""How one device holds the model, in the memory plan's terms: the degrees, ZeRO stage and pipeline
schedule a strategy declares (``memory_layout``), and the even split of blocks into stages.

Torch-free and below both ``strategies/`` and ``memplan``, so that a strategy can describe its
layout and the plan can read it without either importing the other.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Layout:
    """How one device holds the model: degrees, ZeRO stage, pipeline schedule."""

    name: str
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0  # 0 replica, 1 optimizer sharded (zero1), 2 / 3 FSDP (over dp_shard)
    sequence_parallel: bool = False
    microbatches: int = 1  # the pipeline cuts --batch-size into this many
    schedule: str = "1f1b"
    persistent_grads: bool = False  # DDP's buckets hold the gradients through the whole step
    fsdp_params_bf16: bool = False  # FSDP's mixed precision: gathered bf16 parameters
    options: dict = field(default_factory=dict, compare=False)  # the -o options that run it

    @property
    def world(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp * self.pp

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    def describe(self) -> str:
        parts = [f"{k} {v}" for k, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp)) if v > 1]
        return " x ".join(parts) or "1 device"


def split_blocks(n_blocks: int, n_stages: int) -> list[list[int]]:
    """Contiguous runs of block indices, as even as possible (earlier stages take the extra)."""
    base, extra = divmod(n_blocks, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        size = base + (1 if s < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out
