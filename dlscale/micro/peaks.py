"""Datasheet memory bandwidth per GPU (bytes/s, decimal: 1 TB/s = 1e12 B/s).

Rows are matched against the lower-cased device name (``torch.cuda.get_device_name``): every
substring of a row's key must occur in it; the first matching row wins, so more specific rows
come first. Unknown devices (every CPU) get ``None``.

Sources (NVIDIA datasheets, "GPU memory bandwidth" line):
  * H100 SXM 3.35 TB/s, H100 PCIe 2.0 TB/s, H100 NVL 3.9 TB/s: NVIDIA H100 Tensor Core GPU
    datasheet, https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet
  * H200 SXM / NVL 4.8 TB/s: NVIDIA H200 Tensor Core GPU product page and datasheet,
    https://www.nvidia.com/en-us/data-center/h200/
  * A100 80GB SXM 2.039 TB/s, A100 80GB PCIe 1.935 TB/s, A100 40GB (SXM and PCIe) 1.555 TB/s:
    NVIDIA A100 Tensor Core GPU datasheet,
    https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf
  * V100 (SXM2 and PCIe) 900 GB/s: NVIDIA Tesla V100 GPU datasheet,
    https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf
"""
from __future__ import annotations

H100_SRC = "NVIDIA H100 Tensor Core GPU datasheet"
H200_SRC = "NVIDIA H200 Tensor Core GPU datasheet"
A100_SRC = "NVIDIA A100 Tensor Core GPU datasheet"
V100_SRC = "NVIDIA Tesla V100 GPU datasheet"

MEMORY_BANDWIDTH: list[tuple[tuple[str, ...], float | None, str, str]] = [
    # (substrings that must all occur, bytes/s, what it is, source)
    (("gh200",), None, "GH200 (memory differs by model: not tabulated)", ""),  # not an H200
    (("h100", "pcie"), 2.0e12, "H100 PCIe (HBM2e)", H100_SRC),
    (("h100", "nvl"), 3.9e12, "H100 NVL (HBM3)", H100_SRC),
    (("h100",), 3.35e12, "H100 SXM5 (HBM3)", H100_SRC),
    (("h200",), 4.8e12, "H200 (HBM3e)", H200_SRC),
    (("a100", "80gb", "pcie"), 1.935e12, "A100 80GB PCIe (HBM2e)", A100_SRC),
    (("a100", "80gb"), 2.039e12, "A100 80GB SXM (HBM2e)", A100_SRC),
    (("a100",), 1.555e12, "A100 40GB (HBM2)", A100_SRC),
    (("v100",), 0.9e12, "V100 (HBM2)", V100_SRC),
]


def peak_bandwidth(device_name: str | None) -> tuple[float | None, str | None]:
    """(datasheet bytes/s, source) for a device name; (None, None) when unknown."""
    if not device_name:
        return None, None
    name = device_name.lower()
    for keys, value, what, source in MEMORY_BANDWIDTH:
        if all(k in name for k in keys):
            return (value, f"{source} ({what})") if value else (None, None)
    return None, None


def bandwidth_bps(device_name: str | None) -> float:
    """The datasheet bytes/s of a device name, 0.0 where unknown (what the performance model reads as "not
    priced")."""
    return peak_bandwidth(device_name)[0] or 0.0
