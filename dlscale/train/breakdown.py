"""Where the step time goes: data, forward, backward, optimizer, exposed communication.

Measured after the timed window (never inside it), on the same model, batches and optimizer:

1. ``k`` (``STEPS``) steps with device events between the phases (CUDA events on the stream, read after one
   synchronisation at the end of the ``k`` steps, so the host runs ahead of the GPU as it does in the
   window and its launch time is not counted where the window hides it; host clocks on the CPU, where
   every op is synchronous): data (taking the next micro-batch: with real data
   the wait at the loader boundary, as in the window), forward,
   backward (for DDP this includes waiting for the gradient all-reduce that did not overlap),
   optimizer (clip + step + zero_grad);
2. ``k`` steps the same way inside ``no_sync()`` (gradient communication disabled): the backward
   of pure computation;
3. the gradient all-reduce alone: ``k`` all-reduces of one flat buffer of the gradients' size and
   dtype on the data-parallel group.

exposed communication = median backward (1) - median backward (2), at least 0;
(until ``host_ahead`` was recorded, every step began from an idle, synchronised GPU, which put the
host's launch time into the phases: validity's ``breakdown_gap`` shows how far such a sum is from the
window's step);
overlap ratio = 1 - exposed / all-reduce time (2) (the share of communication hidden behind
backward computation), clipped to [0, 1]; step = data + forward + backward + optimizer.
The optimizer steps of phase 2 do update the weights; nothing after this is timed.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from dlscale.train import precision
from dlscale.train.compiling import step_marker
from dlscale.train.step import optimizer_step

STEPS = 10  # timed steps per phase measurement (each with and, distributed, without gradient sync)


class _PhaseTimer:
    """Marks phase boundaries; reads them later, after a single synchronisation."""

    def __init__(self, device: torch.device, n_marks: int):
        self.cuda = device.type == "cuda"
        self.device = device
        self.events = [torch.cuda.Event(enable_timing=True) for _ in range(n_marks)] if self.cuda else None
        self.host = [0.0] * n_marks

    def mark(self, i: int) -> None:
        if self.cuda:
            self.events[i].record()
        else:
            self.host[i] = time.perf_counter()

    def intervals_ms(self, synchronise: bool = True) -> list[float]:
        """Milliseconds between consecutive marks; ``synchronise=False`` when the caller already waited."""
        if self.cuda:
            if synchronise:
                torch.cuda.synchronize(self.device)
            return [self.events[i].elapsed_time(self.events[i + 1]) for i in range(len(self.events) - 1)]
        return [(self.host[i + 1] - self.host[i]) * 1e3 for i in range(len(self.host) - 1)]


@dataclass(frozen=True)
class StepParts:
    """What a breakdown step runs: the strategy's parallel model, the case, the pre-made batches and
    the autocast context; ``fetch`` takes the next micro-batches from the loader (real data)."""
    par: Any
    cfg: Any
    device: torch.device
    batches: list[tuple]
    autocast: Callable
    fetch: Callable[[], list] | None = None


def _phased_steps(parts: StepParts, k: int, sync_off: bool) -> list[list[float]]:
    par, cfg, device, batches, autocast, fetch = (parts.par, parts.cfg, parts.device, parts.batches,
                                                  parts.autocast, parts.fetch)
    mark_step = step_marker(cfg)
    module, opt = par.module, par.optimizer
    params = [p for g in opt.param_groups for p in g["params"]]
    scaler = precision.grad_scaler(cfg.precision, device.type)
    timers = []
    accum = cfg.grad_accum
    for _ in range(k):
        if mark_step is not None:  # as in the worker's step
            mark_step()
        # marks: 0 start | 1 data taken | per micro-batch: forward end, backward end | optimizer end
        t = _PhaseTimer(device, 3 + 2 * accum)
        t.mark(0)
        # the data wait: the next batches from the loader (real data), or the pre-made ones
        batch_list = list(fetch()) if fetch is not None else [batches[i] for i in range(accum)]
        t.mark(1)
        for i, b in enumerate(batch_list):
            # as in the real step, only the last micro-batch synchronises gradients
            ctx = par.no_sync() if (sync_off or i < accum - 1) else contextlib.nullcontext()
            with ctx:
                with autocast():
                    loss = module(*b)
                t.mark(2 + 2 * i)
                scaled = loss / accum if accum > 1 else loss
                with par.backward_context():
                    (scaler.scale(scaled) if scaler else scaled).backward()
            t.mark(3 + 2 * i)
        optimizer_step(opt, scaler, params, cfg.clip_grad_norm)
        t.mark(2 + 2 * accum)
        timers.append(t)
    if device.type == "cuda":  # the one sync point: the host stayed ahead through the k steps
        torch.cuda.synchronize(device)
    out = []
    for t in timers:
        iv = t.intervals_ms(synchronise=False)
        fwd = sum(iv[1 + 2 * i] for i in range(accum))
        bwd = sum(iv[2 + 2 * i] for i in range(accum))
        out.append([iv[0], fwd, bwd, iv[-1]])
    return out


def _allreduce_ms(params, device, group, k: int) -> float:
    numel = sum(p.numel() for p in params if p.requires_grad)
    dtype = next((p.dtype for p in params if p.requires_grad), torch.float32)
    buf = torch.ones(numel, dtype=dtype, device=device)
    times = []
    for _ in range(k + 2):
        t = _PhaseTimer(device, 2)
        t.mark(0)
        dist.all_reduce(buf, group=group)
        t.mark(1)
        times.append(t.intervals_ms()[0])
    return statistics.median(times[2:])


def measure_breakdown(par, cfg, device: torch.device, batches: list[tuple], autocast: Callable,
                      world_size: int, fetch: Callable[[], list] | None = None) -> dict[str, Any]:
    """Median per-phase times (ms) of STEPS steps with and without gradient sync; see module doc.

    Every collective here is issued the same number of times on every rank.
    """
    if par.step is not None:
        return {"supported": False, "reason": "strategy has its own step (pipeline schedule)"}
    k = STEPS
    parts = StepParts(par, cfg, device, batches, autocast, fetch)
    # two untimed steps first: the breakdown's own warm-up (e.g. no_sync variants compile anew)
    _phased_steps(parts, 2, sync_off=False)
    with_sync = _phased_steps(parts, k, sync_off=False)
    med = [statistics.median(col) for col in zip(*with_sync)]
    data_ms, fwd_ms, bwd_ms, opt_ms = med
    res: dict[str, Any] = {"supported": True, "steps": k, "data_ms": data_ms, "forward_ms": fwd_ms,
                           "backward_ms": bwd_ms, "optimizer_ms": opt_ms,
                           "step_ms": data_ms + fwd_ms + bwd_ms + opt_ms,
                           "exposed_comm_ms": None, "comm_ms": None, "overlap_ratio": None,
                           "backward_compute_ms": None, "host_ahead": True}
    distributed = world_size > 1 and par.dp_size > 1 and par.no_sync is not contextlib.nullcontext
    if distributed:
        _phased_steps(parts, 1, sync_off=True)
        no_sync = _phased_steps(parts, k, sync_off=True)
        bwd_compute = statistics.median(r[2] for r in no_sync)
        exposed = max(0.0, bwd_ms - bwd_compute)
        params = [p for g in par.optimizer.param_groups for p in g["params"]]
        comm = _allreduce_ms(params, device, par.dp_group, k)
        res.update({"backward_compute_ms": bwd_compute, "exposed_comm_ms": exposed, "comm_ms": comm,
                    "overlap_ratio": min(1.0, max(0.0, 1.0 - exposed / comm)) if comm > 0 else None})
    return res


def profile_steps(step: Callable[[], Any], device: torch.device, path: str | None, active: int = 3,
                  top: int = 15, fetch: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Record a torch.profiler trace (Chrome/Perfetto JSON) of ``active`` training steps.

    With real data (``fetch``: the loader's next batch) each step takes its batch first, as in the
    window, so the trace shows the input pipeline's threads and kernels (GPU decode) beside the step's.

    Every rank profiles (their collectives must match); only a rank given a ``path`` exports.
    ``top_ops`` in the result lists the ``top`` events with the most self time on the device
    (on a CPU, host self time), per step, so a record says where the step went without opening
    the trace: kernels, NCCL collectives, memory copies (``Memcpy HtoD`` in a training step means
    data crossing PCIe).
    """
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    # the trace is written when the active cycle completes (on_trace_ready), not at exit
    ready = (lambda prof: prof.export_chrome_trace(path)) if path else None
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                 on_trace_ready=ready, record_shapes=False) as prof:
        for _ in range(active + 1):
            if fetch is not None:
                fetch()
            step()
            prof.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"trace": path, "steps": active, "top_ops": top_ops(prof.key_averages(), active, device.type == "cuda", top)}


def top_ops(averages, steps: int, on_device: bool, top: int) -> list[dict[str, Any]]:
    """The events of a profile with the most self time, in ms per step (device time when ``on_device``)."""

    def self_us(e) -> float:
        if on_device:  # torch renamed *_cuda_* to *_device_* in 2.4; accept both
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)) or 0.0)
        return float(e.self_cpu_time_total or 0.0)

    # ProfilerStep#N is the schedule's own per-step annotation: its self time is the gaps between ops
    ops = (e for e in averages if self_us(e) > 0 and not str(e.key).startswith("ProfilerStep"))
    rows = sorted(ops, key=self_us, reverse=True)[:top]
    return [{"name": e.key[:120], "calls_per_step": round(e.count / steps, 2),
             "self_ms_per_step": round(self_us(e) / 1e3 / steps, 4)} for e in rows]
