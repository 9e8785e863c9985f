"""GPT-2 (and gpt2-vpad) in JAX: the layout of ``dlscale.models.gpt2``.

Pre-LN blocks with a fused ``qkv`` projection (C -> 3C) whose output is split into
(B, T, heads, head_dim) tensors with no transposes (JAX attention's layout), causal
``jax.nn.dot_product_attention`` (cuDNN flash attention on GPUs in half precision), tanh GELU,
``lm_head`` tied to ``wte`` (no separate parameter), vocabulary projection padded to
``ctx.vocab_multiple`` rows with masked logits, nanoGPT init.
"""
from __future__ import annotations

import math

from dlscale.frameworks.jax import layers as L
from dlscale.frameworks.jax.models import JaxModel, tensors_to_numpy
from dlscale.models import ModelSpec

LN_EPS = 1e-5  # torch nn.LayerNorm's default


def make(spec: ModelSpec) -> JaxModel:
    a = spec.arch
    C, nl, nh = a.hidden, a.n_layers, a.n_heads
    V, T = a.padded_vocab or a.vocab, spec.seq_len
    std, resid_std = 0.02, 0.02 / math.sqrt(2 * nl)

    def init(ini):
        wte, wpe = ini.normal((V, C), std), ini.normal((T, C), std)
        blocks = [{
            "ln1": L.norm_params(ini, C),
            "attn": {"qkv": L.dense_params(ini, C, 3 * C, std=std), "proj": L.dense_params(ini, C, C, std=resid_std)},
            "ln2": L.norm_params(ini, C),
            "mlp": {"fc": L.dense_params(ini, C, 4 * C, std=std), "proj": L.dense_params(ini, 4 * C, C, std=resid_std)},
        } for _ in range(nl)]
        return {"wte": {"weight": wte}, "wpe": {"weight": wpe}, "blocks": blocks, "ln_f": L.norm_params(ini, C)}, {}

    def block(p, h, ctx):
        B, t, _ = h.shape
        qkv = L.dense(p["attn"]["qkv"], L.layer_norm(p["ln1"], h, LN_EPS), ctx).reshape(B, t, 3, nh, C // nh)
        y = L.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ctx, causal=True)
        h = h + L.dense(p["attn"]["proj"], y.reshape(B, t, C), ctx)
        m = L.gelu(L.dense(p["mlp"]["fc"], L.layer_norm(p["ln2"], h, LN_EPS), ctx), approximate=True)
        return h + L.dense(p["mlp"]["proj"], m, ctx)

    def loss(params, stats, batch, ctx: L.Ctx, key=None):
        idx, targets = batch
        h = L.embed(params["wte"]["weight"], idx) + params["wpe"]["weight"][: idx.shape[1]]
        for p in params["blocks"]:
            h = block(p, h, ctx)
        logits = L.vocab_logits(L.layer_norm(params["ln_f"], h, LN_EPS), params["wte"]["weight"], None, ctx)
        return L.cross_entropy(logits, targets), stats

    return JaxModel(spec.name, spec.flavor, spec, init, loss, tensors_to_numpy)
