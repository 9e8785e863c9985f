"""GPT-2 (nanoGPT layout): 124M (``full``) and the larger published sizes, and ``gpt2-vpad`` with
the vocabulary padded to a multiple of 64 (50,304).

Flavours (OpenAI's GPT-2 sizes, as HF's gpt2, gpt2-medium, gpt2-large, gpt2-xl configs; parameter
counts with the tied head once, position embeddings included):

    full    12 layers,  768 wide, 12 heads   124,439,808
    medium  24 layers, 1024 wide, 16 heads   354,823,168
    large   36 layers, 1280 wide, 20 heads   774,030,080
    xl      48 layers, 1600 wide, 25 heads 1,557,611,200
    tiny     2 layers,   64 wide,  4 heads (vocabulary 500, 64 positions; for the CPU)

n_layer 12, n_head 12, n_embd 768, vocab 50257, block 1024, pre-LN, LayerNorm and Linear with
bias, tanh-approximated GELU, ``lm_head`` tied to ``wte`` (no bias), dropout 0.0, nanoGPT init
(normal 0.02, residual projections scaled by 1/sqrt(2 * n_layer)). Full flavour: 124,439,808
parameters; ``gpt2-vpad``: 124,475,904 (embedding rows padded to a multiple of 64; targets stay
below 50257, the padded logits are never a target).

Attention: fused ``qkv`` (768 -> 2304), ``F.scaled_dot_product_attention(is_causal=True)`` on
(B, heads, T, head_dim) tensors.

Structure a pipeline / tensor-parallel splitter can rely on:

* ``model.embed(idx)`` -> hidden states (B, T, C): ``wte`` + ``wpe``, dropout;
* ``model.blocks``: ``nn.ModuleList`` of ``Block``; each has ``ln1``, ``attn.qkv`` (C -> 3C),
  ``attn.proj`` (C -> C), ``ln2``, ``mlp.fc`` (C -> 4C), ``mlp.proj`` (4C -> C)
  (pre-LN: ``x = x + attn(ln1(x)); x = x + mlp(ln2(x))``);
* ``model.head(h, targets)`` -> loss: ``ln_f``, ``lm_head`` (weight tied to ``wte.weight``; a
  ``VocabProjection``, whose logits on CUDA are padded to a multiple of 64 with masked columns),
  cross-entropy over (B*T, vocab);
* ``model(idx, targets) == model.head(run_blocks(model.embed(idx)), targets)``;
  ``spec.embed_args == 1``.

Meta-device init: ``to_empty`` from meta creates new Parameters and so unties ``lm_head``; call
``model.tie_weights()`` and then ``model.init_weights()`` after it.

FLOPs: both variants report the useful work of the real 50257-token vocabulary
(``spec.arch.flops_params()`` = parameters without ``wpe`` and without padding rows), so
their throughput-based MFU compares directly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.models import BlockLayout, ModelSpec, TransformerArch, register_model
from dlscale.models._layers import VocabProjection

FLAVORS = ("full", "tiny", "medium", "large", "xl")
LAYOUT = BlockLayout(attention="attn", mlp="mlp", colwise=("attn.qkv", "mlp.fc"), rowwise=("attn.proj", "mlp.proj"),
                     norms=("ln1", "ln2"), fused_qkv="attn.qkv")


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 50257  # real vocabulary: targets are drawn below this
    padded_vocab: int = 50257  # rows of wte / lm_head
    block_size: int = 1024
    n_layers: int = 12
    n_heads: int = 12
    hidden: int = 768
    dropout: float = 0.0
    init_std: float = 0.02


_CONFIGS = {
    "full": GPTConfig(),
    "tiny": GPTConfig(vocab=500, padded_vocab=500, block_size=64, n_layers=2, n_heads=4, hidden=64),
    "medium": GPTConfig(n_layers=24, n_heads=16, hidden=1024),
    "large": GPTConfig(n_layers=36, n_heads=20, hidden=1280),
    "xl": GPTConfig(n_layers=48, n_heads=25, hidden=1600),
}


def _pad64(n: int) -> int:
    return (n + 63) // 64 * 64


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        nh = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, nh, C // nh).transpose(1, 2)
        k = k.view(B, T, nh, C // nh).transpose(1, 2)
        v = v.view(B, T, nh, C // nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, C)))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.proj = nn.Linear(4 * cfg.hidden, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab, cfg.hidden)
        self.wpe = nn.Embedding(cfg.block_size, cfg.hidden)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        # logits at an aligned width on CUDA (see VocabProjection); the loss is the same
        self.lm_head = VocabProjection(cfg.hidden, cfg.padded_vocab, bias=False)
        self.tie_weights()
        self.init_weights()

    def tie_weights(self) -> None:
        self.lm_head.weight = self.wte.weight

    def init_weights(self) -> None:
        """nanoGPT init: normal(0, 0.02), zero biases, residual projections / sqrt(2 * n_layer)."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, mean=0.0, std=std)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        resid_std = std / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, mean=0.0, std=resid_std)
            nn.init.normal_(block.mlp.proj.weight, mean=0.0, std=resid_std)

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def head(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(self.ln_f(h))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(h, targets)


def arch_of(cfg: GPTConfig) -> TransformerArch:
    return TransformerArch(n_layers=cfg.n_layers, hidden=cfg.hidden, n_heads=cfg.n_heads, ffn_hidden=4 * cfg.hidden,
                           vocab=cfg.vocab, padded_vocab=cfg.padded_vocab, seq_len=cfg.block_size, layout=LAYOUT,
                           mlp="gelu", norm="layernorm", bias=True, tied_embeddings=True,
                           position_table=cfg.block_size, causal=True, dropout=cfg.dropout)


def _make_spec(name: str, flavor: str, cfg: GPTConfig) -> ModelSpec:
    arch = arch_of(cfg)

    def build() -> nn.Module:
        return GPT(cfg)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g = generator
        tokens = torch.randint(
            0, cfg.vocab, (batch_size, cfg.block_size + 1), generator=g, device=g.device
        )
        idx = tokens[:, :-1].contiguous()
        targets = tokens[:, 1:].contiguous()
        return idx.to(device), targets.to(device)

    return ModelSpec(
        name=name,
        flavor=flavor,
        build=build,
        make_batch=make_batch,
        flops_per_sample=arch.flops_per_sample(),
        unit="seq",
        seq_len=cfg.block_size,
        optimizer="adamw",
        lr=6e-4,
        weight_decay=0.1,
        channels_last=False,
        data_kind="causal-lm",
        blocks=lambda m: list(m.blocks),
        arch=arch,
        embed_args=1,
    )


@register_model("gpt2", flavors=FLAVORS)
def make_spec(flavor: str) -> ModelSpec:
    return _make_spec("gpt2", flavor, _CONFIGS[flavor])


@register_model("gpt2-vpad", flavors=FLAVORS)
def make_spec_vpad(flavor: str) -> ModelSpec:
    base = _CONFIGS[flavor]
    return _make_spec("gpt2-vpad", flavor, replace(base, padded_vocab=_pad64(base.vocab)))
