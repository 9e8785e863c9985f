"""How long saving the training state costs: ``--checkpoint-every N``, a phase of its own after the window.

The phase trains N steps, saves, trains N steps, saves again, trains N more (``SAVES`` saves), each
step timed to a device sync. A save is the model and optimizer state as
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives it for the strategy (sharded DTensors
under FSDP, HSDP and hybrid: each rank writes its shard; the full state under ddp and single, which
DCP's planner writes once, not once per replica), written with ``torch.distributed.checkpoint``:

* ``sync``: ``dcp.save``: training is blocked until the files are written and synced (FileSystemWriter
  fsyncs each file) and rank 0 committed the metadata; blocking time = time to durable completion.
* ``async``: ``dcp.async_save``: training is blocked while the state is staged (copied to host memory)
  (into pinned host buffers on a GPU, kept across the phase's saves as trainers keep them) and the save
  planned; the write runs in a thread (with a gloo group of its own) while the next steps
  train; durable completion is when its future resolves (a callback takes the time). One write is in
  flight at a time: a save first waits for the previous one, and that wait counts as blocking.

Recorded per save (slowest rank): blocking and durable seconds, bytes written (each rank's own files,
summed, and the metadata), write bandwidth (bytes ÷ durable time), and the steps' median before the
first save against the steps after the saves (what an async write costs the steps it overlaps). With
synthetic data the last save is loaded back and the two steps after it are trained again: their losses
must equal those first trained (``restore_matches``). The saves are removed at the end of the phase.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.results.record import median_repeat_with

MODES = ("sync", "async")
SAVES = 2
STATE_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two fp32 moments: the most a registered optimizer keeps
RESTORE_RTOL = 1e-5  # the first step after the load reads only the restored weights: equal on any device
# the steps after it: a GPU's backward kernels (atomic adds) need not be bitwise deterministic, and the
# memorised synthetic batch's loss is small, so its relative drift is large (1.7e-4 and 9.9e-4 measured)
DRIFT_RTOL_GPU = 1e-2


# ----------------------------------------------------------------------------- checks before the case

def check_case(cfg) -> None:
    """The checkpoint options against each other and the strategy: one-line ConfigError."""
    if cfg.checkpoint_mode not in MODES:
        raise ConfigError(f"checkpoint-mode {cfg.checkpoint_mode!r}: choose one of {', '.join(MODES)}")
    if cfg.checkpoint_every is None:
        for name, default in (("checkpoint_mode", "sync"), ("checkpoint_dir", None)):
            if getattr(cfg, name) != default:
                raise ConfigError(f"{name.replace('_', '-')} needs --checkpoint-every")
        return
    if cfg.nnodes > 1 and cfg.checkpoint_dir is None:
        raise ConfigError("checkpoint-every on several nodes needs --checkpoint-dir on a file system every node "
                          "shares (each node's temporary folder is its own)")
    if getattr(cfg, "optimizer_graph", False):
        raise ConfigError("checkpoint-every does not run with --optimizer-graph: the restore replaces the optimizer "
                          "state the captured graph points at")
    from dlscale.strategies import get_strategy, strategy_names  # the registry imports torch: not at the CLI's start

    if not get_strategy(cfg.strategy).caps.checkpoint_saves:
        saved = [s for s in strategy_names() if get_strategy(s).caps.checkpoint_saves]
        raise ConfigError(f"checkpoint-every: strategy {cfg.strategy} is not saved by dlscale's checkpoint phase; "
                          f"use one of {', '.join(saved)}")


def state_bytes(params: int) -> int:
    """The space one save of ``params`` parameters is planned to need (weights and optimizer moments)."""
    return STATE_BYTES_PER_PARAM * params


def check_dir(path: str | None, need_bytes: int) -> None:
    """The folder the saves go to: an existing folder this process can write, with room for ``SAVES``
    saves of ``need_bytes``; None: the case's temporary folder (the system's temp dir is checked)."""
    where = path or tempfile.gettempdir()
    what = f"checkpoint-dir {where}" if path else f"the temporary folder {where} (for --checkpoint-every)"
    if not os.path.isdir(where):
        raise ConfigError(f"{what} is not an existing folder; create it or give another --checkpoint-dir")
    try:
        with tempfile.NamedTemporaryFile(dir=where, prefix=".dlscale-write-test-"):
            pass
    except OSError as e:
        raise ConfigError(f"{what} is not writable ({e.strerror or e}); give a folder this user can write") from None
    free = shutil.disk_usage(where).free
    if free < SAVES * need_bytes:
        raise ConfigError(f"{what} has {free / 1e9:.3g} GB free; {SAVES} saves of the state need about "
                          f"{SAVES * need_bytes / 1e9:.3g} GB ({STATE_BYTES_PER_PARAM} bytes per parameter)")


def check_machine(cfg) -> None:
    """validate_for_launch's part: the folder and its space, for a case with --checkpoint-every (the
    parameters counted on a model built on the meta device: nothing allocated)."""
    if cfg.checkpoint_every is None:
        return
    import torch  # torch: keeps start-up light

    from dlscale.models import count_parameters  # torch: keeps start-up light
    from dlscale.strategies import resolve_spec  # torch: keeps start-up light

    with torch.device("meta"):
        params = count_parameters(resolve_spec(cfg).build())
    check_dir(cfg.checkpoint_dir, state_bytes(params))


# ----------------------------------------------------------------------------- the phase (worker)

def _timed_steps(step, n: int, sync, losses: list | None = None) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        loss = step()
        sync()
        out.append((time.perf_counter() - t) * 1e3)
        if losses is not None and loss is not None:
            losses.append(float(loss.detach()))
    return out


def _shard_local_optim(par) -> dict[str, Any]:
    """fsdp's ShardLocalOptimizer (a torch optimizer over each rank's local shards, dlscale/strategies/
    _common.py): its per-shard state as DTensors placed as their parameters, keyed by parameter name, so
    DCP writes each rank's shard (plain tensors would read as replicated and be written once). The DTensors
    view the live state: a load writes into it."""
    import torch  # torch: keeps start-up light
    from torch.distributed.tensor import DTensor  # torch: keeps start-up light

    opt = par.optimizer
    names = {id(p): n for n, p in par.module.named_parameters()}
    out: dict[str, Any] = {}
    for p, loc in opt._pairs:
        state = opt._inner.state.get(loc, {})
        out[names[id(p)]] = {k: DTensor.from_local(v, p.device_mesh, p.placements, run_check=False, shape=p.size(),
                                                   stride=p.stride())
                             if isinstance(p, DTensor) and torch.is_tensor(v) and v.shape == loc.shape else v
                             for k, v in state.items()}
    return out


def _state(par):
    """The model and optimizer state as the strategy shards it (DCP's state_dict API)."""
    # torch: keeps start-up light
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if hasattr(par.optimizer, "_inner"):  # ShardLocalOptimizer: not a torch optimizer the API knows
        return {"model": get_model_state_dict(par.module), "optim": _shard_local_optim(par)}
    model, optim = get_state_dict(par.module, par.optimizer)
    return {"model": model, "optim": optim}


def _apply(par, state) -> None:
    """Load ``state`` (read by dcp.load into ``_state``'s tensors) into the model and optimizer."""
    # torch: keeps start-up light
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    if hasattr(par.optimizer, "_inner"):  # its state was loaded in place, through the DTensor views
        set_model_state_dict(par.module, state["model"])
        return
    set_state_dict(par.module, par.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _own_bytes(folder: Path, rank: int) -> int:
    """Bytes of the files this rank wrote into a save (DCP names them ``__<rank>_<n>.distcp``), and rank
    0's metadata."""
    names = [p for p in folder.glob(f"__{rank}_*")] + ([folder / ".metadata"] if rank == 0 else [])
    return sum(p.stat().st_size for p in names if p.exists())


def restore_check(trained: list[float], restored: list[float], device_type: str) -> tuple[bool, float]:
    """Whether the losses trained again from the save equal those first trained: the first within
    ``RESTORE_RTOL``, the later ones within it on a CPU and ``DRIFT_RTOL_GPU`` on a GPU; and the largest
    relative difference."""
    rel = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(trained, restored)]
    later = RESTORE_RTOL if device_type == "cpu" else DRIFT_RTOL_GPU
    ok = all(r <= (RESTORE_RTOL if i == 0 else later) for i, r in enumerate(rel))
    return ok, max(rel, default=0.0)


def _staging(mode: str, device_type: str) -> str | None:
    """async's host buffers: pinned on a GPU, pageable on a CPU (pinning needs a GPU); sync has none."""
    if mode != "async":
        return None
    return "pinned" if device_type == "cuda" else "pageable"


def _stager(staging: str | None):
    """async: one stager for the phase, so its host buffers are made once and reused; DCP's default
    makes pageable copies at every save."""
    if staging is None:
        return None
    return PhaseStager(pinned=staging == "pinned")


class PhaseStager:
    """DCP's async stager for the phase: one ``StateDictStager``, whose host copies of the state's storages
    are made at the first save and refilled at the next. ``DefaultStager`` cannot be reused on every torch
    release (some close its copier after each stage), so the phase drives the copier itself and releases
    it once, at its end. Pinned buffers are filled with non-blocking copies and awaited here, so the
    save's blocking time covers the whole copy."""

    should_synchronize_after_execute = False

    def __init__(self, pinned: bool) -> None:
        from torch.distributed.checkpoint._state_dict_stager import StateDictStager  # torch: keeps start-up light

        self.pinned = pinned
        self.copier = StateDictStager(pin_memory=pinned, share_memory=False)

    def stage(self, state_dict):
        import torch  # torch: keeps start-up light

        staged = self.copier.stage(state_dict, non_blocking=self.pinned)
        if self.pinned:
            torch.cuda.synchronize()
        return staged

    def synchronize_staging(self) -> None:
        """Staging is synchronous (``stage`` returns the copies)."""

    def close(self) -> None:
        """DCP's call after a save on some releases: the buffers stay for the next one."""

    def release(self) -> None:
        self.copier.close()


def _save(par, folder: Path, mode: str, pg, t0: float, stager=None) -> dict[str, Any]:
    """One save, training stopped since ``t0`` (before its wait for the previous write): blocking seconds
    (the state gathered, and staged or written), and (async) the future whose callback stamps durable
    completion."""
    import torch.distributed.checkpoint as dcp  # torch: keeps start-up light

    state = _state(par)
    if mode == "sync":
        dcp.save(state, checkpoint_id=str(folder))
        t = time.perf_counter()
        return {"folder": folder, "t0": t0, "blocking_s": t - t0, "done": [t], "future": None}
    fut = dcp.async_save(state, checkpoint_id=str(folder), process_group=pg, async_stager=stager)
    blocking = time.perf_counter() - t0
    done: list[float] = []
    fut.add_done_callback(lambda f: done.append(time.perf_counter()))
    return {"folder": folder, "t0": t0, "blocking_s": blocking, "done": done, "future": fut}


def _finish(s: dict[str, Any], rank: int) -> dict[str, float]:
    if s["future"] is not None:
        s["future"].result()  # raises what the write raised
        while not s["done"]:  # the callback runs right after the result is set
            time.sleep(0.001)
    return {"blocking_s": s["blocking_s"], "durable_s": s["done"][0] - s["t0"],
            "bytes": float(_own_bytes(s["folder"], rank))}


def _device_type(par) -> str:
    return next(par.module.parameters()).device.type


def _root(cfg, out_dir: Path | None) -> Path:
    """The phase's folder, the same on every rank (rank 0 names it)."""
    import torch.distributed as dist  # torch: keeps start-up light

    name = [f"dlscale-checkpoint-{uuid.uuid4().hex[:12]}"]
    dist.broadcast_object_list(name, src=0)
    base = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else Path(out_dir or tempfile.gettempdir())
    return base / name[0]


def _reduce(values: list[float], op) -> list[float]:
    import torch  # torch: keeps start-up light
    import torch.distributed as dist  # torch: keeps start-up light

    t = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t, op=op)
    return [float(x) for x in t.cpu()]


