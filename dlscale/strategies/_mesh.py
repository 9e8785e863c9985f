"""The degrees of a job's parallel dimensions, validated in one place, and its device mesh, built once.

Every strategy that needs a mesh (``tensor``, ``hsdp``, ``hybrid``; ``pipeline`` and ``model``
are the pp-only case) describes its job as a ``ParallelDims``: data parallel split into
``dp_replicate`` (replicas: gradients all-reduced) and ``dp_shard`` (FSDP: parameters, gradients
and optimizer state sharded), pipeline ``pp`` and tensor ``tp``. Their product must be the world
size; otherwise one ConfigError names the exact product (as torchtitan's ParallelDims does)
before any process starts.

``build(device_type)`` makes one 4-D ``DeviceMesh`` with the dimensions in the order
``(dp_replicate, dp_shard, pp, tp)``: tp fastest, so a tensor-parallel group is consecutive
ranks (one node's NVLink domain), then pp, then data parallel outermost; with one data-parallel
kind this is the ``(dp, pp, tp)`` layout ``hybrid`` has always used. Sizes of 1 are kept (cheap:
a few groups of one rank) so that every strategy finds every dimension by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from dlscale import ConfigError

DIMS = ("dp_replicate", "dp_shard", "pp", "tp")


@dataclass(frozen=True)
class ParallelDims:
    """Degrees of data (replicated, sharded), pipeline and tensor parallelism of one job."""

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = 1
    pp: int = 1
    tp: int = 1
    where: str = "parallel"  # the strategy, for messages
    # how the message names the degrees: {dim: label}; dims without a label and of degree 1 are
    # left out of the message (e.g. hybrid shows its "dp" for whichever data-parallel kind it uses)
    labels: tuple[tuple[str, str], ...] = ()
    context: str = ""  # appended to the mismatch message (e.g. "nnodes 1 x nproc-per-node 2")

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

    def _label(self, dim: str) -> str:
        return dict(self.labels).get(dim, dim)

    @property
    def dp(self) -> int:
        """Data-parallel degree: how many different micro-batches one step consumes."""
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.dp_replicate, self.dp_shard, self.pp, self.tp)

    def build(self, device_type: str) -> "ParallelMesh":
        """The job's one DeviceMesh (every rank calls it once, in the same order)."""
        from torch.distributed.device_mesh import init_device_mesh

        return ParallelMesh(self, init_device_mesh(device_type, self.shape, mesh_dim_names=DIMS))

    def describe(self) -> dict:
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "pp": self.pp, "tp": self.tp,
                "mesh_dims": list(DIMS), "mesh": list(self.shape)}


@dataclass
class ParallelMesh:
    """A built mesh and what the strategies ask of it: sub-meshes, groups and this rank's coordinates."""

    dims: ParallelDims
    mesh: object  # torch.distributed.device_mesh.DeviceMesh

    def __getitem__(self, name):
        return self.mesh[name]

    @cached_property
    def coordinate(self) -> dict[str, int]:
        return dict(zip(DIMS, self.mesh.get_coordinate()))

    @property
    def dp_rank(self) -> int:
        """This rank's index among the data-parallel replicas (which slice of the global batch)."""
        c = self.coordinate
        return c["dp_replicate"] * self.dims.dp_shard + c["dp_shard"]

    @property
    def pp_rank(self) -> int:
        return self.coordinate["pp"]

    @property
    def tp_rank(self) -> int:
        return self.coordinate["tp"]

    def group(self, dim: str):
        return self.mesh.get_group(dim)

    @cached_property
    def dp_mesh(self):
        """The 1-D mesh of all data-parallel ranks (replicated and sharded together)."""
        if self.dims.dp_replicate == 1:
            return self.mesh["dp_shard"]
        if self.dims.dp_shard == 1:
            return self.mesh["dp_replicate"]
        return self.mesh["dp_replicate", "dp_shard"]._flatten("dp")

    @property
    def dp_group(self):
        return self.dp_mesh.get_group()

    @property
    def fsdp_mesh(self):
        """What FSDP2 shards over: 1-D ``dp_shard``, or 2-D ``(dp_replicate, dp_shard)`` (HSDP)."""
        if self.dims.dp_replicate == 1:
            return self.mesh["dp_shard"]
        return self.mesh["dp_replicate", "dp_shard"]

    def pipelines(self) -> list[list[int]]:
        """Global ranks of every pipeline of the job, each in stage order."""
        grid = self.mesh.mesh  # (dp_replicate, dp_shard, pp, tp) tensor of global ranks
        r, s, _, t = grid.shape[0], grid.shape[1], grid.shape[2], grid.shape[3]
        return [grid[a, b, :, c].tolist() for a in range(r) for b in range(s) for c in range(t)]

    def info(self) -> dict:
        return {**self.dims.describe(), "dp_rank": self.dp_rank, "pp_rank": self.pp_rank, "tp_rank": self.tp_rank}
