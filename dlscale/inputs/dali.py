"""NVIDIA DALI as the GPU decoder (``--data-decoder dali``): decode, crop, resize, flip and
normalise in DALI's own pipeline, several batches in flight in its C++ threads (no GIL).

The DataLoader workers still make ``images.collate_bytes`` batches (file bytes, the crop box from
the header and the sample's seeded generator, flip, label), so the samples, crops and flips are the
other decode paths'. ``DaliFeed`` is the pipeline's source: DALI calls it (in the input thread,
when the pipeline wants another batch, ``PREFETCH`` ahead) and it takes the DataLoader's next batch
and queues it in a FIFO, whose head pairs with the pipeline's next output (outputs come in the
order fed). ``DaliDecoder.finish`` copies each output into a torch tensor on the input thread's
CUDA stream, to which the output is bound; DALI's buffer is held until an event after the copy
has passed. The ``Prefetcher`` then hands the batch to the training stream as any other.

The graph: ``decoders.image_slice`` (``mixed``: ``HW_DECODER_LOAD`` of the JPEGs on the GPU's
JPEG engines, the rest on nvJPEG's CUDA decoder with host Huffman decoding; only the crop box
decoded where the decoder can) -> ``resize`` to size x size (bilinear, no antialiasing, as the
other GPU path) -> ``crop_mirror_normalize`` (flip, ImageNet mean/std, float32; NHWC memory for
channels_last, viewed as NCHW). On a CPU device (tests) the same graph runs DALI's CPU operators
with ``device_id=None``.

Files: one without the JPEG marker (a PNG) gets a placeholder JPEG in the pipeline and is decoded
by Pillow on the host instead (the CPU path's crop), counted in ``decode_fallbacks``. A batch DALI
fails on (a damaged JPEG fails its whole batch) is decoded by Pillow on the host, every image of
it counted as a fallback; a file Pillow cannot read either is replaced by another image of its
batch and counted as bad. ``FAILED_IN_A_ROW`` failed batches in a row stop the run with DALI's
error: that is DALI not working, not a bad file.
"""
from __future__ import annotations

import collections
import importlib.util
import io
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch

from dlscale import ConfigError
from dlscale.inputs import images

# Share of the JPEGs DALI sends to the GPU's JPEG engines (NVJPG), the rest to nvJPEG's hybrid
# decoder: Huffman decoding on DALI's host threads, IDCT on the SMs, both beside the training. The
# engines are far from full at the rate ResNet-50 trains (torchvision's hardware decode: 15,076
# img/s with NVJPG 24 % busy on an H200, against 6,700 img/s trained compiled; docs/data.md),
# while DALI's default 0.65 would put ~2,300 img/s of Huffman decoding on THREADS host cores, more
# than they decode. 0.9 is the default DALI's nvImageCodec decoder shipped with, +1.8 % end to end
# over 0.65 in NVIDIA's EfficientNet run (NVIDIA/DALI#6366).
HW_DECODER_LOAD = 0.9
PREFETCH = 3  # batches in flight in the pipeline (DALI's prefetch_queue_depth)
THREADS = 4  # DALI's host threads (parsing, the hybrid share's Huffman); the cores stay with the training and readers
HOLD = 4  # outputs held at most for copies still queued; the oldest is waited for past that
FAILED_IN_A_ROW = 4  # batches DALI failed on in a row that stop the run
PACKAGES = {"12": "nvidia-dali-cuda120", "13": "nvidia-dali-cuda130"}  # DALI's wheels by CUDA major version
_PLACEHOLDER = 16  # side of the JPEG fed in place of a file DALI is not given


def install_hint(cuda: str | None = None) -> str:
    """The pip command for the DALI wheel matching ``cuda`` (default: this torch's CUDA version)."""
    cuda = torch.version.cuda if cuda is None else cuda
    major = (cuda or "").split(".")[0]
    if major in PACKAGES:
        return f"pip install {PACKAGES[major]} (DALI for CUDA {major}, this torch's)"
    return ("pip install nvidia-dali-cuda130 (CUDA 13) or nvidia-dali-cuda120 (CUDA 12), for the CUDA major "
            "version of the torch build")


_LAUNCHER: dict[str, str | None] = {}
# DALI's own modules only: its torch plugin would import torch again in the child (2 s more)
_CHILD_CHECK = "import sys, nvidia.dali, nvidia.dali.fn; sys.stdout.write('ok')"


