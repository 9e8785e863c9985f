"""Test data sets that behave like the real ones for a loader.

``imagenet-like``: JPEGs in class folders (ImageNet layout and naming) whose sizes follow ImageNet's
training set. Target: the ILSVRC2012 training archive is listed at 138 GB for 1,281,167 images on
image-net.org's download page, about 110 KB per JPEG; its images come from Flickr and most have a
long side of 500 pixels (Flickr's "medium" size) at 4:3 or 3:2, landscape or portrait, with a
tail of smaller and larger ones. The generator draws the long side (70 % exactly 500 px, 20 %
200-499, 10 % 501-1000), the aspect ratio (4:3, 3:2, 1:1 in both orientations) and a
natural-image-like content (1/f noise: the power spectrum of photographs falls as 1/f^2) whose
detail and contrast vary per image, so compressed sizes spread like real photographs' do;
quality 90, 4:2:0 chroma subsampling, baseline JPEG, as most of ImageNet. What decode costs
depends on pixels and entropy-coded bytes, both matched. ``dlscale-data.json`` in the folder
records the achieved mean size and dimensions: a generated set is described by what it is, not by
what it aimed at.

``tokens``: a flat file of uniformly drawn ids (uint16 or uint32); a loader's cost does not depend
on their values.
"""
from __future__ import annotations

import io
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from dlscale import ConfigError, DlscaleError

MANIFEST = "dlscale-data.json"
GENERATOR = "dlscale imagenet-like v1"
QUALITY = 90
LONG_SIDE = ((0.70, 500, 500), (0.20, 200, 499), (0.10, 501, 1000))  # (share, min, max) pixels
FREE_MARGIN = 256 << 20  # left free on the disk after a token set: the store and logs still need room
RATIOS = ((4 / 3, 0.32), (3 / 2, 0.26), (1.0, 0.10), (3 / 4, 0.16), (2 / 3, 0.16))  # (w/h, share)


def image_size(rng: np.random.Generator) -> tuple[int, int]:
    """(width, height) of one ImageNet-like image."""
    u = rng.random()
    acc = 0.0
    for share, lo, hi in LONG_SIDE:
        acc += share
        if u < acc:
            long = int(rng.integers(lo, hi + 1))
            break
    else:
        long = 500
    ratios = [r for r, _ in RATIOS]
    r = ratios[int(rng.choice(len(RATIOS), p=[p for _, p in RATIOS]))]
    return (long, max(1, round(long / r))) if r >= 1 else (max(1, round(long * r)), long)


