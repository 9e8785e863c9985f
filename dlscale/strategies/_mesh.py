"""The device mesh of a job, built once from its degrees.

Every strategy that needs a mesh (``tensor``, ``hsdp``, ``hybrid``; ``pipeline`` and ``model``
are the pp-only case) describes its job as a ``ParallelDims`` (``dlscale/planner/layout.py``, torch-free:
the memory plan reads the same degrees): data parallel split into ``dp_replicate`` (replicas:
gradients all-reduced) and ``dp_shard`` (FSDP: parameters, gradients and optimizer state
sharded), pipeline ``pp`` and tensor ``tp``, their product the world size.

``ParallelMesh.build(dims, device_type)`` makes one 4-D ``DeviceMesh`` with the dimensions in the
order ``(dp_replicate, dp_shard, pp, tp)``: tp fastest, so a tensor-parallel group is consecutive
ranks (one node's NVLink domain), then pp, then data parallel outermost; with one data-parallel
kind this is the ``(dp, pp, tp)`` layout ``hybrid`` has always used. Sizes of 1 are kept (cheap:
a few groups of one rank) so that every strategy finds every dimension by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from torch.distributed.device_mesh import init_device_mesh

from dlscale.planner.layout import DIMS, ParallelDims

__all__ = ["DIMS", "ParallelDims", "ParallelMesh"]


@dataclass
class ParallelMesh:
    """A built mesh and what the strategies ask of it: sub-meshes, groups and this rank's coordinates."""

    dims: ParallelDims
    mesh: object  # torch.distributed.device_mesh.DeviceMesh

    @classmethod
    def build(cls, dims: ParallelDims, device_type: str) -> "ParallelMesh":
        """The job's one DeviceMesh (every rank calls it once, in the same order)."""
        return cls(dims, init_device_mesh(device_type, dims.shape, mesh_dim_names=DIMS))

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