def launcher_why() -> str | None:
    """Why DALI cannot run here (None: it imports), judged without importing it in this process: the
    launcher (a sweep's parent) must hold no CUDA context, so the import runs in a child interpreter,
    and only where ``find_spec`` finds the package. Cached per process."""
    if "why" not in _LAUNCHER:
        try:
            found = importlib.util.find_spec("nvidia.dali") is not None
        except (ImportError, ValueError):  # no nvidia package at all
            found = False
        why = None
        if not found:
            why = "NVIDIA DALI is not installed"
        else:
            out = images.import_in_child(_CHILD_CHECK, "DALI")
            if isinstance(out, str):
                why = out
            elif out.stdout.strip() != "ok":
                last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
                why = f"DALI does not import: {last[:160]}"
        _LAUNCHER["why"] = why
    return _LAUNCHER["why"]


def check_launcher() -> None:
    """The launcher's check of ``--data-decoder dali``: ConfigError (one line) naming the wheel to install."""
    why = launcher_why()
    if why is not None:
        raise ConfigError(f"data-decoder dali: {why}; {install_hint()}")


@dataclass
class _Dali:
    """The DALI modules dlscale uses, imported in the worker."""

    version: str
    pipeline: Any  # nvidia.dali.Pipeline
    fn: Any
    types: Any
    feed_ndarray: Any


def _import() -> _Dali:
    try:
        import nvidia.dali as dali  # optional: nvidia
        import nvidia.dali.fn as fn  # optional: nvidia
        import nvidia.dali.types as types  # optional: nvidia
        from nvidia.dali.plugin.pytorch import feed_ndarray  # optional: nvidia
    except ImportError as e:
        raise ConfigError(f"data-decoder dali: DALI does not import ({type(e).__name__}: {str(e)[:120]}); "
                          f"{install_hint()}") from None
    return _Dali(dali.__version__, dali.Pipeline, fn, types, feed_ndarray)


def _placeholder_jpeg() -> np.ndarray:
    """A small grey JPEG, fed where the pipeline gets no file of its own (its output is replaced)."""
    Image = images.pil()
    buf = io.BytesIO()
    Image.new("RGB", (_PLACEHOLDER, _PLACEHOLDER), (128, 128, 128)).save(buf, "JPEG", quality=90)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def _tasks() -> set[int]:
    """This process's thread ids (Linux; empty where /proc is missing)."""
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


@dataclass
class HostBatch:
    """One ``collate_bytes`` batch as fed to the pipeline, kept until its output is finished: the
    labels and meta go with it, the bytes serve the host decode, and the pipeline reads the arrays
    it was given without a copy (``no_copy``) until then."""

    flat: torch.Tensor
    lengths: list[int]
    files: list[np.ndarray]  # each file's bytes: views of ``flat``
    labels: torch.Tensor
    boxes: list[tuple[int, int, int, int]]  # left, top, w, h
    flips: list[bool]
    meta: dict[str, Any]
    host: list[int]  # rows the pipeline got a placeholder for (no JPEG marker): decoded by Pillow
    inputs: tuple = ()  # what the pipeline was fed: files, anchors, shapes, mirror flags


@dataclass
class DaliBatch:
    """A pipeline output (a DALI TensorList; None: DALI failed on the batch) and its host batch."""

    out: Any
    host: HostBatch
    error: str | None = None  # DALI's message where it failed


def host_batch(item: tuple, placeholder: np.ndarray) -> HostBatch:
    """A ``collate_bytes`` batch and the pipeline's inputs for it: the files (views of the batch's one
    buffer), crop anchors and shapes (x, y and w, h in pixels, DALI's WH order), mirror flags."""
    flat, lengths, labels, boxes, flips, meta = item
    raw = flat.numpy()
    lens = np.asarray(lengths, dtype=np.int64)
    starts = np.cumsum(lens) - lens
    files = [raw[s:s + n] for s, n in zip(starts.tolist(), lengths)]
    enc = list(files)
    box = np.asarray(boxes, dtype=np.float32).reshape(len(lengths), 4)  # left, top, w, h
    host = np.flatnonzero(~images.jpeg_mask(flat, lengths)).tolist()
    for i in host:
        enc[i] = placeholder
        box[i] = (0, 0, _PLACEHOLDER, _PLACEHOLDER)
    inputs = (enc, np.ascontiguousarray(box[:, :2]), np.ascontiguousarray(box[:, 2:]),
              np.asarray(flips, dtype=np.int32))
    return HostBatch(flat, list(lengths), files, labels, list(boxes), list(flips), meta, host, inputs)


