"""`tensor`: Megatron-style tensor parallelism with DTensor plans (``torch.distributed.tensor.parallel``).

The model's typed architecture (``spec.arch.layout``) names each block's pieces: the
column-parallel Linears (each rank computes its slice of the output features: its attention
heads, its part of the MLP: gpt2/bert ``attn.qkv``, ``mlp.fc``; llama ``attn.wq/wk/wv``,
``mlp.w1/w3``) and the row-parallel ones (partial products all-reduced: ``attn.proj``/``attn.wo``,
``mlp.proj``/``mlp.w2``): two all-reduces per block forward and two backward. Embeddings, norms
and heads are replicated (every rank computes them on the same data), so the model's outputs and
losses are identical on all ranks.

Attention on local heads: a model whose attention takes its head count from the local shapes
(llama: ``view(B, T, -1, head_dim)``, grouped-query attention included: each rank keeps
n_heads/tp query heads and n_kv_heads/tp key/value heads) runs unchanged. A fused ``[q | k | v]``
projection (``layout.fused_qkv``: gpt2, bert) gets two adaptations, made here and not in the
model files:

* its rows are permuted from ``[q | k | v]`` to ``[q_0 k_0 v_0 | q_1 k_1 v_1 ...]``
  (rank r's heads together), so a contiguous column shard holds whole heads of q, k and v;
* the attention module gets a forward that splits its local qkv output in three and runs
  ``n_heads / tp`` heads (the models split by the full hidden size). Before sharding it is
  checked against the model's own forward (eval mode, same output), which also decides whether
  the attention is causal; a model whose attention it cannot reproduce is refused.

Options: ``sequence_parallel`` (default false): LayerNorms and dropout run on sequence shards
between the blocks' parallel regions (Megatron-SP): the row-parallel outputs are reduce-scattered
along the sequence and all-gathered before the next column-parallel layer, so activations outside
the attention/MLP are 1/tp per rank; the sequence length must divide by tp.

Degree: tp = the world size (``hybrid`` combines it with data and pipeline parallelism); it must
divide the attention heads, the key/value heads and the MLP width. Data: every rank gets the same
batch (dp_size 1), so the run trains exactly what ``single`` trains on ``--batch-size``. Models
without a transformer architecture (resnet50) have no tensor-parallel plan.
"""
from __future__ import annotations

import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel, PrepareModuleInput, PrepareModuleOutput, RowwiseParallel, SequenceParallel,
    parallelize_module,
)

from dlscale import ConfigError
from dlscale.models import get_model
from dlscale.planner.layout import Layout
from dlscale.strategies import Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import is_transformer, parse_options
from dlscale.strategies._mesh import ParallelDims, ParallelMesh

OPTIONS = {"sequence_parallel": False}


def validate_tp(name: str, cfg, spec, tp: int, sequence_parallel: bool) -> None:
    if not is_transformer(spec):
        return  # check() records it unsupported
    arch = spec.arch
    for what, n in (("attention heads", arch.n_heads), ("key/value heads", arch.kv_heads),
                    ("MLP width", arch.ffn_hidden)):
        if tp < 1 or n % tp:
            raise ConfigError(f"{name}: tensor parallel degree {tp} does not divide {spec.name}'s {n} {what}")
    if sequence_parallel and spec.seq_len and spec.seq_len % tp:
        raise ConfigError(f"{name}: sequence_parallel needs tp {tp} to divide the sequence length {spec.seq_len}")


def options(cfg) -> dict:
    opts = parse_options("tensor", cfg, OPTIONS)
    validate_tp("tensor", cfg, get_model(cfg.model, cfg.flavor), cfg.world_size, opts["sequence_parallel"])
    return opts


def check_tp(cfg, env) -> str | None:
    spec = get_model(cfg.model, cfg.flavor)
    if not is_transformer(spec):
        return (f"tensor parallelism splits transformer blocks (a TransformerArch with its block layout); "
                f"{cfg.model} has no such plan")
    return None


