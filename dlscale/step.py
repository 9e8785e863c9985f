"""The end of a training step, shared by the worker's timed step and the breakdown's phased one."""
from __future__ import annotations

import torch


def optimizer_step(opt, scaler, params: list, clip: float | None) -> None:
    """The end of every training step: clip the global norm (unscaled first), step, zero grads."""
    if clip is not None:
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, clip)
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
