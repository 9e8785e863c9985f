"""Statistics, throughput, MFU and the peak-FLOPS table. Formulas: docs/metrics.md."""
from __future__ import annotations

import math
import statistics
from typing import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default method), q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: Iterable[float]) -> dict[str, float | int | None]:
    """Median, mean, min, max and sample standard deviation (n-1) of repeat results."""
    xs = [float(v) for v in values]
    if not xs:
        return {"n": 0, "median": None, "mean": None, "min": None, "max": None, "stdev": None}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0,
    }


def throughput(steps: int, global_batch: int, seconds: float) -> float:
    """Samples per second over a timed window: N x global batch / window seconds."""
    return steps * global_batch / seconds


def speedup(median: float, baseline_median: float | None) -> float | None:
    """Speedup over the 1-device run with the same per-device batch; None without a baseline."""
    if not baseline_median:
        return None
    return median / baseline_median


def scaling_efficiency(speedup_value: float | None, devices: int) -> float | None:
    return None if speedup_value is None else speedup_value / devices


# Dense (no sparsity) peak FLOP/s per device and dtype, from vendor datasheets.
# Keys are matched as case-insensitive substrings of the device name, most specific first.
PEAK_FLOPS: list[tuple[str, dict[str, float], str]] = [
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51.2e12},
     "NVIDIA H100 Tensor Core GPU datasheet (PCIe; dense = half the sparsity figure)"),
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12, "fp32": 60e12},
     "NVIDIA H100 Tensor Core GPU datasheet (NVL; dense = half the sparsity figure)"),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
     "NVIDIA H100 Tensor Core GPU datasheet (SXM5; dense = half the sparsity figure)"),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
     "NVIDIA H200 Tensor Core GPU datasheet (SXM; dense = half the sparsity figure)"),
    ("A100", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
     "NVIDIA A100 Tensor Core GPU datasheet (dense)"),
    ("V100", {"fp16": 125e12, "fp32": 15.7e12},
     "NVIDIA Tesla V100 datasheet (SXM2)"),
]


def precision_dtype(precision: str, device_type: str) -> str:
    """Which peak applies: amp-bf16 -> bf16, amp-fp16 -> fp16, fp32 -> tf32 on CUDA (TF32 on)."""
    if precision in ("amp-bf16", "fp8"):  # fp8 runs are rated against the bf16 peak, as torchtitan does
        return "bf16"
    if precision == "amp-fp16":
        return "fp16"
    return "tf32" if device_type == "cuda" else "fp32"


def peak_flops(device_name: str | None, dtype: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s, source) for a device and dtype; (None, None) when unknown (e.g. a CPU)."""
    if not device_name:
        return None, None
    name = device_name.lower()
    for key, table, source in PEAK_FLOPS:
        if key.lower() in name:
            value = table.get(dtype)
            return (value, source) if value else (None, None)
    return None, None


def mfu(flops_per_sample: float, samples_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation = FLOPs per sample x samples/s per device / peak FLOP/s."""
    if not peak:
        return None
    return flops_per_sample * samples_per_s_per_device / peak