def _restore(par, folder: Path, step, n: int, sync) -> list[float]:
    """Load a save into the model and optimizer, train ``n`` steps, their losses."""
    import torch.distributed.checkpoint as dcp  # torch: keeps start-up light

    state = _state(par)
    dcp.load(state, checkpoint_id=str(folder))
    _apply(par, state)
    losses: list[float] = []
    _timed_steps(step, n, sync, losses)
    return losses


def run_phase(cfg, denv, par, step, out_dir: Path | None, static: bool, sync) -> dict[str, Any]:
    """The checkpoint phase on every rank; what rank 0's result keeps (reduced over the ranks)."""
    import torch.distributed as dist  # torch: keeps start-up light

    every, mode = cfg.checkpoint_every, cfg.checkpoint_mode
    root = _root(cfg, out_dir)
    # async: the write's collectives run in a thread while training's run on the default group; a group of
    # their own (gloo: DCP's background collectives are on the CPU) keeps the two from interleaving
    pg = dist.new_group(backend="gloo") if mode == "async" else None
    device_type = _device_type(par)
    staging = _staging(mode, device_type)
    stager = _stager(staging)
    segments, saves, done, after_losses = [_timed_steps(step, every, sync)], [], [], []
    try:
        for k in range(SAVES):
            t = time.perf_counter()
            if saves:  # one write in flight at a time (as trainers do): training waits for the last one
                done.append(_finish(saves[-1], denv.rank))
            saves.append(_save(par, root / f"save{k}", mode, pg, t, stager))
            segments.append(_timed_steps(step, every, sync, after_losses if k == SAVES - 1 else None))
        done.append(_finish(saves[-1], denv.rank))
        dist.barrier()
        n = min(2, every)
        restored = _restore(par, saves[-1]["folder"], step, n, sync) if static else None
        worst = _reduce([x for d in done for x in (d["blocking_s"], d["durable_s"])], dist.ReduceOp.MAX)
        written = _reduce([d["bytes"] for d in done], dist.ReduceOp.SUM)
        restore = {"losses_trained": after_losses[:n], "losses_restored": restored, "restore_matches": None,
                   "restore_max_rel_diff": None}
        if restored is not None:
            ok, rel = restore_check(after_losses[:n], restored, device_type)
            restore["restore_matches"] = bool(_reduce([float(ok)], dist.ReduceOp.MIN)[0])
            restore["restore_max_rel_diff"] = _reduce([rel], dist.ReduceOp.MAX)[0]
    finally:
        if stager is not None:
            stager.release()
        dist.barrier()
        if denv.rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    return {"mode": mode, "every": every, "staging": staging, **summarise(segments, worst, written), **restore}


