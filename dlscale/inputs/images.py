"""Image folders: decode + random-resized crop + horizontal flip, on the CPU or on the GPU.

The augmentation is the standard ImageNet training one (torchvision's ``RandomResizedCrop``:
area 8-100 %, aspect ratio 3/4-4/3, ten tries then a centre crop; flip with probability 0.5).
Its random numbers come from the sample's own generator, seeded by (seed, epoch, index), so the
crop of a sample does not depend on which worker, rank or decoder handles it.

CPU path (``ImageFolderData``): each DataLoader worker reads the file, decodes it with Pillow
(libjpeg-turbo) and crops + resizes in one bilinear (antialiased) ``resize``: the same operations
torchvision's ``ImageFolder`` + ``RandomResizedCrop`` run on a PIL image, so torchvision is not
needed here. Batches travel as uint8 HWC (4x less than float, through shared memory and PCIe);
on a GPU they are normalised there, on the CPU in the worker.

GPU path (``ImageBytesData`` + ``GpuDecoder``): workers only read the bytes and parse the header
(size, for the crop); the batch is decoded on the GPU, which then crops, resizes (bilinear), flips
and normalises. ``--data-decoder`` picks the decoder (``gpu_decoder``): ``torchvision``
(``torchvision.io.decode_jpeg(device="cuda")``: its batched decode asks nvJPEG for the hardware
backend, the JPEG engines (NVJPG) of an A100/H100/H200, and falls back to nvJPEG's CUDA kernels where
the GPU has none) or ``nvimgcodec`` (nvImageCodec: the same hardware engines through its
``HW_GPU_ONLY`` backend, nvJPEG's CUDA decoder for what they cannot take); ``auto`` takes torchvision
where it imports (it decoded faster and trained faster beside the model than nvImageCodec on an H100:
docs/data.md), else nvImageCodec. ``dali`` (NVIDIA DALI, named only) replaces ``GpuDecoder`` as a
whole: decode, crop and normalisation in DALI's own pipeline (``dlscale/inputs/dali.py``).

Split decode (``--data-cpu-share F`` with GPU decode, ``collate_split``): the workers decode and crop
the first round(F x batch) images of each batch themselves (the CPU path's Pillow operations, on the
crop box the header gave) and pass the rest as bytes; the GPU decodes those and the two parts meet in
one batch. torchvision's batched decoder is one per process behind a lock, one batch at a time, so
what host cores take off it shortens the time to the next batch (NVIDIA DALI's ``hw_decoder_load``
splits the same way between its decoders).

Corrupt or truncated files are skipped and counted, not fatal: the next file of the data set takes
the sample's place (so a batch keeps its size) and the record lists the count and the first
names. A long benchmark should not die on one bad file of a 1.28M-file set, and the count keeps
the number honest. ``MAX_BAD_IN_A_ROW`` unreadable files in a row stop the run: that is a
broken data set, not a bad file.
"""
from __future__ import annotations

import collections
import io
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
from typing import Any, Callable, Sequence

import numpy as np
import torch

from dlscale import ConfigError
from dlscale.inputs import crop_kernel

MEAN = (0.485, 0.456, 0.406)  # ImageNet channel statistics, the torchvision reference values
STD = (0.229, 0.224, 0.225)
SCALE = (0.08, 1.0)
RATIO = (3.0 / 4.0, 4.0 / 3.0)
MAX_BAD_IN_A_ROW = 16
BAD_NAMES_KEPT = 5
JPEG_MAGIC = b"\xff\xd8"


def pil():
    """Pillow, or a ConfigError saying how to install it."""
    try:
        from PIL import Image  # optional: PIL
    except ImportError:
        raise ConfigError("imagefolder data needs Pillow: pip install 'dlscale[data]' (or pip install pillow)") \
            from None
    return Image


def decoder_name() -> str:
    Image = pil()
    from PIL import features  # optional: PIL

    turbo = features.version("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
    lib = f"libjpeg-turbo {turbo}" if turbo else f"libjpeg {features.version('jpg')}"
    return f"Pillow {Image.__version__} ({lib})"


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The random numbers of one sample in one epoch (independent of worker, rank and order)."""
    return np.random.default_rng((int(seed) % 2**63, int(epoch), int(index)))  # numpy takes seeds >= 0


def crop_params(width: int, height: int, rng: np.random.Generator,
                scale: tuple[float, float] = SCALE, ratio: tuple[float, float] = RATIO) -> tuple[int, int, int, int]:
    """(left, top, w, h) of a random-resized crop, as torchvision's RandomResizedCrop.get_params."""
    area = width * height
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_r[0], log_r[1]))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def augment_params(width: int, height: int, rng: np.random.Generator) -> tuple[tuple[int, int, int, int], bool]:
    box = crop_params(width, height, rng)
    return box, bool(rng.random() < 0.5)


