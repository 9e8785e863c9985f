"""Statistics, throughput, MFU and the peak-FLOPS table. Formulas: docs/metrics.md."""
from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from dlscale.train.precision import peak_dtype


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
    """Median, mean, min, max and sample standard deviation (n-1; None for one value) of repeat results."""
    xs = [float(v) for v in values]
    if not xs:
        return {"n": 0, "median": None, "mean": None, "min": None, "max": None, "stdev": None}
    return {
        "n": len(xs),
        "median": statistics.median(xs),
        "mean": statistics.fmean(xs),
        "min": min(xs),
        "max": max(xs),
        "stdev": statistics.stdev(xs) if len(xs) > 1 else None,  # one value has no spread (not 0)
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


# Dense (no sparsity) peak FLOP/s per device and dtype, from vendor datasheets. NVIDIA's datasheets
# print tensor-core figures "with sparsity": the dense figure is half of it. "tf32" is what fp32
# training uses on CUDA (TF32 tensor cores on); a device without TF32 has no "tf32" entry, so its
# fp32 MFU stays unknown rather than measured against the wrong peak.
H100_SRC = "NVIDIA H100 Tensor Core GPU datasheet"
H200_SRC = "NVIDIA H200 Tensor Core GPU datasheet"
B200_SRC = "NVIDIA HGX B200 specifications (per GPU; www.nvidia.com/en-us/data-center/hgx/)"
A100_SRC = "NVIDIA A100 Tensor Core GPU datasheet (40 GB and 80 GB, PCIe and SXM alike)"
ADA_SRC = "NVIDIA {} datasheet"
V100_SRC = "NVIDIA Tesla V100 GPU datasheet ({})"
MI300X_SRC = "AMD Instinct MI300X accelerator data sheet"
MI250X_SRC = "AMD Instinct MI250X accelerator data sheet (no TF32)"
HALF = "; dense = half the sparsity figure"
# Rows added later cite the page itself (the older rows' datasheets are linked from docs/metrics.md).
GB200_SRC = ("NVIDIA GB200 NVL72 specifications, https://www.nvidia.com/en-us/data-center/gb200-nvl72/ "
             "(per GPU: the rack's figures / 72)")
H800_SRC = ("NVIDIA H800 Tensor Core GPU datasheet (the H100's compute; NVLink and FP64 cut: "
            "https://aiwiki.ai/wiki/nvidia_h800)")
H20_SRC = ("NVIDIA HGX H20 specifications (dense), as NVIDIA's partners list them, e.g. "
           "https://zangshuxian.com/new/674733024499207168")
A800_SRC = ("NVIDIA A800 Tensor Core GPU datasheet (the A100's compute; NVLink cut to 400 GB/s: "
            "https://hmc-tech.com/gpu/nvidia-a800-vs-nvidia-t40)")
A10G_SRC = ("AWS A10G specifications (dense; no NVIDIA datasheet): "
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/")
A30_URL = "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/a30-datasheet.pdf"
A40_URL = "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
A6000_URL = ("https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/quadro-product-literature/"
             "proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web%20(1).pdf")
ADA_WP_SRC = ("NVIDIA Ada GPU architecture whitepaper (GeForce RTX 4090 datasheet figures), "
              "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf")
L40_URL = "https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf"
T4_URL = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf"
MI325X_SRC = ("AMD Instinct MI325X accelerator data sheet, "
              "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/product-briefs/"
              "instinct-mi325x-datasheet.pdf")


@dataclass(frozen=True)
class PeakEntry:
    name: str  # the product, as the table shows it
    pattern: str  # regular expression matched case-insensitively against the device name
    flops: dict[str, float]  # dtype -> dense peak FLOP/s
    source: str


# Most specific first; a name that matches nothing ("MI250X / MI250", a V100 FHHL, an RTX 4090 D)
# has no peak: MFU is then unknown, never computed against a sibling's figure.
PEAK_FLOPS: list[PeakEntry] = [
    PeakEntry("GB200", r"\bGB200\b", {"fp8": 5e15, "bf16": 2.5e15, "fp16": 2.5e15, "tf32": 1.25e15, "fp32": 80e12},
              GB200_SRC + HALF),
    PeakEntry("B200", r"(?<![a-z0-9])B200\b", {"fp8": 4.5e15, "bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15,
                                                "fp32": 75e12}, B200_SRC + HALF),
    PeakEntry("GH200", r"\bGH200\b", {"fp8": 1979e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12,
                                      "fp32": 66.9e12}, "NVIDIA GH200 Grace Hopper Superchip datasheet" + HALF),
    PeakEntry("H200 NVL", r"\bH200\s*NVL\b", {"fp8": 1670.5e12, "bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12,
                                              "fp32": 60e12}, H200_SRC + " (NVL)" + HALF),
    PeakEntry("H200 SXM", r"\bH200\b", {"fp8": 1979e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12,
                                        "fp32": 66.9e12}, H200_SRC + " (SXM)" + HALF),
    PeakEntry("H100 NVL", r"\bH100\s*NVL\b", {"fp8": 1670.5e12, "bf16": 835e12, "fp16": 835e12, "tf32": 417.5e12,
                                              "fp32": 60e12}, H100_SRC + " (NVL)" + HALF),
    PeakEntry("H100 PCIe", r"\bH100\b.*\bPCIe\b", {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12, "tf32": 378e12,
                                                  "fp32": 51.2e12}, H100_SRC + " (PCIe)" + HALF),
    PeakEntry("H100 SXM", r"\bH100\b", {"fp8": 1979e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12,
                                        "fp32": 66.9e12}, H100_SRC + " (SXM5)" + HALF),
    PeakEntry("H800 PCIe", r"\bH800\b.*\bPCIe\b", {"fp8": 1513e12, "bf16": 756e12, "fp16": 756e12,
                                                  "tf32": 378e12, "fp32": 51.2e12}, H800_SRC + " (PCIe)" + HALF),
    PeakEntry("H800 SXM", r"\bH800\b", {"fp8": 1979e12, "bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12,
                                        "fp32": 66.9e12}, H800_SRC + " (SXM5)" + HALF),
    PeakEntry("H20", r"\bH20\b", {"fp8": 296e12, "bf16": 148e12, "fp16": 148e12, "tf32": 74e12, "fp32": 44e12},
              H20_SRC),
    PeakEntry("A800", r"\bA800\b", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
              A800_SRC + HALF),
    PeakEntry("A100", r"\bA100\b", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12}, A100_SRC + HALF),
    PeakEntry("A10", r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
              "NVIDIA A10 Tensor Core GPU datasheet" + HALF),
    PeakEntry("A10G", r"\bA10G\b", {"bf16": 70e12, "fp16": 70e12, "tf32": 35e12, "fp32": 35e12}, A10G_SRC),
    PeakEntry("A30", r"\bA30\b", {"bf16": 165e12, "fp16": 165e12, "tf32": 82e12, "fp32": 10.3e12},
              "NVIDIA A30 Tensor Core GPU datasheet, " + A30_URL + HALF),
    PeakEntry("A40", r"\bA40\b", {"bf16": 149.7e12, "fp16": 149.7e12, "tf32": 74.8e12, "fp32": 37.4e12},
              "NVIDIA A40 datasheet, " + A40_URL + HALF),
    PeakEntry("RTX A6000", r"\bA6000\b", {"bf16": 154.8e12, "fp16": 154.8e12, "tf32": 77.4e12, "fp32": 38.7e12},
              "NVIDIA RTX A6000 datasheet, " + A6000_URL + HALF),
    # GeForce: tensor figures with FP32 accumulate (what training uses), half the FP16-accumulate ones
    PeakEntry("RTX 4090", r"\bRTX\s*4090\b(?!\s*D\b)", {"fp8": 330.3e12, "bf16": 165.2e12, "fp16": 165.2e12,
                                                       "tf32": 82.6e12, "fp32": 82.6e12}, ADA_WP_SRC + HALF),
    PeakEntry("L40", r"\bL40\b", {"fp8": 362e12, "bf16": 181.05e12, "fp16": 181.05e12, "tf32": 90.5e12,
                                  "fp32": 90.5e12}, "NVIDIA L40 datasheet, " + L40_URL + HALF),
    PeakEntry("L40S", r"\bL40S\b", {"fp8": 733e12, "bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12,
                                    "fp32": 91.6e12}, ADA_SRC.format("L40S") + HALF),
    PeakEntry("L4", r"\bL4\b", {"fp8": 242.5e12, "bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
              ADA_SRC.format("L4 Tensor Core GPU") + HALF),
    # Turing: fp16 tensor cores (FP32 accumulate), no bf16, no TF32: fp32 runs count against 8.1 T
    PeakEntry("T4", r"\bT4\b", {"fp16": 65e12, "fp32": 8.1e12}, "NVIDIA T4 Tensor Core GPU datasheet, " + T4_URL),
    PeakEntry("V100S PCIe", r"\bV100S\b", {"fp16": 130e12, "fp32": 16.4e12}, V100_SRC.format("V100S PCIe")),
    PeakEntry("V100 SXM2", r"\bV100\b.*\bSXM2\b", {"fp16": 125e12, "fp32": 15.7e12}, V100_SRC.format("SXM2")),
    PeakEntry("V100 PCIe", r"\bV100\b.*\bPCIe\b", {"fp16": 112e12, "fp32": 14e12}, V100_SRC.format("PCIe")),
    PeakEntry("MI300X", r"\bMI300X\b", {"fp8": 2614.9e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12,
                                        "fp32": 163.4e12}, MI300X_SRC + " (dense figures)"),
    PeakEntry("MI325X", r"\bMI325X\b", {"fp8": 2614.9e12, "bf16": 1307.4e12, "fp16": 1307.4e12, "tf32": 653.7e12,
                                        "fp32": 163.4e12}, MI325X_SRC + " (dense figures)"),
    PeakEntry("MI250X", r"\bMI250X\b(?!\s*/\s*MI250\b)", {"bf16": 383e12, "fp16": 383e12, "fp32": 95.7e12},
              MI250X_SRC + "; fp32 is the matrix figure"),
]


def peak_entry(device_name: str | None) -> PeakEntry | None:
    """The table row a device name matches (the first, most specific), or None."""
    if not device_name:
        return None
    for e in PEAK_FLOPS:
        if re.search(e.pattern, device_name, flags=re.IGNORECASE):
            return e
    return None


def has_tf32(device_name: str | None) -> bool | None:
    """Whether the tabulated device has TF32 tensor cores (Volta, Turing and CDNA2 do not); None unknown."""
    e = peak_entry(device_name)
    return None if e is None else "tf32" in e.flops


def precision_dtype(precision: str, device_type: str, device_name: str | None = None,
                    tf32: bool | None = None) -> str:
    """Which peak a precision is rated against (dlscale/train/precision.py), on this device: fp32 on CUDA
    is TF32 only where the device has TF32 and the run had it on (``tf32`` as recorded); a V100's
    or T4's fp32 runs count against its fp32 peak."""
    dtype = peak_dtype(precision, device_type)
    if dtype == "tf32" and (tf32 is False or has_tf32(device_name) is False):
        return "fp32"
    return dtype


def peak_used(device_name: str | None, dtype: str) -> dict[str, Any] | None:
    """The peak an MFU is taken against, recorded beside it: the table's device row, the dtype,
    dense (never the sparsity figure), the FLOP/s and the source; None without one."""
    e = peak_entry(device_name)
    value = e.flops.get(dtype) if e else None
    if not value:
        return None
    return {"device": e.name, "dtype": dtype, "dense": True, "flops": value, "source": e.source}


def peak_flops(device_name: str | None, dtype: str) -> tuple[float | None, str | None]:
    """(peak FLOP/s, source) for a device and dtype; (None, None) when unknown (e.g. a CPU)."""
    e = peak_entry(device_name)
    value = e.flops.get(dtype) if e else None
    return (value, e.source) if value else (None, None)


def mfu(flops_per_sample: float, samples_per_s_per_device: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation = FLOPs per sample x samples/s per device / peak FLOP/s."""
    if not peak:
        return None
    return flops_per_sample * samples_per_s_per_device / peak


GROWTH_INTERVAL = 2000  # good steps before the scale doubles: GradScaler's default, the pipeline's and JAX's


@dataclass(frozen=True)
class ScaleReading:
    """The fp16 loss scaler read outside the window: its scale, and its growth tracker (the good steps since
    the scale last changed; None where the scaler does not say) with its growth interval."""

    scale: float
    tracker: int | None = None
    interval: int = GROWTH_INTERVAL


def loss_scale_fields(before: ScaleReading | None, after: ScaleReading | None,
                      window_steps: int | None = None) -> dict[str, Any]:
    """A worker's record fields of the fp16 loss scaler read before and after the window: the two scales,
    the growth trackers, and the updates skipped in between; none without a scaler (``before`` None)."""
    if before is None:
        return {}
    out: dict[str, Any] = {"loss_scale": [before.scale, after.scale if after else None],
                           "skipped_steps": skipped_steps(before, after, window_steps)}
    if before.tracker is not None and after is not None and after.tracker is not None:
        out["loss_scale_tracker"] = [before.tracker, after.tracker]
    return out


def skipped_steps(before: ScaleReading | None, after: ScaleReading | None, window_steps: int | None = None) -> int | None:
    """Optimizer steps the loss scaler skipped in a window of ``window_steps`` updates, from its readings
    around it. Each overflow halves the scale and restarts the tracker; the scale doubles after ``interval``
    good steps in a row. Where the tracker before the window plus its steps stay under the interval, no
    growth can fall inside and the halvings are the skips. Past it the two readings tell skips from a
    growth only where they agree with no skip at all (0); else None: not countable. None without a scaler."""
    if before is None or after is None or before.scale <= 0 or after.scale <= 0:
        return None
    halvings = round(math.log2(before.scale / after.scale))
    t0, t1 = before.tracker, after.tracker
    if t0 is None or t1 is None or window_steps is None or t0 + window_steps < before.interval:
        return max(0, halvings)
    grown, rest = divmod(t0 + window_steps, before.interval)
    return 0 if -halvings == grown and t1 == rest else None