def summarise(segments: list[list[float]], worst: list[float], written: list[float]) -> dict[str, Any]:
    """Per save (``worst``: each save's blocking and durable seconds, slowest rank; ``written``: its bytes)
    blocking, durable, bytes and bandwidth; the steps' median before the first save (``segments[0]``)
    against those after the saves."""
    per = []
    for k, nbytes in enumerate(written):
        blocking, durable = worst[2 * k], worst[2 * k + 1]
        per.append({"blocking_s": blocking, "durable_s": durable, "bytes": int(nbytes),
                    "write_bytes_per_s": nbytes / durable if durable > 0 else None})
    before = statistics.median(segments[0]) if segments[0] else None
    after_steps = [x for seg in segments[1:] for x in seg]
    after = statistics.median(after_steps) if after_steps else None
    return {"saves": per, "step_ms_before": before, "step_ms_after": after,
            "step_effect": after / before - 1 if before and after is not None else None, "steps_ms": segments}


# ----------------------------------------------------------------------------- records and reports

def record_checkpoint(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The median repeat's ``checkpoint`` (else the first ok repeat's)."""
    rep = median_repeat_with(rec, "checkpoint")
    return rep["checkpoint"] if rep else None


def _median_save(c: dict[str, Any] | None, key: str) -> float | None:
    xs = [s.get(key) for s in (c or {}).get("saves") or [] if isinstance(s.get(key), (int, float))]
    return statistics.median(xs) if xs else None


def report_values(rec: dict[str, Any]) -> dict[str, float | None]:
    """Blocking and durable seconds and write bandwidth (medians over the saves), the steps' change."""
    c = record_checkpoint(rec)
    eff = (c or {}).get("step_effect")
    return {"blocking_s": _median_save(c, "blocking_s"), "durable_s": _median_save(c, "durable_s"),
            "write_bytes_per_s": _median_save(c, "write_bytes_per_s"),
            "step_effect": eff if isinstance(eff, (int, float)) else None}


