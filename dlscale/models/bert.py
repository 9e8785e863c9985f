"""BERT-base with pretraining heads (as HF ``BertForPreTraining``, bert-base-uncased).

vocab 30522, hidden 768, 12 post-LN layers, 12 heads, intermediate 3072, 512 positions,
2 token types, LayerNorm eps 1e-12, exact (erf) GELU, dropout 0.1; pooler (dense + tanh on
[CLS]); MLM head = dense + GELU + LayerNorm, then a decoder tied to the word embedding with its
own bias; NSP head = Linear(768, 2). Full flavour: 110,106,428 parameters (same as HF).

Attention uses one fused QKV projection and ``F.scaled_dot_product_attention`` on
(B, heads, T, head_dim) tensors, no mask (the synthetic data has no padding).

Structure a pipeline / tensor-parallel splitter can rely on:

* ``model.embed(input_ids, token_type_ids)`` -> hidden states (B, T, H): ``word_emb``,
  ``pos_emb``, ``type_emb``, ``emb_ln``, dropout;
* ``model.blocks``: ``nn.ModuleList`` of ``BertLayer``; each has ``attn.qkv`` (H -> 3H),
  ``attn.proj`` (H -> H), ``ln1``, ``mlp.fc`` (H -> I), ``mlp.proj`` (I -> H), ``ln2``
  (post-LN: ``x = ln1(x + attn(x)); x = ln2(x + mlp(x))``);
* ``model.head(h, mlm_labels, nsp_labels)`` -> loss: ``pooler``, ``nsp``, ``mlm_dense``,
  ``mlm_ln``, ``decoder`` (weight tied to ``word_emb.weight``);
* ``model(*batch) == model.head(run_blocks(model.embed(*batch[:2])), *batch[2:])``;
  ``spec.embed_args == 2`` says how many leading batch tensors ``embed`` takes.

Meta-device init: ``to_empty`` from meta creates new Parameters and so unties ``decoder``; call
``model.tie_weights()`` and then ``model.init_weights()`` after it.

Loss = MLM cross-entropy (ignore_index -100, scores on all positions as HF does) + NSP CE.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.models._layers import VocabProjection
from dlscale.models import BlockLayout, ModelSpec, TransformerArch, register_model

LAYOUT = BlockLayout(attention="attn", mlp="mlp", colwise=("attn.qkv", "mlp.fc"), rowwise=("attn.proj", "mlp.proj"),
                     norms=("ln1", "ln2"), fused_qkv="attn.qkv")


@dataclass(frozen=True)
class BertConfig:
    vocab: int = 30522
    hidden: int = 768
    n_layers: int = 12
    n_heads: int = 12
    intermediate: int = 3072
    max_positions: int = 512
    type_vocab: int = 2
    seq_len: int = 128
    dropout: float = 0.1  # hidden and attention-probabilities dropout
    ln_eps: float = 1e-12
    init_std: float = 0.02
    mlm_prob: float = 0.15


_CONFIGS = {
    "full": BertConfig(),
    "tiny": BertConfig(
        vocab=1000, hidden=64, n_layers=2, n_heads=4, intermediate=256, max_positions=64, seq_len=32,
        dropout=0.0,  # deterministic, so strategies can be checked against a single process
    ),
}


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.attn_dropout = cfg.dropout
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        nh = self.n_heads
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, nh, C // nh).transpose(1, 2)
        k = k.view(B, T, nh, C // nh).transpose(1, 2)
        v = v.view(B, T, nh, C // nh).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_dropout if self.training else 0.0
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.intermediate)
        self.proj = nn.Linear(cfg.intermediate, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.ln1 = nn.LayerNorm(cfg.hidden, eps=cfg.ln_eps)
        self.mlp = MLP(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden, eps=cfg.ln_eps)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.mlp(x)))


class BertForPreTraining(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.cfg = cfg
        H = cfg.hidden
        self.word_emb = nn.Embedding(cfg.vocab, H)
        self.pos_emb = nn.Embedding(cfg.max_positions, H)
        self.type_emb = nn.Embedding(cfg.type_vocab, H)
        self.emb_ln = nn.LayerNorm(H, eps=cfg.ln_eps)
        self.emb_drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layers))
        self.pooler = nn.Linear(H, H)
        self.nsp = nn.Linear(H, 2)
        self.mlm_dense = nn.Linear(H, H)
        self.mlm_ln = nn.LayerNorm(H, eps=cfg.ln_eps)
        # its bias is the MLM output bias; logits at an aligned width on CUDA (VocabProjection)
        self.decoder = VocabProjection(H, cfg.vocab)
        self.init_weights()
        self.tie_weights()

    def tie_weights(self) -> None:
        self.decoder.weight = self.word_emb.weight

    def init_weights(self) -> None:
        """HF BERT init: normal(0, 0.02) weights and embeddings, zero biases, LN = identity."""
        std = self.cfg.init_std
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=std)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def embed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.shape[1]
        pos = torch.arange(T, device=input_ids.device)
        h = self.word_emb(input_ids) + self.pos_emb(pos) + self.type_emb(token_type_ids)
        return self.emb_drop(self.emb_ln(h))

    def head(
        self, h: torch.Tensor, mlm_labels: torch.Tensor, nsp_labels: torch.Tensor
    ) -> torch.Tensor:
        pooled = torch.tanh(self.pooler(h[:, 0]))
        nsp_logits = self.nsp(pooled)
        t = self.mlm_ln(F.gelu(self.mlm_dense(h)))
        scores = self.decoder(t)
        mlm_loss = F.cross_entropy(
            scores.view(-1, scores.size(-1)), mlm_labels.view(-1), ignore_index=-100
        )
        return mlm_loss + F.cross_entropy(nsp_logits, nsp_labels)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        mlm_labels: torch.Tensor,
        nsp_labels: torch.Tensor,
    ) -> torch.Tensor:
        h = self.embed(input_ids, token_type_ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h, mlm_labels, nsp_labels)


def arch_of(cfg: BertConfig) -> TransformerArch:
    """BERT as a TransformerArch: post-LN blocks, learned positions, the pretraining heads and the
    embedding LayerNorm as extra parameters, the token-type table as a lookup-only one."""
    H, V = cfg.hidden, cfg.vocab
    types = cfg.type_vocab * H
    heads = (H * H + H) + (H * 2 + 2) + (H * H + H) + 2 * H + V  # pooler, NSP, MLM dense + LN, decoder bias
    return TransformerArch(n_layers=cfg.n_layers, hidden=H, n_heads=cfg.n_heads, ffn_hidden=cfg.intermediate,
                           vocab=V, seq_len=cfg.seq_len, layout=LAYOUT, mlp="gelu", norm="layernorm", bias=True,
                           tied_embeddings=True, position_table=cfg.max_positions, final_norm=False, pre_norm=False,
                           causal=False, dropout=cfg.dropout, extra_params=types + 2 * H + heads,
                           extra_lookup_params=types)


@register_model("bert-base")
def make_spec(flavor: str) -> ModelSpec:
    cfg = _CONFIGS[flavor]
    arch = arch_of(cfg)

    def build() -> nn.Module:
        return BertForPreTraining(cfg)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g, B, T = generator, batch_size, cfg.seq_len
        input_ids = torch.randint(0, cfg.vocab, (B, T), generator=g, device=g.device)
        token_type_ids = torch.zeros(B, T, dtype=torch.long, device=g.device)
        token_type_ids[:, T // 2 :] = 1
        # exactly round(15%) masked positions per sequence (never none, fixed count)
        n_mask = max(1, round(cfg.mlm_prob * T))
        pos = torch.rand(B, T, generator=g, device=g.device).argsort(dim=1)[:, :n_mask]
        targets = torch.randint(0, cfg.vocab, (B, n_mask), generator=g, device=g.device)
        mlm_labels = torch.full((B, T), -100, dtype=torch.long, device=g.device)
        mlm_labels.scatter_(1, pos, targets)
        nsp_labels = torch.randint(0, 2, (B,), generator=g, device=g.device)
        return tuple(t.to(device) for t in (input_ids, token_type_ids, mlm_labels, nsp_labels))

    return ModelSpec(
        name="bert-base",
        flavor=flavor,
        build=build,
        make_batch=make_batch,
        flops_per_sample=arch.flops_per_sample(),
        unit="seq",
        seq_len=cfg.seq_len,
        optimizer="adamw",
        lr=1e-4,
        weight_decay=0.01,
        channels_last=False,
        data_kind="mlm-nsp",
        blocks=lambda m: list(m.blocks),
        arch=arch,
        embed_args=2,
        extra={"mlm_prob": cfg.mlm_prob},  # what its data loader masks (dlscale/inputs/tokens.py)
    )
