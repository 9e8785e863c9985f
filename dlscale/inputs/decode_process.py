"""GPU decode in a process of its own beside each rank (``--data-decode-process``).

In the default mode the decode runs on a thread of the training process, and every one of its
calls (nvJPEG's, the crop's, the host's bookkeeping) takes the interpreter's lock and the CUDA
driver's locks that the training thread needs to launch its kernels: a compiled ResNet-50 step,
whose host launches barely keep ahead of the GPU, is late by what the input thread holds them
(docs/data.md). Here one spawned process per rank runs the DataLoader (its workers read the files)
and the ``GpuDecoder`` on the same GPU, and writes each finished batch into one of ``slots``
buffers it allocated and shared once (CUDA IPC; shared memory off CUDA). The training process
then only takes a slot number from a queue.

The hand-over, per slot: the decode process writes the slot, synchronises its stream and sends
(``"batch"``, slot, meta); the training process trains on it and, at its next fetch (every kernel
that reads the slot is queued by then, on the stream it fetched from), records the slot's
interprocess CUDA event on that stream and sends the slot back; the decode process makes its
stream wait for that event before it writes the slot again. Off CUDA the step has finished when
the next fetch comes, so the slot number alone frees it.

Faults: an exception in the decode process reaches the training process as a one-line error at its
next fetch; a decode process that dies is noticed within a second of a fetch waiting for it; the
decode process ends with its parent (``procs.die_with_parent``, and a parent check each time it
waits), and its DataLoader workers with it.

Under NVIDIA MPS both processes' kernels run at once, and the decode's (nvJPEG's colour conversion and
copies after the JPEG engines, the crop) take SMs the training would use; ``--data-decode-sm-share``
caps the decode process's share (MPS's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, in its environment only)
and ``--data-decode-priority low`` makes it an MPS client of below-normal priority
(``CUDA_MPS_CLIENT_PRIORITY=1``), whose waiting work the GPU schedules after the training's.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing
import os
import queue
from dataclasses import dataclass
from typing import Any, Callable

import torch

from dlscale.case import procs

PREFETCH_FACTOR = 2  # batches each DataLoader worker keeps ready (DataLoader's default)

SLOTS_AHEAD = 2  # batches finished ahead of the step, as the input thread's DEVICE_DEPTH
POLL_S = 0.5  # how often a waiting side looks at the other's liveness
START_TIMEOUT_S = 300.0  # first batch: the process imports torch, starts its workers, builds the decoder
MPS_SM_VAR = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"  # an MPS client's share of the SMs, in percent
MPS_PRIORITY_VAR = "CUDA_MPS_CLIENT_PRIORITY"  # an MPS client's priority: 0 normal, 1 below normal
MPS_PRIORITIES = {"normal": None, "low": "1"}  # --data-decode-priority -> MPS_PRIORITY_VAR (normal: unset)


@dataclass(frozen=True)
class DecoderSpec:
    """What the decode process builds its ``images.GpuDecoder`` from (it must pickle: the process is
    spawned). ``decode``: a module-level function of a list of file bytes, or None for
    ``--data-decoder``'s library."""

    size: int
    channels_last: bool
    decoder: str = "auto"
    decode: Callable | None = None
    name: str | None = None
    sm_share: float = 0.0  # --data-decode-sm-share: the SMs the process may use under MPS (0: no cap)
    priority: str = "normal"  # --data-decode-priority: its MPS client priority

    def mps_env(self) -> dict[str, str]:
        """The decode process's own MPS settings: read when it creates its CUDA context, so set first."""
        env = {MPS_SM_VAR: str(round(self.sm_share * 100))} if self.sm_share else {}
        if MPS_PRIORITIES[self.priority] is not None:
            env[MPS_PRIORITY_VAR] = MPS_PRIORITIES[self.priority]
        return env

    def build(self, device: torch.device):
        from dlscale.inputs.images import GpuDecoder  # triton: keeps start-up light

        return GpuDecoder(device, self.size, self.channels_last, decode=self.decode, name=self.name,
                          decoder=self.decoder)


