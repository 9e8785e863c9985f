"""``--precision fp8``: torchao's float8 training of the blocks' Linears, under bf16 autocast.

``convert(model, spec, cfg)`` runs on every rank before the strategy (as torchtitan converts the
model before parallelising it): ``torchao.float8.convert_to_float8_training`` swaps each
``nn.Linear`` inside the model's blocks whose in and out features are multiples of 16 (the fp8
matmul's requirement) for a ``Float8Linear``; its forward and backward matmuls run in float8
(``torch._scaled_mm``: e4m3 inputs and weights, e5m2 output gradients) with dynamic scales, and
everything else (embeddings, norms, attention, the vocabulary projection, the loss) stays in bf16
under autocast, as in torchtitan's float8 recipe. Parameters, gradients and optimizer state stay
fp32 as for amp-bf16; the converted Linears keep no bf16 weight casts and, compiled, fewer
activations (the memory plan counts both: docs/plan.md, "fp8").

Recipe: ``tensorwise`` (torchao's default ``Float8LinearConfig``: one dynamic scale per tensor,
computed from its amax each step); the record keeps the recipe, the torchao version and which
Linears were converted (``strategy_info.fp8``). MFU of an fp8 run is computed against the bf16
peak (as torchtitan reports it), so it compares with the bf16 run of the same case.

Refused (recorded ``unsupported``, one line, no process started) where it cannot run: torchao not
installed (``pip install 'dlscale[fp8]'``), no CUDA device of compute capability >= 8.9 (Ada,
Hopper and newer: the float8 tensor cores), strategies whose own machinery does not take Float8
modules as they are here (``deepspeed``: its own precision; tensor parallel ``tensor`` and
``hybrid`` with tp > 1: float8 needs torchao's Float8 tensor-parallel styles, not wired up).
"""
from __future__ import annotations

import importlib.util

from dlscale import ConfigError

RECIPE = "tensorwise"
MIN_CAPABILITY = (8, 9)


def _tp_degree(cfg) -> int:
    """The case's tensor-parallel degree, from the degrees its strategy declares."""
    from dlscale.strategies import get_strategy  # the registry imports torch: not at the CLI's start

    try:
        return get_strategy(cfg.strategy).parallel_dims(cfg).tp
    except ConfigError:  # an unknown strategy or impossible degrees: the case's validation says so
        return 1


def check(cfg, env: dict) -> str | None:
    """Why this fp8 case cannot run here (None: it can, or it is not an fp8 case)."""
    if cfg.precision != "fp8":
        return None
    if _tp_degree(cfg) > 1:
        return ("precision fp8 with tensor parallelism needs torchao's Float8 tensor-parallel styles, "
                "which dlscale does not wire up; use data or pipeline parallelism")
    if env.get("assume_extras"):  # the compatibility matrix documents capability, not this machine
        return None
    # the device first: where it cannot do float8, installing torchao would not help
    return device_reason(env.get("device_type", "cpu")) or (
        "precision fp8 needs torchao (float8 training); pip install 'dlscale[fp8]'"
        if importlib.util.find_spec("torchao") is None else None)


def device_reason(device_type: str, index: int | None = None) -> str | None:
    """None when the (first, or given) CUDA device has float8 tensor cores, else why not."""
    if device_type != "cuda":
        return (f"precision fp8 needs a CUDA GPU of compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
                f"(float8 tensor cores); this case runs on the {device_type}")
    import torch  # torch: keeps start-up light

    if not torch.cuda.is_available():
        return None  # the launcher sees no GPU (a remote node's case): each worker checks its own
    cap = torch.cuda.get_device_capability(index)
    if tuple(cap) < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(index)
        return (f"precision fp8 needs compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}; "
                f"{name} has {cap[0]}.{cap[1]}")
    return None


def _filter(block_ids: set[int]):
    """Convert Linears inside the blocks whose both dimensions are multiples of 16."""
    import torch  # torch: keeps start-up light

    def keep(module, fqn: str) -> bool:
        return (id(module) in block_ids and isinstance(module, torch.nn.Linear)
                and module.in_features % 16 == 0 and module.out_features % 16 == 0)

    return keep


def convert(model, spec, cfg, device=None, check_device: bool = True) -> dict:
    """Swap the blocks' Linears for torchao's Float8Linear (in place) when ``cfg.precision`` is fp8;
    returns what the record keeps (empty for other precisions)."""
    if cfg.precision != "fp8":
        return {}
    if check_device and device is not None:
        reason = device_reason(device.type, device.index if device.type == "cuda" else None)
        if reason:
            raise RuntimeError(reason)
    import torchao  # optional: torchao
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # optional: torchao

    blocks = spec.blocks(model) if spec.blocks else []
    inside = {id(m) for b in blocks for m in b.modules()}
    config = Float8LinearConfig.from_recipe_name(RECIPE)
    convert_to_float8_training(model, config=config, module_filter_fn=_filter(inside))
    converted = sum(1 for m in model.modules() if type(m).__name__ == "Float8Linear")
    return {"fp8": {"library": "torchao.float8", "torchao": getattr(torchao, "__version__", "unknown"),
                    "recipe": RECIPE, "converted_linears": converted,
                    "kept_in_bf16": "embeddings, norms, attention, vocabulary projection, loss"}}
