"""What torchrun starts on every rank for ``--framework jax``: the JAX twin of dlscale/train/worker.py.

Same arguments (``--config FILE --out DIR``), same process model (one process per device; torchrun's
RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, or Slurm's), same ``rank<R>.json`` and
exit codes (0 ok, 3 out of memory, 1 other). The processes join through
``jax.distributed.initialize``; its coordinator (in rank 0) listens on a port rank 0 picks and
publishes in torchrun's own store (the agent's TCPStore at MASTER_ADDR:MASTER_PORT), or on
MASTER_PORT + 1 where no agent store exists (srun). On the CPU the collectives are gloo's
(``jax_cpu_collectives_implementation``); on GPUs NCCL's.

Measurement, as the torch worker: the warm-up is untimed (XLA compiles there, ahead of time, and
the compile time is recorded); the window starts after every process has its state ready
(``block_until_ready``) and a barrier (``sync_global_devices``), and ends the same way. Step
boundaries are the moments the host sees each step's loss ready, observed while the next step
is already queued (so the device never waits on the observation); the window is the slowest
process's.
"""
from __future__ import annotations

import datetime as _dt
import os
import resource
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

_STARTED = time.time()

from dlscale.case import multinode, procs, stacks
from dlscale.case.rankfiles import worker_args, write_result, write_started
from dlscale.frameworks.jax.models import count_params, get_jax_model
from dlscale.frameworks.jax.profile import profile_steps
from dlscale.monitor import HardwareSampler
from dlscale.results import metrics  # noqa: E402

if __name__ == "__main__":  # end with the launcher even when it is SIGKILLed (procs.py)
    procs.die_with_parent()

import numpy as np  # noqa: E402
import torch  # noqa: E402  (CPU only: the synthetic batch is the torch spec's, so both frameworks see it)
from torch.distributed import TCPStore

from dlscale.case.config import RunConfig, parse_injection, resolve_device  # noqa: E402

EXIT_OOM = 3
COORDINATOR_KEY = "dlscale/jax-coordinator"


class InjectedOOM(RuntimeError):
    pass


def rank_env() -> tuple[int, int, int, int]:
    """(rank, world, local_rank, local_world) from torchrun's variables, Slurm's, or a lone process."""
    e = os.environ
    if "RANK" in e:
        world = int(e["WORLD_SIZE"])
        return int(e["RANK"]), world, int(e.get("LOCAL_RANK", 0)), int(e.get("LOCAL_WORLD_SIZE", world))
    if "SLURM_PROCID" in e:
        multinode.slurm_rendezvous_env()
        return (int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e.get("SLURM_LOCALID", 0)),
                int(e.get("SLURM_NTASKS_PER_NODE", e.get("SLURM_TASKS_PER_NODE", "1").split("(")[0])))
    return 0, 1, 0, 1


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def coordinator_address(rank: int, timeout: float) -> str:
    """host:port of the JAX coordinator, agreed by every process from torchrun's variables."""
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = int(os.environ.get("MASTER_PORT", "29500"))
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
        store = TCPStore(addr, port, is_master=False, timeout=_dt.timedelta(seconds=timeout))
        key = f"{COORDINATOR_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        if rank == 0:
            store.set(key, str(_free_port()))
        return f"{addr}:{int(store.get(key).decode())}"
    return f"{addr}:{port + 1}"


def configure_jax(device_type: str, rank: int, world: int, local_rank: int, timeout: float) -> None:
    """Platform, collectives and process group, before JAX creates its backends."""
    import jax  # optional: jax

    jax.config.update("jax_platforms", "cuda" if device_type == "cuda" else "cpu")
    if device_type == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    else:
        # fp32 means TF32 tensor-core matmuls, as the torch worker sets allow_tf32
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    if world > 1:
        jax.distributed.initialize(coordinator_address=coordinator_address(rank, timeout), num_processes=world,
                                   process_id=rank, local_device_ids=[local_rank] if device_type == "cuda" else None,
                                   cluster_detection_method="deactivate", initialization_timeout=int(timeout))
    elif device_type == "cuda":
        jax.config.update("jax_cuda_visible_devices", str(local_rank))


