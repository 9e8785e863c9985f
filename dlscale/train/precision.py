"""What each ``--precision`` means, in one place: compute dtype, loss scaling, peak-FLOPS dtype.

dlscale keeps fp32 master weights and optimizer state in every precision; ``amp-*`` runs the
forward under autocast in the 16-bit dtype (and FSDP's mixed-precision policy, pipeline stages
and DeepSpeed use the same dtype); ``fp8`` is bf16 autocast with the blocks' Linears converted to
torchao's float8 training (dlscale/train/fp8.py). Only fp16's narrow exponent needs loss scaling.
"""
from __future__ import annotations

import contextlib
from typing import Any

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "fp8")
# fp8: torchao's float8 Linears under bf16 autocast (dlscale/train/fp8.py), so its compute dtype is bf16
_COMPUTE = {"fp32": None, "amp-bf16": "bfloat16", "amp-fp16": "float16", "fp8": "bfloat16"}


def compute_dtype(precision: str) -> Any:
    """The torch dtype the forward computes in (None: fp32, no autocast)."""
    name = _COMPUTE[precision]
    if name is None:
        return None
    import torch  # torch: keeps start-up light

    return getattr(torch, name)


def needs_grad_scaler(precision: str) -> bool:
    """Dynamic loss scaling: fp16 only (bf16 has fp32's exponent range)."""
    return precision == "amp-fp16"


def grad_scaler(precision: str, device_type: str):
    """torch's GradScaler where the precision needs one, else None."""
    if not needs_grad_scaler(precision):
        return None
    import torch  # torch: keeps start-up light

    return torch.amp.GradScaler(device_type)


def autocast(precision: str, device_type: str):
    """A fresh autocast context for the precision (a no-op for fp32)."""
    dtype = compute_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext()
    import torch  # torch: keeps start-up light

    return torch.autocast(device_type, dtype=dtype)


def autocast_factory(precision: str, device_type: str):
    """``() -> context``: what the training step enters once per micro-batch."""
    dtype = compute_dtype(precision)
    if dtype is None:
        return contextlib.nullcontext
    import torch  # torch: keeps start-up light

    return lambda: torch.autocast(device_type, dtype=dtype)


def peak_dtype(precision: str, device_type: str) -> str:
    """Which peak FLOP/s applies: amp-bf16 -> bf16, amp-fp16 -> fp16, fp32 -> tf32 on CUDA (TF32 on);
    fp8 runs are rated against the bf16 peak, as torchtitan does."""
    if precision in ("amp-bf16", "fp8"):
        return "bf16"
    if precision == "amp-fp16":
        return "fp16"
    return "tf32" if device_type == "cuda" else "fp32"
