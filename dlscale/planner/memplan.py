"""Memory plan: the predicted peak memory per device of a training case, and the largest batch that fits.

A first-principles model, term by term (docs/plan.md has the formulas and their derivation):

* model state -- parameters, gradients, optimizer state per device, as the ZeRO memory model
  (Rajbhandari et al. 2020, with dlscale's dtypes) with the real split of the parameters (tensor parallel splits the
  blocks' matrices and replicates embeddings, norms and heads; a pipeline stage holds its blocks,
  the first the embedding, the last the head, and with tied embeddings a copy of it);
* activations -- what one block saves for its backward, per token, written per block family
  (``_BLOCK``: Llama's SwiGLU/RMSNorm/rotary block, the GPT pre-LN and BERT post-LN blocks) and
  per regime (fp32; bf16 autocast over fp32 parameters, eager or torch.compile'd; torchao float8
  Linears, compiled; with selective or full activation checkpointing). The coefficients count the
  tensors autograd keeps (eager: listed with saved-tensor hooks; compiled: the forward graph's
  outputs after inductor's partitioner) and are checked by tests against the CPU allocator's
  measurement; times the tokens of a micro-batch, the blocks on the device and the micro-batches
  in flight;
* the head -- the final norm, the vocabulary projection and the loss keep about one
  logits-sized tensor per token (fp32 log-softmax in eager, the compute-dtype logits when
  compiled), and their backward briefly needs more (``_HEAD``);
* copies -- under autocast with fp32 parameters every Linear's weight is cast to bf16 once per
  step and kept for the backward (2 bytes per parameter), except where the cast is not kept: the
  blocks' casts under activation checkpointing (made inside the checkpointed region, made again
  by the recomputation) and float8 Linears (torchao casts the fp32 weight to float8 itself and
  saves the fp32 parameter); FSDP gathers units in its parameter dtype (zero3: the root unit and
  two blocks at a time; zero2: everything, from forward to backward);
* the peak -- the largest of three instants: the backward begins (all activations, the head's
  backward), the backward ends (all gradients; compiled on one device with tied embeddings, also
  the embedding's dense gradient and the head's weight gradient, alive while their sum is made),
  the optimizer steps (plus foreach AdamW's one temporary per parameter on the CPU; the fused
  AdamW used on GPUs has none).

What it leaves out: the CUDA context and the caching allocator's reserve and fragmentation (the
plan predicts allocated bytes, as ``torch.cuda.max_memory_allocated``; ``fits`` keeps a headroom),
communication buffers of NCCL, and pipeline balance by time (the plan splits blocks evenly).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale import ConfigError
from dlscale.planner.layout import ONE_DEVICE, Layout, ParallelDims, split_blocks

# fp32 optimizer state per parameter: AdamW two moments, SGD one momentum buffer
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}

GiB = 1024 ** 3
DIMS = ("h", "A", "kv", "f", "nh", "1")


# ------------------------------------------------------------------ per-token saved tensors of one block

# Elements per token kept by one block for its backward, as {dim: count} in three dtype classes:
# R: the residual stream's dtype (the parameters' dtype: fp32, or bf16 under FSDP's mixed precision),
# L: the compute dtype (bf16 under autocast, fp32 otherwise), F: always fp32 (norm statistics, the
# attention's logsumexp). Dims: h hidden, A heads x head_dim, kv kv_heads x head_dim, f MLP width,
# nh heads, "1" a scalar per token. Regimes: "fp32"; "amp" (autocast, eager); "amp-compiled";
# "fp8-compiled" (torchao float8 Linears in the blocks, compiled; eager fp8 keeps what "amp" keeps:
# torchao's matmul_with_hp_or_float8_args saves its bf16 input, as autocast's Linear does).
_BLOCK: dict[tuple[str, str], dict[str, dict[str, float]]] = {
    # Llama: x; x*rstd and h1*rstd (fp32 products for the norm weights' gradients); each of wq/wk/wv
    # gets its own bf16 cast of the normed input in eager autocast, one shared normed tensor when
    # compiled; q, k (after rotary), v, the attention output; w1, w3, silu, their product (eager)
    ("llama", "fp32"): {"R": {"h": 6, "A": 2, "kv": 2, "f": 4}, "L": {}, "F": {"nh": 1, "1": 2}},
    ("llama", "amp"): {"R": {"h": 4}, "L": {"h": 5, "A": 2, "kv": 2, "f": 4}, "F": {"nh": 1, "1": 2}},
    # (left as it was counted. The partitioner's listing -- torch 2.13, on the CPU -- of a block
    # between two others: x and h1 (fp32), both normed inputs (one bf16 copy each, read by the
    # backward's matmuls), q, k, v, the attention output, w1, w3 and w2's input: R 2h,
    # L 2h + 2A + 2kv + 3f, 2h bytes per token more than this row where A = h; that difference is
    # what the plan misses of Llama 1B's and 3B's measured peaks, -2.1 %: docs/plan.md)
    ("llama", "amp-compiled"): {"R": {"h": 1}, "L": {"h": 2, "A": 3, "kv": 2, "f": 3}, "F": {"nh": 1, "1": 2}},
    # float8, compiled (the partitioner's listing, as above; torchao 0.17, tensorwise): x and h1
    # (fp32), q, k, v, the attention output, w1 and w3; not the bf16 copies the bf16 backward's
    # matmuls read (both normed inputs, w2's input): the float8 backward reads float8 casts of them,
    # pointwise from x, h1, rstd and w1, w3, which the partitioner recomputes (it saves the scales)
    ("llama", "fp8-compiled"): {"R": {"h": 2}, "L": {"A": 2, "kv": 2, "f": 2}, "F": {"nh": 1, "1": 2}},
    # GPT-2 (pre-LN, fused qkv): x, h1; ln outputs, qkv, attention output, fc and gelu outputs
    ("gpt", "fp32"): {"R": {"h": 4, "A": 2, "kv": 2, "f": 2}, "L": {}, "F": {"nh": 1, "1": 4}},
    ("gpt", "amp"): {"R": {"h": 2}, "L": {"h": 2, "A": 2, "kv": 2, "f": 2}, "F": {"nh": 1, "1": 4}},
    ("gpt", "amp-compiled"): {"R": {"h": 1}, "L": {"h": 2, "A": 3, "kv": 2, "f": 2}, "F": {"nh": 1, "1": 4}},
    # BERT (post-LN): the block input's cast, qkv, attention output, ln inputs (R), ln1 output, fc, gelu
    ("bert", "fp32"): {"R": {"h": 4, "A": 2, "kv": 2, "f": 2}, "L": {}, "F": {"nh": 1, "1": 4}},
    ("bert", "amp"): {"R": {"h": 2}, "L": {"h": 2, "A": 2, "kv": 2, "f": 2}, "F": {"nh": 1, "1": 4}},
}
# A regime without a row of its own borrows this one's (compiling saves less than eager; float8
# less than bf16): the plan is then an upper bound (for float8, ``planned_as`` says so)
_BORROW = {"fp8-compiled": "amp-compiled", "amp-compiled": "amp"}
# Matmul outputs of one block in forward order (selective checkpointing keeps the 1st, 3rd, ...)
_MATMULS = {
    "llama": [{"A": 1}, {"kv": 1}, {"kv": 1}, {"h": 1}, {"f": 1}, {"f": 1}, {"h": 1}],
    "gpt": [{"A": 1, "kv": 2}, {"h": 1}, {"f": 1}, {"h": 1}],
    "bert": [{"A": 1, "kv": 2}, {"h": 1}, {"f": 1}, {"h": 1}],
}
# Of those, the ones the block's backward never reads: Llama's w2 output only enters the residual
# sum. Eager selective checkpointing stores every output its policy saves; compiled, the
# partitioner drops a saved output nothing in the backward reads
_UNREAD = {"llama": {6}, "gpt": set(), "bert": set()}


def family(arch) -> str:
    """Which block implementation the coefficients describe."""
    if arch.mlp == "swiglu":
        return "llama"
    return "gpt" if arch.pre_norm else "bert"


def _table_regime(fam: str, regime: str) -> str:
    """The regime whose row ``_BLOCK`` uses for (fam, regime)."""
    while (fam, regime) not in _BLOCK:
        regime = _BORROW[regime]
    return regime


def block_saved(arch, regime: str, checkpointing: str) -> dict[str, dict[str, float]]:
    """{class: {dim: count}} of the elements per token one block keeps (see ``_BLOCK``)."""
    fam = family(arch)
    if checkpointing == "full":  # the block's input only
        return {"R": {"h": 1}, "L": {}, "F": {}}
    if checkpointing == "selective":  # input, attention output and logsumexp, odd-numbered matmul outputs
        compiled = regime.endswith("compiled")
        low: dict[str, float] = {"A": 1}
        for i, out in enumerate(_MATMULS[fam]):
            if i % 2 == 0 and not (compiled and i in _UNREAD[fam]):
                for d, n in out.items():
                    low[d] = low.get(d, 0) + n
        return {"R": {"h": 1}, "L": low, "F": {"nh": 1}}
    return _BLOCK[(fam, _table_regime(fam, regime))]


def planned_as(arch, regime: str, checkpointing: str) -> str:
    """What the plan borrows where no count of its own exists ('' when it has one)."""
    fam = family(arch)
    used = _table_regime(fam, regime)
    if checkpointing != "none" or used == regime or not regime.startswith("fp8"):
        return ""
    return f"fp8 activations planned as {used}'s (no float8 count for {fam}: an upper bound)"


def _dims(arch, tp: int, sp: bool) -> dict[str, float]:
    """Per-device size of each dim: tensor parallelism splits heads and the MLP, and (sequence
    parallel) the hidden-sized tensors between the parallel regions."""
    return {"h": arch.hidden / (tp if sp else 1), "A": arch.attn_dim / tp, "kv": arch.kv_dim / tp,
            "f": arch.ffn_hidden / tp, "nh": arch.n_heads / tp, "1": 1.0}


def block_bytes_per_token(arch, regime: str, checkpointing: str, r: int, low: int, tp: int = 1,
                          sp: bool = False) -> float:
    """Bytes per token one block keeps; ``r``: residual dtype bytes, ``low``: compute dtype bytes."""
    saved = block_saved(arch, regime, checkpointing)
    d = _dims(arch, tp, sp)
    size = {"R": r, "L": low, "F": 4}
    return sum(size[c] * n * d[k] for c, terms in saved.items() for k, n in terms.items())


# ------------------------------------------------------------------ the head

def head_bytes(arch, regime: str, width: int, r: int, low: int) -> tuple[float, float, float]:
    """(kept from forward to backward per token, extra at its backward's peak per token, extra
    bytes per step) for the final norm + vocabulary projection (``width`` columns) + cross-entropy.
    Eager: the fp32 log-softmax is kept, and its backward holds two fp32 logits-sized gradients.
    Compiled: the logits are kept in the compute dtype and the softmax is rebuilt in the backward,
    whose extra is the projection's weight gradient in the compute dtype. BERT's MLM transform
    (dense, GELU, LayerNorm: about 4 hidden-sized tensors per token) is not counted."""
    h = arch.hidden
    if regime.endswith("compiled"):
        return low * width + low * h + 12, 0.0, low * arch.rows * h
    norm = r * h if family(arch) == "llama" else 0  # RMSNorm's product for its weight's gradient
    return 4 * width + low * h + norm + 4, 8 * width, 0.0


# ------------------------------------------------------------------ how a strategy places the model

@dataclass
class MemoryPlan:
    """Predicted bytes per device (the largest device) and the terms they come from."""

    layout: Layout
    batch_size: int
    params: float
    grads: float
    optimizer: float
    activations: float
    weight_copies: float  # autocast's bf16 weight casts, FSDP's gathered parameters
    head: float  # kept by the head plus its backward's extra
    other: float  # input batch, optimizer temporaries at their instant
    peak: float
    peak_at: str  # "backward start", "backward end" or "optimizer step"
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"strategy": self.layout.name, "layout": self.layout.describe(), "options": self.layout.options,
                "batch_size": self.batch_size, "params_bytes": self.params, "grads_bytes": self.grads,
                "optimizer_bytes": self.optimizer, "activations_bytes": self.activations,
                "weight_copies_bytes": self.weight_copies, "head_bytes": self.head, "other_bytes": self.other,
                "peak_bytes": self.peak, "peak_at": self.peak_at, **self.detail}


@dataclass(frozen=True)
class Workload:
    """What is trained and how: the model, the precision and the step's settings."""

    spec: Any  # ModelSpec with a TransformerArch
    precision: str = "amp-bf16"
    checkpointing: str = "none"
    compiled: bool = False
    device_type: str = "cuda"

    def __post_init__(self) -> None:
        from dlscale.models import TransformerArch  # torch: keeps start-up light

        if not isinstance(self.spec.arch, TransformerArch):
            raise ConfigError(f"plan models transformer architectures; {self.spec.name} has none "
                              "(its memory is measured, not planned: dlscale run --batch-size max)")

    @property
    def amp(self) -> bool:
        return self.precision in ("amp-bf16", "amp-fp16", "fp8")

    @property
    def regime(self) -> str:
        if not self.amp:
            return "fp32"
        if self.precision == "fp8" and self.compiled:
            return "fp8-compiled"
        return "amp-compiled" if self.compiled else "amp"  # eager fp8 saves what autocast saves

    @property
    def block_casts_kept(self) -> bool:
        """Whether the blocks' bf16 weight casts live from forward to backward: made by autocast
        over fp32 weights, not inside a checkpointed region (recomputed there), not float8 Linears."""
        return self.amp and self.precision != "fp8" and self.checkpointing == "none"