_BAD_IMAGE = (OSError, SyntaxError, ValueError, EOFError, struct.error)


def _pil_rgb(data: bytes):
    Image = pil()
    img = Image.open(io.BytesIO(data))
    img.load()
    return img if img.mode == "RGB" else img.convert("RGB")


def _crop_resize_pil(img, box: tuple[int, int, int, int], flip: bool, size: int) -> np.ndarray:
    """``box`` of a PIL image resized to size x size (bilinear, antialiased), maybe flipped: HWC uint8."""
    Image = pil()
    left, top, w, h = box
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(img)  # a writable copy (torch.from_numpy of a read-only array warns)


def decode_augment(data: bytes, size: int, rng: np.random.Generator) -> np.ndarray:
    """Decode an image file's bytes, random-resized-crop to size x size, maybe flip: HWC uint8."""
    img = _pil_rgb(data)
    box, flip = augment_params(img.width, img.height, rng)
    return _crop_resize_pil(img, box, flip, size)


class _Folder(torch.utils.data.Dataset):
    """Shared part: the file list as numpy bytes (no per-file Python objects: forked workers
    would touch their reference counts and copy the pages), labels, and the skip rule."""

    def __init__(self, root: str, files: Sequence[str], labels: Sequence[int], size: int, seed: int):
        self.root = root
        self.files = np.array([f.encode() for f in files], dtype=np.bytes_)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.size = size
        self.seed = seed

    def __len__(self) -> int:
        return len(self.files)

    def path(self, i: int) -> str:
        return os.path.join(self.root, self.files[i].decode())

    def _read_good(self, index: int, use: Callable[[bytes, int], Any]) -> tuple[Any, int, int, list[str]]:
        """(use(bytes, i) of the first readable file from ``index`` on, its index, bytes read, bad names)."""
        bad: list[str] = []
        nbytes = 0
        n = len(self.files)
        for k in range(MAX_BAD_IN_A_ROW):
            i = (index + k) % n
            try:
                with open(self.path(i), "rb") as f:
                    data = f.read()
                nbytes += len(data)
                return use(data, i), i, nbytes, bad
            except _BAD_IMAGE as e:
                bad.append(f"{self.files[i].decode()}: {type(e).__name__}: {str(e)[:80]}")
        raise RuntimeError(f"imagefolder {self.root}: {MAX_BAD_IN_A_ROW} unreadable images in a row "
                           f"from {self.files[index % n].decode()}; first: {bad[0]}")


class ImageFolderData(_Folder):
    """CPU decode. Items: (HWC uint8 array, label, bytes read, bad-file notes)."""

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        rng = sample_rng(self.seed, epoch, index)
        img, i, nbytes, bad = self._read_good(index, lambda data, _i: decode_augment(data, self.size, rng))
        return img, int(self.labels[i]), nbytes, bad


def _meta(items: list, nbytes_at: int, bad_at: int) -> dict[str, Any]:
    bad = [b for it in items for b in it[bad_at]]
    return {"bytes": sum(it[nbytes_at] for it in items), "bad": len(bad), "bad_names": bad[:BAD_NAMES_KEPT]}


_STATS: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}
# the same float32 values as _mean_std's, on the host (a kernel takes them as arguments)
_MEAN255 = tuple((torch.tensor(MEAN) * 255.0).tolist())
_STD255 = tuple((torch.tensor(STD) * 255.0).tolist())


