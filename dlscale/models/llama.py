"""Llama-style decoder: RMSNorm, SwiGLU, rotary embeddings, grouped-query attention.

Flavours follow the published shapes (the models' config.json on the Hugging Face Hub:
meta-llama/Llama-3.2-1B, meta-llama/Llama-3.2-3B, meta-llama/Llama-3.1-8B), at a training
sequence of 2,048 tokens; parameter counts as published (tied output projection counted once):

    1b   16 layers, 2048 wide, 32 heads, 8 kv heads, SwiGLU 8192,  tied   1,235,814,400
    3b   28 layers, 3072 wide, 24 heads, 8 kv heads, SwiGLU 8192,  tied   3,212,749,824
    8b   32 layers, 4096 wide, 32 heads, 8 kv heads, SwiGLU 14336, untied 8,030,261,248
    tiny  2 layers,   64 wide,  4 heads, 2 kv heads, SwiGLU 128,   tied (vocabulary 512, 64 tokens)

All: vocabulary 128,256 (a multiple of 64, so the head's logits are aligned as they are), RMSNorm
eps 1e-5, no biases, rope theta 500,000 with Llama 3's frequency scaling (factor 32 for 3.2, 8 for
3.1; low/high frequency factors 1 and 4, original context 8,192). Llama 3.2's small models tie
the output projection to the embedding; 3.1 8B does not: ``LlamaConfig.tied`` follows the
published configs, and the untied head is a separate ``output`` weight.

Written for speed the way torchtitan writes its Llama: separate ``wq``/``wk``/``wv`` projections
(tensor parallel shards them column-wise as they are, no permutation), attention views use ``-1``
heads so a block runs unchanged on a tensor-parallel shard, one
``scaled_dot_product_attention(is_causal=True, enable_gqa=True)`` call (the kernel reads the shared
key/value heads; no ``repeat_kv`` copy), ``nn.RMSNorm`` (fused by torch.compile), rotary tables
precomputed once per model (one tensor shared by every block) and cast to the activations' dtype,
no graph breaks.

Structure a pipeline / tensor-parallel splitter can rely on:

* ``model.embed(idx)`` -> (B, T, C); ``model.blocks``: ``nn.ModuleList`` of ``Block`` with
  ``attn_norm``, ``attn.wq/wk/wv/wo``, ``mlp_norm``, ``mlp.w1/w2/w3``
  (``x = x + attn(attn_norm(x)); x = x + mlp(mlp_norm(x))``, ``mlp(x) = w2(silu(w1 x) * w3 x)``);
* ``model.head(h, targets)`` -> loss: ``norm``, ``output``, cross-entropy;
* ``model(idx, targets) == model.head(run_blocks(model.embed(idx)), targets)``.

Meta-device init: after ``to_empty``, call ``model.tie_weights()`` (tied flavours) and
``model.init_weights()`` (also recomputes the rotary tables).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.models import BlockLayout, ModelSpec, TransformerArch, register_model
from dlscale.models._layers import VocabProjection

FLAVORS = ("1b", "3b", "8b", "tiny")
LAYOUT = BlockLayout(attention="attn", mlp="mlp", colwise=("attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3"),
                     rowwise=("attn.wo", "mlp.w2"), norms=("attn_norm", "mlp_norm"), fused_qkv=None)


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's rotary frequency scaling (``rope_type: llama3`` in the configs)."""

    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int = 128256
    hidden: int = 2048
    n_layers: int = 16
    n_heads: int = 32
    n_kv_heads: int = 8
    ffn_hidden: int = 8192
    seq_len: int = 2048
    tied: bool = True
    rope_theta: float = 500000.0
    rope_scaling: RopeScaling | None = RopeScaling(32.0)
    norm_eps: float = 1e-5
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads


_CONFIGS = {
    "1b": LlamaConfig(),
    "3b": LlamaConfig(hidden=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_hidden=8192),
    "8b": LlamaConfig(hidden=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_hidden=14336, tied=False,
                      rope_scaling=RopeScaling(8.0)),
    "tiny": LlamaConfig(vocab=512, hidden=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=128, seq_len=64),
}