def _gpu_indices(local_world: int) -> list | None:
    """NVML indices or UUIDs of the GPUs this node's ranks use (local ranks 0..local_world-1)."""
    vis = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not vis:
        return list(range(local_world))
    picked = vis[:local_world]
    return picked if all(v.isdigit() or v.upper().startswith(("GPU-", "MIG-")) for v in picked) else None


def _start_sampler(cfg: RunConfig, local_rank: int, local_world: int, device_type: str, rank: int, out_dir: Path):
    if not cfg.monitor or local_rank != 0:
        return None

    gpus = _gpu_indices(local_world) if device_type == "cuda" else None
    gpus = [int(g) if isinstance(g, str) and g.isdigit() else g for g in gpus] if gpus else gpus
    sampler = HardwareSampler(cfg.sample_interval, gpu_indices=gpus,
                              series_path=str(out_dir / f"series-rank{rank}.jsonl"), pid=os.getppid())
    sampler.start()
    sampler.wait_ready(5.0)
    return sampler


def _peak_memory(device_type: str) -> dict[str, int | None]:
    if device_type == "cuda":
        try:
            import jax  # optional: jax

            stats = jax.local_devices()[0].memory_stats() or {}
        except Exception:  # noqa: BLE001 - the backend is gone or never came up
            stats = {}
        return {"peak_mem_allocated_bytes": stats.get("peak_bytes_in_use"),
                # the allocator's pool (with XLA's default preallocation: most of the device)
                "peak_mem_reserved_bytes": stats.get("peak_pool_bytes", stats.get("pool_bytes"))}
    return {"peak_mem_allocated_bytes": None, "peak_mem_reserved_bytes": None,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _value(x) -> float | None:
    v = float(np.asarray(x.addressable_data(0)))
    return v if v == v and abs(v) != float("inf") else None


def _scale_reading(state) -> metrics.ScaleReading | None:
    """The fp16 loss scale and its growth tracker (finite steps since it last changed) from the state."""
    from dlscale.frameworks.jax import train as T  # optional: jax, optax

    scale, good = _value(state.scale), _value(state.good_steps)
    return None if scale is None else metrics.ScaleReading(scale, None if good is None else int(good),
                                                           T.SCALE_INTERVAL)


def local_batches(model, cfg: RunConfig, dp_size: int, dp_rank: int) -> list[tuple[np.ndarray, ...]]:
    """grad_accum micro-batches for this process: its slice of the global batch drawn by the torch
    spec's make_batch from the worker's seed (the torch worker's rule: same data in both)."""
    gen = torch.Generator().manual_seed(cfg.seed + 12345)
    b = cfg.batch_size
    out = []
    for _ in range(cfg.grad_accum):
        full = model.spec.make_batch(b * dp_size, torch.device("cpu"), gen)
        out.append(model.to_numpy(tuple(t[dp_rank * b:(dp_rank + 1) * b] for t in full)))
    return out


def train(cfg: RunConfig, device_type: str, ids: tuple[int, int, int, int], result: dict[str, Any],
          out_dir: Path) -> None:
    import jax  # optional: jax

    from dlscale.frameworks.jax import train as T  # optional: jax, optax

    rank, world, local_rank, local_world = ids
    dev = jax.local_devices()[0]
    result["device_name"] = dev.device_kind if device_type == "cuda" else "cpu"
    result["tf32"] = device_type == "cuda"
    result["jax_backend"] = jax.default_backend()
    if jax.device_count() != world:
        raise RuntimeError(f"JAX sees {jax.device_count()} devices for {world} processes (one device per process)")
    model = get_jax_model(cfg.model, cfg.flavor)
    attention = "cudnn" if device_type == "cuda" and cfg.precision != "fp32" else "xla"
    s = T.setup(model, T.StepOptions(precision=cfg.precision, strategy=cfg.strategy, accum=cfg.grad_accum,
                                     seed=cfg.seed, clip=cfg.clip_grad_norm, attention=attention,
                                     vocab_multiple=64 if device_type == "cuda" else 1))
    result["params"] = count_params(s.state.params)
    result["dp_size"] = s.dp_size
    batches = T.global_batches(s, local_batches(model, cfg, s.dp_size, s.dp_rank))
    jax.block_until_ready((s.state, batches))
    result["marks"]["built"] = time.time()
    inject = _injection(cfg, rank)
    sampler = _start_sampler(cfg, local_rank, local_world, device_type, rank, out_dir)
    try:
        _measure(_Run(cfg, device_type, rank, s, batches, inject, sampler, result, out_dir))
    finally:
        if sampler is not None:
            sampler.stop()


@dataclass
class _Run:
    """One rank's measurement: the case, what train.setup built, and where the figures go."""
    cfg: RunConfig
    device_type: str
    rank: int
    s: Any  # train.Setup
    batches: tuple
    inject: Callable[[int], None]  # the failure hook, called with the global step
    sampler: Any  # monitor.HardwareSampler or None
    result: dict[str, Any]
    out_dir: Path


def _measure(run: _Run) -> None:
    """Compile, warm up, the timed window, then the extras after it (profile, loss check)."""
    step, state = _compile_and_warm_up(run)
    state = _timed_window(run, step, state)
    _after_window(run, step, state)


def _compile_and_warm_up(run: _Run):
    """(the compiled step, the state after the warm-up steps); their times and the strategy's info."""
    import jax  # optional: jax

    from dlscale.frameworks.jax import layers, train as T  # optional: jax, optax

    cfg, s, result = run.cfg, run.s, run.result
    t_c = time.perf_counter()
    step = s.step.lower(s.state, run.batches).compile()  # XLA's compile, timed on its own
    result["compile_s"] = time.perf_counter() - t_c
    state = s.state
    losses = []
    t_w = time.perf_counter()
    for i in range(cfg.warmup):
        run.inject(i)
        state, loss = step(state, run.batches)
        losses.append(_value(loss))
    jax.block_until_ready(state)
    result["warmup_s"] = time.perf_counter() - t_w
    result["marks"]["warmed_up"] = time.time()
    result["warmup_losses"] = losses
    result["strategy_info"] = {
        "dp_rank": s.dp_rank, "mesh": {"data": int(s.mesh.devices.size)}, "framework": "jax",
        "param_sharding": "sharded over data" if cfg.strategy == "fsdp" else "replicated",
        "attention": sorted(layers.ATTENTION_USED) or None, "compute_dtype": s.ctx.dtype,
        "state_bytes_per_device": T.state_bytes_per_device(state),
    }
    return step, state


def _timed_window(run: _Run, step, state):
    """The timed steps and the figures of the window; returns the state after them."""
    import jax  # optional: jax
    from jax.experimental import multihost_utils  # optional: jax

    cfg, batches, result = run.cfg, run.batches, run.result
    n = cfg.steps
    marks = [0.0] * (n + 1)
    jax.block_until_ready(state)
    scale_before = _scale_reading(state) if cfg.precision == "amp-fp16" else None  # fp16: skipped updates
    multihost_utils.sync_global_devices("dlscale window start")
    # ---- timed window: steps only; each step's end is observed while the next is queued ----
    wall_start = time.time()
    t0 = marks[0] = time.perf_counter()
    prev = None
    for i in range(n):
        run.inject(cfg.warmup + i)
        state, loss = step(state, batches)
        if prev is not None:
            prev.block_until_ready()
            marks[i] = time.perf_counter()
        prev = loss
    jax.block_until_ready(state)
    marks[n] = time.perf_counter()
    multihost_utils.sync_global_devices("dlscale window end")
    t1 = time.perf_counter()
    wall_end = time.time()
    # ---- end of timed window ----
    result["marks"]["window_done"] = time.time()
    window = t1 - t0
    windows = np.asarray(multihost_utils.process_allgather(np.array([window]))).reshape(-1)
    result.update({
        "status": "ok",
        "window_s": float(windows.max()),
        "local_window_s": window,
        "window_wall": [wall_start, wall_end],
        "step_times_ms": [(marks[i + 1] - marks[i]) * 1e3 for i in range(n)],
        "loss_last": _value(loss),
    })
    result.update(metrics.loss_scale_fields(scale_before, None if scale_before is None else _scale_reading(state), n))
    result.update(_peak_memory(run.device_type))
    if run.sampler is not None:
        result["utilisation"] = run.sampler.summary(wall_start, wall_end)
    return state


def _after_window(run: _Run, step, state) -> None:
    """The trained model's loss, the count of non-finite losses, then the profile's extra steps."""
    cfg, batches, result = run.cfg, run.batches, run.result
    # the trained model's loss before the profile trains further steps (as the torch worker)
    mb0 = tuple(b[0] for b in batches)
    result["loss_after"] = _value(run.s.eval_loss(state.params, state.stats, mb0))
    result["loss_after_steps"] = cfg.warmup + cfg.steps
    read = [*result["warmup_losses"], result["loss_last"], result["loss_after"]]  # each step has a loss:
    result["nonfinite_losses"] = sum(v is None for v in read)  # a null one was NaN or inf (torch: _read_loss)
    if cfg.breakdown:
        result["breakdown"] = None
        result["breakdown_note"] = "the step-time breakdown measures torch phases; not available under JAX"
    if cfg.profile:
        trace = run.out_dir / "trace.json" if run.rank == 0 else None
        state, result["profile"] = profile_steps(step, state, batches, trace)


def _injection(cfg: RunConfig, rank: int):
    """The test hook of config.inject_failure: crash, oom or hang at a global step on a rank."""
    if not cfg.inject_failure:
        return lambda step: None
    kind, at, target = parse_injection(cfg.inject_failure)
    if kind == "oom-above":
        kind, at = ("oom", 0) if cfg.batch_size > at else (None, 0)
    if kind is None or (target is not None and target != rank):
        return lambda step: None

    def check(step: int) -> None:
        if step != at:
            return
        if kind == "oom":
            raise InjectedOOM("RESOURCE_EXHAUSTED: injected out-of-memory (inject_failure)")
        if kind == "crash":
            raise RuntimeError("injected crash (inject_failure)")
        while True:
            time.sleep(1)

    return check


def is_oom(e: BaseException) -> bool:
    text = str(e)
    return (isinstance(e, (InjectedOOM, MemoryError)) or "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()
            or "DefaultCPUAllocator" in text or "can't allocate memory" in text or "not enough memory" in text)


def main(argv: list[str] | None = None) -> int:
    cfg, out_dir = worker_args(argv, "dlscale JAX training worker (started by torchrun)")
    device_type = resolve_device(cfg.device)
    ids = rank_env()
    rank = ids[0]
    result: dict[str, Any] = {
        "rank": rank, "local_rank": ids[2], "world_size": ids[1], "host": socket.gethostname(),
        "device": f"{device_type}:{ids[2] if device_type == 'cuda' else 0}", "pid": os.getpid(),
        "status": "failed", "error": None, "framework": "jax",
        "marks": {"started": _STARTED, "imported": time.time()},
    }
    write_started(out_dir, rank)
    stacks.arm(out_dir, rank)  # the launcher asks where this rank is if time runs out
    code = 0
    try:
        configure_jax(device_type, rank, ids[1], ids[2], cfg.collective_timeout)
        import jax  # optional: jax

        jax.devices()  # backends (and the distributed client) up here, not inside the build
        result["marks"]["process_group"] = time.time()
        train(cfg, device_type, ids, result, out_dir)
    except Exception as e:  # noqa: BLE001 - every failure is reported in the rank file
        code = EXIT_OOM if is_oom(e) else 1
        result["status"] = "oom" if code == EXIT_OOM else "failed"
        result["error"] = _one_line(e)
        result["traceback"] = traceback.format_exc(limit=20)
    finally:
        result.update({k: v for k, v in _peak_memory(device_type).items() if result.get(k) is None})
        result["marks"]["finished"] = time.time()
        write_result(out_dir, rank, result)
    if code:
        print(f"dlscale jax worker rank {rank}: {result['status']}: {result['error']}", file=sys.stderr, flush=True)
        os._exit(code)  # peers may wait in a collective: no teardown that could hang
    if ids[1] > 1:
        import jax  # optional: jax

        jax.distributed.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return text[0][:500] if text else type(e).__name__


if __name__ == "__main__":
    sys.exit(main())