def _mean_std(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """MEAN and STD x 255 as (1,3,1,1) tensors on ``device``, made once (no copy per batch)."""
    if device not in _STATS:
        _STATS[device] = (torch.tensor(MEAN, device=device).view(1, 3, 1, 1) * 255.0,
                          torch.tensor(STD, device=device).view(1, 3, 1, 1) * 255.0)
    return _STATS[device]


def _normalize_(x: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW (any memory format) -> float normalised, in the same memory format."""
    mean, std = _mean_std(x.device)
    return x.float().sub_(mean).div_(std)


def collate_uint8(items: list) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Stack HWC uint8 images (through shared memory in a worker): (B,H,W,3) uint8, labels, meta."""
    imgs = torch.utils.data.default_collate([torch.from_numpy(it[0]) for it in items])
    return imgs, torch.tensor([it[1] for it in items], dtype=torch.int64), _meta(items, 2, 3)


def collate_normalized(items: list) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """For training on the CPU: normalise in the worker; NCHW float contiguous, as the synthetic batch."""
    imgs, labels, meta = collate_uint8(items)
    return _normalize_(imgs.permute(0, 3, 1, 2)).contiguous(), labels, meta


def finish_on_device(item, device: torch.device, channels_last: bool):
    """A CPU-decoded batch on the device: copy uint8 (non-blocking from pinned memory), normalise
    there; (B,H,W,3) permuted to NCHW is already channels_last in memory."""
    imgs, labels, meta = item
    x = _normalize_(imgs.to(device, non_blocking=True).permute(0, 3, 1, 2))
    x = x.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    return (x, labels.to(device, non_blocking=True)), meta


# ---------------------------------------------------------------------------------------------
# GPU decode

class ImageBytesData(_Folder):
    """GPU decode: workers read the file and its header only. Items: (bytes as uint8 tensor,
    label, crop box, flip, bytes read, bad-file notes)."""

    def __getitem__(self, key: tuple[int, int]):
        epoch, index = key
        Image = pil()
        rng = sample_rng(self.seed, epoch, index)

        def header(data: bytes, _i: int):
            with Image.open(io.BytesIO(data)) as im:  # parses the header; pixels stay compressed
                w, h = im.size
            return data, augment_params(w, h, rng)

        (data, (box, flip)), i, nbytes, bad = self._read_good(index, header)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(self.labels[i]), box, flip, nbytes, bad


def collate_bytes(items: list):
    """The files of a batch as ONE uint8 tensor and their lengths: one shared-memory block (and
    file descriptor) per batch between processes, not one per image."""
    return (torch.cat([it[0] for it in items]), [len(it[0]) for it in items],
            torch.tensor([it[1] for it in items], dtype=torch.int64), [it[2] for it in items],
            [it[3] for it in items], _meta(items, 4, 5))


def collate_split(items: list, cpu_images: int, size: int):
    """Part of a GPU-decode batch decoded by the worker: its first ``cpu_images`` files decoded and
    cropped here (Pillow, the CPU path's operations on the crop box the header gave), the rest
    batched as ``collate_bytes`` does for the GPU. Returns ``(cpu HWC uint8 (k,H,W,3), flat,
    lengths, labels, boxes, flips, meta)`` with the labels in that order (the CPU-decoded images
    first). A file Pillow cannot decode goes to the GPU part, whose decoder handles and counts it."""
    cpu, rest = [], []
    for it in items:
        if len(cpu) < cpu_images:
            try:
                cpu.append((_crop_resize_pil(_pil_rgb(it[0].numpy().tobytes()), it[2], it[3], size), it[1]))
                continue
            except _BAD_IMAGE:
                pass
        rest.append(it)
    imgs = (torch.utils.data.default_collate([torch.from_numpy(c[0]) for c in cpu]) if cpu
            else torch.empty((0, size, size, 3), dtype=torch.uint8))
    flat = torch.cat([it[0] for it in rest]) if rest else torch.empty(0, dtype=torch.uint8)
    labels = torch.tensor([c[1] for c in cpu] + [it[1] for it in rest], dtype=torch.int64)
    return (imgs, flat, [len(it[0]) for it in rest], labels, [it[2] for it in rest], [it[3] for it in rest],
            _meta(items, 4, 5))


def jpeg_mask(flat: torch.Tensor, lengths: Sequence[int]) -> np.ndarray:
    """Which files of a ``collate_bytes`` batch start with the JPEG marker (bool per file), read
    from the batch's one host buffer at once: not a slice and a host read per file, since the input
    thread shares the interpreter with the training step."""
    raw, lens = flat.numpy(), np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    whole = lens >= 2
    magic = np.zeros(len(lens), dtype=bool)
    magic[whole] = (raw[starts[whole]] == JPEG_MAGIC[0]) & (raw[starts[whole] + 1] == JPEG_MAGIC[1])
    return magic


TORCHVISION_INSTALL = "pip install torchvision matching this torch"
NVIMGCODEC_INSTALL = ("pip install 'dlscale[nvimgcodec]' (nvidia-nvimgcodec-cu13 with nvidia-nvjpeg; for a CUDA 12 "
                      "torch: pip install 'nvidia-nvimgcodec-cu12[nvjpeg]')")
NVIMGCODEC_CPU_THREADS = 4  # nvImageCodec's host threads (JPEG parsing); the cores stay with the training and readers
DecodeFn = Callable[[list[torch.Tensor]], list[Any]]


def _torchvision():
    """torchvision, or None where it does not import."""
    try:
        import torchvision  # optional: torchvision
        from torchvision.io import decode_jpeg  # noqa: F401
    except ImportError:
        return None
    return torchvision


def torchvision_decoder(device: torch.device) -> tuple[DecodeFn, str]:
    """torchvision.io.decode_jpeg on ``device`` (nvJPEG on CUDA), or a ConfigError saying how to install."""
    torchvision = _torchvision()
    if torchvision is None:
        raise ConfigError("data-decode gpu needs torchvision (nvJPEG through torchvision.io.decode_jpeg): "
                          f"{TORCHVISION_INSTALL}")
    from torchvision.io import ImageReadMode, decode_jpeg  # torchvision: keeps start-up light

    def decode(datas: list[torch.Tensor]) -> list[torch.Tensor]:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)

    how = "nvJPEG: hardware JPEG decoder where the GPU has one, else CUDA" if device.type == "cuda" else "nvJPEG"
    return decode, f"torchvision {torchvision.__version__} io.decode_jpeg on {device.type} ({how})"


# nvImageCodec prints, when imported, one message per codec library it cannot load; only libnvjpeg matters here
_NVJPEG_MISSING = re.compile(r"failed to load nvjpeg library|\[nvjpeg-ext\] failed to load", re.IGNORECASE)
_OTHER_CODECS = re.compile(r"nvjpeg2k|nvjpeg2000|nvtiff|nvcomp", re.IGNORECASE)
_NVIMG: dict[str, Any] = {}


def _import_nvimgcodec():
    """``from nvidia import nvimgcodec`` with what its extension loaders print on file descriptor 2
    captured: (module or None, the captured text, the import error or None)."""
    sys.stderr.flush()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            try:
                from nvidia import nvimgcodec  # optional: nvidia
                err = None
            except (ImportError, OSError) as e:
                nvimgcodec, err = None, e
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode(errors="replace")
    return nvimgcodec, text, err


def nvimgcodec_status():
    """(nvidia.nvimgcodec or None, why it cannot decode JPEGs here or None), imported once per process.
    Imports without a GPU; its messages about codecs dlscale does not use (JPEG 2000, TIFF) are
    dropped, others passed on to stderr."""
    if "module" not in _NVIMG:
        module, text, err = _import_nvimgcodec()
        why = None
        if err is not None:
            missing = isinstance(err, ModuleNotFoundError) and (err.name or "").startswith("nvidia")
            why = ("nvImageCodec (nvidia-nvimgcodec-cu13) is not installed" if missing
                   else f"nvImageCodec does not import: {type(err).__name__}: {str(err)[:120]}")
            module = None
        elif _NVJPEG_MISSING.search(text):
            why = "nvImageCodec is installed but cannot load libnvjpeg (CUDA's nvJPEG: the nvidia-nvjpeg wheel)"
        keep = [ln for ln in text.splitlines() if ln.strip() and not _OTHER_CODECS.search(ln)
                and not (why and "nvjpeg" in ln.lower())]
        if keep:
            sys.stderr.write("\n".join(keep) + "\n")
        _NVIMG.update(module=module, why=why)
    return _NVIMG["module"], _NVIMG["why"]


CHILD_IMPORT_TIMEOUT_S = 120


def import_in_child(code: str, what: str) -> subprocess.CompletedProcess | str:
    """Run ``code`` (an import check) in a child interpreter with this process's path: a launcher must
    not import a GPU library itself (on a GPU machine the import makes a CUDA context, and the
    launcher, a sweep's parent alive through every later case, would hold it beside each case:
    memory, ``competing_gpu``). The finished child, or why it did not finish."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=CHILD_IMPORT_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return f"importing {what} took over {CHILD_IMPORT_TIMEOUT_S} s"


def _launcher_nvimgcodec_why() -> str | None:
    """``nvimgcodec_status()``'s verdict, judged in a child interpreter (``import_in_child``). Its
    messages are passed on to stderr; cached per process."""
    if "launcher_why" not in _NVIMG:
        code = ("import sys; from dlscale.inputs.images import nvimgcodec_status; why = nvimgcodec_status()[1]; "
                "sys.stdout.write('ok' if why is None else 'why:' + why)")
        out = import_in_child(code, "nvImageCodec")
        if isinstance(out, str):
            why = out
        else:
            if out.stderr:
                sys.stderr.write(out.stderr)
            text = out.stdout.strip()
            why = None if text == "ok" else text[4:] if text.startswith("why:") else \
                f"its import check failed (exit {out.returncode})"
        _NVIMG["launcher_why"] = why
    return _NVIMG["launcher_why"]


def check_gpu_decoder(choice: str) -> None:
    """The launcher's check of ``--data-decoder`` (no CUDA context is made: nvImageCodec is imported
    in a child interpreter): the chosen library imports, or ConfigError (one line) naming what is
    missing and how to install it. DALI's check is ``dali.check_launcher``, called by
    ``inputs.check_machine``: dali builds on this module, so this module does not import it."""
    if choice == "torchvision":
        torchvision_decoder(torch.device("cuda"))
        return
    if choice == "nvimgcodec":
        why = _launcher_nvimgcodec_why()
        if why is not None:
            raise ConfigError(f"data-decoder nvimgcodec: {why}; {NVIMGCODEC_INSTALL}")
        return
    if _torchvision() is None and _launcher_nvimgcodec_why() is not None:
        raise ConfigError(f"data-decode gpu needs torchvision (nvJPEG through torchvision.io.decode_jpeg) or "
                          f"nvImageCodec (hardware JPEG decoders): {TORCHVISION_INSTALL}, or "
                          f"{NVIMGCODEC_INSTALL.split(' (')[0]}")


def _probe_jpeg() -> bytes:
    """A small baseline 4:2:0 JPEG (what ImageNet's files are), made with Pillow."""
    Image = pil()
    y, x = np.mgrid[0:192, 0:256]
    rgb = np.stack([x, y, (x + y) // 2], axis=-1).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, "JPEG", quality=90, subsampling=2)
    return buf.getvalue()


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def nvimgcodec_hardware(nv, device: torch.device) -> bool:
    """Whether this GPU's hardware JPEG decoders take a baseline JPEG through nvImageCodec (a
    decoder allowed only the HW_GPU_ONLY backend decodes one; False where it cannot or raises)."""
    try:
        dec = nv.Decoder(device_id=_cuda_index(device), max_num_cpu_threads=1,
                         backends=[nv.Backend(nv.BackendKind.HW_GPU_ONLY)])
        img = dec.decode([nv.CodeStream(_probe_jpeg())])[0]
    except Exception:  # noqa: BLE001 - any failure means: no usable hardware decoder
        return False
    return img is not None


def _chw(img, device: torch.device) -> torch.Tensor:
    """A decoded nvImageCodec image (HWC uint8 on the GPU) as a CHW torch view, zero-copy: DLPack
    (torch hands its current stream to the producer), else the CUDA array interface."""
    try:
        t = torch.from_dlpack(img)
    except (TypeError, RuntimeError, BufferError, AttributeError):
        t = torch.as_tensor(img, device=device)
    return t.permute(2, 0, 1)


class NvimgcodecDecode:
    """nvImageCodec as ``GpuDecoder``'s decode: a batch of JPEG bytes in one ``Decoder.decode``
    call on the current CUDA stream (the input thread's own, in the Prefetcher), which the decoder
    synchronises its output with; each image a CHW view of nvImageCodec's buffer, None where it
    could not decode (Pillow takes those). ``batch_done()`` (GpuDecoder, after the batch's crop is
    queued) marks the stream point after which the batch's buffers and source bytes are no longer
    read: they are held until the GPU passes it, so neither is freed under a queued copy."""

    HOLD = 4  # batches held at most; the oldest is waited for past that (normally long finished)

    def __init__(self, nv, device: torch.device, hardware: bool):
        self.nv, self.device = nv, device
        kinds = [nv.BackendKind.HW_GPU_ONLY, nv.BackendKind.GPU_ONLY] if hardware else [nv.BackendKind.GPU_ONLY]
        self.decoder = nv.Decoder(device_id=_cuda_index(device), max_num_cpu_threads=NVIMGCODEC_CPU_THREADS,
                                  backends=[nv.Backend(k) for k in kinds])
        # RGB as torchvision's ImageReadMode.RGB; no EXIF rotation: the crop box comes from the header
        # as stored (Pillow's size), the same on the CPU path
        self.params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB,
                                      allow_any_depth=False)
        self._pending: list = []
        self._held: collections.deque = collections.deque()

    def __call__(self, datas: list[torch.Tensor]) -> list[torch.Tensor | None]:
        while self._held and (len(self._held) > self.HOLD or self._held[0][0].query()):
            self._held.popleft()[0].synchronize()
        stream = torch.cuda.current_stream(self.device)
        srcs = [self.nv.CodeStream(d.numpy()) for d in datas]
        imgs = self.decoder.decode(srcs, params=self.params, cuda_stream=stream.cuda_stream)
        self._pending.append((datas, srcs, imgs))
        return [None if im is None else _chw(im, self.device) for im in imgs]

    def batch_done(self) -> None:
        if self._pending:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
            self._held.append((event, self._pending))
            self._pending = []


def nvimgcodec_decoder(device: torch.device, hardware: bool | None = None) -> tuple[NvimgcodecDecode, str, str]:
    """nvImageCodec's decode on ``device``, its name for the record and its backend ("hardware":
    the NVJPG engines, nvJPEG's CUDA decoder for what they cannot take; "cuda": the probe found no
    hardware decoder, so CUDA only). ``hardware`` None: probed. ConfigError where nvImageCodec
    cannot decode JPEGs here."""
    nv, why = nvimgcodec_status()
    if why is not None:
        raise ConfigError(f"data-decoder nvimgcodec: {why}; {NVIMGCODEC_INSTALL}")
    if hardware is None:
        hardware = nvimgcodec_hardware(nv, device)
    # the hardware backend is allowed either way (nvImageCodec passes over it where it cannot decode):
    # the probe names the backend in the record, it does not choose it
    decode = NvimgcodecDecode(nv, device, hardware=True)
    where = f"cuda:{_cuda_index(device)}"
    if hardware:
        how = f"hardware JPEG decoder (NVJPG), CUDA nvJPEG where it cannot; {NVIMGCODEC_CPU_THREADS} CPU threads"
    else:
        how = "CUDA nvJPEG: its hardware backend decoded no probe JPEG on this GPU"
    return decode, f"nvImageCodec {nv.__version__} on {where} ({how})", "hardware" if hardware else "cuda"


def gpu_decoder(device: torch.device, choice: str = "auto") -> tuple[DecodeFn, str, str, str]:
    """``--data-decoder`` resolved on this GPU: (decode, name for the record, decoder: torchvision |
    nvimgcodec, backend: hardware | cuda | hardware-or-cuda). auto: torchvision where it imports (its
    nvJPEG takes the hardware decoders where the GPU has them: ``hardware-or-cuda``, nvJPEG does not
    say which), else nvImageCodec (hardware where its probe decodes); the name says why."""
    if choice == "dali":
        raise ValueError("DALI decodes in its own pipeline (dlscale.inputs.dali.DaliDecoder), not as "
                         "GpuDecoder's decode")
    if choice == "torchvision" or device.type != "cuda":
        decode, name = torchvision_decoder(device)
        return decode, name, "torchvision", _TV_BACKEND if device.type == "cuda" else device.type
    if choice == "nvimgcodec":
        decode, name, backend = nvimgcodec_decoder(device)
        return decode, name, "nvimgcodec", backend
    if _torchvision() is not None:
        decode, name = torchvision_decoder(device)
        return decode, f"{name}; chosen by auto", "torchvision", _TV_BACKEND
    nv, why = nvimgcodec_status()
    if nv is None or (why is not None and "libnvjpeg" in why):
        # the launcher's check_gpu_decoder refuses this case before any process starts
        raise ConfigError(f"data-decode gpu: torchvision is not installed and {why}")
    decode, name, backend = nvimgcodec_decoder(device)
    return decode, f"{name}; auto: torchvision is not installed", "nvimgcodec", backend


# torchvision's batched decode creates nvJPEG's hardware backend first and the default one where the
# GPU has no JPEG engines (ARCH_MISMATCH); it does not report which it got
_TV_BACKEND = "hardware-or-cuda"


def _pil_chw(data: torch.Tensor) -> torch.Tensor:
    Image = pil()
    img = Image.open(io.BytesIO(data.numpy().tobytes()))
    img.load()
    if img.mode != "RGB":
        img = img.convert("RGB")
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def pil_decode(datas: list[torch.Tensor]) -> list[torch.Tensor]:
    """Pillow's decode of a list of file bytes to CHW uint8 images: a host stand-in for a GPU decoder
    (``GpuDecoder(decode=...)``), module-level so that a decode process can be given it."""
    return [_pil_chw(d) for d in datas]


def _crop_params(imgs: list[torch.Tensor], boxes, flips, size: int) -> np.ndarray:
    """Per image (n, 9) float64: left, top, w/size, h/size, width-1, height-1, its first byte in the
    images concatenated, its channel plane, flip. A box outside its image (header and pixels
    disagree: a damaged file) becomes the whole image."""
    n, s = len(imgs), size
    hw = np.array([im.shape[-2:] for im in imgs], dtype=np.int64)  # (n, 2): h, w
    box = np.array(boxes, dtype=np.float64).reshape(n, 4)  # left, top, w, h
    off = (box[:, 0] + box[:, 2] > hw[:, 1]) | (box[:, 1] + box[:, 3] > hw[:, 0])
    box[off] = np.stack([np.zeros(off.sum()), np.zeros(off.sum()), hw[off, 1], hw[off, 0]], axis=1)
    plane = hw[:, 0] * hw[:, 1]
    base = np.concatenate([[0], np.cumsum(3 * plane)[:-1]])
    return np.stack([box[:, 0], box[:, 1], box[:, 2] / s, box[:, 3] / s, hw[:, 1] - 1, hw[:, 0] - 1,
                     base, plane, np.asarray(flips, dtype=bool)], axis=1)


def crop_batch(imgs: list[torch.Tensor], boxes, flips, size: int, device, channels_last: bool,
               kernel: bool = True) -> torch.Tensor:
    """Decoded CHW uint8 images -> the training batch: each crop box resized to ``size`` x ``size``
    (bilinear, ``_crop_resize_flip``'s coordinates), flipped where asked, normalised, channels_last
    where asked. One Triton kernel where it runs (``crop_kernel``: CUDA) unless ``kernel`` is False,
    else the torch version."""
    if not (kernel and crop_kernel.usable(torch.device(device))):
        mean, std = _mean_std(device)
        out = _crop_resize_flip(imgs, boxes, flips, size, device).sub_(mean).div_(std)
        return out.contiguous(memory_format=torch.channels_last) if channels_last else out
    par = torch.from_numpy(_crop_params(imgs, boxes, flips, size)).to(device, non_blocking=False)
    flat = torch.cat([im.reshape(-1) for im in imgs])
    return crop_kernel.crop_normalize(flat, par, size, _MEAN255, _STD255, channels_last)


def _crop_resize_flip(imgs: list[torch.Tensor], boxes, flips, size: int, device) -> torch.Tensor:
    """Every image's crop box resized to ``size`` x ``size`` (bilinear, no antialiasing: the
    coordinates ``grid_sample`` with ``align_corners=False`` and border padding takes on each image)
    and flipped where asked, as one gather over the batch's images concatenated: a few kernels per
    batch and no Python loop over images issuing device work. The decode thread shares the
    interpreter with the training loop, which launches its kernels between GIL hand-overs; a
    per-image loop here held the GIL long enough to stall those launches by the interpreter's
    switch interval (docs/data.md), and a padded batch cost the model memory bandwidth. The torch
    version of ``crop_kernel``'s kernel (CPU, or where Triton is missing)."""
    n, s = len(imgs), size
    par = torch.from_numpy(_crop_params(imgs, boxes, flips, size)).to(device, non_blocking=False)
    flat = torch.cat([im.reshape(-1) for im in imgs])
    pix = torch.arange(s, device=device, dtype=torch.float64) + 0.5
    # source pixel of each output column / row (align_corners=False), clamped to the image (border)
    sx = par[:, :1] + pix * par[:, 2:3] - 0.5
    sx = torch.where(par[:, 8:9] > 0, sx.flip(1), sx).clamp_(min=0).minimum(par[:, 4:5])
    sy = (par[:, 1:2] + pix * par[:, 3:4] - 0.5).clamp_(min=0).minimum(par[:, 5:6])
    x0, y0 = sx.floor(), sy.floor()
    wx, wy = (sx - x0).float(), (sy - y0).float()
    dx = (x0 < par[:, 4:5]).long()  # 0 on the last column: its right neighbour has weight 0
    dy = (y0 < par[:, 5:6]).long()
    width = par[:, 4:5].long() + 1
    chan = torch.arange(3, device=device).view(1, 3, 1, 1) * par[:, 7].long().view(n, 1, 1, 1)
    row = (par[:, 6:7].long() + y0.long() * width).view(n, 1, s, 1) + chan  # (n, 3, s, 1)
    col = x0.long().view(n, 1, 1, s)
    i00 = row + col  # (n, 3, s, s)
    down = (dy * width).view(n, 1, s, 1)
    right = dx.view(n, 1, 1, s)
    top = torch.take(flat, i00).float().lerp_(torch.take(flat, i00 + right).float(), wx.view(n, 1, 1, s))
    bot = torch.take(flat, i00 + down).float().lerp_(torch.take(flat, i00 + down + right).float(),
                                                      wx.view(n, 1, 1, s))
    return top.lerp_(bot, wy.view(n, 1, s, 1))


class GpuDecoder:
    """Batch decode + augment on a device. Non-JPEG files (PNG) and files the batched decoder
    rejects (an exception, or None in its place) are decoded by Pillow on the host and counted
    (``fallbacks``); files neither can read are replaced by another image of the batch and counted
    as bad. ``decode``: a list of file bytes -> a list of CHW uint8 images (or None each)."""

    def __init__(self, device: torch.device, size: int, channels_last: bool, decode: DecodeFn | None = None,
                 name: str | None = None, decoder: str = "auto"):
        self.device, self.size, self.channels_last = device, size, channels_last
        self.kind: str | None = None  # torchvision | nvimgcodec (None: a decode given by the caller)
        self.backend: str | None = None  # hardware | cuda | hardware-or-cuda
        if decode is None:
            decode, name, self.kind, self.backend = gpu_decoder(device, decoder)
        self.decode, self.name = decode, name or "custom"
        self.crop_kernel = True  # crop_batch's Triton kernel where it runs (False: the torch version)
        self.crop_note = ""  # why the kernel is not used where it could run
        if crop_kernel.usable(device):
            self._check_kernel()

    def _decode_all(self, flat: torch.Tensor, lengths: list[int]) -> tuple[list[torch.Tensor | None], int]:
        """The batch's files (``flat`` split by ``lengths``) decoded: (images or None each, Pillow fallbacks)."""
        datas = list(torch.split(flat, lengths))
        out: list[torch.Tensor | None] = [None] * len(datas)
        jpeg = np.flatnonzero(jpeg_mask(flat, lengths)).tolist()
        if jpeg:
            try:
                for i, img in zip(jpeg, self.decode([datas[i] for i in jpeg])):
                    out[i] = img
            except (RuntimeError, *_BAD_IMAGE):  # one bad file fails the batched call: one by one
                for i in jpeg:
                    try:
                        out[i] = self.decode([datas[i]])[0]
                    except (RuntimeError, *_BAD_IMAGE):
                        pass
        fallbacks = 0
        for i, img in enumerate(out):
            if img is None:
                try:
                    out[i] = _pil_chw(datas[i]).to(self.device, non_blocking=True)
                    fallbacks += 1
                except _BAD_IMAGE:
                    pass
        return out, fallbacks

    @property
    def crop_path(self) -> str:
        """How the crop, resize, flip and normalisation run (named in the record)."""
        if self.crop_kernel and crop_kernel.usable(self.device):
            return "one Triton kernel"
        return f"torch ops ({self.crop_note})" if self.crop_note else "torch ops"

    def _check_kernel(self) -> None:
        """Compile and run the kernel once on two small images (before the run's first batch) against
        the torch version; if it fails to build or run, or disagrees, the torch version runs instead
        and ``crop_path`` says why: a GPU or Triton the kernel was not built for costs speed, not the run."""
        gen = torch.Generator().manual_seed(0)
        imgs = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=gen).to(self.device)
                for h, w in ((13, 17), (9, 8))]
        boxes, flips = [(2, 1, 11, 9), (0, 0, 8, 9)], [False, True]
        try:
            got = crop_batch(imgs, boxes, flips, 6, self.device, self.channels_last, kernel=True)
            want = crop_batch(imgs, boxes, flips, 6, self.device, self.channels_last, kernel=False)
            diff = float((got - want).abs().max())
        except Exception as e:  # noqa: BLE001 - any failure to build or launch: the torch version runs
            self.crop_kernel, self.crop_note = False, f"the Triton kernel failed here: {type(e).__name__}: {str(e)[:120]}"
            return
        if not diff <= 1e-3:
            self.crop_kernel = False
            self.crop_note = f"the Triton kernel disagreed with the torch version here by {diff:.3g}"

    def augment(self, imgs: list[torch.Tensor], boxes, flips) -> torch.Tensor:
        """Decoded images -> the training batch: crop, resize, flip, normalise (channels_last where set)."""
        out = crop_batch(imgs, boxes, flips, self.size, self.device, self.channels_last, self.crop_kernel)
        done = getattr(self.decode, "batch_done", None)
        if done is not None:  # the decoded images are read by the work queued so far, no later
            done()
        return out

    def _decode_augment(self, flat, lengths, boxes, flips) -> tuple[torch.Tensor, int, int]:
        """The files decoded and augmented: (batch, Pillow fallbacks, unreadable files replaced)."""
        imgs, fallbacks = self._decode_all(flat, lengths)
        good = [i for i, im in enumerate(imgs) if im is not None]
        if not good:
            raise RuntimeError(f"no image of a batch of {len(imgs)} could be decoded")
        bad = sum(im is None for im in imgs)
        imgs = [im if im is not None else imgs[good[i % len(good)]]  # unreadable: another image of the batch
                for i, im in enumerate(imgs)]
        return self.augment(imgs, boxes, flips), fallbacks, bad

    def __call__(self, item):
        """A batch from ``collate_bytes``, or from ``collate_split`` (its CPU-decoded images first)."""
        cpu = None
        if len(item) == 7:
            cpu, *item = item
        flat, lengths, labels, boxes, flips, meta = item
        fallbacks = bad = 0
        out = gpu = None
        if lengths:
            gpu, fallbacks, bad = self._decode_augment(flat, lengths, boxes, flips)
            out = gpu
        if cpu is not None and len(cpu):
            # the worker's images: uint8 over PCIe, normalised here (as CPU decode's finish_on_device)
            x = _normalize_(cpu.to(self.device, non_blocking=True).permute(0, 3, 1, 2))
            if gpu is None:
                out = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
            else:  # one batch in the model's memory format: the two parts copied into their rows
                out = torch.empty((len(x) + len(gpu), *gpu.shape[1:]), device=self.device, dtype=gpu.dtype,
                                  memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
                out[:len(x)].copy_(x)
                out[len(x):].copy_(gpu)
        meta = dict(meta, decode_fallbacks=fallbacks, bad=meta["bad"] + bad)
        return (out, labels.to(self.device, non_blocking=True)), meta
