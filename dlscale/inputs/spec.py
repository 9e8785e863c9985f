"""What ``--data`` names, parsed and checked before anything starts.

``synthetic`` (default): the pre-made batches of the model's ``make_batch``, on the device.
``imagefolder:PATH``: ImageNet layout, one folder per class holding image files.
``tokens:PATH[:uint16|uint32]``: a flat binary file of token ids (default uint16, as nanoGPT and
llm.c write them), memory-mapped.

Parsing (``parse_data``) is syntax only, so a stored config always loads; ``check_case`` looks
at the files and the model and raises ConfigError naming the file and what is wrong.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlscale import ConfigError

if TYPE_CHECKING:
    from dlscale.case.config import DataSection

KINDS = ("synthetic", "imagefolder", "tokens")
TOKEN_DTYPES = ("uint16", "uint32")
DECODE_DEVICES = ("cpu", "gpu")
# which library decodes JPEGs with --data-decode gpu (dlscale/inputs/images.py, dali.py, docs/data.md);
# auto: torchvision where it imports, else nvimgcodec (dali only when named)
GPU_DECODERS = ("auto", "torchvision", "nvimgcodec", "dali")
# the decode process's MPS client priority (--data-decode-priority; dlscale/inputs/decode_process.py)
DECODE_PRIORITIES = ("normal", "low")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")
# what a model's ``ModelSpec.data_kind`` may say: the batch layout a real-data reader must produce
DATA_KINDS = ("image", "causal-lm", "mlm-nsp")
SPEC_HELP = "synthetic, imagefolder:PATH or tokens:PATH[:uint16|uint32]"
# a case whose steps waited for data this share of the window or more is input-bound (docs/data.md)
INPUT_BOUND_SHARE = 0.05
# a window that takes fewer than this many times the batches the loader holds ready at its start
# may understate the wait: its first batches come from the prefetch buffer filled during warm-up
BUFFER_MARGIN = 10


def input_verdict(gpu_idle_share: float | None, wait_share: float | None) -> tuple[bool | None, str]:
    """(input-bound, what decided): the GPU's idle share for data where it was measured (a host ahead
    of the GPU waits at no cost), else the host's wait share; None without either."""
    if gpu_idle_share is not None:
        return gpu_idle_share >= INPUT_BOUND_SHARE, "gpu idle"
    return (None if wait_share is None else wait_share >= INPUT_BOUND_SHARE), "host wait"


@dataclass(frozen=True)
class DataSpec:
    kind: str  # one of KINDS
    path: str | None = None
    dtype: str | None = None  # tokens only

    @property
    def synthetic(self) -> bool:
        return self.kind == "synthetic"

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "uint16" else 4