class DaliDecoder:
    """``--data-decoder dali`` on ``device``: the pipeline's graph (``feed(it, batch)`` builds one over
    a DataLoader iterator) and ``finish``, which makes the training batch of each output."""

    kind = "dali"

    def __init__(self, device: torch.device, size: int, channels_last: bool, hw_decoder_load: float = HW_DECODER_LOAD,
                 depth: int = PREFETCH, threads: int = THREADS):
        self.dali = _import()
        self.device, self.size, self.channels_last = device, size, channels_last
        self.cuda = device.type == "cuda"
        self.hw_decoder_load, self.depth, self.threads = hw_decoder_load, depth, threads
        self.index = (device.index if device.index is not None else torch.cuda.current_device()) if self.cuda else None
        if self.cuda:
            how = f"decoders.image_slice mixed, hw_decoder_load {hw_decoder_load:g}"
            self.backend = f"hardware-and-cuda (hw_decoder_load {hw_decoder_load:g})"
        else:
            how, self.backend = "decoders.image_slice cpu", "cpu"
        where = f"cuda:{self.index}" if self.cuda else "cpu"
        self.name = (f"DALI {self.dali.version} on {where} ({how}, prefetch {depth}); "
                     f"crop: DALI resize + crop_mirror_normalize")
        self._held: collections.deque = collections.deque()

    def pipeline(self, source, batch: int):
        """The pipeline over ``source`` (a callable returning the next batch's inputs), unbuilt."""
        fn, types = self.dali.fn, self.dali.types
        pipe = self.dali.pipeline(batch_size=batch, num_threads=self.threads, device_id=self.index,
                                  prefetch_queue_depth=self.depth, exec_async=True, exec_pipelined=True,
                                  exec_dynamic=True)  # outputs bound to a stream need DALI's dynamic executor
        decode: dict[str, Any] = dict(device="cpu")
        if self.cuda:
            # affine=False: DALI's threads are not pinned to cores, which other ranks of the host use too
            decode = dict(device="mixed", hw_decoder_load=self.hw_decoder_load, affine=False)
        with pipe:
            enc, anchor, shape, mirror = fn.external_source(
                source=source, num_outputs=4, batch=True, no_copy=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32], ndim=[1, 1, 1, 0])
            # the crop box in pixels as stored (no EXIF rotation: the box came from the header as
            # stored, as on the other paths); RGB as torchvision's ImageReadMode.RGB
            img = fn.decoders.image_slice(enc, anchor, shape, axis_names="WH", normalized_anchor=False,
                                          normalized_shape=False, output_type=types.RGB,
                                          adjust_orientation=False, **decode)
            # float out: no rounding to uint8 between the resize and the normalisation, as the other path
            img = fn.resize(img, resize_x=self.size, resize_y=self.size, interp_type=types.INTERP_LINEAR,
                            antialias=False, dtype=types.FLOAT)
            out = fn.crop_mirror_normalize(img, mirror=mirror, mean=list(images._MEAN255), std=list(images._STD255),
                                           dtype=types.FLOAT, output_layout="HWC" if self.channels_last else "CHW")
            pipe.set_outputs(out)
        return pipe

    def feed(self, it: Iterator, batch: int) -> DaliFeed:
        """The pipeline built over the DataLoader iterator ``it`` (batches of ``batch`` samples)."""
        return DaliFeed(self, it, batch)

    def _release(self) -> None:
        """Drop held outputs whose copies the GPU has done; wait for the oldest past HOLD."""
        while self._held and (len(self._held) > HOLD or self._held[0][0].query()):
            self._held.popleft()[0].synchronize()

    def finish(self, item: DaliBatch) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, Any]]:
        """A pipeline output -> ((images, labels) on the device, meta): the output copied into a
        torch tensor (NCHW float32; channels_last memory where asked) on the current stream, rows
        DALI did not decode decoded by Pillow on the host."""
        hb, n, s = item.host, len(item.host.lengths), self.size
        x = torch.empty((n, s, s, 3) if self.channels_last else (n, 3, s, s), dtype=torch.float32, device=self.device)
        stream = torch.cuda.current_stream(self.device) if self.cuda else None
        dense = None
        if item.out is not None:
            dense = item.out.as_tensor()
            self.dali.feed_ndarray(dense, x, cuda_stream=stream)
        if stream is not None:
            # DALI's output buffer, and the host batch it read without a copy, are held until the GPU
            # has passed the copy (queued on this stream, which DALI's output was bound to)
            self._release()
            event = torch.cuda.Event()
            event.record(stream)
            self._held.append((event, item, dense))
        batch = x.permute(0, 3, 1, 2) if self.channels_last else x
        rows = list(range(n)) if item.out is None else hb.host
        fallbacks, bad = self._decode_on_host(batch, hb, rows) if rows else (0, 0)
        meta = dict(hb.meta, decode_fallbacks=fallbacks, bad=hb.meta["bad"] + bad)
        return (batch, hb.labels.to(self.device, non_blocking=True)), meta

    def _decode_on_host(self, batch: torch.Tensor, hb: HostBatch, rows: list[int]) -> tuple[int, int]:
        """``rows`` of ``batch`` decoded by Pillow (the CPU path's crop of the same box and flip),
        normalised; a file Pillow cannot read either takes another row's image. Returns (decoded,
        replaced)."""
        failed = []
        for i in rows:
            try:
                img = images._crop_resize_pil(images._pil_rgb(hb.files[i].tobytes()), hb.boxes[i], hb.flips[i],
                                              self.size)
            except images._BAD_IMAGE:
                failed.append(i)
                continue
            t = torch.from_numpy(img).to(self.device, non_blocking=False).permute(2, 0, 1).unsqueeze(0)
            batch[i].copy_(images._normalize_(t)[0])
        if failed:
            gone = set(failed)
            good = [i for i in range(len(hb.lengths)) if i not in gone]
            if not good:
                raise RuntimeError(f"no image of a batch of {len(hb.lengths)} could be decoded")
            for k, i in enumerate(failed):  # unreadable: another image of the batch, as GpuDecoder does
                batch[i].copy_(batch[good[k % len(good)]])
        return len(rows) - len(failed), len(failed)


