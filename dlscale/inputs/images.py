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
(size, for the crop); ``torchvision.io.decode_jpeg(device="cuda")`` (nvJPEG) decodes the batch on
the GPU, which then crops, resizes (antialiased bilinear), flips and normalises.

Corrupt or truncated files are skipped and counted, not fatal: the next file of the data set takes
the sample's place (so a batch keeps its size) and the record lists the count and the first
names. A long benchmark should not die on one bad file of a 1.28M-file set, and the count keeps
the number honest. ``MAX_BAD_IN_A_ROW`` unreadable files in a row stop the run: that is a
broken data set, not a bad file.
"""
from __future__ import annotations

import io
import math
import os
import struct
from typing import Any, Callable, Sequence

import numpy as np
import torch

from dlscale import ConfigError

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
        from PIL import Image
    except ImportError:
        raise ConfigError("imagefolder data needs Pillow: pip install 'dlscale[data]' (or pip install pillow)") \
            from None
    return Image


def decoder_name() -> str:
    Image = pil()
    from PIL import features

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


def decode_augment(data: bytes, size: int, rng: np.random.Generator) -> np.ndarray:
    """Decode an image file's bytes, random-resized-crop to size x size, maybe flip: HWC uint8."""
    Image = pil()
    img = Image.open(io.BytesIO(data))
    img.load()
    if img.mode != "RGB":
        img = img.convert("RGB")
    (left, top, w, h), flip = augment_params(img.width, img.height, rng)
    img = img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.array(img)  # a writable copy (torch.from_numpy of a read-only array warns)


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


def torchvision_decoder(device: torch.device) -> tuple[Callable[[list[torch.Tensor]], list[torch.Tensor]], str]:
    """torchvision.io.decode_jpeg on ``device`` (nvJPEG on CUDA), or a ConfigError saying how to install."""
    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except ImportError:
        raise ConfigError("data-decode gpu needs torchvision (nvJPEG through torchvision.io.decode_jpeg): "
                          "pip install torchvision matching this torch") from None

    def decode(datas: list[torch.Tensor]) -> list[torch.Tensor]:
        return decode_jpeg(datas, mode=ImageReadMode.RGB, device=device)

    return decode, f"torchvision {torchvision.__version__} io.decode_jpeg on {device.type} (nvJPEG)"


def _pil_chw(data: torch.Tensor) -> torch.Tensor:
    Image = pil()
    img = Image.open(io.BytesIO(data.numpy().tobytes()))
    img.load()
    if img.mode != "RGB":
        img = img.convert("RGB")
    return torch.from_numpy(np.array(img)).permute(2, 0, 1)


def _crop_resize_flip(imgs: list[torch.Tensor], boxes, flips, size: int, device) -> torch.Tensor:
    """Every image's crop box resized to ``size`` x ``size`` and flipped where asked, in one
    ``grid_sample`` over the batch padded to its largest image (bilinear, no antialiasing: the
    GPU path's work per batch is a few kernels, not a few per image, so the decode thread in the
    training process holds the interpreter for little)."""
    import torch.nn.functional as F

    h_max, w_max = max(im.shape[-2] for im in imgs), max(im.shape[-1] for im in imgs)
    batch = torch.zeros((len(imgs), 3, h_max, w_max), dtype=torch.uint8, device=device)
    hw = np.array([im.shape[-2:] for im in imgs], dtype=np.float64)  # (n, 2): h, w
    box = np.array(boxes, dtype=np.float64).reshape(len(imgs), 4)  # left, top, w, h
    for i, im in enumerate(imgs):
        batch[i, :, :im.shape[-2], :im.shape[-1]].copy_(im, non_blocking=True)
    # header and pixels disagree (a damaged file): the whole image
    off = (box[:, 0] + box[:, 2] > hw[:, 1]) | (box[:, 1] + box[:, 3] > hw[:, 0])
    box[off] = np.stack([np.zeros(off.sum()), np.zeros(off.sum()), hw[off, 1], hw[off, 0]], axis=1)
    left, top, w, h = box.T
    # output [-1, 1] -> the box's pixel span in the padded image's [-1, 1] coordinates, built on the
    # host in one array (no per-image tensor writes: the decode thread holds the interpreter less)
    theta = np.zeros((len(imgs), 2, 3), dtype=np.float32)
    theta[:, 0, 0] = np.where(np.asarray(flips, dtype=bool), -1.0, 1.0) * w / w_max
    theta[:, 0, 2] = (2 * left + w) / w_max - 1
    theta[:, 1, 1] = h / h_max
    theta[:, 1, 2] = (2 * top + h) / h_max - 1
    grid = F.affine_grid(torch.from_numpy(theta).to(device), [len(imgs), 3, size, size], align_corners=False)
    return F.grid_sample(batch.float(), grid, mode="bilinear", padding_mode="border", align_corners=False)


class GpuDecoder:
    """Batch decode + augment on a device. Non-JPEG files (PNG) and files the batched decoder
    rejects are decoded by Pillow on the host and counted (``fallbacks``); files neither can read
    are replaced by another image of the batch and counted as bad."""

    def __init__(self, device: torch.device, size: int, channels_last: bool,
                 decode: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None, name: str | None = None):
        self.device, self.size, self.channels_last = device, size, channels_last
        if decode is None:
            decode, name = torchvision_decoder(device)
        self.decode, self.name = decode, name or "custom"

    def _decode_all(self, datas: list[torch.Tensor]) -> tuple[list[torch.Tensor | None], int]:
        out: list[torch.Tensor | None] = [None] * len(datas)
        jpeg = [i for i, d in enumerate(datas) if bytes(d[:2].tolist()) == JPEG_MAGIC]
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

    def __call__(self, item):
        flat, lengths, labels, boxes, flips, meta = item
        datas = list(torch.split(flat, lengths))
        imgs, fallbacks = self._decode_all(datas)
        good = [i for i, im in enumerate(imgs) if im is not None]
        if not good:
            raise RuntimeError(f"no image of a batch of {len(datas)} could be decoded")
        bad = sum(im is None for im in imgs)
        imgs = [im if im is not None else imgs[good[i % len(good)]]  # unreadable: another image of the batch
                for i, im in enumerate(imgs)]
        out = _crop_resize_flip(imgs, boxes, flips, self.size, self.device)
        mean, std = _mean_std(self.device)
        out = out.sub_(mean).div_(std)
        if self.channels_last:
            out = out.contiguous(memory_format=torch.channels_last)
        meta = dict(meta, decode_fallbacks=fallbacks, bad=meta["bad"] + bad)
        return (out, labels.to(self.device, non_blocking=True)), meta
