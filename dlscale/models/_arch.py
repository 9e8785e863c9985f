"""Typed architecture of a transformer: what parameter counts, FLOPs, strategies and the memory
planner read, instead of a loose dict.

A model file builds its ``TransformerArch`` from its own configuration and puts it in
``ModelSpec.arch``; the model's parameter count (tested against the built module) and its FLOPs
come from here, so that the formula is written once for every transformer.

FLOPs (docs/models.md): training FLOPs per token = 6 N + 12 L A T, with N the parameters that
take part in a matmul for every token (all of them, less the tables that are only looked up:
learned positions, token types, an untied input embedding, and vocabulary padding rows), L the
layers, A = query heads x head dim (the width of the attention scores; with grouped-query
attention the keys and values are shared but every query head still does its own QK^T and AV),
T the sequence length. This is PaLM's appendix-B formula (6 N T + 12 L H T^2 per sequence, as
nanoGPT and torchtitan count), with H generalised to A; SwiGLU's three matrices are in N.
Recomputation (activation checkpointing) is not counted: MFU counts the model's FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

MLP_KINDS = ("gelu", "swiglu")
NORM_KINDS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class BlockLayout:
    """Where tensor parallelism finds the pieces of one block (attribute paths inside the block)."""

    attention: str  # the attention module
    mlp: str  # the MLP module
    colwise: tuple[str, ...]  # Linears whose output features are split (each rank: its heads / MLP slice)
    rowwise: tuple[str, ...]  # Linears whose input features are split (partial outputs all-reduced)
    norms: tuple[str, ...]  # the block's norms (sequence parallel runs them on sequence shards)
    # one [q | k | v] Linear: tensor parallel permutes its rows so that a shard holds whole heads and
    # runs the attention on the local heads itself; None: the attention works on local shards as is
    fused_qkv: str | None = None


@dataclass(frozen=True)
class TransformerArch:
    """Shape of a transformer language model (decoder or encoder)."""

    n_layers: int
    hidden: int
    n_heads: int
    ffn_hidden: int  # MLP inner width (SwiGLU: the width of each of w1 and w3)
    vocab: int  # real vocabulary: targets lie below it
    seq_len: int  # tokens per sample
    layout: BlockLayout
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    head_dim: int | None = None  # None = hidden // n_heads
    padded_vocab: int | None = None  # rows of the embedding; None = vocab
    mlp: str = "gelu"  # "gelu": proj(gelu(fc x)); "swiglu": w2(silu(w1 x) * w3 x)
    norm: str = "layernorm"  # "layernorm" (weight and bias) or "rmsnorm" (weight)
    bias: bool = True  # biases on the blocks' Linears
    tied_embeddings: bool = True  # output projection = input embedding
    position_table: int = 0  # rows of a learned position embedding (0: rotary)
    final_norm: bool = True  # a norm after the last block (pre-LN decoders)
    pre_norm: bool = True  # x + f(norm(x)) (False: post-LN, norm(x + f(x)), as BERT)
    causal: bool = True
    dropout: float = 0.0
    extra_params: int = 0  # parameters outside embeddings, blocks and final norm (BERT's heads)
    extra_lookup_params: int = 0  # of which only looked up, no matmul (BERT's token types)

    def __post_init__(self) -> None:
        if self.mlp not in MLP_KINDS:
            raise ValueError(f"mlp must be one of {MLP_KINDS}, got {self.mlp!r}")
        if self.norm not in NORM_KINDS:
            raise ValueError(f"norm must be one of {NORM_KINDS}, got {self.norm!r}")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(f"kv heads {self.kv_heads} must divide the {self.n_heads} heads")

    # ------------------------------------------------------------ derived shape

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def dim_head(self) -> int:
        return self.head_dim or self.hidden // self.n_heads

    @property
    def attn_dim(self) -> int:
        """Width of the queries and of the attention output: heads x head dim."""
        return self.n_heads * self.dim_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_head

    @property
    def rows(self) -> int:
        return self.padded_vocab or self.vocab

    @property
    def n_blocks(self) -> int:
        return self.n_layers

    @property
    def norm_params(self) -> int:
        return 2 * self.hidden if self.norm == "layernorm" else self.hidden

    # ------------------------------------------------------------ parameters

    def block_params(self) -> int:
        h, a, kv, f = self.hidden, self.attn_dim, self.kv_dim, self.ffn_hidden
        attn = h * a + 2 * h * kv + a * h + (a + 2 * kv + h if self.bias else 0)
        if self.mlp == "gelu":
            mlp = 2 * h * f + (f + h if self.bias else 0)
        else:
            mlp = 3 * h * f + (2 * f + h if self.bias else 0)
        return attn + mlp + 2 * self.norm_params

    def embedding_params(self) -> int:
        return (self.rows + self.position_table) * self.hidden

    def head_params(self) -> int:
        """The output projection's own parameters (0 when tied to the embedding)."""
        return 0 if self.tied_embeddings else self.rows * self.hidden

    def param_count(self) -> int:
        """Unique parameters (a tied output projection once); tests compare it with the module."""
        final = self.norm_params if self.final_norm else 0
        return (self.embedding_params() + self.n_layers * self.block_params() + final + self.head_params()
                + self.extra_params)

    def flops_params(self) -> int:
        """N of the FLOPs formula: the parameters used in a matmul for every token."""
        lookup = self.position_table * self.hidden + self.extra_lookup_params
        padding = (self.rows - self.vocab) * self.hidden  # rows no target ever needs
        untied_input = 0 if self.tied_embeddings else self.rows * self.hidden
        return self.param_count() - lookup - padding - untied_input

    # ------------------------------------------------------------ FLOPs

    def flops_per_sample(self) -> float:
        """Training FLOPs of one sequence: 6 N T + 12 L A T^2 (forward + backward)."""
        return transformer_flops_per_sample(self.flops_params(), self.n_layers, self.attn_dim, self.seq_len)

    def flops_per_token(self) -> float:
        return self.flops_per_sample() / self.seq_len


def transformer_flops_per_sample(n_params: int, n_layers: int, attn_dim: int, seq: int) -> float:
    """Training FLOPs per sequence: 6*N*T + 12*L*A*T^2 (PaLM appendix B, as in nanoGPT).

    N excludes the tables that are only looked up; A is the attention width (the hidden size for
    multi-head attention); T the sequence length.
    """
    return 6.0 * n_params * seq + 12.0 * n_layers * attn_dim * seq * seq
