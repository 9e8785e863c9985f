"""One step model for every parallel strategy: data (ddp, zero1), sharded (fsdp zero2/zero3, hsdp),
tensor, pipeline and their dp x tp x pp compositions (docs/metrics.md, "Performance model of the
parallel strategies").

Per optimizer step and device::

    GPU path = compute + communication on the critical path - what the implementation hides
               + the optimizer update and the weight casts (memory-bound, once a step)
    step     = max(GPU path, host work)

(host work: the block passes at the measured block floor, plus per FSDP unit and per tensor-parallel Linear the
``HostCosts`` fitted on measured records by ``host.fit_host_costs``; none measured, nothing added)

Compute is FLOPs over an achieved rate, ``peak x efficiency``; the efficiency comes from a
measurement wherever one exists (``predict`` picks it in this order: the same configuration at
fewer devices, the same model under another strategy, a ``micro layer`` timing of the block, and
only then an assumed MFU, which the prediction says it is). Every collective is priced with the
alpha-beta link model of ``core`` (``Links``: the intra-node figure by GPUs spanned, the inter-node
figure per node, shared by every group of the node that crosses it).

The entry point is ``predict(candidate, arch, machine, evidence)``; ``plan`` and ``predict
--strategy`` call it, and so can a tuner ranking configurations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from dlscale import ConfigError
from dlscale.perfmodel.core import Links, inter_allreduce_s, ring_allreduce_s

FAMILIES = ("single", "ddp", "zero1", "fsdp", "hsdp", "tensor", "pipeline", "hybrid")
SCHEDULES = ("gpipe", "1f1b", "interleaved")
CHECKPOINTING = ("none", "selective", "full")
# where the compute rate came from, best first (``predict`` takes the first that exists)
BASES = ("measured", "from-1-gpu", "from-node", "from-multinode", "other-strategy", "micro-layer", "assumed-mfu")
# The band of a prediction by basis, (below, above): how far below / above it the measured throughput fell, the
# 80th percentile of each side over the validation's held-out points of that basis (benchmarks/
# perfmodel_validate.py --strategies-only), at least 5 %: from-node and from-multinode on the published tables
# (the same configuration at fewer devices: under 2 % below, none above); from-1-gpu on the project's own 2-GPU
# records (with the host-work term; their spread is mostly the same configuration measured on different days);
# assumed-mfu as the published tables predicted at a compute rate fitted on the other sources. Bases without points of their own
# borrow: measured the from-node figure, other-strategy and micro-layer from-1-gpu's.
BAND: dict[str, tuple[float, float]] = {
    "measured": (0.05, 0.05), "from-node": (0.05, 0.05), "from-multinode": (0.05, 0.05),
    "from-1-gpu": (0.22, 0.45), "other-strategy": (0.22, 0.45), "micro-layer": (0.22, 0.45),
    "assumed-mfu": (0.32, 0.34)}
DEFAULT_MFU = 0.40  # the assumption where nothing is measured (plan's --mfu)
# HBM bytes of a matmul weight's casts per forward + backward pass, (forward, gradient), whatever the batch: under
# AMP the fp32 weight is cast for the forward (read 4, write 2; torchao's float8: amax read 4, cast read 4 write 1)
# and its bf16 gradient cast back to fp32 (read 2, write 4). The output projection stays bf16 under fp8.
CAST_BYTES = {"amp-bf16": (6.0, 6.0), "amp-fp16": (6.0, 6.0), "fp8": (9.0, 6.0)}


# ----------------------------------------------------------------------------- typed inputs

@dataclass(frozen=True)
class Candidate:
    """One configuration of a job: the strategy, its degrees (mesh order dp_replicate, dp_shard, pp, tp:
    tp fastest, inside a node) and the step's settings.

    ``batch_size`` is what one data-parallel rank consumes per step (dlscale's ``--batch-size``; a
    pipeline cuts it into ``microbatches``). ``zero``: 0 replicas, 1 optimizer sharded, 2/3 FSDP over
    ``dp_shard`` (HSDP: ``dp_replicate`` > 1 too). ``head_sharded``: the output projection split over tp
    (Megatron, torchtitan); dlscale's tensor strategy replicates it. ``dp_overlap``: whether gradient
    and parameter traffic runs behind compute (None: as dlscale's strategy does it). ``param_bytes`` /
    ``grad_bytes``: bytes per gathered parameter and per reduced gradient (None: 2 under AMP / 4, and 4).
    """

    strategy: str
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    batch_size: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual: int = 1
    sequence_parallel: bool = False
    checkpointing: str = "none"
    precision: str = "amp-bf16"
    blocks_per_unit: int = 1
    head_sharded: bool = False
    balance: str = "time"
    dp_overlap: bool | None = None
    param_bytes: float | None = None
    grad_bytes: float | None = None
    compiled: bool = False

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def amp(self) -> bool:
        return self.precision != "fp32"

    @property
    def label(self) -> str:
        parts = [f"{k}{v}" for k, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp)) if v > 1]
        zero = {1: " zero1", 2: " zero2", 3: " zero3"}.get(self.zero, "")
        return f"{self.strategy}{zero} {'x'.join(parts) or '1 device'} b{self.batch_size}" + (
            f" m{self.microbatches} {self.schedule}" if self.pp > 1 else "")

    def same_config(self, other: "Candidate") -> bool:
        """Same strategy, degrees per model replica, batch and step settings (the data-parallel degree may differ)."""
        keys = ("strategy", "tp", "pp", "zero", "batch_size", "microbatches", "schedule", "virtual",
                "sequence_parallel", "checkpointing", "precision", "head_sharded", "compiled")
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    @classmethod
    def from_layout(cls, layout: Any, batch_size: int, checkpointing: str = "none", precision: str = "amp-bf16",
                    compiled: bool = False) -> "Candidate":
        """The candidate of a ``memplan.Layout`` (what ``plan`` enumerates and strategies declare)."""
        return cls(strategy=layout.name, dp_replicate=layout.dp_replicate, dp_shard=layout.dp_shard, tp=layout.tp,
                   pp=layout.pp, zero=layout.zero, batch_size=batch_size, microbatches=layout.microbatches,
                   schedule=layout.schedule, virtual=int((layout.options or {}).get("virtual", 2))
                   if layout.schedule == "interleaved" else 1, sequence_parallel=layout.sequence_parallel,
                   checkpointing=checkpointing, precision=precision,
                   blocks_per_unit=int((layout.options or {}).get("blocks_per_unit") or 1), compiled=compiled,
                   param_bytes=None if layout.fsdp_params_bf16 or layout.zero < 2 else 4.0)


@dataclass(frozen=True)
class HostCosts:
    """Host seconds a step of dlscale's strategies spends beyond the model's own kernel launches, which no GPU
    work hides once they exceed it: per FSDP unit (FSDP2's all-gather and reduce-scatter launches, the
    per-parameter copy-in / copy-out, its hooks) and per tensor-parallel Linear of a block (DTensor's dispatch
    and sharding propagation, forward and backward). Fitted on measured records (``host.fit_host_costs``);
    0: none measured, nothing added."""

    fsdp_unit_s: float = 0.0
    tp_linear_s: float = 0.0
    source: str = ""

    def __bool__(self) -> bool:
        return bool(self.fsdp_unit_s or self.tp_linear_s)


@dataclass(frozen=True)
class Machine:
    """The devices of a job: how many, GPUs per node, peak FLOP/s of one device and the links.

    ``block_floor_s``: the shortest forward + backward one block of the model takes on this stack whatever its
    FLOPs (the host's time to launch its kernels: an eager model at small micro-batches), from a measured
    block timing (``evidence.block_floor``); 0: none known, a block's time is its FLOPs over the rate.
    ``host``: the strategies' own host work (``HostCosts``) on this stack. ``mem_bw_bps``: one device's memory
    bandwidth (bytes/s), what the once-a-step optimizer update and weight casts run at; 0: unknown, not priced."""

    gpus: int
    gpus_per_node: int
    peak_flops: float
    links: Links = field(default_factory=Links)
    name: str = ""
    block_floor_s: float = 0.0
    host: HostCosts = field(default_factory=HostCosts)
    mem_bw_bps: float = 0.0

    @property
    def nodes(self) -> int:
        return max(1, self.gpus // self.gpus_per_node)


@dataclass(frozen=True)
class Reference:
    """A measured point the compute rate can be taken from: its configuration, machine and throughput."""

    candidate: Candidate
    machine: Machine
    tokens_per_s_per_device: float
    ref: str = ""
    rel_spread: float | None = None


@dataclass(frozen=True)
class LayerTiming:
    """A ``micro layer`` record of the model's block shape: forward + backward seconds and the FLOPs they ran."""

    seconds: float
    flops: float
    ref: str = ""


@dataclass(frozen=True)
class Evidence:
    """What the compute rate may come from (see ``predict``)."""

    references: tuple[Reference, ...] = ()
    layer: LayerTiming | None = None
    assumed_mfu: float = DEFAULT_MFU
    # the block floor by compile setting, for a target machine given without one (``Machine.block_floor_s``)
    block_floors: dict[bool, float] = field(default_factory=dict)
    # the strategies' host work by (compile setting, several ranks), for a target machine given without it
    # (``Machine.host``; ``host.fit_host_costs``)
    host_costs: dict[tuple[bool, bool], HostCosts] = field(default_factory=dict)
    # micro layer timings by the (precision, compiled) of the candidates they stand for
    # (``evidence.layer_timing``); ``layer``, where given, stands for every candidate
    layers: dict[tuple[str, bool], LayerTiming] = field(default_factory=dict)

    def layer_for(self, c: "Candidate") -> LayerTiming | None:
        return self.layer or self.layers.get((c.precision, c.compiled))


@dataclass(frozen=True)
class Rate:
    """The achieved fraction of the peak on the model's compute, and where it came from."""

    efficiency: float
    basis: str
    evidence: str
    rel_spread: float = 0.0
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Terms:
    """Seconds of one step on the busiest device, by what they are."""

    compute_s: float
    tp_s: float = 0.0  # tensor-parallel collectives (on the critical path)
    p2p_s: float = 0.0  # pipeline sends on the critical path
    bubble_s: float = 0.0  # pipeline fill and drain
    dp_total_s: float = 0.0  # data-parallel traffic (gradients, parameter gathers) in all
    dp_exposed_s: float = 0.0  # of which not hidden behind compute
    step_s: float = 0.0
    dp_what: str = ""
    host_s: float = 0.0  # the host's work of the step (kernel launches, FSDP units, DTensor dispatch)
    host_exposed_s: float = 0.0  # by how much it exceeds the GPU's critical path
    update_s: float = 0.0  # optimizer update and weight casts: once a step, whatever the batch (in step_s)

    def losses(self) -> dict[str, float]:
        return {"tensor-parallel collectives": self.tp_s, "pipeline p2p": self.p2p_s, "pipeline bubble": self.bubble_s,
                self.dp_what or "data-parallel traffic": self.dp_exposed_s, "host work": self.host_exposed_s,
                "optimizer update and weight casts": self.update_s}

    def with_update(self, update_s: float) -> "Terms":
        """The step with the optimizer update and weight casts after the backward, on the GPU's path."""
        return replace(self, update_s=update_s, step_s=self.step_s + update_s)

    def with_host(self, host_s: float) -> "Terms":
        """The step as the longer of the GPU's critical path and the host's work: the host launches ahead of
        the GPU, so whichever is longer sets the step."""
        gpu = self.step_s
        return replace(self, host_s=host_s, host_exposed_s=max(0.0, host_s - gpu), step_s=max(gpu, host_s))


@dataclass
class StepPrediction:
    """The predicted step of one candidate: time, throughput, MFU, the basis of its compute, band, limit."""

    candidate: Candidate
    terms: Terms
    tokens_per_s_per_device: float
    mfu: float
    basis: str
    evidence: str
    low: float
    high: float
    limited_by: str
    efficiency: float
    notes: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        return self.terms.step_s

    def to_dict(self) -> dict[str, Any]:
        t = self.terms
        return {"strategy": self.candidate.strategy, "config": self.candidate.label, "step_ms": t.step_s * 1e3,
                "compute_ms": t.compute_s * 1e3, "tp_ms": t.tp_s * 1e3, "p2p_ms": t.p2p_s * 1e3,
                "bubble_ms": t.bubble_s * 1e3, "dp_comm_ms": t.dp_total_s * 1e3, "dp_exposed_ms": t.dp_exposed_s * 1e3,
                "host_ms": t.host_s * 1e3, "update_ms": t.update_s * 1e3,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_device, "tokens_per_s_per_gpu_low": self.low,
                "tokens_per_s_per_gpu_high": self.high, "mfu": self.mfu, "basis": self.basis,
                "evidence": self.evidence, "limited_by": self.limited_by, "efficiency": self.efficiency,
                "notes": list(self.notes)}


# ----------------------------------------------------------------------------- checks

def check_candidate(c: Candidate, arch: Any, machine: Machine) -> None:
    """ConfigError (one line) for a candidate the model cannot price on ``machine``."""
    if c.strategy not in FAMILIES:
        raise ConfigError(f"the performance model has no strategy {c.strategy!r}; it models {', '.join(FAMILIES)}")
    for name in ("dp_replicate", "dp_shard", "tp", "pp", "batch_size", "microbatches", "virtual", "blocks_per_unit"):
        v = getattr(c, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
    if machine.gpus % machine.gpus_per_node and machine.gpus > machine.gpus_per_node:
        raise ConfigError(f"{machine.gpus} GPUs do not fill nodes of {machine.gpus_per_node}")
    if c.devices != machine.gpus:
        raise ConfigError(f"degrees dp {c.dp} x tp {c.tp} x pp {c.pp} = {c.devices} do not match the {machine.gpus} "
                          f"GPUs")
    if c.tp > 1 and (machine.gpus_per_node % c.tp if c.tp <= machine.gpus_per_node else True):
        raise ConfigError(f"tensor parallel degree {c.tp} must divide the {machine.gpus_per_node} GPUs of a node "
                          f"(tp runs inside a node)")
    for what, n in (("attention heads", arch.n_heads), ("key/value heads", arch.kv_heads),
                    ("MLP width", arch.ffn_hidden)):
        if n % c.tp:
            raise ConfigError(f"tensor parallel degree {c.tp} does not divide the model's {n} {what}")
    if c.pp * c.virtual > arch.n_layers:
        raise ConfigError(f"{c.pp * c.virtual} pipeline stages for {arch.n_layers} blocks")
    if c.schedule not in SCHEDULES or c.checkpointing not in CHECKPOINTING:
        raise ConfigError(f"schedule must be one of {', '.join(SCHEDULES)} and checkpointing one of "
                          f"{', '.join(CHECKPOINTING)}; got {c.schedule!r}, {c.checkpointing!r}")
    if c.pp > 1 and c.batch_size % c.microbatches:
        raise ConfigError(f"microbatches {c.microbatches} must divide the batch size {c.batch_size}")
    if c.zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero stage must be 0..3, got {c.zero!r}")
    if machine.nodes > 1 and machine.links.inter is None and _crosses_nodes(c, machine):
        raise ConfigError(f"{machine.gpus} GPUs on {machine.nodes} nodes need the inter-node link: give "
                          f"--inter-busbw GBPS (per node)")
    if machine.links.intra_for(machine.gpus_per_node) is None and c.devices > 1 and machine.gpus_per_node > 1:
        raise ConfigError("a multi-GPU shape needs the intra-node link: give --intra-busbw GBPS")


def _crosses_nodes(c: Candidate, machine: Machine) -> bool:
    return c.devices > machine.gpus_per_node


# ----------------------------------------------------------------------------- collectives on the mesh

@dataclass(frozen=True)
class Group:
    """One process group of a mesh dimension: ``k`` members on each of ``m`` nodes; ``c`` such groups on
    every node share its inter-node link."""

    k: int
    m: int
    c: int

    @property
    def size(self) -> int:
        return self.k * self.m


def mesh_group(stride: int, size: int, gpus_per_node: int) -> Group:
    """The group of a mesh dimension whose consecutive members are ``stride`` ranks apart (tp: 1, pp: tp,
    dp_shard: tp x pp, dp_replicate: tp x pp x dp_shard), on nodes of ``gpus_per_node`` consecutive ranks."""
    if size <= 1:
        return Group(1, 1, 1)
    # members 0, stride, 2 stride, ... that fall in the first node (a pipeline's first and last stage,
    # stride tp x (pp - 1), share a node of 8 at pp 8 although 8 // 7 is 1)
    k = 1 if stride >= gpus_per_node else max(1, min(size, (gpus_per_node - 1) // stride + 1))
    m = max(1, -(-size // k))
    return Group(k, m, max(1, gpus_per_node // k) if m > 1 else 1)


def _intra(links: Links, k: int):
    link = links.intra_for(k)
    if link is None:
        raise ConfigError(f"a group of {k} GPUs in a node needs the intra-node link: give --intra-busbw GBPS")
    return link


def _inter(links: Links, m: int):
    if links.inter is None:
        raise ConfigError(f"a group across {m} nodes needs the inter-node link: give --inter-busbw GBPS (per node)")
    return links.inter


def allreduce_group_s(nbytes: float, g: Group, links: Links) -> float:
    """All-reduce of ``nbytes`` in a group: reduce-scatter and all-gather in each node (2(k-1) a + 2S(k-1)/k /
    B_intra(k)), the nodes' all-reduce of the c groups' S over the node's link (ring or tree, as ``core``)."""
    if nbytes <= 0 or g.size <= 1:
        return 0.0
    t = 0.0
    if g.k > 1:
        t += ring_allreduce_s(nbytes, g.k, _intra(links, g.k))
    if g.m > 1:
        _inter(links, g.m)
        t += inter_allreduce_s(g.c * nbytes, g.m, links)  # the node's c groups share its link
    return t


def gather_group_s(nbytes: float, g: Group, links: Links) -> float:
    """All-gather (or reduce-scatter) whose full buffer is ``nbytes``: (k-1) a + S(k-1)/k / B_intra(k) in the
    node, (m-1) a + c S (m-1)/m / B_inter across nodes (each node receives what the other nodes hold)."""
    if nbytes <= 0 or g.size <= 1:
        return 0.0
    t = 0.0
    if g.k > 1:
        link = _intra(links, g.k)
        t += (g.k - 1) * link.latency_s + nbytes * (g.k - 1) / g.k / link.busbw_bps
    if g.m > 1:
        inter = _inter(links, g.m)
        t += (g.m - 1) * inter.latency_s + g.c * nbytes * (g.m - 1) / g.m / inter.busbw_bps
    return t


def p2p_s(nbytes: float, g: Group, links: Links) -> float:
    """One pipeline send on the slowest boundary: inside a node at the intra figure, across nodes at the
    node's link shared by the c pipelines that cross it at once."""
    if nbytes <= 0 or g.size <= 1:
        return 0.0
    if g.m > 1:
        inter = _inter(links, g.m)
        return inter.latency_s + g.c * nbytes / inter.busbw_bps
    link = _intra(links, 2)
    return link.latency_s + nbytes / link.busbw_bps


def groups(c: Candidate, gpus_per_node: int) -> dict[str, Group]:
    """The group of each mesh dimension (ParallelDims' order: dp_replicate, dp_shard, pp, tp)."""
    return {"tp": mesh_group(1, c.tp, gpus_per_node), "pp": mesh_group(c.tp, c.pp, gpus_per_node),
            "dp_shard": mesh_group(c.tp * c.pp, c.dp_shard, gpus_per_node),
            "dp_replicate": mesh_group(c.tp * c.pp * c.dp_shard, c.dp_replicate, gpus_per_node),
            "dp": mesh_group(c.tp * c.pp, c.dp, gpus_per_node)}


# ----------------------------------------------------------------------------- FLOPs of the pieces

def block_flops_per_token(arch: Any) -> float:
    """Training FLOPs per token of one block: 6 x its matmul parameters + 12 x attention width x sequence
    (the block's share of ``arch.flops_per_token``, PaLM appendix B)."""
    matmul = arch.block_params() - 2 * arch.norm_params
    return 6.0 * matmul + 12.0 * arch.attn_dim * arch.seq_len


def head_flops_per_token(arch: Any) -> float:
    """Everything of ``arch.flops_per_token`` outside the blocks: the output projection (and BERT's heads)."""
    return max(0.0, arch.flops_per_token() - arch.n_layers * block_flops_per_token(arch))


def recompute_extra(arch: Any, checkpointing: str) -> float:
    """Extra block FLOPs of recomputation, a share of the block's training FLOPs: full checkpointing runs the
    forward again (+1/3); selective (torchtitan's op policy, as dlscale's) recomputes every other matmul."""
    if checkpointing == "none":
        return 0.0
    if checkpointing == "full":
        return 1.0 / 3.0
    from dlscale.planner.memplan import _MATMULS, family  # keeps the CLI start-up light

    dims = {"h": arch.hidden, "A": arch.attn_dim, "kv": arch.kv_dim, "f": arch.ffn_hidden}
    sizes = [sum(n * dims[d] for d, n in out.items()) for out in _MATMULS[family(arch)]]
    return (sum(sizes[1::2]) / sum(sizes)) / 3.0


def stage_blocks(n_layers: int, pp: int, head_blocks: float, balance: str) -> tuple[int, bool]:
    """(blocks on the busiest stage, whether it is the last, which also runs the head) for ``pp`` stages.

    ``blocks``: an even split, the first stages taking the remainder (as dlscale's and Megatron's). ``time``:
    the contiguous split that minimises the slowest stage with the head worth ``head_blocks`` blocks on the
    last (dlscale's default ``balance=time``)."""
    if pp == 1:
        return n_layers, True
    if balance != "time":
        first, last = -(-n_layers // pp), n_layers // pp
        return (first, False) if first > last + head_blocks else (last, True)
    best: tuple[float, int, bool] | None = None
    for k_last in range(0, n_layers - pp + 2):
        rest = -(-(n_layers - k_last) // (pp - 1))
        cost = max(rest, k_last + head_blocks)
        cand = (cost, rest if rest >= k_last + head_blocks else k_last, rest < k_last + head_blocks)
        if best is None or cand[0] < best[0]:
            best = cand
    return (best[1], best[2]) if best else (-(-n_layers // pp), False)


# ----------------------------------------------------------------------------- the step

@dataclass(frozen=True)
class _Pieces:
    """Per micro-batch on the busiest stage: forward and backward seconds of one block and of the head, the
    tensor-parallel seconds per block, and the parameter bytes of a block and of the rest on a device."""

    block_f: float
    block_b: float
    head_f: float
    head_b: float
    tp_block_f: float
    tp_block_b: float
    blocks: int
    has_head: bool
    block_params: float
    root_params: float

    @property
    def held_params(self) -> float:
        """The parameters of the busiest stage on one device (before any data-parallel sharding)."""
        return self.blocks * self.block_params + self.root_params


def _pieces(c: Candidate, arch: Any, machine: Machine, eff: float) -> _Pieces:
    rate = machine.peak_flops * eff
    tokens = c.batch_size // c.microbatches * arch.seq_len if c.pp > 1 else c.batch_size * arch.seq_len
    # forward + backward of one block: its FLOPs over the rate, or the host's floor where that is longer
    blk = max(block_flops_per_token(arch) * tokens / c.tp / rate, machine.block_floor_s)
    head_div = c.tp if c.head_sharded else 1
    head = head_flops_per_token(arch) * tokens / head_div / rate
    extra = recompute_extra(arch, c.checkpointing) * blk
    act_bytes = 2.0 if c.amp else 4.0
    g = groups(c, machine.gpus_per_node)
    ar = allreduce_group_s(tokens * arch.hidden * act_bytes, g["tp"], machine.links) if c.tp > 1 else 0.0
    # Megatron's column/row split: 2 all-reduces a block forward, 2 backward (sequence parallel: an
    # all-gather and a reduce-scatter for each, the same bytes); full checkpointing repeats the forward's
    recompute_ar = 2 * ar if c.checkpointing == "full" else 0.0
    blocks, has_head = stage_blocks(arch.n_layers, c.pp, head / blk if blk > 0 else 0.0, c.balance)
    norm_in = 2 * arch.norm_params
    block_dev = (arch.block_params() - norm_in) / c.tp + norm_in
    final = arch.norm_params if arch.final_norm else 0
    root = (arch.embedding_params() + arch.head_params() + final + arch.extra_params) / (c.tp if c.head_sharded else 1)
    if c.pp > 1:
        root = root / 2  # the embedding on the first stage, the head on the last
    return _Pieces(blk / 3, 2 * blk / 3 + extra, head / 3, 2 * head / 3, 2 * ar, 2 * ar + recompute_ar, blocks,
                   has_head, block_dev, root)


def two_streams(tasks: list[tuple[float, float, float]]) -> float:
    """End of a sequence of (collective before, compute, collective after) tasks on one compute stream and one
    communication stream, each collective before a task prefetched one task ahead (issued when the previous
    task's compute starts, as FSDP2's forward and backward prefetch), each collective after queued when its
    compute ends (gradient buckets, reduce-scatters)."""
    if not tasks:
        return 0.0
    comm = tasks[0][0]
    ready = [0.0] * len(tasks)
    ready[0] = comm
    comp = 0.0
    for i, (_, work, after) in enumerate(tasks):
        start = max(comp, ready[i])
        comp = start + work
        if i + 1 < len(tasks) and tasks[i + 1][0] > 0:
            comm = max(comm, start) + tasks[i + 1][0]
            ready[i + 1] = comm
        if after > 0:
            comm = max(comm, comp) + after
    return max(comp, comm)


def tp_linears(arch: Any) -> int:
    """The Linears of a block that tensor parallelism shards (column- and row-wise): each a DTensor op forward
    and backward."""
    return len(arch.layout.colwise) + len(arch.layout.rowwise)


def host_s(c: Candidate, arch: Any, machine: Machine, block_passes: int, units: int) -> float:
    """The host's work of a step on the busiest device: ``block_passes`` forward + backward block passes at the
    block floor (the model's own launches), each with its tensor-parallel Linears' DTensor dispatch when
    tp > 1, and ``units`` FSDP units' per-step work when the parameters are sharded (zero 2/3)."""
    h = machine.host
    per_block = machine.block_floor_s + (tp_linears(arch) * h.tp_linear_s if c.tp > 1 else 0.0)
    return block_passes * per_block + (units * h.fsdp_unit_s if c.zero >= 2 else 0.0)


def update_bytes_per_param() -> float:
    """HBM bytes of the fused AdamW update per parameter (the transformers' optimizer; fp32 master weights and
    gradients): it reads parameter, gradient and both moments and writes parameter and moments."""
    from dlscale.planner.memplan import OPTIMIZER_STATE_BYTES  # keeps the CLI start-up light

    return 4.0 + 4.0 + 4.0 + 2.0 * OPTIMIZER_STATE_BYTES["adamw"]


def block_cast_bytes(c: Candidate, arch: Any, block_params: float) -> float:
    """Cast bytes of one forward + backward pass of a block's weights (recomputation casts its share again)."""
    fwd, grad = CAST_BYTES.get(c.precision, (0.0, 0.0))
    return block_params * (fwd * (1.0 + 3.0 * recompute_extra(arch, c.checkpointing)) + grad)


def update_s(c: Candidate, arch: Any, machine: Machine, p: "_Pieces") -> float:
    """Seconds of the once-a-step memory-bound work on the busiest device at its memory bandwidth: the optimizer
    update of the parameters it holds (zero1: 1/dp of them, FSDP: 1/dp_shard) and, per micro-batch, the casts of
    its block weights and the head's (sharded weights are cast before they are gathered); 0 where the bandwidth
    is unknown."""
    if not machine.mem_bw_bps:
        return 0.0
    shard = c.dp_shard if c.zero >= 2 else 1
    update = p.held_params / (c.dp if c.zero == 1 else shard) * update_bytes_per_param()
    # the output projection's weight, tied to the embedding or not, is cast for its matmul
    head = arch.rows * arch.hidden / (c.tp if c.head_sharded else 1) if p.has_head else 0.0
    head_c = replace(c, precision="amp-bf16") if c.precision == "fp8" else c
    passes = c.microbatches if c.pp > 1 else 1
    casts = passes * (p.blocks * block_cast_bytes(c, arch, p.block_params) + block_cast_bytes(head_c, arch, head))
    return (update + casts / shard) / machine.mem_bw_bps


def _dp_collectives(c: Candidate, machine: Machine, params: float) -> tuple[float, float, float]:
    """(gather before a unit's forward/backward, reduction after its backward, the zero1 parameter broadcast)
    seconds for ``params`` parameters of one unit on a device."""
    g = groups(c, machine.gpus_per_node)
    links = machine.links
    gb = c.grad_bytes or 4.0
    if c.zero >= 2:
        pb = c.param_bytes or (2.0 if c.amp else 4.0)
        gather = gather_group_s(pb * params, g["dp_shard"], links)
        reduce = gather_group_s(gb * params, g["dp_shard"], links)
        # HSDP: the reduce-scattered shard all-reduced across the replicas
        reduce += allreduce_group_s(gb * params / c.dp_shard, g["dp_replicate"], links)
        return gather, reduce, 0.0
    reduce = allreduce_group_s(gb * params, g["dp"], links)
    bcast = gather_group_s(4.0 * params, g["dp"], links) if c.zero == 1 else 0.0
    return 0.0, reduce, bcast


def _dp_overlap(c: Candidate) -> bool:
    if c.dp_overlap is not None:
        return c.dp_overlap
    # dlscale's hybrid with pp > 1 and dp_shard=ddp averages the gradients after the schedule, not overlapped
    return not (c.strategy == "hybrid" and c.pp > 1 and c.zero < 2)


def _flat_step(c: Candidate, arch: Any, machine: Machine, p: _Pieces) -> Terms:
    """No pipeline: the blocks' forward and backward (tensor-parallel collectives in them) on one stream, the
    data-parallel traffic per unit on the other (``two_streams``)."""
    units = [min(c.blocks_per_unit, p.blocks - i) for i in range(0, p.blocks, c.blocks_per_unit)]
    compute = p.blocks * (p.block_f + p.block_b) + p.head_f + p.head_b
    tp = p.blocks * (p.tp_block_f + p.tp_block_b)
    host = host_s(c, arch, machine, p.blocks, len(units) + 1)
    if c.dp == 1:
        return Terms(compute, tp, step_s=compute + tp).with_update(update_s(c, arch, machine, p)).with_host(host)
    zero3 = c.zero == 3
    g_root, r_root, b_root = _dp_collectives(c, machine, p.root_params)
    per = [_dp_collectives(c, machine, n * p.block_params) for n in units]
    fwd = [(g_root, 0.0, 0.0)] + [(gu, n * (p.block_f + p.tp_block_f), 0.0) for n, (gu, _, _) in zip(units, per)]
    fwd.append((0.0, p.head_f, 0.0))
    bwd = [(0.0, p.head_b, 0.0)] + [(gu if zero3 else 0.0, n * (p.block_b + p.tp_block_b), ru)
                                    for n, (gu, ru, _) in reversed(list(zip(units, per)))]
    bwd.append((0.0, 0.0, r_root))
    total = (g_root + r_root + sum(gu * (2 if zero3 else 1) + ru for gu, ru, _ in per)) if c.zero >= 2 else \
        (r_root + sum(ru for _, ru, _ in per))
    bcast = b_root + sum(b for _, _, b in per)  # zero1: updated parameters broadcast after the step
    busy = compute + tp
    if _dp_overlap(c):
        exposed = two_streams(fwd + bwd) - busy + bcast
    else:
        exposed = total + bcast
    what = {0: "gradient all-reduce", 1: "gradient all-reduce + parameter broadcast"}.get(
        c.zero, "FSDP all-gather/reduce-scatter" + (" + replica all-reduce" if c.dp_replicate > 1 else ""))
    return Terms(compute, tp, dp_total_s=total + bcast, dp_exposed_s=max(0.0, exposed), step_s=busy + max(0.0, exposed),
                 dp_what=what).with_update(update_s(c, arch, machine, p)).with_host(host)


def _pipeline_step(c: Candidate, arch: Any, machine: Machine, p: _Pieces) -> Terms:
    """A pipeline of ``pp`` stages, ``m`` micro-batches: every slot (one micro-batch's forward and backward on
    the busiest stage, its tensor-parallel collectives and two sends) repeated m + (pp - 1)/v times (GPipe and
    1F1B: v = 1; interleaved: v virtual stages a rank, v times the sends); the bubble is the (pp - 1)/v extra
    slots, (pp - 1)/(m + pp - 1) of the step for v = 1; tied embeddings add the first and last stage's
    all-reduce of their gradient (counted with the sends). Data-parallel traffic over the stage's parameters once
    a step, behind the schedule but for one unit's gather and reduction (dlscale's hybrid with replicas
    averages after the schedule, not overlapped)."""
    m = c.microbatches
    v = c.virtual if c.schedule == "interleaved" else 1
    mb_compute = p.blocks * (p.block_f + p.block_b) + (p.head_f + p.head_b if p.has_head else 0.0)
    mb_tp = p.blocks * (p.tp_block_f + p.tp_block_b)
    act = 2.0 if c.amp else 4.0
    nbytes = c.batch_size // m * arch.seq_len * arch.hidden * act / (c.tp if c.sequence_parallel else 1)
    mb_p2p = 2 * v * p2p_s(nbytes, groups(c, machine.gpus_per_node)["pp"], machine.links)
    slot = mb_compute + mb_tp + mb_p2p
    fill = (c.pp - 1) / v
    # tied embeddings live on the first and the last stage: their fp32 gradients are summed between the two
    # after the schedule (pipeline.py, as Megatron-LM), not overlapped
    tied = 0.0
    if arch.tied_embeddings:
        pair = mesh_group(c.tp * (c.pp - 1), 2, machine.gpus_per_node)
        tied = allreduce_group_s(4.0 * arch.embedding_params() / (c.tp if c.head_sharded else 1), pair, machine.links)
    t_pipe = (m + fill) * slot + tied
    terms = Terms(m * mb_compute, m * mb_tp, m * mb_p2p + tied, fill * slot, step_s=t_pipe)
    host = host_s(c, arch, machine, m * p.blocks, -(-p.blocks // c.blocks_per_unit) + 1)
    upd = update_s(c, arch, machine, p)
    if c.dp == 1:
        return terms.with_update(upd).with_host(host)
    g, r, b = _dp_collectives(c, machine, p.held_params)
    total = g * (2 if c.zero == 3 else 1) + r + b
    if _dp_overlap(c):
        exposed = (g + r) / max(1, p.blocks) + max(0.0, total - t_pipe) + b
    else:
        exposed = total
    what = "FSDP all-gather/reduce-scatter" if c.zero >= 2 else "gradient all-reduce"
    return replace(terms, dp_total_s=total, dp_exposed_s=exposed, step_s=t_pipe + exposed,
                   dp_what=what).with_update(upd).with_host(host)


def step_terms(c: Candidate, arch: Any, machine: Machine, efficiency: float) -> Terms:
    """Every term of one step of ``c`` on ``machine`` at a compute rate of ``peak x efficiency``."""
    p = _pieces(c, arch, machine, efficiency)
    return _pipeline_step(c, arch, machine, p) if c.pp > 1 else _flat_step(c, arch, machine, p)


def tokens_per_step(c: Candidate, arch: Any) -> float:
    """Tokens one step trains: the batch of each data-parallel rank times dp (model-parallel ranks share it)."""
    return c.batch_size * c.dp * arch.seq_len


def throughput(c: Candidate, arch: Any, machine: Machine, efficiency: float) -> float:
    """Tokens/s per device at a compute efficiency."""
    return tokens_per_step(c, arch) / step_terms(c, arch, machine, efficiency).step_s / c.devices


_CALIBRATED: dict[tuple, tuple[float, tuple[str, ...]]] = {}
_CALIBRATED_MAX = 4096  # entries kept; a plan or a validation run calibrates a few dozen references


def calibrate(ref: Reference, arch: Any) -> tuple[float, list[str]]:
    """The compute efficiency at which the model gives the reference's measured throughput (bisection: the
    throughput grows with it), and notes where none in 0.1 %..300 % of the peak does. Cached by the
    reference's content: ``plan`` and the validation calibrate the same reference for every row."""
    m = ref.machine
    key = (ref.candidate, m.gpus, m.gpus_per_node, m.peak_flops, m.name, m.block_floor_s, m.host, m.links.key(),
           ref.tokens_per_s_per_device, ref.ref, arch)
    hit = _CALIBRATED.get(key)
    if hit is None:
        eff, notes = _calibrate(ref, arch)
        if len(_CALIBRATED) >= _CALIBRATED_MAX:
            _CALIBRATED.clear()
        hit = _CALIBRATED[key] = (eff, tuple(notes))
    return hit[0], list(hit[1])


def _calibrate(ref: Reference, arch: Any) -> tuple[float, list[str]]:
    lo, hi = math.log(1e-3), math.log(3.0)
    target = ref.tokens_per_s_per_device
    if throughput(ref.candidate, arch, ref.machine, math.exp(hi)) < target:
        return math.exp(hi), [f"{ref.ref}: measured faster than the model allows at 300 % of the peak (its "
                              f"communication is shorter than modelled); capped"]
    if throughput(ref.candidate, arch, ref.machine, math.exp(lo)) > target:
        return math.exp(lo), [f"{ref.ref}: measured slower than the model at 0.1 % of the peak; capped"]
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if throughput(ref.candidate, arch, ref.machine, math.exp(mid)) < target else (lo, mid)
    return math.exp(0.5 * (lo + hi)), []


def _protocol(ref: Reference, c: Candidate, machine: Machine) -> str:
    if ref.candidate.devices == c.devices and ref.machine.gpus_per_node == machine.gpus_per_node:
        return "measured"
    if ref.candidate.devices == 1:
        return "from-1-gpu"
    return "from-node" if ref.candidate.devices <= ref.machine.gpus_per_node else "from-multinode"


def _same_config(ref: Reference, c: Candidate) -> bool:
    r = ref.candidate
    if r.devices == 1:
        return (r.strategy == "single" and r.batch_size == c.batch_size and r.precision == c.precision and r.checkpointing == c.checkpointing
                and r.compiled == c.compiled)
    return c.same_config(r) and r.devices <= c.devices


def pick_reference(c: Candidate, machine: Machine, evidence: Evidence) -> tuple[Reference | None, str]:
    """The reference the compute rate comes from and its basis: the same configuration at the most devices not
    above the target's; else another strategy's measurement of the model (the same precision and compile
    setting first, then the same batch, then the most devices); None where nothing is measured."""
    same = [r for r in evidence.references if _same_config(r, c)]
    if same:
        ref = max(same, key=lambda r: (r.candidate.devices, r.machine.gpus_per_node == machine.gpus_per_node))
        return ref, _protocol(ref, c, machine)
    if not evidence.references:
        return None, ""
    ref = max(evidence.references, key=lambda r: (r.candidate.precision == c.precision,
                                                  r.candidate.compiled == c.compiled,
                                                  r.candidate.batch_size == c.batch_size, r.candidate.devices))
    return ref, "other-strategy"


def compute_rate(c: Candidate, arch: Any, machine: Machine, evidence: Evidence) -> Rate:
    """The compute efficiency of ``c``: from a measured reference (``pick_reference``), else from the micro
    layer timing of a block, else the assumed MFU (said so)."""
    ref, basis = pick_reference(c, machine, evidence)
    if ref is not None:
        eff, notes = calibrate(ref, arch)
        what = (f"compute rate {100 * eff:.1f} % of peak, inferred from the measured {ref.candidate.label} on "
                f"{ref.candidate.devices} GPU(s) ({ref.tokens_per_s_per_device:,.0f} tokens/s/GPU; {ref.ref})")
        return Rate(eff, basis, what, ref.rel_spread or 0.0, tuple(notes))
    lt = evidence.layer_for(c)
    if lt is not None:
        # the block's timing includes its weights' casts, which the step prices once a step, not per token
        casts = block_cast_bytes(replace(c, checkpointing="none"), arch, arch.block_params()) / machine.mem_bw_bps \
            if machine.mem_bw_bps else 0.0
        seconds = max(0.5 * lt.seconds, lt.seconds - casts)
        eff = lt.flops / seconds / machine.peak_flops
        less = f", less {casts * 1e3:.2f} ms of weight casts" if casts else ""
        return Rate(eff, "micro-layer", f"compute rate {100 * eff:.1f} % of peak from a micro layer record "
                                        f"({lt.seconds * 1e3:.2f} ms fwd+bwd of the block{less}; {lt.ref})")
    return Rate(evidence.assumed_mfu, "assumed-mfu",
                f"assumed: compute at {100 * evidence.assumed_mfu:.0f} % of peak (nothing of this model measured)")


def _limited_by(t: Terms) -> str:
    name, loss = max(t.losses().items(), key=lambda kv: kv[1])
    return name if loss >= 0.05 * t.step_s else "compute"


def predict(candidate: Candidate, arch: Any, machine: Machine, evidence: Evidence = Evidence()) -> StepPrediction:
    """The predicted step of one configuration: the entry point of the strategy model.

    Arguments (all typed, nothing read from the command line):

    * ``candidate`` (``Candidate``): strategy, degrees dp_replicate x dp_shard x tp x pp (their product the
      GPUs), ZeRO stage, per-rank batch, micro-batches and schedule, activation checkpointing, precision;
      ``Candidate.from_layout(memplan_layout, batch, checkpointing, precision)`` builds it from what ``plan``
      enumerates;
    * ``arch``: the model's ``TransformerArch`` (``get_model(name, flavor).arch``, or one built from a
      published shape);
    * ``machine`` (``Machine``): GPUs, GPUs per node, peak FLOP/s of one device, the ``Links`` (intra-node
      busbw by GPUs spanned, inter-node busbw per node, latencies);
    * ``evidence`` (``Evidence``): measured ``Reference`` points of the model, a ``LayerTiming`` from
      ``micro layer``, the MFU assumed where neither exists, the block floors and the strategies' ``HostCosts``
      (by compile setting and rank count) for a machine given without them.

    Ranking configurations on N GPUs (what a tuner does): build one ``Machine`` and one ``Evidence`` (from a
    store: ``evidence.evidence_from_records(records, model, flavor, peak, links, batch, assumed_mfu)``), then
    ``sorted(cands, key=lambda c: -predict(c, arch, machine, ev).tokens_per_s_per_device)``; a candidate that
    raises ``ConfigError`` cannot run on that machine.

    Returns a ``StepPrediction``: ``step_s``, ``tokens_per_s_per_device`` with its band (``low``, ``high``),
    ``mfu``, ``basis`` (one of ``BASES``) with its ``evidence`` text, ``limited_by`` and every term
    (``terms``). Raises ``ConfigError`` (one line) for a configuration the model cannot price: degrees that do
    not multiply to the GPUs, tp across nodes or not dividing the heads, a missing link figure.
    """
    check_candidate(candidate, arch, machine)
    if not machine.block_floor_s and evidence.block_floors.get(candidate.compiled):
        machine = replace(machine, block_floor_s=evidence.block_floors[candidate.compiled])
    host = evidence.host_costs.get((candidate.compiled, candidate.devices > 1))
    if not machine.host and host:
        machine = replace(machine, host=host)
    rate = compute_rate(candidate, arch, machine, evidence)
    t = step_terms(candidate, arch, machine, rate.efficiency)
    tps = tokens_per_step(candidate, arch) / t.step_s / candidate.devices
    below, above = (math.hypot(b, rate.rel_spread) for b in BAND[rate.basis])
    mfu = tps * arch.flops_per_token() / machine.peak_flops
    notes = list(rate.notes)
    if t.host_exposed_s > 0:
        h = machine.host
        notes.append(f"host-bound: {t.host_s * 1e3:.1f} ms of host work against a {(t.step_s - t.host_exposed_s) * 1e3:.1f}"
                     f" ms GPU path ({h.fsdp_unit_s * 1e3:.2f} ms per FSDP unit, {h.tp_linear_s * 1e3:.2f} ms per "
                     f"tensor-parallel Linear; {h.source or 'given'})")
    return StepPrediction(candidate, t, tps, mfu, rate.basis, rate.evidence, tps * max(0.0, 1 - below),
                          tps * (1 + above), _limited_by(t), rate.efficiency, notes)