def parse_data(text: str) -> DataSpec:
    """``--data`` text -> DataSpec; ConfigError (one line) for anything else. No disk access."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"data must be {SPEC_HELP}, got {text!r}")
    if text == "synthetic":
        return DataSpec("synthetic")
    kind, sep, rest = text.partition(":")
    if kind not in ("imagefolder", "tokens") or not sep or not rest:
        raise ConfigError(f"data must be {SPEC_HELP}, got {text!r}")
    if kind == "imagefolder":
        return DataSpec("imagefolder", rest)
    path, dtype = rest, "uint16"
    head, colon, tail = rest.rpartition(":")
    if colon and tail in TOKEN_DTYPES:
        path, dtype = head, tail
    elif colon and tail.startswith(("uint", "int", "float")):
        raise ConfigError(f"token dtype must be one of {', '.join(TOKEN_DTYPES)}, got {tail!r} in {text!r}")
    if not path:
        raise ConfigError(f"data must be {SPEC_HELP}, got {text!r}")
    return DataSpec("tokens", path, dtype)


def check_split(decoder: str, cpu_share: float) -> None:
    """A host share of GPU decode (``--data-cpu-share``) is for the decoders dlscale drives itself."""
    if cpu_share and decoder == "dali":
        raise ConfigError(f"data-cpu-share {cpu_share:g} does not apply to --data-decoder dali: DALI splits its own "
                          f"decode between the GPU's JPEG engines and nvJPEG's CUDA decoder (hw_decoder_load)")


def check_fields(d: DataSection) -> DataSpec:
    """RunConfig's static checks of the data section (called from RunConfig.__post_init__)."""
    data, workers, decode, cold_read, decoder = d.data, d.data_workers, d.data_decode, d.data_cold_read, d.data_decoder
    cpu_share, decode_process, sm_share = d.data_cpu_share, d.data_decode_process, d.data_decode_sm_share
    priority = d.data_decode_priority
    spec = parse_data(data)
    if decode_process and decode != "gpu":
        raise ConfigError("data-decode-process moves GPU decode into a process of its own: it needs --data "
                          "imagefolder:PATH --data-decode gpu (CPU decode runs in the DataLoader's worker processes "
                          "already)")
    if decode_process and decoder == "dali":
        raise ConfigError("data-decode-process does not apply to --data-decoder dali: DALI's pipeline runs in "
                          "threads of its own; choose torchvision, nvimgcodec or auto")
    if sm_share and not decode_process:
        raise ConfigError(f"data-decode-sm-share {sm_share:g} caps the SMs of the decode process: it needs "
                          f"--data-decode-process (and NVIDIA MPS running; docs/data.md)")
    if priority not in DECODE_PRIORITIES:
        raise ConfigError(f"unknown data-decode-priority {priority!r}; choose one of: {', '.join(DECODE_PRIORITIES)}")
    if priority != "normal" and not decode_process:
        raise ConfigError(f"data-decode-priority {priority} sets the MPS priority of the decode process: it needs "
                          f"--data-decode-process (and NVIDIA MPS running; docs/data.md)")
    if sm_share and round(sm_share * 100) < 1:
        raise ConfigError(f"data-decode-sm-share {sm_share:g} is below 1 % of the SMs; give 0 (no cap) or 0.01 to 1")
    if cpu_share and decode != "gpu":
        raise ConfigError(f"data-cpu-share {cpu_share:g} splits GPU decode between the host and the GPU: it needs "
                          f"--data imagefolder:PATH --data-decode gpu (with --data-decode cpu every image is "
                          f"decoded on the host already)")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"data-workers must be an integer >= 0 (0: load in the training process), got {workers!r}")
    if d.data_prefetch is not None and workers == 0:
        raise ConfigError(f"data-prefetch {d.data_prefetch} is what each DataLoader worker loads ahead: it needs "
                          f"--data-workers 1 or more (0 loads in the training process)")
    if decode not in DECODE_DEVICES:
        raise ConfigError(f"unknown data-decode {decode!r}; choose one of: {', '.join(DECODE_DEVICES)}")
    if decoder not in GPU_DECODERS:
        raise ConfigError(f"unknown data-decoder {decoder!r}; choose one of: {', '.join(GPU_DECODERS)}")
    if spec.synthetic:
        given = [n for n, v, d in (("data-workers", workers, None), ("data-decode", decode, "cpu"),
                                   ("data-decoder", decoder, "auto"), ("data-cold-read", cold_read, False),
                                   ("data-prefetch", d.data_prefetch, None))
                 if v != d]
        if given:
            raise ConfigError(f"{', '.join(given)} needs --data imagefolder:PATH or tokens:PATH "
                              f"(synthetic batches are made once, on the device)")
    if decode == "gpu" and spec.kind != "imagefolder":
        raise ConfigError(f"data-decode gpu decodes images; --data {data} is {spec.kind}")
    check_split(decoder, cpu_share)
    if decoder != "auto" and decode != "gpu":
        raise ConfigError(f"data-decoder {decoder} chooses the GPU's JPEG decoder: it needs --data-decode gpu "
                          f"(CPU decode is Pillow's)")
    if cold_read and not hasattr(os, "posix_fadvise"):
        raise ConfigError("data-cold-read needs posix_fadvise (Linux and most Unix); this OS has none")
    return spec
