"""BERT-base with pretraining heads in JAX: the layout of ``dlscale.models.bert``.

Post-LN layers with a fused ``qkv`` projection, exact (erf) GELU, LayerNorm eps 1e-12, pooler +
NSP head, MLM head (dense, GELU, LayerNorm) and a decoder tied to ``word_emb`` with its own bias
(``decoder.bias``; the decoder weight is not a separate parameter), HF init. Dropout 0.1 in the
full flavour (hidden states and attention probabilities, as torch's SDPA applies it), none in
the tiny one. Loss = MLM cross-entropy over the masked positions (label -100 ignored) + NSP.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dlscale.frameworks.jax import layers as L
from dlscale.frameworks.jax.models import JaxModel, tensors_to_numpy
from dlscale.models import ModelSpec
from dlscale.models.bert import _CONFIGS

LN_EPS = 1e-12
STD = 0.02


def make(spec: ModelSpec) -> JaxModel:
    a = spec.arch
    H, I, nl, nh, V = a.hidden, a.ffn_hidden, a.n_layers, a.n_heads, a.vocab
    rate = float(a.dropout)

    cfg = _CONFIGS[spec.flavor]
    P, TV = cfg.max_positions, cfg.type_vocab

    def init(ini):
        params = {
            "word_emb": {"weight": ini.normal((V, H), STD)},
            "pos_emb": {"weight": ini.normal((P, H), STD)},
            "type_emb": {"weight": ini.normal((TV, H), STD)},
            "emb_ln": L.norm_params(ini, H),
            "blocks": [{
                "attn": {"qkv": L.dense_params(ini, H, 3 * H, std=STD), "proj": L.dense_params(ini, H, H, std=STD)},
                "ln1": L.norm_params(ini, H),
                "mlp": {"fc": L.dense_params(ini, H, I, std=STD), "proj": L.dense_params(ini, I, H, std=STD)},
                "ln2": L.norm_params(ini, H),
            } for _ in range(nl)],
            "pooler": L.dense_params(ini, H, H, std=STD),
            "nsp": L.dense_params(ini, H, 2, std=STD),
            "mlm_dense": L.dense_params(ini, H, H, std=STD),
            "mlm_ln": L.norm_params(ini, H),
            "decoder": {"bias": ini.zeros((V,))},
        }
        return params, {}

    def layer(p, h, ctx, key):
        B, T, _ = h.shape
        k_attn, k1, k2 = jax.random.split(key, 3) if key is not None else (None, None, None)
        qkv = L.dense(p["attn"]["qkv"], h, ctx).reshape(B, T, 3, nh, H // nh)
        y = L.attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], ctx, causal=False,
                        dropout_rate=rate, key=k_attn)
        a = L.dense(p["attn"]["proj"], y.reshape(B, T, H), ctx)
        h = L.layer_norm(p["ln1"], h + L.dropout(a, rate, k1, ctx), LN_EPS)
        m = L.dense(p["mlp"]["proj"], L.gelu(L.dense(p["mlp"]["fc"], h, ctx), approximate=False), ctx)
        return L.layer_norm(p["ln2"], h + L.dropout(m, rate, k2, ctx), LN_EPS)

    def loss(params, stats, batch, ctx: L.Ctx, key=None):
        input_ids, token_type_ids, mlm_labels, nsp_labels = batch
        T = input_ids.shape[1]
        use_key = key is not None and ctx.train and rate > 0
        keys = list(jax.random.split(key, nl + 1)) if use_key else [None] * (nl + 1)
        h = (L.embed(params["word_emb"]["weight"], input_ids) + params["pos_emb"]["weight"][:T]
             + L.embed(params["type_emb"]["weight"], token_type_ids))
        h = L.dropout(L.layer_norm(params["emb_ln"], h, LN_EPS), rate, keys[0], ctx)
        for p, k in zip(params["blocks"], keys[1:]):
            h = layer(p, h, ctx, k)
        pooled = jnp.tanh(L.dense(params["pooler"], h[:, 0], ctx))
        nsp_logits = L.dense(params["nsp"], pooled, ctx)
        t = L.layer_norm(params["mlm_ln"], L.gelu(L.dense(params["mlm_dense"], h, ctx), approximate=False), LN_EPS)
        scores = L.vocab_logits(t, params["word_emb"]["weight"], params["decoder"]["bias"], ctx)
        mlm = L.cross_entropy(scores, mlm_labels, ignore_index=-100)
        return mlm + L.cross_entropy(nsp_logits, nsp_labels), stats

    return JaxModel(spec.name, spec.flavor, spec, init, loss, tensors_to_numpy, uses_dropout=rate > 0)
