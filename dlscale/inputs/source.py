"""A batch source per rank: what the worker's training step reads its micro-batches from.

``SyntheticSource`` holds the pre-made batches and does nothing per step (the worker does not even
call it inside the window). ``LoaderSource`` reads real data through ``torch.utils.data.DataLoader``
(worker processes, pinned memory, prefetch, persistent workers) and, on a GPU, finishes every batch
on the device one step ahead in a background thread on its own CUDA stream: the copy from pinned
memory (non-blocking), normalisation, or the whole decode (``--data-decode gpu``; nvImageCodec's
hardware decode too: it is given that stream, and the event recorded after ``finish`` covers its
output). With ``--data-decoder dali`` a ``Feed`` sits between the DataLoader and ``finish``: DALI's
pipeline, which pulls the host batches itself and keeps several in flight in its own threads; the
thread copies its outputs on the same stream (``dlscale/inputs/dali.py``). ``next()``
refills ``batches`` in place (the list the step closes over) and returns it.

The worker times ``next()`` with the host clock: that is the wait for data at the loader boundary.
With the loader keeping up it is a queue hand-over (microseconds); when it does not, the wait is
the time the training loop had nothing to train on. Its sum over the window divided by the window
is the data-wait share; at ``INPUT_BOUND_SHARE`` or more the case is input-bound (the step would be
that much shorter with free data, past the run-to-run noise of a few per cent).
"""
from __future__ import annotations

import contextlib
import functools
import os
import queue
import statistics
import sys
import threading
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import psutil
import torch
import torch.distributed as dist

from dlscale import ConfigError
from dlscale.inputs import dali, dataset_info, images, tokens
from dlscale.inputs.decode_process import (
    PREFETCH_FACTOR, DecodeProcess, DecoderSpec, LoaderPlan, data_loader,
)
from dlscale.inputs.sampler import GlobalBatchSampler
from dlscale.inputs.spec import (
    BUFFER_MARGIN, INPUT_BOUND_SHARE, DataSpec, check_split, input_verdict, parse_data,
)

if TYPE_CHECKING:
    from dlscale.case.config import DataSection

DEVICE_DEPTH = 2  # batches finished on the device ahead of the step
# The interpreter's switch interval while the input thread runs (CPython's default is 5 ms). The
# training thread gives the GIL up around every kernel launch; when it wants it back while the
# input thread runs Python, it waits up to this long (a profiled compiled ResNet-50 step showed a
# 5 ms hole in its launches: docs/data.md). 0.5 ms bounds that wait at ~1 % of such a step.
GIL_SWITCH_S = 5e-4


class SyntheticSource:
    """The pre-made batches; nothing happens per step."""

    static = True

    def __init__(self, batches: list[tuple]):
        self.batches = batches

    def next(self) -> list[tuple]:
        return self.batches

    def window_start(self) -> None:
        pass

    def window_end(self) -> None:
        pass

    def summary(self, waits_s: list[float], window_s: float, step_ms: list[float] | None = None,
                gpu_idle_ms: list[float] | None = None) -> None:
        return None

    def close(self) -> None:
        pass


