"""The layers the JAX models are made of, as pure functions over parameter dicts.

Precision follows torch autocast, so both frameworks compute the same thing: matmuls,
convolutions, GELU and attention run in the compute dtype (``ctx.dtype``: float32, bfloat16 or
float16, fp32 accumulation); LayerNorm, BatchNorm statistics, softmax cross-entropy and the
residual stream run in float32; parameters are float32 (the master copy) and cast at use.

Matmuls and convolutions return the compute dtype directly (the GPU libraries accumulate half
precision in fp32 anyway), never ``preferred_element_type=float32`` followed by a cast: the
transpose of that cast hands the backward pass a float32 cotangent, so every gradient matmul
would mix float32 with the half-precision operand and XLA would run it in fp32/TF32 on upcast
copies (2/3 of the FLOPs at half the tensor-core rate or worse). Here, as in torch autocast, the
backward matmuls run in the compute dtype too.

Layouts are JAX's: a dense kernel is (in, out), a convolution kernel HWIO on NHWC activations,
an embedding (rows, features). ``dlscale.frameworks.jax.convert`` maps torch tensors onto them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

F32 = jnp.float32
# attention implementations the traced models used (filled at trace time; the worker records it)
ATTENTION_USED: set[str] = set()
# as dlscale.models._layers: exp(-1e4) underflows to 0 in a float32 softmax, finite in fp16/bf16
MASKED_LOGIT = -1.0e4


@dataclass(frozen=True)
class Ctx:
    """How a model computes: static for jit (hashable)."""

    dtype: str = "float32"  # compute dtype of matmuls, convolutions, attention
    train: bool = True
    # jax.nn.dot_product_attention implementation: "cudnn" (fused flash attention on GPUs, half
    # precision only), "xla", or None (JAX's choice); a failing "cudnn" falls back to "xla"
    attention: str | None = None
    vocab_multiple: int = 1  # pad vocabulary projections to this many rows (64 on GPUs)
    # BatchNorm statistics per group of the batch: one group per data-parallel device, as in
    # torch DDP (local statistics, no communication), 1 on a single device
    bn_groups: int = 1

    @property
    def cdt(self):
        return jnp.dtype(self.dtype)


# ------------------------------------------------------------------ init

class HostInit:
    """Initial parameters drawn on the host with numpy, the same on every process for one seed.

    Why not ``jax.random`` under jit: XLA compiles a random-number program for every parameter
    shape, which took 15-25 s for the tiny GPT-2 on a 2-core CPU (the whole training step
    compiles in less); numpy draws the full GPT-2 in about a second, and the arrays are then
    placed shard by shard (``train.place``). The distributions are the torch models' own.
    """

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def normal(self, shape, std: float):
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def uniform(self, shape, bound: float):
        return self.rng.uniform(-bound, bound, shape).astype(np.float32)

    def zeros(self, shape):
        return np.zeros(shape, np.float32)

    def ones(self, shape):
        return np.ones(shape, np.float32)


class ShapeInit:
    """The same tree of ``jax.ShapeDtypeStruct`` leaves, nothing allocated (parameter counts of
    the full models, shardings)."""

    def _leaf(self, shape, *_):
        return jax.ShapeDtypeStruct(tuple(shape), jnp.float32)

    normal = uniform = _leaf

    def zeros(self, shape):
        return self._leaf(shape)

    ones = zeros


def dense_params(init, fan_in: int, fan_out: int, *, std: float | None = None, bias: bool = True) -> dict:
    """A dense layer: normal(0, std) kernel and zero bias, or torch nn.Linear's default
    (uniform +-1/sqrt(fan_in) for both) when ``std`` is None."""
    if std is None:
        bound = 1.0 / math.sqrt(fan_in)
        p = {"kernel": init.uniform((fan_in, fan_out), bound)}
        if bias:
            p["bias"] = init.uniform((fan_out,), bound)
        return p
    p = {"kernel": init.normal((fan_in, fan_out), std)}
    if bias:
        p["bias"] = init.zeros((fan_out,))
    return p


def norm_params(init, features: int) -> dict:
    return {"weight": init.ones((features,)), "bias": init.zeros((features,))}


# ------------------------------------------------------------------ layers

def dense(p: dict, x, ctx: Ctx):
    dt = ctx.cdt
    y = jnp.dot(x.astype(dt), p["kernel"].astype(dt))  # not preferred_element_type: module docstring
    if "bias" in p:
        y = y + p["bias"].astype(dt)
    return y


def layer_norm(p: dict, x, eps: float):
    """LayerNorm in float32 (torch autocast runs layer_norm in fp32); returns float32."""
    x = x.astype(F32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * p["weight"] + p["bias"]


def embed(table, ids):
    return jnp.take(table, ids, axis=0)


def gelu(x, approximate: bool):
    return jax.nn.gelu(x, approximate=approximate)


def dropout(x, rate: float, key, ctx: Ctx):
    if not ctx.train or rate == 0.0 or key is None:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def attention(q, k, v, ctx: Ctx, *, causal: bool, dropout_rate: float = 0.0, key=None):
    """Scaled dot-product attention on (B, T, heads, head_dim) in the compute dtype.

    Without dropout: ``jax.nn.dot_product_attention`` (cuDNN flash attention where asked for and
    possible, XLA otherwise). With attention-probability dropout (BERT-base in training, as torch's
    SDPA does it) the fused kernels do not apply: softmax in float32, dropout, then the product.
    """
    if dropout_rate > 0.0 and ctx.train and key is not None:
        scale = 1.0 / math.sqrt(q.shape[-1])
        s = jnp.einsum("btnh,bsnh->bnts", q, k).astype(F32) * scale
        if causal:
            t = q.shape[1]
            s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
        ATTENTION_USED.add("manual (dropout)")
        w = dropout(jax.nn.softmax(s, axis=-1), dropout_rate, key, ctx).astype(q.dtype)
        return jnp.einsum("bnts,bsnh->btnh", w, v)
    impl = ctx.attention
    if impl == "cudnn":
        try:
            out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
            ATTENTION_USED.add("cudnn")
            return out
        except Exception:  # noqa: BLE001 - not this dtype/shape/GPU/cuDNN: XLA's, as JAX would
            impl = "xla"
    ATTENTION_USED.add(impl or "default")
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=impl)


def vocab_logits(x, table, bias, ctx: Ctx):
    """``x @ table.T (+ bias)`` with the vocabulary padded to ``ctx.vocab_multiple`` rows.

    The padded rows are zero and their logits get MASKED_LOGIT, so the softmax and the loss equal
    those over the real vocabulary (as ``dlscale.models._layers.vocab_logits`` does on CUDA: a
    vocabulary such as 50,257 rows misaligns the logits for the tensor cores).
    """
    vocab = table.shape[0]
    pad = -vocab % ctx.vocab_multiple
    dt = ctx.cdt
    w = table if pad == 0 else jnp.pad(table, ((0, pad), (0, 0)))
    logits = jnp.dot(x.astype(dt), w.astype(dt).T)
    if pad:
        b = jnp.zeros((vocab,), F32) if bias is None else bias
        b = jnp.concatenate([b, jnp.full((pad,), MASKED_LOGIT, F32)])
        return logits + b.astype(dt)
    return logits if bias is None else logits + bias.astype(dt)


def cross_entropy(logits, labels, ignore_index: int | None = None):
    """Mean softmax cross-entropy in float32 over the last axis; ``ignore_index`` labels count
    neither in the sum nor in the mean (torch's F.cross_entropy).

    As ``logsumexp - logit[label]``, the label's logit picked by comparing with an iota: reductions
    and elementwise work XLA fuses, where ``take_along_axis`` on the log-softmax materialises it
    in float32 and its gradient is a scatter into a zeroed (batch, seq, vocab) float32 array.
    """
    x = logits.astype(F32)
    safe = labels if ignore_index is None else jnp.where(labels != ignore_index, labels, 0)
    hit = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1) == safe[..., None]
    nll = jax.nn.logsumexp(x, axis=-1) - jnp.sum(jnp.where(hit, x, 0.0), axis=-1)
    if ignore_index is None:
        return jnp.mean(nll)
    valid = labels != ignore_index
    return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(jnp.sum(valid), 1)


def conv(p: dict, x, ctx: Ctx, stride: int = 1, padding: int = 0):
    dt = ctx.cdt
    return lax.conv_general_dilated(
        x.astype(dt), p["kernel"].astype(dt), (stride, stride), [(padding, padding)] * 2,
        dimension_numbers=("NHWC", "HWIO", "NHWC"))


def batch_norm(p: dict, stats: dict, x, ctx: Ctx, momentum: float = 0.1, eps: float = 1e-5):
    """BatchNorm2d on NHWC: batch statistics in training (per group of ``ctx.bn_groups``: each
    data-parallel device normalises with its own slice's statistics, as torch DDP does), running
    statistics otherwise. Returns (output in the compute dtype, new running statistics)."""
    if not ctx.train:
        y = (x.astype(F32) - stats["mean"]) * lax.rsqrt(stats["var"] + eps) * p["weight"] + p["bias"]
        return y.astype(ctx.cdt), stats
    n, h, w, c = x.shape
    g = ctx.bn_groups
    xg = x.astype(F32).reshape(g, n // g, h, w, c)
    mean = jnp.mean(xg, axis=(1, 2, 3), keepdims=True)
    var = jnp.mean(jnp.square(xg - mean), axis=(1, 2, 3), keepdims=True)
    y = ((xg - mean) * lax.rsqrt(var + eps)).reshape(n, h, w, c) * p["weight"] + p["bias"]
    count = (n // g) * h * w
    batch_mean = jnp.mean(mean.reshape(g, c), axis=0)
    batch_var = jnp.mean(var.reshape(g, c), axis=0) * count / max(count - 1, 1)  # unbiased, as torch
    new = {"mean": (1 - momentum) * stats["mean"] + momentum * lax.stop_gradient(batch_mean),
           "var": (1 - momentum) * stats["var"] + momentum * lax.stop_gradient(batch_var)}
    return y.astype(ctx.cdt), new


def max_pool(x, window: int, stride: int, padding: int):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, window, window, 1),
                             (1, stride, stride, 1), ((0, 0), (padding, padding), (padding, padding), (0, 0)))