def _field(rng: np.random.Generator, h: int, w: int, alpha: float) -> np.ndarray:
    """Zero-mean, unit-variance 2-D noise with a 1/f^alpha amplitude spectrum (float32)."""
    fy = np.fft.fftfreq(h).astype(np.float32)[:, None]
    fx = np.fft.rfftfreq(w).astype(np.float32)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spec = (rng.standard_normal((h, w // 2 + 1), dtype=np.float32)
            + 1j * rng.standard_normal((h, w // 2 + 1), dtype=np.float32)) / f ** alpha
    spec[0, 0] = 0
    x = np.fft.irfft2(spec, s=(h, w)).astype(np.float32)
    return x / (x.std() + 1e-9)


def image_bytes(seed: int, index: int, quality: int = QUALITY) -> bytes:
    """One ImageNet-like JPEG, a pure function of (seed, index)."""
    from PIL import Image  # optional: PIL

    rng = np.random.default_rng((seed, index))
    w, h = image_size(rng)
    alpha = rng.uniform(0.75, 1.25)  # detail: lower alpha, more fine structure, larger file
    contrast = rng.uniform(30.0, 65.0)
    y = np.clip(_field(rng, h, w, alpha) * contrast + rng.uniform(70, 180), 0, 255).astype(np.uint8)
    hc, wc = max(1, h // 2), max(1, w // 2)
    chroma = [np.clip(_field(rng, hc, wc, alpha + 0.3) * rng.uniform(6, 18) + 128 + rng.uniform(-25, 25), 0, 255)
              .astype(np.uint8) for _ in range(2)]
    planes = [Image.fromarray(y)] + [Image.fromarray(c).resize((w, h), Image.Resampling.BILINEAR) for c in chroma]
    buf = io.BytesIO()
    Image.merge("YCbCr", planes).save(buf, "JPEG", quality=quality, subsampling="4:2:0")
    return buf.getvalue()


def _class_name(c: int) -> str:
    return f"n{c:08d}"  # WordNet-id-like, as ImageNet's folders


def _write_chunk(args: tuple[str, int, int, int, int, int]) -> tuple[int, int, int, int]:
    out, seed, start, stop, classes, quality = args
    total = wsum = hsum = 0
    from PIL import Image  # optional: PIL

    for i in range(start, stop):
        data = image_bytes(seed, i, quality)
        c = i % classes
        path = Path(out) / _class_name(c) / f"{_class_name(c)}_{i}.JPEG"
        path.write_bytes(data)
        with Image.open(io.BytesIO(data)) as im:
            wsum += im.width
            hsum += im.height
        total += len(data)
    return stop - start, total, wsum, hsum


def _prepare_out(out: Path, need_bytes: int = 0) -> None:
    """An empty folder at ``out`` with room for ``need_bytes``; ConfigError (one line) when it cannot be."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"--out {out} exists and is not an empty folder; give a new one")
    existing = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create the folder: {e.strerror or e}") from None
    free = shutil.disk_usage(out).free
    if need_bytes and need_bytes + FREE_MARGIN > free:
        if existing != out.absolute():  # what this call made goes again: a refusal leaves nothing behind
            shutil.rmtree(existing / out.absolute().relative_to(existing).parts[0], ignore_errors=True)
        raise ConfigError(f"--size needs {need_bytes / 2**30:,.2f} GiB but {out} has {free / 2**30:,.2f} GiB "
                          f"free (and {FREE_MARGIN >> 20} MiB is kept free): give a smaller --size")


def make_imagenet_like(out: str, n: int, classes: int = 1000, seed: int = 0, jobs: int | None = None,
                       quality: int = QUALITY) -> dict[str, Any]:
    """Write ``n`` JPEGs into ``classes`` folders of ``out``; returns (and stores) the achieved statistics."""
    if n < 1 or classes < 1:
        raise ConfigError(f"--size and --classes must be >= 1, got {n} and {classes}")
    if not 1 <= quality <= 95:
        raise ConfigError(f"--quality must be 1..95 (Pillow's useful range), got {quality}")
    try:
        import PIL  # noqa: F401
    except ImportError:
        raise ConfigError("generating JPEGs needs Pillow: pip install 'dlscale[data]'") from None
    classes = min(classes, n)
    root = Path(out)
    _prepare_out(root)
    for c in range(classes):
        (root / _class_name(c)).mkdir()
    jobs = max(1, jobs or (os.cpu_count() or 1))
    step = max(1, min(256, -(-n // (jobs * 4))))
    chunks = [(str(root), seed, s, min(n, s + step), classes, quality) for s in range(0, n, step)]
    t0 = time.perf_counter()
    if jobs == 1:
        parts = [_write_chunk(c) for c in chunks]
    else:
        with ProcessPoolExecutor(jobs) as ex:
            parts = list(ex.map(_write_chunk, chunks))
    count = sum(p[0] for p in parts)
    total = sum(p[1] for p in parts)
    stats = {"kind": "imagenet-like", "generator": GENERATOR, "images": count, "classes": classes, "seed": seed,
             "quality": quality, "bytes": total, "mean_bytes": total / count,
             "mean_width": sum(p[2] for p in parts) / count, "mean_height": sum(p[3] for p in parts) / count,
             "seconds": round(time.perf_counter() - t0, 2), "jobs": jobs}
    (root / MANIFEST).write_text(json.dumps(stats, indent=1))
    return stats


def _write_tokens(path: Path, n_tokens: int, dtype: str, vocab: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    chunk = 1 << 24
    with open(path, "wb") as f:
        for s in range(0, n_tokens, chunk):
            rng.integers(0, vocab, min(chunk, n_tokens - s), dtype=np.uint32).astype(dtype).tofile(f)


def make_tokens(out: str, n_tokens: int, dtype: str = "uint16", vocab: int = 50257, seed: int = 0) -> dict[str, Any]:
    """``out``/tokens.bin: ``n_tokens`` ids drawn uniformly from [0, vocab)."""
    if dtype not in ("uint16", "uint32"):
        raise ConfigError(f"--dtype must be uint16 or uint32, got {dtype!r}")
    limit = 2 ** 16 if dtype == "uint16" else 2 ** 32
    if not 1 <= vocab <= limit:
        raise ConfigError(f"--vocab must be 1..{limit} for {dtype}, got {vocab}")
    if n_tokens < 2:
        raise ConfigError(f"--size must be at least 2 tokens, got {n_tokens}")
    root = Path(out)
    created = not root.exists()
    _prepare_out(root, n_tokens * np.dtype(dtype).itemsize)
    path = root / "tokens.bin"
    t0 = time.perf_counter()
    try:
        _write_tokens(path, n_tokens, dtype, vocab, seed)
    except BaseException as e:  # a full disk, Ctrl-C, SIGTERM: no partial set is left to be mistaken for one
        path.unlink(missing_ok=True)
        if created:
            shutil.rmtree(root, ignore_errors=True)
        if isinstance(e, OSError):
            raise DlscaleError(f"writing {path} failed: {e.strerror or e}; the partial set was removed") from None
        raise
    stats = {"kind": "tokens", "file": str(path), "tokens": n_tokens, "dtype": dtype, "vocab": vocab, "seed": seed,
             "bytes": path.stat().st_size, "seconds": round(time.perf_counter() - t0, 2),
             "spec": f"tokens:{path}:{dtype}"}
    (root / MANIFEST).write_text(json.dumps(stats, indent=1))
    return stats