@dataclass(frozen=True)
class LoaderPlan:
    """What a rank's DataLoader is made of (here, or in its decode process: it pickles)."""

    dataset: Any
    collate: Callable
    sampler: Any
    workers: int
    prefetch: int = PREFETCH_FACTOR  # batches each worker loads ahead


@dataclass(frozen=True)
class _Job:
    loader: LoaderPlan
    device: str
    spec: DecoderSpec
    slots: int
    events: tuple  # interprocess CUDA event handles, one per slot (empty off CUDA)
    parent: int


def _take_free(free, idle: collections.deque, parent: int) -> bool:
    """Add the slots the training process handed back so far to ``idle``, waiting for one only when
    none is idle; False when told to stop (None) or orphaned."""
    while True:
        try:
            s = free.get(timeout=POLL_S) if not idle else free.get_nowait()
        except queue.Empty:
            if idle:
                return True
            if os.getppid() != parent:
                return False
            continue
        if s is None:
            return False
        idle.append(s)


def data_loader(plan: LoaderPlan, cuda: bool):
    """The DataLoader of a rank's source (here, or in its decode process): the plan's workers,
    pinned memory on CUDA, its prefetch batches each, persistent workers. The workers are forked:
    the decode process is spawned, and a spawned process would spawn them too, each a fresh
    interpreter importing torch again (they read and decode on the host and never touch CUDA)."""
    w = plan.workers
    fork = w > 0 and "fork" in multiprocessing.get_all_start_methods()
    return torch.utils.data.DataLoader(plan.dataset, batch_sampler=plan.sampler, num_workers=w,
                                       collate_fn=plan.collate, pin_memory=cuda,
                                       prefetch_factor=plan.prefetch if w else None, persistent_workers=w > 0,
                                       multiprocessing_context="fork" if fork else None)


def _serve(job: _Job, ready, free) -> None:
    """The decode process: DataLoader -> GpuDecoder -> slots, until told to stop or orphaned."""
    procs.die_with_parent()
    os.environ.update(job.spec.mps_env())  # before any CUDA call of this process
    it = None
    try:
        device = torch.device(job.device)
        cuda = device.type == "cuda"
        if cuda:  # first: the DataLoader's pin-memory thread takes the current device
            torch.cuda.set_device(device)
        it = iter(data_loader(job.loader, cuda))  # the workers fork here
        stream, events = None, []
        if cuda:
            stream = torch.cuda.Stream(device)
            events = [torch.cuda.Event.from_ipc_handle(device, h) for h in job.events]
        gpu = job.spec.build(device)
        pids = [w.pid for w in getattr(it, "_workers", []) or []]
        ready.put(("info", {"name": gpu.name, "kind": gpu.kind, "backend": gpu.backend, "crop": gpu.crop_path,
                            "pid": os.getpid(), "worker_pids": pids,
                            "mps_sm_percent": os.environ.get(MPS_SM_VAR),
                            "mps_priority": os.environ.get(MPS_PRIORITY_VAR)}))
        slots: list[tuple[torch.Tensor, torch.Tensor]] = []
        idle = collections.deque(range(job.slots))
        while _take_free(free, idle, job.parent):
            slot = idle.popleft()
            item = next(it)
            with torch.cuda.stream(stream) if cuda else contextlib.nullcontext():
                (x, y), meta = gpu(item)
                if not slots:  # the buffers, shaped by the first batch, shared once
                    slots = [(torch.empty_like(x).share_memory_(), torch.empty_like(y).share_memory_())
                             for _ in range(job.slots)]  # share_memory_: in place now, not in the queue's thread
                    ready.put(("slots", slots))
                if cuda:
                    stream.wait_event(events[slot])  # the steps that read this slot are done
                slots[slot][0].copy_(x)
                slots[slot][1].copy_(y)
            if cuda:
                stream.synchronize()
            ready.put(("batch", slot, meta))
    except BaseException as e:  # noqa: BLE001 - handed to the training process, raised there
        with contextlib.suppress(Exception):
            ready.put(("error", f"{type(e).__name__}: {e}"))
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()


