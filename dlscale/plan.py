"""``dlscale plan``: for each strategy and degree a job allows, the predicted memory per device
(``memplan``), whether it fits, the largest batch that fits, and a first-order throughput.

Throughput model (until the performance-model package, ``dlscale.perfmodel``, offers a stable entry
point for non-DDP strategies; connect it in ``predict_step``): per optimizer step on each device,

    compute   = training FLOPs of its share of the global batch x recompute / (peak x efficiency)
                recompute: full checkpointing runs the blocks' forward twice (+1/3 of their
                FLOPs), selective recomputes the even-numbered matmuls (their share of a third)
    tensor    = 4 all-reduces per block and micro-batch (2 forward, 2 backward) of the block's
                activations (bf16), ring time 2 (tp-1)/tp x bytes / bus bandwidth, not overlapped
    pipeline  = (compute + tensor) x (m + pp - 1) / m  (the 1F1B/GPipe bubble)
    data      = ddp: all-reduce of the fp32 gradients, hidden behind the backward (2/3 of compute)
                as far as it fits; zero1: the same plus an all-gather of the updated parameters;
                fsdp: all-gathers of the bf16 parameters (forward, and backward for zero3) and a
                reduce-scatter of the fp32 gradients, hidden behind the whole compute
    step      = pipeline + exposed data time;  tokens/s/GPU = global batch x seq / step / GPUs

``efficiency`` is the fraction of the peak one device reaches on this model (``--mfu``, default
0.40: dlscale's Llama-style 1B/3B target region on one H200; measure yours with ``dlscale run``).
Bus bandwidths: within a node (``--intra-busbw``, NVLink class) and per GPU across nodes
(``--inter-busbw``); a group that spans nodes runs at the inter-node figure.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError
from dlscale.memplan import _MATMULS, GiB, Layout, Workload, candidate_layouts, family, largest_batch, plan_memory


@dataclass(frozen=True)
class Machine:
    """What the plan assumes about the devices and their links."""

    gpus: int
    nodes: int
    memory_bytes: float
    peak_flops: float  # dense bf16 (fp32: tf32) FLOP/s of one device
    efficiency: float = 0.40
    intra_busbw: float = 300e9  # bytes/s
    inter_busbw: float = 50e9  # bytes/s per GPU across nodes
    headroom: float = 0.10  # of the memory kept free: CUDA context, allocator cache and fragmentation

    @property
    def per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def capacity(self) -> float:
        return self.memory_bytes * (1 - self.headroom)


def recompute_factor(arch, checkpointing: str) -> float:
    """Training FLOPs with recomputation / without (block matmuls only; attention is kept)."""
    if checkpointing == "none":
        return 1.0
    if checkpointing == "full":
        return 1 + 1 / 3
    mms = _MATMULS[family(arch)]
    dims = {"h": arch.hidden, "A": arch.attn_dim, "kv": arch.kv_dim, "f": arch.ffn_hidden}
    sizes = [sum(n * dims[d] for d, n in out.items()) for out in mms]
    return 1 + (sum(sizes[1::2]) / sum(sizes)) / 3


def _ring(nbytes: float, n: int, busbw: float, factor: float) -> float:
    return 0.0 if n <= 1 else factor * (n - 1) / n * nbytes / busbw


def predict_step(work: Workload, layout: Layout, batch: int, machine: Machine, params_dev: float) -> dict[str, float]:
    """Seconds of one step and tokens/s per GPU for ``batch`` (dlscale's --batch-size) on ``layout``."""
    arch = work.spec.arch
    world = layout.world
    global_batch = batch * layout.dp  # model-parallel ranks share their batch
    flops_dev = work.spec.flops_per_sample * global_batch / world * recompute_factor(arch, work.checkpointing)
    compute = flops_dev / (machine.peak_flops * machine.efficiency)
    tp_link = machine.intra_busbw if layout.tp <= machine.per_node else machine.inter_busbw
    act_bytes = 2 * batch / layout.microbatches * arch.seq_len * arch.hidden
    blocks_dev = -(-arch.n_layers // layout.pp)
    tensor = 4 * blocks_dev * layout.microbatches * _ring(act_bytes, layout.tp, tp_link, 2)
    pipeline = (compute + tensor) * (layout.microbatches + layout.pp - 1) / layout.microbatches
    spans = layout.world > machine.per_node and layout.dp > 1
    dp_link = machine.inter_busbw if spans else machine.intra_busbw
    if layout.zero >= 2:
        gathers = 2 if layout.zero == 3 else 1
        comm = (gathers * _ring(2 * params_dev, layout.dp_shard, dp_link, 1)  # bf16 parameters gathered
                + _ring(4 * params_dev, layout.dp_shard, dp_link, 1))  # fp32 gradients reduce-scattered
        comm += _ring(4 * params_dev / layout.dp_shard, layout.dp_replicate, machine.inter_busbw, 2)  # hsdp
        exposed = max(0.0, comm - compute)
    else:
        comm = _ring(4 * params_dev, layout.dp, dp_link, 2)
        exposed = max(0.0, comm - 2 / 3 * compute)
        if layout.zero == 1:
            exposed += _ring(4 * params_dev, layout.dp, dp_link, 1)
    step = pipeline + exposed
    tokens = global_batch * arch.seq_len / step / world
    return {"step_s": step, "compute_s": compute, "tensor_s": tensor, "bubble_s": pipeline - compute - tensor,
            "data_comm_s": comm, "exposed_s": exposed, "tokens_per_s_per_gpu": tokens,
            "mfu": work.spec.flops_per_sample / arch.seq_len * tokens / machine.peak_flops}


def plan_rows(work: Workload, machine: Machine, batch: int, microbatches: int = 4, schedule: str = "1f1b",
              sequence_parallel: bool = False, strategies: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per layout: memory terms, fit, largest batch, predicted throughput (best first)."""
    if machine.nodes < 1 or machine.gpus % machine.nodes:
        raise ConfigError(f"--nodes {machine.nodes} must divide --gpus {machine.gpus}")
    rows = []
    for layout in candidate_layouts(work.spec, machine.gpus, machine.per_node, machine.nodes, microbatches,
                                    schedule, sequence_parallel):
        if strategies and layout.name not in strategies:
            continue
        b = batch if layout.microbatches == 1 else -(-batch // layout.microbatches) * layout.microbatches
        mem = plan_memory(work, layout, b)
        best = largest_batch(work, layout, machine.capacity)
        perf = predict_step(work, layout, b, machine, mem.detail["params_on_device"])
        rows.append({**mem.as_dict(), "fits": mem.peak <= machine.capacity, "max_batch_size": best,
                     "capacity_bytes": machine.capacity, **perf})
    rows.sort(key=lambda r: (not r["fits"], -r["tokens_per_s_per_gpu"]))
    return rows


def gib(x: float) -> float:
    return x / GiB