class Prefetcher:
    """A thread that takes host batches from ``it``, finishes them (``finish(item) -> (tensors,
    meta)``) on its own CUDA stream and queues them ``depth`` deep; ``get()`` hands one to the
    training stream (event wait + ``record_stream``, so the allocator keeps the memory until the
    step used it). ``it`` is advanced on that stream too (a DALI ``Feed`` binds its outputs to the
    current stream). On the CPU there is no stream; the thread still runs ahead."""

    def __init__(self, it, finish: Callable, device: torch.device, depth: int = DEVICE_DEPTH):
        self.it, self.finish, self.device = it, finish, device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.native_id: int | None = None
        self.switch_s = sys.getswitchinterval()
        sys.setswitchinterval(min(self.switch_s, GIL_SWITCH_S))
        self.thread = threading.Thread(target=self._run, name="dlscale-input", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.native_id = threading.get_native_id()
        try:
            if self.cuda:
                torch.cuda.set_device(self.device)
            while not self.stop.is_set():
                with torch.cuda.stream(self.stream) if self.cuda else contextlib.nullcontext():
                    item = next(self.it)
                    out, meta = self.finish(item)
                    event = None
                    if self.cuda:
                        event = torch.cuda.Event()
                        event.record(self.stream)
                self._put((out, meta, event, None))
        except BaseException as e:  # noqa: BLE001 - handed to the training thread, raised there
            self._put((None, None, None, e))

    def _put(self, entry) -> None:
        while not self.stop.is_set():
            try:
                self.q.put(entry, timeout=0.1)
                return
            except queue.Full:
                continue

    def get(self):
        while True:
            try:
                out, meta, event, err = self.q.get(timeout=1.0)
                break
            except queue.Empty:
                if not self.thread.is_alive():
                    raise RuntimeError("the input thread ended without a batch") from None
        if err is not None:
            raise err
        if self.cuda:
            cur = torch.cuda.current_stream(self.device)
            cur.wait_event(event)
            for t in out:
                t.record_stream(cur)
        return out, meta

    def close(self) -> None:
        self.stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self.q.get_nowait()
        self.thread.join(timeout=10)
        sys.setswitchinterval(self.switch_s)


def _cpu_finish(item):
    *tensors, meta = item
    return tuple(tensors), meta


@dataclass
class LoaderInfo:
    """How a rank reads its data (recorded)."""

    kind: str
    data_kind: str
    workers: int
    decode: str  # cpu | gpu
    decoder: str
    finish_on: str  # where batches are normalised / moved: "worker", "device thread"
    pin_memory: bool
    prefetch_factor: int | None
    persistent_workers: bool
    local_batch: int
    global_batch: int
    n_samples: int
    micro_batches_per_epoch: int
    # GPU decode: the library that decoded (torchvision | nvimgcodec | dali; --data-decoder auto
    # resolved) and its backend (hardware: the GPU's JPEG engines; cuda: nvJPEG's CUDA kernels on the
    # SMs; hardware-or-cuda: torchvision's nvJPEG, which takes the engines where there are some;
    # hardware-and-cuda (hw_decoder_load F): DALI's split, share F of the JPEGs on the engines)
    gpu_decoder: str | None = None
    decoder_backend: str | None = None


class Feed(Protocol):
    """What sits between the DataLoader's iterator and ``finish`` (DALI's pipeline): an iterator of
    items for ``finish`` that holds ``depth`` batches ahead, with host threads of its own
    (``thread_ids``, counted as loader CPU), closed with the source."""

    depth: int
    thread_ids: list[int]

    def __next__(self) -> Any: ...

    def close(self) -> None: ...


@dataclass
class Delivery:
    """How a loader's items become the step's batches: ``finish`` (host batch -> device tensors,
    meta) on the input thread (``threaded``) or inline, after a ``stage`` (DALI's feed), or taken
    finished from a decode process (``remote``)."""

    finish: Callable | None
    threaded: bool = False
    stage: Callable[[Iterator, int], Feed] | None = None
    remote: DecodeProcess | None = None


@dataclass
class _Snapshot:
    metas: int
    cpu_s: float | None
    storage_read: int | None


class LoaderSource:
    """Real data through a DataLoader; see the module doc."""

    static = False

    def __init__(self, loader, delivery: Delivery, device: torch.device, accum: int, info: LoaderInfo,
                 page_cache: dict[str, Any]):
        finish, threaded, stage, remote = delivery.finish, delivery.threaded, delivery.stage, delivery.remote
        self.info, self.accum, self.page_cache = info, accum, page_cache
        self.loader = loader
        self.remote = remote  # --data-decode-process: the loader and the decode run there
        self.it = iter(loader) if loader is not None else None
        self.feed: Feed | None = None
        if stage is not None:
            # after iter(): the DataLoader's workers are forked before the stage starts threads of its own
            try:
                self.feed = stage(self.it, info.local_batch)
            except BaseException:
                self._shutdown_workers()
                raise
        feed = self.feed if self.feed is not None else self.it
        self.prefetcher = Prefetcher(feed, finish, device) if threaded and remote is None else None
        if remote is not None:
            self._get = remote.get
        else:
            self._get = self.prefetcher.get if threaded else (lambda: finish(next(feed)))
        self.batches: list[tuple] = []
        self._metas: list[dict] = []
        self._w0: _Snapshot | None = None
        self._w1: _Snapshot | None = None
        self._procs = self._loader_processes()

    def next(self) -> list[tuple]:
        if self.remote is not None:  # the previous step's batches: every kernel reading them is queued
            self.remote.release()
        out = []
        for _ in range(self.accum):
            batch, meta = self._get()
            self._metas.append(meta)
            out.append(batch)
        self.batches[:] = out
        return self.batches

    # -- accounting (outside the window) ----------------------------------------------------

    def _loader_processes(self):
        try:
            import psutil  # optional: psutil
        except ImportError:
            return None
        if self.remote is not None:
            return self.remote.processes()
        procs = []
        for w in getattr(self.it, "_workers", []) or []:
            with contextlib.suppress(Exception):
                procs.append(psutil.Process(w.pid))
        return procs

    def _thread_ids(self) -> list[int]:
        ids = []
        if self.prefetcher is not None and self.prefetcher.native_id:
            ids.append(self.prefetcher.native_id)
        pin = getattr(self.it, "_pin_memory_thread", None)
        if pin is not None and getattr(pin, "native_id", None):
            ids.append(pin.native_id)
        if self.feed is not None:
            ids.extend(self.feed.thread_ids)
        return ids

    def _snapshot(self) -> _Snapshot:
        """CPU seconds of the loader (worker processes + the input and pin-memory threads) and the
        bytes its workers read from storage (/proc/PID/io read_bytes: page-cache hits excluded)."""
        if self._procs is None:  # no psutil
            return _Snapshot(len(self._metas), None, None)

        cpu: float | None = 0.0
        storage: int | None = 0 if self._procs else None
        for p in self._procs:
            try:
                t = p.cpu_times()
                cpu = None if cpu is None else cpu + t.user + t.system
            except (psutil.Error, OSError):
                cpu = None
            try:
                storage = None if storage is None else storage + p.io_counters().read_bytes
            except (psutil.Error, OSError, AttributeError):
                storage = None
        ids = set(self._thread_ids())
        if cpu is not None and ids:
            try:
                cpu += sum(th.user_time + th.system_time for th in psutil.Process().threads() if th.id in ids)
            except (psutil.Error, OSError):
                cpu = None
        if not self._procs and self.prefetcher is None:
            cpu = None  # loading runs in the training thread itself: not separable
        return _Snapshot(len(self._metas), cpu, storage)

    def window_start(self) -> None:
        self._w0 = self._snapshot()

    def window_end(self) -> None:
        self._w1 = self._snapshot()

    def _buffer_batches(self) -> int:
        """Batches ready ahead when the window starts: the workers' prefetch, the device thread's,
        DALI's or the decode process's."""
        return (self.info.workers * (self.info.prefetch_factor or 0)
                + (DEVICE_DEPTH if self.prefetcher is not None else 0)
                + (self.feed.depth if self.feed is not None else 0)
                + (self.remote.depth if self.remote is not None else 0))

    def summary(self, waits_s: list[float], window_s: float, step_ms: list[float] | None = None,
                gpu_idle_ms: list[float] | None = None) -> dict[str, Any]:
        """The rank's data record for the window (``waits_s``: the per-step waits the worker timed;
        ``step_ms``: the step times, for the share of the window's second half, when the prefetch
        buffer filled during warm-up has been used up; ``gpu_idle_ms``: on a GPU, the time each step's
        device idled before its batch was there). The verdict reads the GPU's idle share where there is
        one: a host that runs ahead of the GPU waits for data while the GPU still works through queued
        steps, and that wait costs no throughput."""
        w0, w1 = self._w0, self._w1
        metas = self._metas[w0.metas:w1.metas] if w0 and w1 else []
        total = sum(waits_s)
        share = total / window_s if window_s > 0 else None
        samples = len(metas) * self.info.local_batch
        nbytes = sum(m["bytes"] for m in metas)
        cpu_s = (w1.cpu_s - w0.cpu_s) if w0 and w1 and w0.cpu_s is not None and w1.cpu_s is not None else None
        storage = (w1.storage_read - w0.storage_read) if (w0 and w1 and w0.storage_read is not None
                                                          and w1.storage_read is not None) else None
        bad = sum(m["bad"] for m in self._metas)
        per_epoch = self.info.micro_batches_per_epoch
        start_m = (w0.metas // self.accum) * self.accum if w0 else 0
        ms = [w * 1e3 for w in waits_s]
        buffer = self._buffer_batches()
        h = len(waits_s) // 2
        late = sum(step_ms[h:]) if step_ms and len(step_ms) == len(waits_s) else 0.0
        idle_share = (sum(gpu_idle_ms) / (window_s * 1e3) if gpu_idle_ms is not None and window_s > 0 else None)
        bound, basis = input_verdict(idle_share, share)
        return {
            "data_wait_ms": [round(x, 4) for x in ms],
            "data_wait_ms_total": total * 1e3,
            "data_wait_share": share,
            "data_wait_share_last_half": sum(waits_s[h:]) * 1e3 / late if late > 0 else None,
            "data_wait_ms_p50": statistics.median(ms) if ms else None,
            "data_wait_ms_max": max(ms) if ms else None,
            "data_gpu_idle_ms": None if gpu_idle_ms is None else [round(x, 4) for x in gpu_idle_ms],
            "data_gpu_idle_share": idle_share,
            "input_bound": bound,
            "input_bound_basis": basis,
            "input_bound_threshold": INPUT_BOUND_SHARE,
            "samples": samples,
            "samples_per_s": samples / window_s if window_s > 0 else None,
            "bytes_read": nbytes,
            "read_mb_s": nbytes / window_s / 1e6 if window_s > 0 else None,
            "loader_cpu_s": cpu_s,
            "loader_cpu_cores": cpu_s / window_s if cpu_s is not None and window_s > 0 else None,
            "samples_per_loader_core_s": samples / cpu_s if cpu_s else None,
            "storage_read_bytes": storage,
            "storage_read_mb_s": storage / window_s / 1e6 if storage is not None and window_s > 0 else None,
            "bad_files": bad,
            "bad_names": [n for m in self._metas for n in m["bad_names"]][:images.BAD_NAMES_KEPT],
            "decode_fallbacks": sum(m.get("decode_fallbacks", 0) for m in self._metas),
            "epoch_at_window_start": start_m / per_epoch,
            "epoch_at_window_end": (start_m + len(metas)) / per_epoch,
            "window_batches": len(metas),
            "prefetch_buffer_batches": buffer,
            "wait_may_be_understated": len(metas) < BUFFER_MARGIN * buffer,
            "loader": asdict(self.info),
            "page_cache": self.page_cache,
        }

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.feed is not None:  # after the input thread, which may be waiting on it
            self.feed.close()
        if self.remote is not None:
            self.remote.close()
        self._shutdown_workers()
        self.it = None

    def _shutdown_workers(self) -> None:
        shutdown = getattr(self.it, "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()


# ---------------------------------------------------------------------------------------------

def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def resolve_workers(requested: int | None, kind: str, decode: str, local_world: int, cpu_share: float = 0.0) -> int:
    """DataLoader workers of one rank. Auto: CPU decode takes every core of the rank's share of the
    host but one (left to the training process); GPU decode only reads files (up to 4); with part
    of it decoded on the host (--data-cpu-share) half the rank's cores, since the GPU decode's input
    thread and the training's launches need host time beside them (ResNet-50 compiled on one H200,
    16 cores, share 0.25: 15 workers ran 0.93 of GPU-only decode, 8 workers 1.01, 4 left the step
    waiting for data 54 % of the time; docs/data.md); token batches are cheap (1, or 2 with
    4+ cores per rank)."""
    if requested is not None:
        return requested
    per_rank = max(1, _cpus() // max(1, local_world))
    if kind == "tokens":
        return 2 if per_rank >= 4 else 1
    if decode == "gpu":
        return max(1, per_rank // 2) if cpu_share else max(1, min(4, per_rank - 1))
    return max(1, per_rank - 1)


def _barrier(device: torch.device) -> None:
    if dist.is_available() and dist.is_initialized():
        if device.type == "cuda":
            dist.barrier(device_ids=[device.index if device.index is not None else torch.cuda.current_device()])
        else:
            dist.barrier()


def _page_cache(paths: list[str], cold: bool, local_rank: int) -> dict[str, Any]:
    """Cold read (local rank 0 of each node evicts the files) and the resident share after it."""
    out: dict[str, Any] = {"cold_read": cold}
    if local_rank != 0:
        return out
    sample = dataset_info.sample_paths(paths)
    if cold:
        out["resident_share_before_cold_read"] = dataset_info.resident_share(sample)
        out["files_dropped"] = dataset_info.drop_from_cache(paths)
    out["resident_share_at_start"] = dataset_info.resident_share(sample)
    out["resident_sample_files"] = len(sample)
    return out


@dataclass
class Reader:
    """How samples of one data set become batches for one model."""

    dataset: Any
    collate: Callable
    finish: Callable | None  # host batch -> (tensors on the device, meta)
    decoder: str
    finish_on: str
    paths: list[str]  # the files (page cache)
    data_kind: str
    gpu_decoder: str | None = None  # GPU decode: torchvision | nvimgcodec | dali
    decoder_backend: str | None = None  # GPU decode: hardware | cuda | hardware-or-cuda | hardware-and-cuda (...)
    # between the DataLoader's iterator and finish, given it and the local batch (DALI's pipeline)
    stage: Callable[[Iterator, int], Feed] | None = None
    # --data-decode-process: what the decode process builds (``finish`` is None, ``decoder`` the
    # words after the decoder's name)
    process: DecoderSpec | None = None


def _split_collate(size: int, cpu_images: int, batch: int) -> tuple[Callable, str]:
    """GPU decode's collate, and the record's words for the share of each batch decoded on the host."""
    if not cpu_images:
        return images.collate_bytes, ""
    return (functools.partial(images.collate_split, cpu_images=cpu_images, size=size),
            f"; {cpu_images} of {batch} images a batch decoded on the host by {images.decoder_name()}")


def gpu_reader(ds, gpu, paths: list[str], kind: str, cpu_images: int = 0, batch: int = 0) -> Reader:
    """The Reader of GPU decode: file bytes batched by the workers, decoded and cropped by ``gpu``
    (an ``images.GpuDecoder``) on the input thread, but for ``cpu_images`` of each batch of ``batch``
    that the workers decode themselves (``images.collate_split``); the record names the decoder,
    the crop's path and the split."""
    collate, split = _split_collate(gpu.size, cpu_images, batch)
    return Reader(ds, collate, gpu, f"{gpu.name}; crop: {gpu.crop_path}{split}", "device thread", paths, kind,
                  gpu.kind, gpu.backend)


def process_reader(ds, spec: DecoderSpec, paths: list[str], kind: str, cpu_images: int = 0,
                   batch: int = 0) -> Reader:
    """The Reader of ``--data-decode-process``: ``gpu_reader``'s, with the DataLoader and the
    decoder built in the decode process (``spec``); the decoder's name, library and backend come
    from there when it starts (``start_source``)."""
    collate, split = _split_collate(spec.size, cpu_images, batch)
    return Reader(ds, collate, None, split, "decode process", paths, kind, process=spec)


def dali_reader(ds, size: int, channels_last: bool, device: torch.device, paths: list[str], kind: str) -> Reader:
    """The Reader of ``--data-decoder dali``: ``collate_bytes`` batches from the workers, decoded,
    cropped and normalised by DALI's pipeline (the stage), copied to torch on the input thread."""
    dec = dali.DaliDecoder(device, size, channels_last)
    return Reader(ds, images.collate_bytes, dec.finish, dec.name, "DALI pipeline", paths, kind, dec.kind,
                  dec.backend, stage=dec.feed)


def make_reader(model, device: torch.device, data: DataSection, seed: int = 0, batch: int = 0) -> Reader:
    """Dataset, collate and finish of the data section's ``--data`` for ``model`` (a ModelSpec) on
    ``device``; ``batch``: the samples of one loader batch (of which --data-cpu-share are decoded on
    the host), ``seed`` the case's."""
    spec = parse_data(data.data)
    decode, decoder, cpu_share = data.data_decode, data.data_decoder, data.data_cpu_share
    kind = model.data_kind
    if kind is None:
        raise ConfigError(f"model {model.name} has no real-data reader; use --data synthetic")
    cuda = device.type == "cuda"
    if spec.kind == "imagefolder":
        listing = dataset_info.list_imagefolder(spec.path)
        paths = [os.path.join(listing.root, f) for f in listing.files]
        size = int(model.arch.image_size)
        channels_last = bool(model.channels_last) and cuda
        if decode == "gpu":
            ds = images.ImageBytesData(listing.root, listing.files, listing.labels, size, seed)
            if decoder == "dali":
                check_split(decoder, cpu_share)  # check_fields's, for callers that did not go through it
                return dali_reader(ds, size, channels_last, device, paths, kind)
            if data.data_decode_process:
                process = DecoderSpec(size, channels_last, decoder, sm_share=data.data_decode_sm_share,
                                      priority=data.data_decode_priority)
                return process_reader(ds, process, paths, kind, round(cpu_share * batch), batch)
            return gpu_reader(ds, images.GpuDecoder(device, size, channels_last, decoder=decoder), paths, kind,
                              round(cpu_share * batch), batch)
        ds = images.ImageFolderData(listing.root, listing.files, listing.labels, size, seed)
        if not cuda:
            return Reader(ds, images.collate_normalized, _cpu_finish, images.decoder_name(), "worker", paths, kind)

        def finish(item):
            return images.finish_on_device(item, device, channels_last)

        return Reader(ds, images.collate_uint8, finish, images.decoder_name(), "device thread", paths, kind)
    vocab, seq = int(model.arch.vocab), int(model.seq_len)
    if kind == "mlm-nsp":
        ds = tokens.BertPairs(spec.path, spec.dtype, seq, vocab, seed, float(model.extra["mlm_prob"]))
    else:
        ds = tokens.TokenWindows(spec.path, spec.dtype, seq, vocab, seed)
    if not cuda:
        return Reader(ds, tokens.collate_batch, _cpu_finish, f"numpy.memmap {spec.dtype}", "worker", [spec.path], kind)

    def finish_tokens(item):
        return tokens.finish_on_device(item, device)

    return Reader(ds, tokens.collate_batch, finish_tokens, f"numpy.memmap {spec.dtype}", "device thread",
                  [spec.path], kind)


def start_source(reader: Reader, sampler: GlobalBatchSampler, data: DataSection, device: torch.device,
                 workers: int, accum: int = 1, page_cache: dict[str, Any] | None = None) -> LoaderSource:
    """A DataLoader over ``reader`` with ``workers`` processes, pinned memory on CUDA, prefetch and
    persistent workers; returned holding its first batch (``accum`` micro-batches a step)."""
    cuda = device.type == "cuda"
    spec, decode, page_cache = parse_data(data.data), data.data_decode, page_cache or {}
    plan = LoaderPlan(reader.dataset, reader.collate, sampler, workers, data.data_prefetch or PREFETCH_FACTOR)
    name, gpu_decoder, backend = reader.decoder, reader.gpu_decoder, reader.decoder_backend
    loader = remote = None
    if reader.process is not None:  # the DataLoader lives in the decode process
        remote = DecodeProcess(plan, device, reader.process, accum)
        got = remote.info
        sms = f"; MPS SMs {got['mps_sm_percent']} %" if got.get("mps_sm_percent") else ""
        sms += f"; MPS client priority {got['mps_priority']}" if got.get("mps_priority") else ""
        name = f"{got['name']}; crop: {got['crop']}{reader.decoder}{sms}"
        gpu_decoder, backend = got["kind"], got["backend"]
    else:
        loader = data_loader(plan, cuda)
    info = LoaderInfo(spec.kind, reader.data_kind, workers, decode, name, reader.finish_on, cuda,
                      plan.prefetch if workers else None,
                      workers > 0, sampler.b, sampler.g, sampler.n, sampler.per_epoch, gpu_decoder, backend)
    try:
        src = LoaderSource(loader, Delivery(reader.finish, cuda, reader.stage, remote), device, accum, info, page_cache)
    except BaseException:
        if remote is not None:
            remote.close()
        raise
    try:
        src.next()
    except BaseException:
        src.close()
        raise
    return src


def open_source(model, cfg, par, denv, make_synthetic: Callable[[], list[tuple]]):
    """The rank's batch source (``denv``: its DistEnv): ``make_synthetic()`` for --data synthetic,
    else a LoaderSource already holding its first batch (the DataLoader workers are up before the
    warm-up). The data knobs come from ``cfg``'s data section only."""
    spec: DataSpec = parse_data(cfg.data)
    if spec.synthetic:
        return SyntheticSource(make_synthetic())
    device = denv.device
    b = cfg.batch_size * par.devices_per_process
    g = cfg.batch_size * par.dp_size
    reader = make_reader(model, device, cfg, cfg.seed, b)
    sampler = GlobalBatchSampler(len(reader.dataset), g, par.dp_rank * b, b, cfg.seed,
                                 what=f"{spec.kind} {spec.path}")
    page = _page_cache(reader.paths, cfg.data_cold_read, denv.local_rank)
    _barrier(device)  # every rank starts reading after its node's cache was dropped
    workers = resolve_workers(cfg.data_workers, spec.kind, cfg.data_decode, denv.local_world_size, cfg.data_cpu_share)
    return start_source(reader, sampler, cfg, device, workers, cfg.grad_accum, page)