class DecodeProcess:
    """The training side: starts the decode process and hands its batches to the step (``get``,
    ``release``; the same ``(tensors, meta)`` as the input thread's ``Prefetcher.get``)."""

    def __init__(self, plan: LoaderPlan, device: torch.device, spec: DecoderSpec, accum: int = 1):
        self.device = device
        self.cuda = device.type == "cuda"
        self.depth = SLOTS_AHEAD * accum
        n = self.depth + accum  # ahead + in use
        self.events = ([torch.cuda.Event(interprocess=True, blocking=False) for _ in range(n)]
                       if self.cuda else [])
        ctx = torch.multiprocessing.get_context("spawn")  # CUDA cannot be used in a forked child
        self.ready, self.free = ctx.Queue(), ctx.Queue()
        job = _Job(plan, str(device), spec, n, tuple(e.ipc_handle() for e in self.events), os.getpid())
        self.slots: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.held: list[int] = []  # slots handed to the step since the last release
        self.closed = False
        # not a daemon: a daemon may not start the DataLoader's workers; closed before the interpreter's
        # exit joins it (atexit runs last-registered first, multiprocessing's own join after this)
        self.proc = ctx.Process(target=_serve, args=(job, self.ready, self.free), name="dlscale-decode")
        self.proc.start()
        atexit.register(self.close)
        try:
            self.info: dict[str, Any] = self._take("info", START_TIMEOUT_S)[1]
        except BaseException:
            self.close()
            raise

    def _take(self, kind: str, timeout: float):
        waited = 0.0
        while True:
            try:
                msg = self.ready.get(timeout=POLL_S)
                break
            except queue.Empty:
                waited += POLL_S
                if not self.proc.is_alive():
                    raise RuntimeError(f"the decode process ended (exit code {self.proc.exitcode}) without "
                                       f"a batch") from None
                if waited >= timeout:
                    raise RuntimeError(f"the decode process sent nothing for {timeout:.0f} s") from None
        if msg[0] == "error":
            raise RuntimeError(f"decode process: {msg[1]}")
        if msg[0] != kind:
            raise RuntimeError(f"decode process: expected {kind!r}, got {msg[0]!r}")
        return msg

    def get(self):
        """The next finished batch (its slot's tensors, which stay valid until the next ``release``)."""
        msg = self._take("slots", START_TIMEOUT_S) if not self.slots else None
        if msg is not None:
            self.slots = msg[1]
        _, slot, meta = self._take("batch", START_TIMEOUT_S)
        self.held.append(slot)
        return self.slots[slot], meta

    def release(self) -> None:
        """Hand back the slots fetched since the last call: called at the next fetch, when every
        kernel that reads them has been queued on the current stream."""
        if self.cuda:
            cur = torch.cuda.current_stream(self.device)
            for s in self.held:
                self.events[s].record(cur)
        for s in self.held:
            self.free.put(s)
        self.held = []

    def processes(self) -> list:
        """psutil Processes of the loader: the decode process and its DataLoader workers."""
        try:
            import psutil  # optional: psutil
        except ImportError:
            return []
        out = []
        for pid in [self.info.get("pid"), *self.info.get("worker_pids", [])]:
            with contextlib.suppress(Exception):
                out.append(psutil.Process(pid))
        return out

    def close(self) -> None:
        atexit.unregister(self.close)
        if self.closed:
            return
        self.closed = True
        self.slots = []  # let go of the shared buffers before their owner ends
        with contextlib.suppress(Exception):
            self.free.put(None)
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(timeout=5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        for q in (self.ready, self.free):
            q.close()
            q.cancel_join_thread()

