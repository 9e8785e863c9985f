"""The nn.Modules `micro layer` times (imported only when a layer is built: it imports torch).

BERT, GPT-2 and T5 are compact layers written here with those models' shapes; the Llama and GPT-3
kinds are the project's own model blocks (dlscale/models/llama.py, dlscale/models/gpt2.py) built
at the published shapes, so that one block definition serves both training and this benchmark.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from dlscale.models import gpt2, llama


class Attention(nn.Module):
    """Multi-head attention through SDPA; ``cross``: queries from x, keys and values from memory."""

    def __init__(self, d: int, heads: int, bias: bool, dropout: float, cross: bool):
        super().__init__()
        self.d, self.heads, self.dropout, self.cross = d, heads, dropout, cross
        if cross:
            self.q = nn.Linear(d, d, bias=bias)
            self.kv = nn.Linear(d, 2 * d, bias=bias)
        else:
            self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)

    def forward(self, x, memory=None, causal: bool = False):
        b, s, _ = x.shape
        d, heads = self.d, self.heads
        dh = d // heads
        if self.cross:
            e = memory.shape[1]
            q = self.q(x).view(b, s, heads, dh).transpose(1, 2)
            k, v = self.kv(memory).view(b, e, 2, heads, dh).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = self.qkv(x).view(b, s, 3, heads, dh).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                           is_causal=causal)
        return self.out(o.transpose(1, 2).reshape(b, s, d))


class MLP(nn.Module):
    def __init__(self, d: int, ff: int, bias: bool, act: nn.Module):
        super().__init__()
        self.fc1 = nn.Linear(d, ff, bias=bias)
        self.fc2 = nn.Linear(ff, d, bias=bias)
        self.act = act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class Layer(nn.Module):
    """BERT (post-LN, GELU), GPT-2 (pre-LN, tanh-GELU, causal), T5 encoder / decoder (pre-RMSNorm, no
    biases, ReLU; the decoder causal with cross-attention over ``memory``)."""

    def __init__(self, kind: str, d: int, ff: int, heads: int, dropout: float):
        super().__init__()
        t5 = kind.startswith("t5")
        self.kind = kind

        def norm():
            return nn.RMSNorm(d, eps=1e-6) if t5 else nn.LayerNorm(d, eps=1e-12 if kind == "bert" else 1e-5)

        act = nn.ReLU() if t5 else nn.GELU(approximate="tanh" if kind == "gpt2" else "none")
        self.attn = Attention(d, heads, not t5, dropout, cross=False)
        self.norm1 = norm()
        self.mlp = MLP(d, ff, not t5, act)
        self.norm2 = norm()
        if kind == "t5-decoder":
            self.cross = Attention(d, heads, not t5, dropout, cross=True)
            self.norm3 = norm()
        self.drop = nn.Dropout(dropout)

    def forward(self, x, memory=None):
        kind = self.kind
        if kind == "bert":  # post-LN
            x = self.norm1(x + self.drop(self.attn(x)))
            return self.norm2(x + self.drop(self.mlp(x)))
        x = x + self.drop(self.attn(self.norm1(x), causal=kind in ("gpt2", "t5-decoder")))
        if kind == "t5-decoder":
            x = x + self.drop(self.cross(self.norm3(x), memory))
        return x + self.drop(self.mlp(self.norm2(x)))


def llama_block(d: int, ff: int, heads: int, kv_heads: int, max_seq: int) -> nn.Module:
    """dlscale's Llama block (RMSNorm, grouped-query attention with rotary embeddings, SwiGLU) at this
    shape, with Llama 3.1's rotary scaling and tables for ``max_seq`` positions."""
    cfg = llama.LlamaConfig(hidden=d, n_layers=1, n_heads=heads, n_kv_heads=kv_heads, ffn_hidden=ff, seq_len=max_seq,
                            tied=False, rope_scaling=llama.RopeScaling(8.0))
    block = llama.Block(cfg)
    block.attn.rope = llama.rope_tables(cfg)
    return block


def gpt_block(d: int, heads: int, dropout: float) -> nn.Module:
    """dlscale's GPT-2 block (pre-LN, fused qkv, tanh-GELU MLP of 4 x d, causal): GPT-3 is the same
    block (its alternating sparse attention aside, which the usual benchmarks leave out too)."""
    return gpt2.Block(gpt2.GPTConfig(n_layers=1, n_heads=heads, hidden=d, dropout=dropout))
