"""Model-state memory per device predicted by the ZeRO memory model, for the dtypes dlscale uses.

dlscale keeps fp32 parameters and runs autocast (or FSDP's mixed-precision policy, whose bf16
copies are transient), so per parameter a plain replica holds 4 bytes of weights, 4 of gradients
and K of optimizer state (AdamW: two fp32 moments, K = 8; SGD with momentum: K = 4): 16 bytes
for AdamW. Sharding over N devices (ZeRO, Rajbhandari et al. 2020, with these dtypes):

    replica (single, dp, ddp)      4 + 4 + K            = 16        bytes/param (AdamW)
    ZeRO-1 (zero1, deepspeed 1)    4 + 4 + K/N          =  8 + 8/N
    ZeRO-2 (fsdp zero2, ds 2)      4 + (4 + K)/N        =  4 + 12/N
    ZeRO-3 (fsdp zero3, ds 3)      (4 + 4 + K)/N        = 16/N

(The paper's mixed-precision Adam, fp16 weights and gradients with fp32 master copies, is
2 + 2 + 12 = 16 bytes: 4 + 12/N, 2 + 14/N, 16/N; DeepSpeed with --precision amp-bf16 is that
case, see ``predicted_model_state_bytes(..., deepspeed_mixed=True)``.)

Model-parallel strategies split the parameters themselves: tensor and pipeline/model hold
about P/N parameters each with their full state, 16/N bytes per parameter of the whole model;
this is a lower bound (tensor parallel replicates embeddings and LayerNorms, pipeline stages are
balanced by time or blocks, not bytes). hsdp shards over its shard group only; hybrid divides by
tp x pp and, with dp_shard=fsdp, by dp too (ZeRO-3 over dp).

Activations, communication buckets, gathered FSDP units and the allocator's cache come on top:
compare the prediction with the records' peak memory, never expect equality.
"""
from __future__ import annotations

from typing import Any

OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd": 4}

def bytes_per_param(stage: int, n: int, optimizer: str = "adamw", mixed: bool = False) -> float:
    """Model-state bytes per parameter on one device for ZeRO ``stage`` (0-3) over ``n`` devices.

    ``mixed``: 16-bit weights and gradients with fp32 master weights and moments (DeepSpeed's
    own mixed precision): 2 + 2 + (4 + K).
    """
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"unknown optimizer {optimizer!r}; one of {', '.join(OPTIMIZER_STATE_BYTES)}")
    if n < 1:
        raise ValueError(f"device count must be >= 1, got {n}")
    k = OPTIMIZER_STATE_BYTES[optimizer]
    param, grad, state = (2, 2, 4 + k) if mixed else (4, 4, k)
    if stage == 0:
        return param + grad + state
    if stage == 1:
        return param + grad + state / n
    if stage == 2:
        return param + (grad + state) / n
    if stage == 3:
        return (param + grad + state) / n
    raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage}")


def predicted_model_state_bytes(strategy: str, n_params: int, world: int, *, optimizer: str = "adamw",
                                options: dict[str, Any] | None = None, deepspeed_mixed: bool = False) -> float:
    """Bytes of parameters + gradients + optimizer state per device (the largest device).

    ``options``: the strategy's ``-o`` options where they change the answer (fsdp/hsdp ``shard``,
    hsdp ``replicate``, deepspeed ``stage``, hybrid ``dp``/``tp``/``pp``/``dp_shard``/``shard``).
    """
    opts = dict(options or {})
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    shard3 = 2 if opts.get("shard") == "zero2" else 3
    if strategy in ("single", "dp", "ddp"):
        return n_params * bytes_per_param(0, 1, optimizer)
    if strategy == "zero1":
        return n_params * bytes_per_param(1, world, optimizer)
    if strategy == "fsdp":
        return n_params * bytes_per_param(shard3, world, optimizer)
    if strategy == "hsdp":
        replicate = int(opts.get("replicate") or 1)
        return n_params * bytes_per_param(shard3, world // replicate, optimizer)
    if strategy in ("tensor", "pipeline", "model"):
        return n_params * bytes_per_param(0, 1, optimizer) / world
    if strategy == "deepspeed":
        stage = int(opts.get("stage", 2))
        return n_params * bytes_per_param(stage, world, optimizer, mixed=deepspeed_mixed)
    if strategy == "hybrid":
        tp, pp = int(opts.get("tp", 1)), int(opts.get("pp", 1))
        dp = int(opts.get("dp") or world // (tp * pp))
        per_replica = n_params / (tp * pp)
        stage = shard3 if opts.get("dp_shard") == "fsdp" else 0
        return per_replica * bytes_per_param(stage, dp, optimizer)
    raise ValueError(f"no memory model for strategy {strategy!r}")