def _first_line(err: BaseException) -> str:
    """The line of a DALI error that says what failed (its message repeats the pipeline's traceback)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    at = [i for i, ln in enumerate(lines) if ln.lower().endswith("encountered:")]
    if at and at[-1] + 1 < len(lines):
        return lines[at[-1] + 1][:200]
    return (lines[-1] if lines else type(err).__name__)[:200]


class DaliFeed:
    """The pipeline over a DataLoader iterator: an iterator of ``DaliBatch`` for ``DaliDecoder.finish``
    (the ``Feed`` of ``dlscale/inputs/source.py``). The pipeline pulls host batches through
    ``_next_host`` (DALI calls it in the thread that advances this iterator) ``depth`` ahead."""

    def __init__(self, dec: DaliDecoder, it: Iterator, batch: int):
        self.dec, self.it, self.depth = dec, it, dec.depth
        self.fifo: collections.deque[HostBatch] = collections.deque()
        self.placeholder = _placeholder_jpeg()
        self.failed_in_a_row = 0
        before = _tasks()
        self.pipe = dec.pipeline(self._next_host, batch)
        try:
            self.pipe.build()
        except RuntimeError as e:  # DALI's message puts what failed after its pipeline's traceback
            raise RuntimeError(f"DALI pipeline build failed: {_first_line(e)}") from e
        # DALI's host threads start at the build: counted as loader CPU
        self.thread_ids = sorted(_tasks() - before)

    def _next_host(self) -> tuple:
        """DALI's source: the DataLoader's next batch, queued for pairing with its output. The
        DataLoader's errors propagate (through ``schedule_run``) to the input thread."""
        hb = host_batch(next(self.it), self.placeholder)
        self.fifo.append(hb)
        return hb.inputs

    def __iter__(self) -> DaliFeed:
        return self

    def __next__(self) -> DaliBatch:
        if self.pipe is None:
            raise RuntimeError("the DALI pipeline is closed")
        # feeds the next host batch(es) and starts their decode; the loader's errors raise here
        self.pipe.schedule_run()
        stream = torch.cuda.current_stream(self.dec.device) if self.dec.cuda else None
        try:
            (out,) = self.pipe.outputs(stream)  # bound to the stream: no host wait for the GPU work
        except RuntimeError as e:  # DALI failed on the oldest batch in flight: it goes to the host decoder
            self.failed_in_a_row += 1
            if self.failed_in_a_row >= FAILED_IN_A_ROW:
                raise RuntimeError(f"DALI failed on {self.failed_in_a_row} batches in a row; last: "
                                   f"{_first_line(e)}") from e
            msg = _first_line(e)
            sys.stderr.write(f"dlscale: DALI failed on a batch, decoded on the host instead: {msg}\n")
            return DaliBatch(None, self.fifo.popleft(), msg)
        self.failed_in_a_row = 0
        return DaliBatch(out, self.fifo.popleft())

    def close(self) -> None:
        """Stop DALI's threads and free its buffers (the queued host batches go with them)."""
        pipe, self.pipe = self.pipe, None
        if pipe is not None:
            pipe._shutdown()  # DALI has no public close; its own exit hook calls this
        self.fifo.clear()