def _stage_parts(arch, pp: int) -> list[dict[str, float]]:
    """Parameters of each pipeline stage (blocks split evenly, earlier stages take the remainder):
    blocks, embedding (first), final norm and output projection (last; tied: a copy of the embedding)."""
    emb = arch.embedding_params()
    final = arch.norm_params if arch.final_norm else 0
    head = arch.head_params() if not arch.tied_embeddings else arch.rows * arch.hidden
    rest_extra = arch.extra_params
    parts = []
    for s, run in enumerate(split_blocks(arch.n_layers, pp)):
        first, last = s == 0, s == pp - 1
        other = (emb if first else 0) + ((final + rest_extra + (head if (pp > 1 or not arch.tied_embeddings) else 0))
                                         if last else 0)
        parts.append({"blocks": len(run), "other": other})
    return parts


@dataclass(frozen=True)
class _Terms:
    """What the plan of every pipeline stage shares: dtypes, sizes per block and per token, the head."""

    k_opt: float  # optimizer state bytes per parameter
    fsdp: bool
    bf16_params: bool
    block_dev: float  # parameters of one block on the device (tensor parallel splits its matrices)
    tokens_mb: float  # tokens of one micro-batch
    per_block: float  # bytes one block keeps per token
    head: tuple[float, float, float]  # head_bytes: kept per token, extra per token, fixed
    recompute: float  # bytes per token one block keeps again when recomputed (0: no checkpointing)
    recast: float  # its bf16 weight casts made again by the recomputation
    tied_tail: float  # one graph with tied embeddings: both gradients of the tied weight alive