def rope_inv_freq(cfg: LlamaConfig) -> torch.Tensor:
    """Rotary inverse frequencies, with Llama 3's scaling: wavelengths longer than the original
    context / low_freq_factor are stretched by ``factor``, shorter than context / high_freq_factor
    kept, and those between interpolated smoothly."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    sc = cfg.rope_scaling
    if sc is None:
        return inv.float()
    wavelen = 2 * math.pi / inv
    low_wavelen = sc.original_context / sc.low_freq_factor
    high_wavelen = sc.original_context / sc.high_freq_factor
    scaled = torch.where(wavelen > low_wavelen, inv / sc.factor, inv)
    smooth = (sc.original_context / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor)
    between = (1 - smooth) * scaled / sc.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, between, scaled).float()


def rope_tables(cfg: LlamaConfig, device=None) -> torch.Tensor:
    """(2, T, head_dim) float32: cos and sin of every position, each frequency twice (the
    rotate-half layout: dimension i pairs with i + head_dim/2)."""
    inv = rope_inv_freq(cfg).to(device)
    t = torch.arange(cfg.seq_len, device=device, dtype=torch.float32)
    freqs = torch.outer(t, inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return torch.stack((emb.cos(), emb.sin()))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.hidden, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.hidden, bias=False)
        # (2, T, head_dim): set by the model, one tensor for all blocks
        self.register_buffer("rope", torch.empty(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        hd = self.head_dim
        # -1 heads: on a tensor-parallel shard these are the rank's own heads
        q = self.wq(x).view(B, T, -1, hd).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, hd).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, hd).transpose(1, 2)
        cos, sin = self.rope[0, :T].to(q.dtype), self.rope[1, :T].to(q.dtype)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)  # gate
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn_hidden, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.hidden, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.output = VocabProjection(cfg.hidden, cfg.vocab, bias=False)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        if self.cfg.tied:
            self.output.weight = self.tok_embeddings.weight

    def init_weights(self) -> None:
        """Hugging Face's Llama init: normal(0, 0.02) for every Linear and the embedding, RMSNorm
        weights 1; and the rotary tables (also after ``to_empty``)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, nn.RMSNorm):
                nn.init.ones_(m.weight)
        device = self.tok_embeddings.weight.device
        rope = rope_tables(self.cfg, None if device.type == "meta" else device).to(device)
        for block in self.blocks:
            block.attn.rope = rope

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok_embeddings(idx)

    def head(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.output(self.norm(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(h, targets)


def arch_of(cfg: LlamaConfig) -> TransformerArch:
    return TransformerArch(n_layers=cfg.n_layers, hidden=cfg.hidden, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                           head_dim=cfg.head_dim, ffn_hidden=cfg.ffn_hidden, vocab=cfg.vocab, seq_len=cfg.seq_len,
                           layout=LAYOUT, mlp="swiglu", norm="rmsnorm", bias=False, tied_embeddings=cfg.tied,
                           position_table=0, final_norm=True, causal=True, dropout=0.0)


@register_model("llama", flavors=FLAVORS)
def make_spec(flavor: str) -> ModelSpec:
    cfg = _CONFIGS[flavor]
    arch = arch_of(cfg)

    def build() -> nn.Module:
        return Llama(cfg)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g = generator
        tokens = torch.randint(0, cfg.vocab, (batch_size, cfg.seq_len + 1), generator=g, device=g.device)
        return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)

    return ModelSpec(name="llama", flavor=flavor, build=build, make_batch=make_batch,
                     flops_per_sample=arch.flops_per_sample(), unit="seq", seq_len=cfg.seq_len, optimizer="adamw",
                     lr=3e-4, weight_decay=0.1, channels_last=False, blocks=lambda m: list(m.blocks), arch=arch,
                     embed_args=1)