# ---------------------------------------------------------------- attention rewrite


def _attn_dropout(attn: nn.Module) -> float:
    for name in ("attn_dropout", "dropout"):
        v = getattr(attn, name, None)
        if isinstance(v, float):
            return v
    return 0.0


def _tp_attention_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Attention on this rank's heads: the local qkv output is [q_r | k_r | v_r]."""
    B, T, _ = x.shape
    qkv = self.qkv(x)
    q, k, v = qkv.split(qkv.shape[-1] // 3, dim=2)
    nh = self.n_heads
    q = q.view(B, T, nh, -1).transpose(1, 2)
    k = k.view(B, T, nh, -1).transpose(1, 2)
    v = v.view(B, T, nh, -1).transpose(1, 2)
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=self._tp_dropout if self.training else 0.0,
                                       is_causal=self._tp_causal)
    y = self.proj(y.transpose(1, 2).reshape(B, T, -1))
    drop = getattr(self, "resid_drop", None)
    return drop(y) if drop is not None else y


_CAUSAL_CACHE: dict[type, bool] = {}


def _causal_of(attn: nn.Module, hidden: int, device) -> bool:
    """Whether ``attn`` is causal, by comparing its own forward with the rewrite (both ways)."""
    cls = type(attn)
    if cls in _CAUSAL_CACHE:
        return _CAUSAL_CACHE[cls]
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(2, 8, hidden, generator=g).to(device=device, dtype=attn.qkv.weight.dtype)
    was = attn.training
    attn.eval()
    try:
        with torch.no_grad():
            ref = attn(x)
            scale = ref.abs().max().clamp_min(1e-12)
            err = {}
            for causal in (True, False):
                attn._tp_causal = causal
                attn._tp_dropout = 0.0
                err[causal] = float((_tp_attention_forward(attn, x) - ref).abs().max() / scale)
        best = min(err, key=err.get)
        # same kernels on the same data: the right variant agrees to rounding (TF32 included)
        if err[best] < 1e-3 and err[best] < 0.1 * err[not best]:
            _CAUSAL_CACHE[cls] = best
            return best
    finally:
        attn.train(was)
        for k in ("_tp_causal", "_tp_dropout"):
            attn.__dict__.pop(k, None)
    raise RuntimeError(f"tensor parallel: cannot reproduce the attention of {cls.__name__} with local heads")


