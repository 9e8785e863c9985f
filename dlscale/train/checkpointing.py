"""Activation checkpointing per block: ``--activation-checkpointing none|selective|full``.

Each of the model's blocks (``spec.blocks``) runs under ``torch.utils.checkpoint`` (non-reentrant,
RNG state preserved so dropout recomputes the same mask):

* ``full``: the block keeps only its input; its whole forward is recomputed in the backward.
* ``selective``: torchtitan's op-level policy (its ``selective_ac_option = "op"``, the default
  it recommends over every-other-layer): inside the block the outputs of the attention kernel
  (scaled_dot_product_attention: flash, memory-efficient, cuDNN, the CPU flash kernel) and of
  every other matmul (``mm``, and ``addmm`` for Linears with a bias, counted in the order the
  forward runs them: the 1st, 3rd, ... are kept, the 2nd, 4th, ... recomputed) are saved, plus
  reduce-scatter outputs and ``max`` (float8's amax); everything else (norms, activations, casts,
  rotary, elementwise) is recomputed. The attention, the costliest op to recompute, is never
  recomputed; the block's input is kept as in ``full``.

The wrap replaces the block's ``forward`` on the instance, so it is applied once, before the
strategy, and works with every strategy that runs blocks (DDP, ZeRO, FSDP units, tensor-parallel
blocks, pipeline stages; torch.compile traces the checkpoint as one region). Refused, before any
process starts, for models without blocks, for blocks with BatchNorm (the recomputation would
update its running statistics a second time) and for strategies that declare they cannot
(``Capabilities.no_checkpointing``: ``dp``, whose nn.DataParallel replicates the blocks per step;
their instance forward would run the original module).
"""
from __future__ import annotations

import functools
from collections import defaultdict

from dlscale import ConfigError

MODES = ("none", "selective", "full")


def check_mode(mode) -> None:
    if mode not in MODES:
        raise ConfigError(f"unknown activation-checkpointing {mode!r}; choose one of: {', '.join(MODES)}")


def check_case(cfg, spec) -> None:
    """Whether the case can checkpoint its blocks: a one-line ConfigError when not."""
    check_mode(cfg.activation_checkpointing)
    if cfg.activation_checkpointing == "none":
        return
    what = f"activation-checkpointing {cfg.activation_checkpointing}"
    if spec.blocks is None:
        raise ConfigError(f"{what} wraps the model's blocks; {spec.name} declares none")
    from dlscale.strategies import get_strategy  # the registry imports torch: not at the CLI's start

    why_not = get_strategy(cfg.strategy).caps.no_checkpointing
    if why_not:
        raise ConfigError(f"{what} does not run under {cfg.strategy} ({why_not})")
    if _blocks_hold_batchnorm(spec):
        raise ConfigError(f"{what}: {spec.name}'s blocks hold BatchNorm, whose running statistics the "
                          "recomputation would update twice")


_BATCHNORM: dict[tuple[str, str, str], bool] = {}


def _blocks_hold_batchnorm(spec) -> bool:
    """Whether any of the model's blocks holds BatchNorm: built on the meta device once per model,
    flavour and blocks function in a process (every case of a sweep asks)."""
    key = (spec.name, spec.flavor, getattr(spec.blocks, "__qualname__", repr(spec.blocks)))
    if key not in _BATCHNORM:
        import torch  # torch: keeps start-up light

        # a meta build draws no random numbers; no fork_rng, whose restore would reset the RNG of a
        # case training in another thread of this process meanwhile
        with torch.device("meta"):
            blocks = spec.blocks(spec.build())
        _BATCHNORM[key] = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for b in blocks for m in b.modules())
    return _BATCHNORM[key]


@functools.lru_cache(maxsize=None)
def _ops():
    """(ops whose outputs selective checkpointing keeps, the matmuls among them)."""
    import torch  # torch: keeps start-up light

    aten = torch.ops.aten
    names = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu", "max")
    save = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    if hasattr(torch.ops, "_c10d_functional"):
        save.add(torch.ops._c10d_functional.reduce_scatter_tensor.default)
    mms = {aten.mm.default, aten.addmm.default}
    return frozenset(save | mms), frozenset(mms)


def _selective_context():
    """A fresh pair of contexts per block call: the matmul count restarts for each forward and each
    recomputation, so both make the same choices."""
    # torch: keeps start-up light
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    save, mms = _ops()
    counts: dict[str, int] = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        key = "recompute" if ctx.is_recompute else "forward"
        if func in mms:
            counts[key] += 1
        keep = func in save and not (func in mms and counts[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _wrap(block, mode: str) -> None:
    from torch.utils.checkpoint import checkpoint  # torch: keeps start-up light

    inner = block.forward
    kwargs = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = _selective_context

    def forward(*args, **kw):
        return checkpoint(inner, *args, **kwargs, **kw)

    block.forward = forward


def apply(model, spec, mode: str) -> dict:
    """Checkpoint every block of ``model`` as ``mode`` says (in place); what the record keeps."""
    check_mode(mode)
    if mode == "none":
        return {}
    blocks = spec.blocks(model)
    for block in blocks:
        _wrap(block, mode)
    policy = ("block input only" if mode == "full" else
              "block input, attention outputs, odd-numbered matmul outputs (torchtitan op-level policy)")
    return {"activation_checkpointing": {"mode": mode, "blocks": len(blocks), "saves": policy}}
