"""A job's degrees and how one device holds the model: ``ParallelDims`` (data replicated and
sharded, pipeline, tensor; validated in one place), the ``Layout`` of the memory plan (those
degrees plus the ZeRO stage and pipeline schedule a strategy declares) and the even split of
blocks into stages.

Torch-free and below both ``strategies/`` and ``memplan``, so that a strategy can describe its
degrees and layout and the plan can read them without either importing the other. The device
mesh built from the degrees is ``strategies/_mesh.py``'s ``ParallelMesh``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from dlscale import ConfigError

DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (replicated, sharded), pipeline and tensor parallelism of one job.

    Their product must be the world size; otherwise one ConfigError names the exact product (as
    torchtitan's ParallelDims does) before any process starts."""

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = 1
    pp: int = 1
    tp: int = 1
    where: str = field(default="parallel", compare=False)  # the strategy, for messages
    # how the message names the degrees: {dim: label}; dims without a label and of degree 1 are
    # left out of the message (e.g. hybrid shows its "dp" for whichever data-parallel kind it uses)
    labels: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    context: str = field(default="", compare=False)  # appended to the mismatch message

    def __post_init__(self) -> None:
        for dim in DIMS:
            value = getattr(self, dim)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{self.where} {self._label(dim)} must be an integer >= 1, got {value!r}")
        product = self.dp_replicate * self.dp_shard * self.pp * self.tp
        if product != self.world_size:
            shown = [(self._label(d), getattr(self, d)) for d in DIMS if getattr(self, d) > 1 or d in dict(self.labels)]
            terms = " x ".join(f"{label} {value}" for label, value in shown) or "1"
            ctx = f" ({self.context})" if self.context else ""
            raise ConfigError(f"{self.where} degrees {terms} = {product} do not match the world size "
                              f"{self.world_size}{ctx}")

    @classmethod
    def of(cls, dp_replicate: int = 1, dp_shard: int = 1, pp: int = 1, tp: int = 1, where: str = "parallel"):
        """The degrees of a job whose world is their product (the planner's candidates)."""
        return cls(dp_replicate * dp_shard * pp * tp, dp_replicate, dp_shard, pp, tp, where=where)

    def _label(self, dim: str) -> str:
        return dict(self.labels).get(dim, dim)

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different micro-batches one step consumes."""
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.dp_replicate, self.dp_shard, self.pp, self.tp)

    def describe(self) -> dict:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "pp": self.pp, "tp": self.tp,
                "mesh_dims": list(DIMS), "mesh": list(self.shape)}


ONE_DEVICE = ParallelDims(1)


@dataclass(frozen=True)
class Layout:
    """How one device holds the model: the job's degrees, ZeRO stage, pipeline schedule."""

    name: str
    dims: ParallelDims = ONE_DEVICE
    zero: int = 0  # 0 replica, 1 optimizer sharded (zero1), 2 / 3 FSDP (over dp_shard)
    sequence_parallel: bool = False
    microbatches: int = 1  # the pipeline cuts --batch-size into this many
    schedule: str = "1f1b"
    persistent_grads: bool = False  # DDP's buckets hold the gradients through the whole step
    fsdp_params_bf16: bool = False  # FSDP's mixed precision: gathered bf16 parameters
    options: dict = field(default_factory=dict, compare=False)  # the -o options that run it

    @property
    def dp_replicate(self) -> int:
        return self.dims.dp_replicate

    @property
    def dp_shard(self) -> int:
        return self.dims.dp_shard

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def world(self) -> int:
        return self.dims.world_size

    @property
    def dp(self) -> int:
        return self.dims.dp

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