def _permute_qkv(linear: nn.Linear, tp: int) -> None:
    """Rows [q | k | v] -> [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] (q_r: rank r's heads)."""
    out, inp = linear.weight.shape
    c = out // 3
    with torch.no_grad():
        w = linear.weight.view(3, tp, c // tp, inp).transpose(0, 1).reshape(out, inp).clone()
        linear.weight.copy_(w)
        if linear.bias is not None:
            b = linear.bias.view(3, tp, c // tp).transpose(0, 1).reshape(out).clone()
            linear.bias.copy_(b)


def _block_plan(layout, sequence_parallel: bool) -> dict:
    """The DTensor plan of one block from its layout (Megatron column/row split, optionally with
    sequence-parallel norms between the parallel regions)."""
    if not sequence_parallel:
        return {**{n: ColwiseParallel() for n in layout.colwise}, **{n: RowwiseParallel() for n in layout.rowwise}}
    gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                use_local_output=True)
    plan = {n: SequenceParallel(use_local_output=True) for n in layout.norms}
    plan[layout.attention] = gather
    plan[layout.mlp] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    plan.update({n: ColwiseParallel() for n in layout.colwise})
    plan.update({n: RowwiseParallel(output_layouts=Shard(1)) for n in layout.rowwise})
    return plan


def apply_tensor_parallel(blocks: list[nn.Module], spec, tp_mesh, sequence_parallel: bool = False) -> None:
    """Shard ``blocks`` (all of the model's, or one pipeline stage's run) over ``tp_mesh`` in place.

    With sequence parallelism the first block takes the full sequence and scatters it, the last
    gathers it again, so what runs before and after the blocks (embeddings, heads, the previous
    or next pipeline stage) sees whole sequences.
    """
    tp = tp_mesh.size()
    arch = spec.arch
    layout = arch.layout
    for i, block in enumerate(blocks):
        if layout.fused_qkv is not None:
            attn = block.get_submodule(layout.attention)
            qkv = block.get_submodule(layout.fused_qkv)
            causal = _causal_of(attn, arch.hidden, qkv.weight.device)
            attn._tp_causal = causal
            attn._tp_dropout = _attn_dropout(attn)
            attn.forward = types.MethodType(_tp_attention_forward, attn)
            _permute_qkv(qkv, tp)
        parallelize_module(block, tp_mesh, _block_plan(layout, sequence_parallel))
        if layout.fused_qkv is not None:
            attn.n_heads = arch.n_heads // tp
        if sequence_parallel and i == 0:  # replicated embeddings -> this rank's sequence shard
            parallelize_module(block, tp_mesh, PrepareModuleInput(
                input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True))
        if sequence_parallel and i == len(blocks) - 1:  # sequence shards -> the full sequence for the head
            parallelize_module(block, tp_mesh, PrepareModuleOutput(
                output_layouts=(Shard(1),), desired_output_layouts=(Replicate(),), use_local_output=True))


def replicate_rest(model: nn.Module, mesh) -> int:
    """Make every parameter that no plan sharded a replicated DTensor; returns how many.

    The optimizer's foreach/fused kernels and ``clip_grad_norm_`` cannot mix DTensor and plain
    tensors, so the embeddings, LayerNorms and heads hold ``Replicate()`` DTensors too: their
    modules take and return plain tensors (hooks wrap the inputs and unwrap the outputs), and
    weights tied between two modules stay one parameter.
    """
    converted: dict[int, nn.Parameter] = {}
    count = 0

    def to_dtensor(mod, args):
        return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                     if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a for a in args)

    def to_local(mod, args, out):
        return out.to_local() if isinstance(out, DTensor) else out

    for mod in list(model.modules()):
        direct = [(n, p) for n, p in mod.named_parameters(recurse=False) if not isinstance(p, DTensor)]
        if not direct:
            continue
        for name, p in direct:
            new = converted.get(id(p))
            if new is None:
                new = nn.Parameter(distribute_tensor(p.detach(), mesh, [Replicate()]),
                                   requires_grad=p.requires_grad)
                converted[id(p)] = new
                count += 1
            setattr(mod, name, new)
        mod.register_forward_pre_hook(to_dtensor)
        mod.register_forward_hook(to_local)
    return count


def dims(world: int, nnodes: int, opts: dict):
    return ParallelDims(world, tp=world, where="tensor")


def memory_layout(dims, opts: dict):
    return Layout("tensor", dims, sequence_parallel=bool(opts.get("sequence_parallel")), options=opts)


@register_strategy("tensor", description="tensor parallel (DTensor column/row-parallel attention and MLP)",
                   hooks=Hooks(check=check_tp, validate=options, dims=dims, memory_layout=memory_layout))
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    pm = ParallelMesh.build(dims(dist.world_size, 1, opts), dist.device.type)
    apply_tensor_parallel(spec.blocks(model), spec, pm["tp"], opts["sequence_parallel"])
    replicated = replicate_rest(model, pm["tp"])
    return Parallelized(module=model, optimizer=make_optimizer(model.parameters(), spec, cfg, dist.device),
                        dp_size=1, dp_group=pm.dp_group,
                        dp_rank=0, info={"tp": dist.world_size, "tp_rank": pm.tp_rank,
                              "local_heads": spec.arch.n_heads // dist.world_size,
                              "local_kv_heads": spec.arch.kv_heads // dist.world_size,
                              "replicated_params": replicated, **opts})
