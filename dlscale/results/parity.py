"""Loss parity: one definition of the loss every strategy reports, and how close it must be to `single`'s.

Definition (the same for every strategy): a step's loss is the mean over the **global batch** of
that step's last micro-batch (all of it with ``--grad-accum 1``): each data-parallel rank's
micro-batch loss, averaged over the data-parallel ranks (``global_loss``); strategies whose own
step already returns the global value say so with ``Parallelized.loss_global`` (pipelines). Recorded
per repeat: ``warmup_losses`` (every warm-up step), ``loss_last`` (the window's last step) and
``loss_after`` (the trained model, eval mode, on micro-batch 0). A strategy that trains the same
global batch as ``single`` must give the same numbers, up to float summation order.

``dlscale parity STORE`` (dlscale/report/parity.py) puts every strategy's trajectory beside
``single``'s with ``tolerance(...)``; docs/parity.md.
"""
from __future__ import annotations

import math
from typing import Any

LOSS_SCOPE = "global"  # recorded with the losses: older records hold rank 0's share instead

# Relative tolerance of a loss against single's, by (device type, precision). CPU fp32 is
# deterministic up to summation order (thread count, reduction order: measured <= 2e-7 after a few
# steps); CUDA fp32 runs TF32 matmuls; bf16/fp16 autocast rounds activations to 8/11 bits.
TOLERANCES: dict[tuple[str, str], float] = {
    ("cpu", "fp32"): 1e-4,
    ("cuda", "fp32"): 5e-3,
    ("cpu", "amp-bf16"): 3e-2,
    ("cuda", "amp-bf16"): 3e-2,
    ("cpu", "amp-fp16"): 1e-2,
    ("cuda", "amp-fp16"): 1e-2,
}
DEFAULT_TOLERANCE = 3e-2  # any other combination


def tolerance(device_type: str, precision: str) -> float:
    return TOLERANCES.get((str(device_type), str(precision)), DEFAULT_TOLERANCE)


# Training steps over which a reduced-precision loss is compared: bf16/fp16 rounding differences
# between two summation orders grow with every step (the tolerances above hold for a few tens of
# them); over hundreds, or once a model has memorised the synthetic batch (its loss near 0, where a
# relative difference means nothing), two correct runs part by more than any tolerance. fp32: all.
REDUCED_PRECISION_STEPS = 20


def compared_steps(precision: str) -> int | None:
    """How many training steps' losses parity compares at ``precision`` (None: all of them)."""
    return REDUCED_PRECISION_STEPS if str(precision) in ("amp-bf16", "amp-fp16") else None


def rel_diff(x: float, ref: float) -> float:
    """|x - ref| / |ref| (absolute difference when ref is 0)."""
    d = abs(x - ref)
    return d / abs(ref) if ref != 0 else d


def finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def global_loss(loss, par, denv) -> float | None:
    """Worker side: this step's loss as the global batch's mean, on every rank.

    A collective over the data-parallel group when the strategy's loss is per rank: every rank
    must call it the same number of times (outside the timed window only). None for no loss or a
    non-finite one.
    """
    if loss is None:
        return None
    import torch.distributed as dist  # torch: keeps start-up light

    t = loss.detach().float().reshape(1).clone()
    if denv.world_size > 1 and par.dp_size > 1 and not par.loss_global:
        t = t / par.dp_size
        dist.all_reduce(t, group=par.dp_group)
    return finite(float(t.item()))
