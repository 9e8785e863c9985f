"""``dlscale plan``: for each strategy and degree a job allows, the predicted memory per device
(``memplan``), whether it fits, the largest batch that fits, and the predicted throughput.

Throughput comes from the performance model of the parallel strategies
(``dlscale.perfmodel.strategies.predict``, the same entry point as ``dlscale predict --strategy``):
compute at a rate taken from a measurement where the store has one (the same configuration at
fewer devices, another strategy of the model, a ``micro layer`` record of its block), else at the
assumed ``--mfu`` (and the row says so), plus each strategy's communication on the alpha-beta link
model, minus what it hides. Each row carries its basis, band and what limits it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError
from dlscale.planner.memplan import GiB, Workload, candidate_layouts, largest_batch, plan_memory
from dlscale.perfmodel.core import Link, Links
from dlscale.perfmodel.strategies import DEFAULT_MFU, Candidate, Evidence, Machine as PerfMachine, predict


@dataclass(frozen=True)
class Machine:
    """What the plan assumes about the devices and their links (bus bandwidths in B/s; the inter-node figure
    per node, shared by its GPUs, as ``dlscale predict``'s; None: not given)."""

    gpus: int
    nodes: int
    memory_bytes: float
    peak_flops: float  # dense bf16 (fp32: tf32) FLOP/s of one device
    efficiency: float = DEFAULT_MFU  # the compute rate assumed where nothing is measured
    intra_busbw: float = 300e9  # an NVLink-class figure, where nothing else is given
    inter_busbw: float | None = None
    headroom: float = 0.10  # of the memory kept free: CUDA context, allocator cache and fragmentation
    intra_latency_s: float = 0.0
    inter_latency_s: float = 0.0
    intra_source: str = ""
    mem_bw_bps: float = 0.0  # one device's memory bandwidth (0: unknown; the optimizer update is not priced)

    @property
    def per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def capacity(self) -> float:
        return self.memory_bytes * (1 - self.headroom)

    @property
    def links(self) -> Links:
        inter = Link(self.inter_busbw, self.inter_latency_s) if self.inter_busbw else None
        return Links(intra={0: Link(self.intra_busbw, self.intra_latency_s)}, inter=inter)

    def perf(self) -> PerfMachine:
        return PerfMachine(self.gpus, self.per_node, self.peak_flops, self.links, mem_bw_bps=self.mem_bw_bps)


def runs_here(layout, machine: Machine, visible_gpus: int) -> str:
    """'yes', or why dlscale cannot run this row on this machine (too few GPUs visible, several nodes)."""
    if machine.nodes > 1:
        return f"no: {machine.nodes} nodes (dlscale slurm / multi-node launch)"
    if layout.world > visible_gpus:
        return f"no: {layout.world} GPUs, {visible_gpus} visible"
    return "yes"


@dataclass(frozen=True)
class Grid:
    """Which layouts the plan enumerates: pipeline micro-batches and schedule, sequence parallelism, and only
    these strategies (None: all)."""

    microbatches: int = 4
    schedule: str = "1f1b"
    sequence_parallel: bool = False
    strategies: frozenset[str] | None = None


def plan_rows(work: Workload, machine: Machine, batch: int, grid: Grid = Grid(), evidence: Evidence | None = None,
              visible_gpus: int = 0) -> list[dict[str, Any]]:
    """One row per layout: memory terms, fit, largest batch, the model's predicted step (fitting rows first,
    fastest first). ``evidence``: the measurements the compute rate comes from (None: the assumed MFU);
    ``visible_gpus``: the GPUs of this machine, for the ``runs_here`` column."""
    if machine.nodes < 1 or machine.gpus % machine.nodes:
        raise ConfigError(f"--nodes {machine.nodes} must divide --gpus {machine.gpus}")
    if machine.nodes > 1 and not machine.inter_busbw:
        raise ConfigError(f"{machine.gpus} GPUs on {machine.nodes} nodes need the inter-node link: give "
                          f"--inter-busbw GBPS (per node)")
    ev = evidence or Evidence(assumed_mfu=machine.efficiency)
    perf = machine.perf()
    rows = []
    for layout in candidate_layouts(work.spec, machine.gpus, machine.per_node, machine.nodes, grid.microbatches,
                                    grid.schedule, grid.sequence_parallel):
        if grid.strategies and layout.name not in grid.strategies:
            continue
        b = batch if layout.microbatches == 1 else -(-batch // layout.microbatches) * layout.microbatches
        mem = plan_memory(work, layout, b)
        best = largest_batch(work, layout, machine.capacity)
        cand = Candidate.from_layout(layout, b, work.checkpointing, work.precision, work.compiled)
        p = predict(cand, work.spec.arch, perf, ev)
        rows.append({**mem.as_dict(), "fits": mem.peak <= machine.capacity, "max_batch_size": best,
                     "capacity_bytes": machine.capacity, **p.to_dict(), "step_s": p.step_s,
                     "runs_here": runs_here(layout, machine, visible_gpus)})
    rows.sort(key=lambda r: (not r["fits"], -r["tokens_per_s_per_gpu"]))
    return rows


def gib(x: float) -> float:
    return x / GiB
