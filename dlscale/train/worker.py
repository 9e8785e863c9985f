"""What torchrun starts on every rank: build -> parallelize -> warm up -> timed window -> record.

This is the only code in the timed region. Between the two synchronisations of the window
(device sync + barrier at both ends) only the training step runs; per-step boundaries are
marked with CUDA events (asynchronous, no host sync) or host clocks on the CPU, and read after
the window. Each rank writes ``rank<R>.json`` into the output directory; the launcher merges.

Exit codes: 0 ok, 3 out of memory, 1 any other failure (the rank file says why).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import gc
import math
import os
import resource
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_STARTED = time.time()  # before torch's import: the process's phases are timed from here

from dlscale.case import procs  # noqa: E402

if __name__ == "__main__":  # first of all: end with torchrun's agent (or srun's task) even when it is SIGKILLed
    procs.die_with_parent()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dlscale.case import multinode, progress
from dlscale.monitor import HardwareSampler
from dlscale.quality.loop import Hooks, train_until
from dlscale.results import metrics, parity
from dlscale.train import checkpointing, energy, fp8, precision  # noqa: E402
from dlscale.case import stacks
from dlscale.case.rankfiles import worker_args, write_result, write_started
from dlscale.train import checkpoint_timing, ranktimes  # noqa: E402
from dlscale.train.breakdown import measure_breakdown, profile_steps
from dlscale.train.compiling import compile_module, step_marker  # noqa: E402
from dlscale.train.step import GraphedOptimizerStep, optimizer_step  # noqa: E402
from dlscale.case.config import RunConfig, parse_injection, resolve_device  # noqa: E402
from dlscale.inputs import open_source  # noqa: E402
from dlscale.models import count_parameters  # noqa: E402
from dlscale.strategies import DistEnv, Parallelized, get_strategy, resolve_spec  # noqa: E402

EXIT_OOM = 3

# a host allocation failure: MemoryError, or c10's allocator refusing ("DefaultCPUAllocator: can't
# allocate memory" / "not enough memory"); on the CPU that is the case's out-of-memory, as on a GPU
_CPU_OOM = ("DefaultCPUAllocator", "can't allocate memory", "not enough memory")


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is an out-of-memory failure, on the device or on the host."""
    if isinstance(e, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(e, RuntimeError) and any(m in str(e) for m in _CPU_OOM)


def dist_env_from_environ(device_type: str) -> DistEnv:
    """Rank layout from torchrun's variables (or Slurm's, when started by srun)."""
    e = os.environ
    if "RANK" in e:
        rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
        local_rank = int(e.get("LOCAL_RANK", 0))
        local_world = int(e.get("LOCAL_WORLD_SIZE", world))
    elif "SLURM_PROCID" in e:
        rank, world = int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"])
        local_rank = int(e.get("SLURM_LOCALID", 0))
        local_world = int(e.get("SLURM_NTASKS_PER_NODE", e.get("SLURM_TASKS_PER_NODE", "1").split("(")[0]))
        multinode.slurm_rendezvous_env()  # MASTER_ADDR/PORT from the step's first node when missing
    else:
        rank, world, local_rank, local_world = 0, 1, 0, 1
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    return DistEnv(rank, world, local_rank, local_world, device, backend)


class _Injected:
    """Test hook: raise/hang at a given global step on a given rank (config.inject_failure); "slow@MS"
    sleeps MS milliseconds before every step of the rank (a straggler)."""

    def __init__(self, spec: str | None, rank: int, batch_size: int | None = None):
        self.kind = None
        if spec:
            kind, step, target = parse_injection(spec)
            if kind == "oom-above":  # "oom-above@N": OOM at step 0 when the batch is larger than N
                kind, step = ("oom", 0) if batch_size is not None and batch_size > step else (None, 0)
            if target is None or target == rank:
                self.kind, self.step = kind, step

    def slow(self) -> None:
        if self.kind == "slow":
            time.sleep(self.step / 1e3)

    def check(self, step: int) -> None:
        if self.kind == "slow":
            return self.slow()
        if self.kind is None or step != self.step:
            return
        if self.kind == "oom":
            raise torch.OutOfMemoryError("injected out-of-memory (inject_failure)")
        if self.kind == "crash":
            raise RuntimeError("injected crash (inject_failure)")
        while True:  # hang: only the case's time limit or a collective timeout ends this
            time.sleep(1)


def _autocast(cfg: RunConfig, device: torch.device):
    return precision.autocast_factory(cfg.precision, device.type)


def build_step(par: Parallelized, cfg: RunConfig, device: torch.device, batches: list[tuple]):
    """The training step: grad_accum micro-batches forward/backward, clip, optimizer step.

    Returns step() -> loss tensor (not synchronised: the value is read after the window).
    """
    if par.step is not None:
        micro = batches
        return lambda: par.step(micro)
    module, opt = par.module, par.optimizer
    autocast = _autocast(cfg, device)
    scaler = precision.grad_scaler(cfg.precision, device.type)
    accum = cfg.grad_accum
    clip = cfg.clip_grad_norm
    params = [p for g in opt.param_groups for p in g["params"]]
    no_sync = par.no_sync
    backward_context = par.backward_context
    mark_step = step_marker(cfg)
    if cfg.optimizer_graph:  # validated: no scaler, the worker's own step, CUDA
        graphed = GraphedOptimizerStep(opt, params, clip)
        par.info["optimizer_graph"] = graphed.info  # filled in while training; recorded after the window
        finish = graphed
    else:
        graphed = None

        def finish():
            optimizer_step(opt, scaler, params, clip)

    def step():
        if mark_step is not None:
            mark_step()
        loss = None
        for i in range(accum):
            ctx = no_sync() if i < accum - 1 else contextlib.nullcontext()
            with ctx:
                with autocast():
                    loss = module(*batches[i])
                scaled = loss / accum if accum > 1 else loss
                with backward_context():
                    (scaler.scale(scaled) if scaler else scaled).backward()
        finish()
        return loss

    step.optimizer_graph = graphed  # the model-state reading steps it eagerly (_model_state_memory)
    step.scaler = scaler
    return step


def _loss_scale(par: Parallelized, step) -> metrics.ScaleReading | None:
    """The amp-fp16 loss scaler's scale and growth tracker (the worker's GradScaler, or a custom step's own, as
    the pipeline's); None without one. A host sync: called only outside the window."""
    scaler = getattr(par.step if par.step is not None else step, "scaler", None)
    if scaler is None:
        return None
    get_tracker = getattr(scaler, "get_growth_tracker", None) or getattr(scaler, "_get_growth_tracker", None)
    return metrics.ScaleReading(float(scaler.get_scale()), int(get_tracker()) if get_tracker else None,
                                int(scaler.get_growth_interval()))


def make_batches(spec, cfg: RunConfig, par: Parallelized, dp_rank: int, device: torch.device) -> list[tuple]:
    """grad_accum micro-batches for this rank: its slice of the global synthetic batch.

    The global batch is drawn from a fixed seed and sliced by data-parallel rank, so any
    strategy sees exactly the data a single process would see for the same global batch.
    """
    gen = torch.Generator().manual_seed(cfg.seed + 12345)
    out = []
    b = cfg.batch_size * par.devices_per_process  # nn.DataParallel feeds all GPUs
    for _ in range(cfg.grad_accum):
        full = spec.make_batch(cfg.batch_size * par.dp_size, torch.device("cpu"), gen)
        mine = []
        for t in full:
            t = t[dp_rank * b:(dp_rank + 1) * b].to(device)
            if spec.channels_last and device.type == "cuda" and t.dim() == 4:
                mine.append(t.contiguous(memory_format=torch.channels_last))
            else:
                mine.append(t.contiguous())
        out.append(tuple(mine))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> dict[str, int | None]:
    if device.type == "cuda":
        return {"peak_mem_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_mem_reserved_bytes": torch.cuda.max_memory_reserved(device)}
    # On the CPU the closest honest figure is the process's peak resident set.
    return {"peak_mem_allocated_bytes": None,
            "peak_mem_reserved_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def build_parallel(spec, cfg: RunConfig, denv: DistEnv) -> tuple[Parallelized, int]:
    """The case's model built (the same weights on every rank), prepared (FP8, activation
    checkpointing) and parallelised by its strategy: (the strategy's result, the model's parameters)."""
    device = denv.device
    torch.manual_seed(cfg.seed)  # identical initial weights on every rank
    with torch.device(device):
        model = spec.build()
    if spec.channels_last and device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    params = count_parameters(model)
    prepared = {**fp8.convert(model, spec, cfg, device), **checkpointing.apply(model, spec, cfg.activation_checkpointing)}
    par = get_strategy(cfg.strategy).fn(model, spec, cfg, denv)
    par.info.update(prepared)
    return par, params


def train(cfg: RunConfig, denv: DistEnv, result: dict[str, Any], out_dir: Path | None = None) -> None:
    """Everything between process-group start and the rank's result (filled into ``result``)."""
    device = denv.device
    spec = resolve_spec(cfg)
    if device.type == "cuda":
        # fp32 means TF32 tensor cores on GPU (recorded), as the DLPerf fp32 runs on Ampere+.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
        result["tf32"] = torch.cuda.get_device_capability(device) >= (8, 0)  # Volta/Turing: the flag does nothing
        result["device_name"] = torch.cuda.get_device_name(device)
    else:
        result["tf32"] = False
        result["device_name"] = "cpu"

    progress.phase("build", "start", denv.rank)
    par, result["params"] = build_parallel(spec, cfg, denv)
    if device.type == "cuda":
        # The full model was built on every device before sharding (FSDP, ZeRO-3, pipeline):
        # report the training peak, not the construction peak (which is kept separately).
        result["init_peak_mem_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    result.setdefault("marks", {})["built"] = time.time()
    progress.phase("build", "end", denv.rank)
    eager_module = par.module  # for the correctness check: no recompilation for inference
    if cfg.compile:
        par.module = compile_module(par.module, cfg)
    result["dp_size"] = par.dp_size
    result["strategy_info"] = par.record_info()
    dp_rank = par.dp_rank
    # synthetic: the pre-made batches; real data: a DataLoader that refills ``batches`` in place
    source = open_source(spec, cfg, par, denv, lambda: make_batches(spec, cfg, par, dp_rank, device))
    batches = source.batches
    step = build_step(par, cfg, device, batches)
    inject = _Injected(cfg.inject_failure, denv.rank, cfg.batch_size)

    sampler = _start_sampler(cfg, denv, out_dir)
    rank = _Rank(cfg, denv, result, par, step, batches, eager_module, inject, sampler, out_dir, source)
    try:
        if cfg.until is not None:  # time to quality: timed chunks, evaluations between (dlscale/quality/loop.py)
            _until_loop(rank)
        else:
            _train_loop(rank)
        if par.teardown is not None:
            par.teardown()
    finally:
        if sampler is not None:
            sampler.stop()
        source.close()


def _local_gpu_uuids(denv: DistEnv) -> list[str] | None:
    """UUIDs of the GPUs this node's ranks use (cuda:0 .. cuda:local_world-1), so the sampler
    averages over them only, not over idle GPUs of the machine; None (every GPU) off CUDA or
    when the UUID is unavailable."""
    if denv.device.type != "cuda":
        return None
    try:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(local_world)]
    except Exception:  # noqa: BLE001 - an older torch without .uuid: sample every GPU
        return None
    return [u if u.upper().startswith(("GPU-", "MIG-")) else f"GPU-{u}" for u in uuids]


def _start_sampler(cfg: RunConfig, denv: DistEnv, out_dir: Path | None):
    """One hardware sampler per node (local rank 0), in its own process; never fatal."""
    if not cfg.monitor or denv.local_rank != 0 or out_dir is None:
        return None

    # the series is per node; os.getppid() is torchrun's agent, so RSS covers all local ranks
    sampler = HardwareSampler(cfg.sample_interval, gpu_indices=_local_gpu_uuids(denv),
                              series_path=str(out_dir / f"series-rank{denv.rank}.jsonl"), pid=os.getppid())
    sampler.start()
    sampler.wait_ready(5.0)  # a first sample before warm-up, so even a short window is covered
    return sampler


def _window_times(events, fetched, host_marks: list[float], n: int) -> tuple[list[float], list[float] | None]:
    """The window's step times (ms: CUDA events, else host marks) and, for real data on a GPU, the
    time the GPU idled before each step's batch: ``fetched[i]`` is recorded after the fetch, and the
    GPU reaches it once the previous step's work is done and the batch is ready (the fetch queued a
    wait on the input stream), so its distance from the previous step's end event is idle time for
    data (0 while the host runs ahead of the GPU)."""
    if events is None:
        return [(host_marks[i + 1] - host_marks[i]) * 1e3 for i in range(n)], None
    steps = [events[i].elapsed_time(events[i + 1]) for i in range(n)]
    return steps, ([events[i].elapsed_time(fetched[i]) for i in range(n)] if fetched is not None else None)


def _window_counters(source, denv: DistEnv):
    """Counters read at the window's start: real data's loader CPU and reads, and the node's energy
    (local rank 0; dlscale/train/energy.py); returns the energy meter for ``energy.stop`` after the window."""
    source.window_start()
    return energy.start(denv, _local_gpu_uuids(denv))


def _window_counters_end(source, meter, result: dict[str, Any]) -> None:
    source.window_end()
    energy.stop(meter, result)  # the node's energy over the window, where a counter was read


@dataclass
class _Rank:
    """What one rank's loops work with, built once by ``train``."""

    cfg: RunConfig
    denv: DistEnv
    result: dict[str, Any]
    par: Parallelized
    step: Callable
    batches: list[tuple]  # the step's micro-batches (refilled in place by a real-data source)
    eager_module: Any  # the model before torch.compile (the correctness check's)
    inject: _Injected
    sampler: Any  # the node's hardware sampler (local rank 0), or None
    out_dir: Path | None
    source: Any  # dlscale/inputs/source.py: SyntheticSource or LoaderSource

    @property
    def fetch(self) -> Callable | None:
        """Real data: what refills ``batches`` each step; None for synthetic batches."""
        return None if self.source.static else self.source.next


@dataclass
class _Window:
    """The timed window's marks: CUDA events (GPU) or host clocks (CPU), read after it."""

    n: int
    events: list | None
    fetched: list | None  # real data on a GPU: an event after each step's fetch
    host_marks: list[float]
    waits: list[float]  # real data: host seconds each step waited at the loader boundary
    wall: tuple[float, float] = (0.0, 0.0)
    seconds: float = 0.0

    @classmethod
    def new(cls, n: int, cuda: bool, real_data: bool) -> "_Window":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else None
        fetched = [torch.cuda.Event(enable_timing=True) for _ in range(n)] if cuda and real_data else None
        return cls(n, events, fetched, [0.0] * (n + 1), [0.0] * n)


def _train_loop(r: _Rank) -> None:
    cfg, denv, result, par, step = r.cfg, r.denv, r.result, r.par, r.step
    fetch = r.fetch
    _warmup(cfg, denv, result, par, step, r.inject, fetch)
    n = result["window_steps"] = window_steps(cfg, result.get("warmup_step_s") or [], denv)
    w = _Window.new(n, denv.device.type == "cuda", fetch is not None)
    scale_before = _loss_scale(par, step)  # amp-fp16: skipped steps are the window's halvings of the scale
    meter = _window_counters(r.source, denv)  # loader and energy counters, read before the barrier
    loss = _timed_window(r, w, fetch)
    _window_counters_end(r.source, meter, result)
    result.setdefault("marks", {})["window_done"] = time.time()
    step_ms, idle_ms = _window_times(w.events, w.fetched, w.host_marks, n)
    # the slowest rank defines the window
    t = torch.tensor([w.seconds], dtype=torch.float64, device=denv.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    result.update({
        "status": "ok",
        "window_s": float(t.item()),
        "local_window_s": w.seconds,
        "window_wall": list(w.wall),
        "step_times_ms": step_ms,
    })
    result["loss_last"] = _read_loss(result, loss if par.reports_loss else None, par, denv)
    result.update(metrics.loss_scale_fields(scale_before, _loss_scale(par, step), n))
    result.update(_peak_memory(denv.device))
    if fetch is not None:
        result["data"] = r.source.summary(w.waits, w.seconds, step_ms, idle_ms)
    if r.sampler is not None:
        result["utilisation"] = r.sampler.summary(*w.wall)
    _after_window(r, fetch, r.inject)


def _timed_window(r: _Rank, w: _Window, fetch: Callable | None):
    """The window: synchronised start, ``w.n`` training steps and nothing else, synchronised end;
    fills ``w``'s marks, wall times and seconds; returns the last step's loss."""
    device, cfg, inject, step = r.denv.device, r.cfg, r.inject, r.step
    cuda = device.type == "cuda"
    events, fetched, host_marks, waits, n = w.events, w.fetched, w.host_marks, w.waits, w.n
    pg_barrier = (lambda: dist.barrier(device_ids=[r.denv.local_rank])) if cuda else dist.barrier
    _sync(device)
    pg_barrier()
    # ---- timed window: nothing but training steps between here and the closing sync ----
    wall_start = time.time()
    t0 = time.perf_counter()
    if fetch is None:  # synthetic batches: no per-step work at all
        if cuda:
            events[0].record()
            for i in range(n):
                inject.check(cfg.warmup + i)
                loss = step()
                events[i + 1].record()
        else:
            host_marks[0] = t0
            for i in range(n):
                inject.check(cfg.warmup + i)
                loss = step()
                host_marks[i + 1] = time.perf_counter()
    elif cuda:
        events[0].record()
        for i in range(n):
            inject.check(cfg.warmup + i)
            ta = time.perf_counter()
            fetch()
            waits[i] = time.perf_counter() - ta
            fetched[i].record()
            loss = step()
            events[i + 1].record()
    else:
        host_marks[0] = t0
        for i in range(n):
            inject.check(cfg.warmup + i)
            ta = time.perf_counter()
            fetch()
            waits[i] = time.perf_counter() - ta
            loss = step()
            host_marks[i + 1] = time.perf_counter()
    _sync(device)
    pg_barrier()
    t1 = time.perf_counter()
    w.wall = (wall_start, time.time())
    # ---- end of timed window ----
    w.seconds = t1 - t0
    return loss


def calibrated_steps(fewest: int, warmup_step_s: list[float], target_s: float | None,
                     most: int = 100_000) -> int:
    """Timed steps for a window of ``target_s``: from the fastest warm-up step after the first (the
    first compiles and allocates, and the next few still settle: the fastest is the nearest to the
    window's steps, and errs towards a longer window), never fewer than ``fewest``; ``fewest``
    without a target or a timing."""
    timed = [t for t in warmup_step_s[1:] if t > 0]
    if not target_s or not timed:
        return fewest
    return max(fewest, min(most, math.ceil(target_s / min(timed))))


def window_steps(cfg, warmup_step_s: list[float], denv) -> int:
    """The window's step count, the same on every rank (the largest any rank asks for)."""
    n = calibrated_steps(cfg.steps, warmup_step_s, cfg.min_window_s)
    if cfg.min_window_s is None or denv.world_size == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=denv.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _until_loop(r: _Rank) -> None:
    """--until: train to the target (dlscale/quality/loop.py), then what follows the main window."""
    cfg, denv, result, par, source = r.cfg, r.denv, r.result, r.par, r.source
    fetch = r.fetch
    meter = _window_counters(source, denv)  # loader and energy counters, as around the main window
    st = train_until(cfg, denv, result, par, resolve_spec(cfg), Hooks(r.step, fetch, r.inject, r.eager_module))
    _window_counters_end(source, meter, result)
    if "energy" in result:  # the counters span every step trained (warm-up and evaluations too), not the window's
        result["energy"]["steps"] = st.steps
    result["loss_last"] = _read_loss(result, st.loss if par.reports_loss else None, par, denv)
    result.update(_peak_memory(denv.device))
    if fetch is not None:
        n = len(result["step_times_ms"])
        result["data"] = source.summary(st.waits[-n:], result["window_s"], result["step_times_ms"], None)
    if r.sampler is not None:
        result["utilisation"] = r.sampler.summary(*result["window_wall"])
    _after_window(r, fetch)
    result["loss_after_steps"] = st.steps  # the steps this run took, not warm-up + steps


def _warmup(cfg, denv, result, par, step, inject, fetch) -> None:
    """Warm-up: compile, cudnn autotune, allocator growth, NCCL connections. Losses are read here (a
    host sync per step is harmless outside the window) for correctness checks."""
    losses = []
    step_s: list[float] = []
    t_w = time.perf_counter()
    ticker = None
    for i in range(cfg.warmup):
        compiling_now = cfg.compile and i == 0  # torch.compile compiles on the first call
        if compiling_now:
            progress.phase("compile", "start", denv.rank)
        elif i == int(cfg.compile):
            progress.phase("warmup", "start", denv.rank)
            ticker = progress.WarmupTicker(cfg.warmup, denv.rank)
        inject.check(i)
        t_step = time.perf_counter()
        if fetch is not None:
            fetch()
        loss = step()
        losses.append(_read_loss(result, loss if par.reports_loss else None, par, denv))
        if cfg.min_window_s is not None:
            _sync(denv.device)  # a whole step, not its launch (--min-window sizes the window from it)
        step_s.append(time.perf_counter() - t_step)
        if compiling_now:
            progress.phase("compile", "end", denv.rank)
        elif ticker is not None:
            ticker.tick(i + 1)
    progress.phase("warmup", "end", denv.rank)
    result["warmup_s"] = time.perf_counter() - t_w
    result["warmup_step_s"] = step_s
    result.setdefault("nonfinite_losses", 0)
    result["loss_scope"] = parity.LOSS_SCOPE
    result.setdefault("marks", {})["warmed_up"] = time.time()
    result["warmup_losses"] = losses


def _after_window(r: _Rank, fetch: Callable | None, inject: _Injected | None = None) -> None:
    """Extra measurements, all after the window and after the memory peak was read. The loss of the
    trained model first: the breakdown and the profile train further steps, which would otherwise
    make ``loss_after`` depend on them (and a parity check of a case with --breakdown against one
    without fail). ``inject``: the straggler hook the per-rank step times repeat (None: none)."""
    cfg, denv, result, par, step, batches, eager_module, out_dir = (r.cfg, r.denv, r.result, r.par, r.step, r.batches,
                                                                    r.eager_module, r.out_dir)
    device = denv.device
    result["loss_after"] = _loss_after(par, eager_module, batches[0], cfg, device, denv, result)
    result["loss_after_steps"] = cfg.warmup + result.get("window_steps", cfg.steps)  # steps taken (parity)
    ranktimes.measure(cfg, denv, result, ranktimes.SoloInputs(par, batches, _autocast(cfg, device),
                                                               getattr(inject, "slow", None), eager_module))
    if cfg.checkpoint_every:  # the checkpoint phase: steps and saves timed (dlscale/train/checkpoint_timing.py)
        progress.phase("checkpoint", "start", denv.rank)
        result["checkpoint"] = checkpoint_timing.run_phase(cfg, denv, par, step, out_dir, fetch is None,
                                                           lambda: _sync(device))
        progress.phase("checkpoint", "end", denv.rank)
    if cfg.breakdown:
        progress.phase("breakdown", "start", denv.rank)
        result["breakdown"] = measure_breakdown(par, cfg, device, batches, _autocast(cfg, device),
                                                denv.world_size, fetch=fetch)
        progress.phase("breakdown", "end", denv.rank)
    if cfg.profile:
        trace = str(out_dir / "trace.json") if (out_dir is not None and denv.rank == 0) else None
        progress.phase("profile", "start", denv.rank)
        result["profile"] = profile_steps(step, device, trace, fetch=fetch)
        progress.phase("profile", "end", denv.rank)
    result["strategy_info"] = par.record_info()  # again: a strategy may fill in what it saw while training
    if device.type == "cuda":
        result["model_state_mem_bytes"] = _model_state_memory(step, device)


def _model_state_memory(step, device: torch.device) -> int | None:
    """Bytes allocated on this device as the optimizer step begins, in one extra step after the window.

    At that instant the backward has freed its activations and the gradients are complete, so
    the figure is parameters + gradients + optimizer state (+ persistent communication buffers
    such as DDP's buckets, and the pre-built input batches): the model state of the ZeRO memory
    model, measured directly. The global pre-hook also fires inside pipeline schedules and for
    ZeRO wrappers (inner and outer optimizer: the larger is kept). None when no torch optimizer
    stepped (e.g. DeepSpeed's own).
    """
    seen: list[int] = []

    handle = register_optimizer_step_pre_hook(
        lambda opt, args, kwargs: seen.append(torch.cuda.memory_allocated(device)))
    graphed = getattr(step, "optimizer_graph", None)  # a replayed graph calls no hook: this one step is eager
    try:
        with graphed.eager() if graphed is not None else contextlib.nullcontext():
            step()
        _sync(device)
    finally:
        handle.remove()
    return max(seen) if seen else None


def _read_loss(result: dict[str, Any], loss, par: Parallelized, denv: DistEnv) -> float | None:
    """``parity.global_loss`` of a step's loss, counting in ``result["nonfinite_losses"]`` one that was
    computed but is NaN or inf (recorded as null: the validity check ``loss_nonfinite`` needs the count
    where every loss of a repeat is null, which would otherwise read as a strategy without losses)."""
    value = parity.global_loss(loss, par, denv)
    if loss is not None and value is None:
        result["nonfinite_losses"] = result.get("nonfinite_losses", 0) + 1
    return value


def _loss_after(par: Parallelized, module, batch: tuple, cfg: RunConfig, device, denv: DistEnv,
                result: dict[str, Any]) -> float | None:
    """Loss of the trained model on micro-batch 0 (eval mode), its global mean (dlscale/results/parity.py).

    Correctness check only (outside the window): equal for any strategy that trains the same
    global batch as a single process does. Strategies with their own step evaluate through
    ``par.eval_loss``.
    """
    if par.eval_loss is not None:
        return _read_loss(result, par.eval_loss(batch), par, denv)
    if par.step is not None:
        return None
    training = module.training
    module.eval()  # dropout off, so the check is deterministic
    try:
        with torch.no_grad(), _autocast(cfg, device)():
            loss = module(*batch)
    finally:
        module.train(training)  # the steps after it (breakdown, profile, model state) train as the window did
    return _read_loss(result, loss, par, denv)


def new_result(denv: DistEnv, started: float) -> dict[str, Any]:
    """A rank's result before training: who it is, "failed" until it says otherwise, and the
    wall-clock marks of its phases (epoch seconds; the launcher turns them into durations)."""
    return {
        "rank": denv.rank, "local_rank": denv.local_rank, "world_size": denv.world_size,
        "host": socket.gethostname(), "device": str(denv.device), "pid": os.getpid(),
        "status": "failed", "error": None, "backend": denv.backend,
        "threads": torch.get_num_threads(),  # intra-op threads as torch uses them (OMP_NUM_THREADS)
        "marks": {"started": started, "imported": time.time()},
    }


def record_failure(result: dict[str, Any], e: BaseException) -> int:
    """The rank's status and one-line error for ``e`` in ``result``; its exit code (EXIT_OOM or 1)."""
    if is_oom(e):
        result["status"], result["error"] = "oom", _one_line(e)
        return EXIT_OOM
    result["status"], result["error"] = "failed", _one_line(e)
    return 1


def main(argv: list[str] | None = None) -> int:
    cfg, out_dir = worker_args(argv, "dlscale training worker (started by torchrun)")
    device_type = resolve_device(cfg.device)
    denv = dist_env_from_environ(device_type)
    result = new_result(denv, _STARTED)
    write_started(out_dir, denv.rank)
    stacks.arm(out_dir, denv.rank)  # the launcher asks where this rank is if time runs out
    code = 0
    try:
        progress.phase("rendezvous", "start", denv.rank)
        dist.init_process_group(denv.backend, rank=denv.rank, world_size=denv.world_size,
                                timeout=_dt.timedelta(seconds=cfg.collective_timeout),
                                device_id=denv.device if denv.backend == "nccl" else None,
                                **multinode.restart_store(denv, cfg.collective_timeout))  # --max-restarts
        multinode.after_init(denv, result)  # multi-node: every rank's host/device -> world.json
        result["marks"]["process_group"] = time.time()
        progress.phase("rendezvous", "end", denv.rank)
        train(cfg, denv, result, out_dir)
    except Exception as e:
        code = record_failure(result, e)
        result["traceback"] = traceback.format_exc(limit=20)
    finally:
        if code:
            multinode.on_failure(denv, result)  # multi-node: publish/attribute the failure
        result.update({k: v for k, v in _peak_memory(denv.device).items() if k not in result})
        result["marks"]["finished"] = time.time()
        write_result(out_dir, denv.rank, result)
    if code:
        print(f"dlscale worker rank {denv.rank}: {result['status']}: {result['error']}", file=sys.stderr,
              flush=True)
        # Peers may be blocked in a collective with us; exit without a teardown that could hang.
        os._exit(code)
    dist.destroy_process_group()
    # Leave without running C++ static destructors: torch's teardown of background threads has
    # been seen to abort ("terminate called without an active exception") after a good run.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _one_line(e: BaseException) -> str:
    """The error for the record: its first line, and the lines after it while a line ends with ':'
    (a library's multi-line message, e.g. DALI's "Critical error when building pipeline:", says
    what failed only further down)."""
    lines = [ln.strip() for ln in f"{type(e).__name__}: {e}".splitlines() if ln.strip()]
    if not lines:
        return type(e).__name__
    out, rest = lines[0], iter(lines[1:])
    while out.endswith(":") and len(out) < 500:
        nxt = next(rest, None)
        if nxt is None:
            break
        out += " " + nxt
    return out[:500]


if __name__ == "__main__":
    sys.exit(main())