def _terms(work: Workload, layout: Layout, batch_size: int) -> _Terms:
    arch = work.spec.arch
    fsdp = layout.zero >= 2
    bf16_params = fsdp and layout.fsdp_params_bf16 and work.amp
    r = 2 if bf16_params else 4  # residual stream: the parameters' dtype
    low = 2 if work.amp else 4
    width = arch.rows if work.device_type != "cuda" else -(-arch.rows // 64) * 64
    norm_in_block = 2 * arch.norm_params
    block_dev = (arch.block_params() - norm_in_block) / layout.tp + norm_in_block
    per_block = block_bytes_per_token(arch, work.regime, work.checkpointing, r, low, layout.tp,
                                      layout.sequence_parallel)
    # with checkpointing, each block's forward runs again in the backward: what one block keeps
    # without checkpointing, and (autocast over fp32 weights) that block's bf16 weight casts again
    recompute = (block_bytes_per_token(arch, work.regime, "none", r, low, layout.tp, layout.sequence_parallel)
                 if work.checkpointing != "none" else 0.0)
    recast = 2 * block_dev if (recompute and work.amp and work.precision != "fp8" and not fsdp) else 0.0
    # one compiled graph, tied embeddings: its backward ends with the embedding's dense fp32 gradient
    # and the head's weight gradient (compute dtype) both alive while their sum, the tied weight's
    # gradient, is made (the CPU allocator's timeline of inductor's backward; untied, each is a
    # gradient of its own: nothing beyond the gradients). Not counted for eager or wrapped models
    one_graph = work.compiled and layout.world == 1 and layout.zero == 0 and not layout.persistent_grads
    tied_tail = (4 + low) * arch.rows * arch.hidden if one_graph and arch.tied_embeddings else 0.0
    return _Terms(OPTIMIZER_STATE_BYTES[work.spec.optimizer], fsdp, bf16_params, block_dev,
                  batch_size / layout.microbatches * arch.seq_len, per_block,
                  head_bytes(arch, work.regime, width, r, low), recompute, recast, tied_tail)


def plan_memory(work: Workload, layout: Layout, batch_size: int) -> MemoryPlan:
    """The predicted peak of the device that holds the most (see the module's docstring)."""
    terms = _terms(work, layout, batch_size)
    plans = [_stage_plan(work, layout, batch_size, terms, s, part)
             for s, part in enumerate(_stage_parts(work.spec.arch, layout.pp))]
    best = plans[0]
    for plan in plans[1:]:
        if plan.peak > best.peak:
            best = plan
    return best


def _stage_plan(work: Workload, layout: Layout, batch_size: int, t: _Terms, s: int, part: dict) -> MemoryPlan:
    """The plan of pipeline stage ``s`` (the only one without a pipeline): its three instants."""
    arch = work.spec.arch
    last = s == layout.pp - 1
    shard = layout.dp_shard if t.fsdp else 1
    p_dev = part["blocks"] * t.block_dev + part["other"]
    in_flight = _in_flight(layout, s)
    params = 4 * p_dev / shard
    grads = 4 * p_dev / shard
    optimizer = t.k_opt * p_dev / (layout.dp_shard if t.fsdp else layout.dp_replicate if layout.zero == 1 else 1)
    activations = part["blocks"] * t.per_block * t.tokens_mb * in_flight
    gathered = _gathered(layout, part, t.block_dev, t.bf16_params, work.amp, work.block_casts_kept)
    head_kept, head_extra, head_fixed = t.head
    head = (head_kept + head_extra) * t.tokens_mb + head_fixed if last else 0.0
    inputs = 16 * batch_size * arch.seq_len  # token ids and targets (int64)
    grads_t1 = grads if (layout.persistent_grads or layout.zero == 1) else 0.0
    t1 = params + optimizer + grads_t1 + gathered + activations + head + inputs
    if t.recompute and work.compiled and work.checkpointing == "full":
        # one compiled backward graph: the first recomputation runs while the head's tensors live
        # (measured on the CPU's inductor; selective recomputes op by op, as eager)
        t1 += (t.recompute - t.per_block) * t.tokens_mb + t.recast
    elif t.recompute:  # the last block recomputed after the head's backward, the head's gradients made
        t1 = max(t1, t1 - head + t.recompute * t.tokens_mb + t.recast + 4 * (part["other"] if last else 0))
    tail = t.tied_tail  # one graph: one stage
    t2 = params + optimizer + grads + inputs + tail + (gathered if layout.zero == 2 else 0.0)
    opt_temp = 4 * p_dev / shard if work.device_type != "cuda" else 0.0
    t3 = params + optimizer + grads + inputs + opt_temp
    peak, at = max((t1, "backward start"), (t2, "backward end"), (t3, "optimizer step"))
    return MemoryPlan(layout, batch_size, params, grads if at != "backward start" else grads_t1, optimizer,
                      activations if at == "backward start" else 0.0,
                      gathered if at == "backward start" or layout.zero == 2 else 0.0,
                      head if at == "backward start" else 0.0,
                      inputs + (opt_temp if at == "optimizer step" else tail if at == "backward end" else 0.0),
                      peak, at,
                      {"stage": s, "in_flight_microbatches": in_flight, "block_bytes_per_token": t.per_block,
                       "params_on_device": p_dev})


def _in_flight(layout: Layout, stage: int) -> int:
    """Micro-batches whose activations a stage holds at once: GPipe all of them; 1F1B at most pp - s
    (stage s runs that many forwards before its first backward); interleaved counted as GPipe (an
    upper bound)."""
    if layout.pp == 1:
        return 1
    if layout.schedule == "1f1b":
        return min(layout.microbatches, layout.pp - stage)
    return layout.microbatches


def _gathered(layout: Layout, part: dict, block_dev: float, bf16_params: bool, amp: bool,
              block_casts: bool = True) -> float:
    """Parameter copies alive when the backward begins: FSDP's gathered units, or autocast's casts
    (the blocks' only where ``block_casts``: not checkpointed, not float8)."""
    if layout.zero >= 2:
        b = 2 if bf16_params else 4
        if layout.zero == 2:  # everything gathered from forward to backward
            return b * (part["blocks"] * block_dev + part["other"])
        # the root unit and two units in flight (the one running and the one prefetched), each of
        # blocks_per_unit blocks
        k = max(1, int((layout.options or {}).get("blocks_per_unit") or 1))
        return b * (part["other"] + min(2 * k, part["blocks"]) * block_dev)
    if amp:  # autocast's bf16 cast of every weight, kept for the backward
        return 2 * ((part["blocks"] * block_dev if block_casts else 0) + part["other"])
    return 0.0


def largest_batch(work: Workload, layout: Layout, capacity: float, limit: int = 1 << 16) -> int:
    """The largest --batch-size (a multiple of the micro-batch count) whose predicted peak fits."""
    m = layout.microbatches
    if plan_memory(work, layout, m).peak > capacity:
        return 0
    lo, hi = 1, 2
    while hi * m <= limit and plan_memory(work, layout, hi * m).peak <= capacity:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if plan_memory(work, layout, mid * m).peak <= capacity:
            lo = mid
        else:
            hi = mid
    return lo * m


# ------------------------------------------------------------------ which layouts a job can use

def candidate_layouts(spec, gpus: int, gpus_per_node: int, nodes: int, microbatches: int = 4,
                      schedule: str = "1f1b", sequence_parallel: bool = False) -> list[Layout]:
    """The strategies dlscale runs for ``gpus`` devices, with every degree combination they allow."""
    arch = spec.arch
    out: list[Layout] = []
    if gpus == 1:
        return [Layout("single", ONE_DEVICE, options={})]
    replicas, shards = ParallelDims.of(dp_replicate=gpus), ParallelDims.of(dp_shard=gpus)
    out.append(Layout("ddp", replicas, persistent_grads=True))
    out.append(Layout("zero1", replicas, zero=1, persistent_grads=True))
    out.append(Layout("fsdp", shards, zero=2, fsdp_params_bf16=True, options={"shard": "zero2"}))
    out.append(Layout("fsdp", shards, zero=3, fsdp_params_bf16=True, options={"shard": "zero3"}))
    if nodes > 1:
        out.append(Layout("hsdp", ParallelDims.of(dp_replicate=nodes, dp_shard=gpus // nodes), zero=3,
                          fsdp_params_bf16=True, options={"replicate": nodes}))
    if _tp_ok(arch, gpus) and gpus <= gpus_per_node:
        out.append(Layout("tensor", ParallelDims.of(tp=gpus), sequence_parallel=sequence_parallel,
                          options={"sequence_parallel": sequence_parallel} if sequence_parallel else {}))
    if gpus <= arch.n_layers:  # 1F1B needs at least as many micro-batches as stages
        m = max(microbatches, gpus)
        out.append(Layout("pipeline", ParallelDims.of(pp=gpus), microbatches=m, schedule=schedule,
                          options={"microbatches": m, "schedule": schedule}))
    for tp in _divisors(gpus):
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            if sum(x > 1 for x in (dp, tp, pp)) < 2:
                continue  # a single dimension: the named strategy above
            if (tp > 1 and (not _tp_ok(arch, tp) or tp > gpus_per_node)) or pp > arch.n_layers:
                continue
            m = max(microbatches, pp)
            for shard in ("ddp", "fsdp"):
                if shard == "fsdp" and dp == 1:
                    continue
                opts = {"dp": dp, "tp": tp, "pp": pp, "dp_shard": shard}
                if pp > 1:
                    opts.update(microbatches=m, schedule=schedule)
                if tp > 1 and sequence_parallel:
                    opts["sequence_parallel"] = True
                dims = ParallelDims.of(dp_replicate=dp if shard == "ddp" else 1,
                                       dp_shard=dp if shard == "fsdp" else 1, tp=tp, pp=pp)
                out.append(Layout("hybrid", dims, zero=3 if shard == "fsdp" else 0,
                                  sequence_parallel=sequence_parallel and tp > 1,
                                  microbatches=m if pp > 1 else 1, schedule=schedule,
                                  persistent_grads=shard == "ddp" and tp == 1 and pp == 1,
                                  fsdp_params_bf16=shard == "fsdp", options=opts))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _tp_ok(arch, tp: int) -> bool:
    return all(x % tp == 0 for x in (arch.n_heads, arch.kv_heads, arch.ffn_hidden))


def layout_for_run(spec, strategy: str, world: int, nnodes: int, options: dict) -> Layout:
    """The Layout of one ``dlscale run`` case: its strategy's degrees (``dims``) and what it declares
    of how it holds the model (``memory_layout``)."""
    from dlscale.strategies import get_strategy  # the registry imports torch: ``dlscale plan`` starts without

    return get_strategy(strategy).layout(world, nnodes, options)