def plan_estimate(params: int, nodes: int, write_bytes_per_s: float | None) -> dict[str, Any]:
    """``plan``'s checkpoint estimate: the state's bytes (``state_bytes``), the share of it each node writes
    (DCP spreads a save over every rank, replicated tensors included), and with a measured per-node write
    bandwidth (``micro io --write-dir``) the seconds a synchronous save blocks."""
    total = state_bytes(params)
    per_node = total / max(1, nodes)
    return {"state_bytes": total, "bytes_per_node": per_node, "write_bytes_per_s": write_bytes_per_s,
            "sync_save_s": per_node / write_bytes_per_s if write_bytes_per_s else None}


def console_line(rec: dict[str, Any]) -> str | None:
    """``run``'s line for the checkpoint phase of the median repeat; None without one."""
    c = record_checkpoint(rec)
    if not c:
        return None
    v = report_values(rec)
    eff = f"{v['step_effect'] * 100:+.0f} %" if v["step_effect"] is not None else "-"
    restore = {True: "restored to the same losses", False: "RESTORE DIFFERS", None: "restore not checked"}
    nbytes = statistics.median(s["bytes"] for s in c["saves"]) if c.get("saves") else 0
    return (f"# checkpoint ({c.get('mode')}, every {c.get('every')} steps, median of {len(c.get('saves') or [])} "
            f"saves): blocking {v['blocking_s']:.3g} s, durable {v['durable_s']:.3g} s, {nbytes / 1e6:.3g} MB at "
            f"{(v['write_bytes_per_s'] or 0) / 1e6:.3g} MB/s; steps after it {eff}; "
            f"{restore.get(c.get('restore_matches'), 'restore not checked')}"
            + (f" (largest relative difference {c['restore_max_rel_diff']:.1e})"
               if c.get("restore_max_rel_diff") is not None else ""))
