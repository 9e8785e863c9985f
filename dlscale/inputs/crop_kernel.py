"""The GPU decode path's crop + resize + flip + normalise as one Triton kernel.

The torch version (``images._crop_resize_flip`` then a normalise and a layout change) materialises
four int64 index tensors and several float temporaries of the batch's output size (~1.2 GB at
ResNet-50's b256) and reads and writes them in a dozen kernels: ~4 ms per batch of 256 on an H200,
on the SMs and the memory bandwidth the model trains with. Here every output pixel is computed once
from the four source bytes it needs (the same coordinates and weights) and written normalised, in
the layout the model wants: one launch per batch.

Triton comes with PyTorch's CUDA builds; without it (CPU builds) the torch version runs.
``TRITON_INTERPRET=1`` runs the kernel on CPU tensors (the tests compare it with the torch version).
"""
from __future__ import annotations

import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU builds of torch come without Triton
    triton = None

BLOCK = 1024  # output pixels per program


def usable(device: torch.device) -> bool:
    """Whether the kernel can run for tensors on ``device`` (CUDA with Triton; the CPU under TRITON_INTERPRET=1)."""
    if triton is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


if triton is not None:
    # a Triton kernel: its parameters are its launch ABI (pointers, scalars, constexpr), not groupable state
    @triton.jit
    def _crop_kernel(flat_ptr, par_ptr, out_ptr, m0, m1, m2, s0, s1, s2, S, s_n, s_c, s_y, s_x,
                     BLOCK: tl.constexpr):
        n = tl.program_id(1)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < S * S
        y = offs // S
        x = offs - y * S
        p = par_ptr + n * 9  # left, top, w/S, h/S, width-1, height-1, base, plane, flip (float64)
        left = tl.load(p)
        top = tl.load(p + 1)
        sw = tl.load(p + 2)
        sh = tl.load(p + 3)
        wmax = tl.load(p + 4)
        hmax = tl.load(p + 5)
        base = tl.load(p + 6).to(tl.int64)
        plane = tl.load(p + 7).to(tl.int64)
        flip = tl.load(p + 8)
        # the source coordinates as the torch version computes them (align_corners=False, clamped)
        xs = tl.where(flip > 0, S - 1 - x, x)
        sx = left + (xs.to(tl.float64) + 0.5) * sw - 0.5
        sx = tl.minimum(tl.maximum(sx, 0.0), wmax)
        sy = top + (y.to(tl.float64) + 0.5) * sh - 0.5
        sy = tl.minimum(tl.maximum(sy, 0.0), hmax)
        x0 = tl.floor(sx)
        y0 = tl.floor(sy)
        wx = (sx - x0).to(tl.float32)
        wy = (sy - y0).to(tl.float32)
        right = (x0 < wmax).to(tl.int64)  # 0 on the last column: its right neighbour has weight 0
        width = wmax.to(tl.int64) + 1
        down = (y0 < hmax).to(tl.int64) * width
        i00 = base + y0.to(tl.int64) * width + x0.to(tl.int64)
        out = out_ptr + n * s_n + y * s_y + x * s_x
        for c in tl.static_range(3):
            i = i00 + c * plane
            a = tl.load(flat_ptr + i, mask=mask, other=0).to(tl.float32)
            b = tl.load(flat_ptr + i + right, mask=mask, other=0).to(tl.float32)
            d = tl.load(flat_ptr + i + down, mask=mask, other=0).to(tl.float32)
            e = tl.load(flat_ptr + i + down + right, mask=mask, other=0).to(tl.float32)
            # torch.lerp's two-sided formula (exact at both ends)
            t = tl.where(wx < 0.5, a + wx * (b - a), b - (b - a) * (1.0 - wx))
            u = tl.where(wx < 0.5, d + wx * (e - d), e - (e - d) * (1.0 - wx))
            v = tl.where(wy < 0.5, t + wy * (u - t), u - (u - t) * (1.0 - wy))
            if c == 0:
                v = (v - m0) / s0
            elif c == 1:
                v = (v - m1) / s1
            else:
                v = (v - m2) / s2
            tl.store(out + c * s_c, v, mask=mask)


def crop_normalize(flat: torch.Tensor, par: torch.Tensor, size: int, mean: tuple[float, float, float],
                   std: tuple[float, float, float], channels_last: bool) -> torch.Tensor:
    """(n, 3, size, size) float32 from the images concatenated (``flat``: CHW uint8 each) and their
    parameters (``par``: (n, 9) float64, as ``images._crop_params`` makes them), normalised by
    ``mean``/``std`` (per channel, on the 0-255 scale), in channels_last where asked."""
    n = par.shape[0]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out = torch.empty((n, 3, size, size), device=flat.device, dtype=torch.float32, memory_format=fmt)
    grid = (triton.cdiv(size * size, BLOCK), n)
    _crop_kernel[grid](flat, par, out, *mean, *std, size, *out.stride(), BLOCK=BLOCK)
    return out
