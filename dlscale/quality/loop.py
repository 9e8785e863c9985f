"""The worker's --until loop: timed chunks of training steps, an evaluation between chunks.

Steps run in chunks that end at every ``--eval-every``-th optimizer step (and at the end of the
warm-up); each chunk is timed as the main window is (device sync and barrier at both ends, the
slowest rank's seconds), with nothing but fetch, learning-rate update and step inside. The
evaluation (eval mode, no gradients, the validation split's first ``--eval-batches`` global
batches, each rank its data-parallel slice, the global mean) runs between chunks, outside the
timed steps. Time to target = the training seconds of every step up to the evaluation that met
the target (warm-up steps included: they train the model; compile time is in the warm-up);
wall to target adds the evaluations. The run stops at the target, at warm-up + --max-steps, or
when the next chunk and evaluation would pass the case's time limit: not reached is a result.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_pre_hook

from dlscale.case import progress
from dlscale.inputs.spec import parse_data
from dlscale.quality.target import eval_data_text, horizon, lr_at, parse_target, peak_lr
from dlscale.results import parity
from dlscale.train import precision

# the share of --time-limit (at least RESERVE_S) kept for start-up before the loop and the
# checks and record after it, so the loop stops itself before the launcher's kill
RESERVE_SHARE, RESERVE_S = 0.15, 5.0
PROGRESS_S = 5.0  # at most one progress line this often (rank 0's stdout, read by the launcher)


@dataclass
class Hooks:
    """What the worker hands the loop: its step, batch fetch (None: synthetic), failure hook, and
    the module to evaluate (the eager one: no recompilation for eval mode)."""

    step: Callable[[], Any]
    fetch: Callable[[], Any] | None
    inject: Any
    module: torch.nn.Module | None


@dataclass
class _State:
    steps: int = 0
    warm_s: float = 0.0
    window_s: float = 0.0
    local_window_s: float = 0.0
    window_steps: int = 0
    eval_s: float = 0.0
    step_ms: list[float] = field(default_factory=list)
    warm_ms: list[float] = field(default_factory=list)
    waits: list[float] = field(default_factory=list)
    warm_losses: list[float | None] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)
    window_wall: list[float] = field(default_factory=list)
    loss: Any = None
    reached: bool = False
    reason: str | None = None
    global_batch: int = 0
    peak_lr: float = 0.0
    lr: float = 0.0  # the rate of the step being taken


class Evaluator:
    """The validation loss of the model as it is now, the same on every rank."""

    def __init__(self, cfg, spec, par, module, denv):
        from dlscale.inputs import tokens  # triton: keeps start-up light

        self.par, self.module, self.denv, self.cfg = par, module, denv, cfg
        data = parse_data(eval_data_text(cfg))
        self.path = data.path
        seq, vocab = int(spec.seq_len), int(spec.arch.vocab)
        if spec.data_kind == "mlm-nsp":
            ds = tokens.BertPairs(data.path, data.dtype, seq, vocab, cfg.seed, float(spec.extra["mlm_prob"]))
        else:
            ds = tokens.TokenWindows(data.path, data.dtype, seq, vocab, cfg.seed)
        b = cfg.batch_size * par.devices_per_process
        g = cfg.batch_size * par.dp_size
        self.samples = g * cfg.eval_batches
        self.batches = []
        for j in range(cfg.eval_batches):  # fixed: the first global batches of the split, in order
            *tensors, _meta = ds.__getitems__([(0, j * g + par.dp_rank * b + k) for k in range(b)])
            self.batches.append(tuple(t.to(denv.device) for t in tensors))
        self.autocast = precision.autocast_factory(cfg.precision, denv.device.type)

    def _one(self, batch: tuple):
        if self.par.eval_loss is not None:
            return self.par.eval_loss(batch)
        if self.par.step is not None or self.module is None:
            return None
        with torch.no_grad(), self.autocast():
            return self.module(*batch)

    def __call__(self) -> float | None:
        training = self.module.training if self.module is not None else None
        if self.module is not None:
            self.module.eval()  # dropout off: the evaluation is deterministic
        try:
            losses = [self._one(b) for b in self.batches]
        finally:
            if training is not None:
                self.module.train(training)
        if any(x is None for x in losses):
            return None
        mean = torch.stack([x.detach().float().reshape(()) for x in losses]).mean()
        return parity.global_loss(mean, self.par, self.denv)


def _barrier(denv) -> None:
    if denv.device.type == "cuda":
        torch.cuda.synchronize(denv.device)
        dist.barrier(device_ids=[denv.local_rank])
    else:
        dist.barrier()


def _apply_lr(opt, lr: float) -> None:
    """Set the rate of the optimizer about to step. A global step pre-hook reaches the torch
    optimizer that really steps, whatever the strategy wraps around it (FSDP's shard-local
    optimizer builds its inner one at the first step; ZeRO and DDP's in-backward update step
    inner ones)."""
    for group in opt.param_groups:
        if "lr" not in group:
            continue
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def _chunk(cfg, denv, par, hooks: Hooks, st: _State, n: int, plan) -> tuple[float, list[float]]:
    """``n`` timed steps from step ``st.steps``: (seconds on this rank, per-step ms)."""
    cuda = denv.device.type == "cuda"
    warm = st.steps < cfg.warmup
    events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)] if cuda else None
    marks = [0.0] * (n + 1)
    warm_raw = []  # warm-up steps' losses as the step returned them, read after the chunk's timing
    _barrier(denv)
    t0 = marks[0] = time.perf_counter()
    if cuda:
        events[0].record()
    for i in range(n):
        s = st.steps + i
        hooks.inject.check(s)
        st.lr = plan(s)  # applied by the optimizer step pre-hook (train_until)
        if hooks.fetch is not None:
            ta = time.perf_counter()
            hooks.fetch()
            st.waits.append(time.perf_counter() - ta)
        st.loss = hooks.step()
        if warm:  # as the main warm-up: each step's loss, kept (reading it is a host sync)
            warm_raw.append(st.loss if par.reports_loss else None)
        if cuda:
            events[i + 1].record()
        marks[i + 1] = time.perf_counter()
    _barrier(denv)
    seconds = time.perf_counter() - t0
    # every rank read the same number of losses: the collective global_loss may hold stays in step
    st.warm_losses += [parity.global_loss(loss, par, denv) for loss in warm_raw]
    if cuda:
        ms = [events[i].elapsed_time(events[i + 1]) for i in range(n)]
    else:
        ms = [(marks[i + 1] - marks[i]) * 1e3 for i in range(n)]
    return seconds, ms


def _agree(denv, chunk_s: float, late: bool, hit: bool) -> tuple[float, bool, bool]:
    """The slowest rank's chunk seconds; whether any rank is out of time, and whether any met the
    target: every rank stops together (a strategy whose ranks do not all hold the loss cannot hang)."""
    t = torch.tensor([chunk_s, float(late), float(hit)], dtype=torch.float64, device=denv.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0].item()), bool(t[1].item()), bool(t[2].item())


def _account(cfg, st: _State, n: int, seconds: float, local_s: float, ms: list[float]) -> None:
    if st.steps < cfg.warmup:
        st.warm_s += seconds
        st.warm_ms += ms
    else:
        st.window_s += seconds
        st.local_window_s += local_s
        st.window_steps += n
        st.step_ms += ms
    st.steps += n


def _next_stop(cfg, steps: int, total: int) -> int:
    nxt = (steps // cfg.eval_every + 1) * cfg.eval_every
    if steps < cfg.warmup:
        nxt = min(nxt, cfg.warmup)
    return min(nxt, total)


def train_until(cfg, denv, result: dict[str, Any], par, spec, hooks: Hooks) -> _State:
    """Train until the target, the step budget or the time budget; fills ``result`` as the main
    warm-up and window do (warm-up losses, window seconds and steps, step times) plus ``quality``."""
    target = parse_target(cfg.until)
    total = horizon(cfg)
    st = _State(global_batch=cfg.batch_size * cfg.grad_accum * par.dp_size)
    st.peak_lr = peak_lr(cfg, float(spec.lr), st.global_batch)  # the model's rate: make_optimizer's

    def plan(s: int) -> float:
        return lr_at(s, st.peak_lr, cfg.lr_schedule, cfg.lr_warmup, total)

    marks = result.setdefault("marks", {})
    deadline = marks.get("started", time.time()) + cfg.time_limit - max(RESERVE_S, RESERVE_SHARE * cfg.time_limit)
    evaluate = Evaluator(cfg, spec, par, hooks.module, denv)
    val = evaluate()
    st.curve.append(_point(st, val, None, 0.0))
    progress.phase("until", "start", denv.rank)

    hook = register_optimizer_step_pre_hook(lambda opt, args, kwargs: _apply_lr(opt, st.lr))
    try:
        _loop(cfg, denv, par, hooks, st, (target, total, plan, evaluate, deadline, marks))
    finally:
        hook.remove()
    progress.phase("until", "end", denv.rank)
    result["nonfinite_losses"] = sum(1 for x in st.warm_losses if x is None) if par.reports_loss else 0
    _fill_result(cfg, result, st, target, evaluate)
    return st


def _loop(cfg, denv, par, hooks: Hooks, st: _State, run: tuple) -> None:
    """Chunks and evaluations until the target, the step budget or the time budget."""
    target, total, plan, evaluate, deadline, marks = run
    val = st.curve[-1]["val"]
    wall0 = shown = time.time()
    if cfg.warmup == 0:
        marks["warmed_up"] = wall0
    stop = False
    while not stop:  # the target is checked from the first evaluation after training
        n = _next_stop(cfg, st.steps, total) - st.steps
        if st.steps >= cfg.warmup and not st.window_wall:
            st.window_wall.append(time.time())
        local_s, ms = _chunk(cfg, denv, par, hooks, st, n, plan)
        if st.steps + n == cfg.warmup:
            marks["warmed_up"] = time.time()
        evaluating = (st.steps + n) % cfg.eval_every == 0 or st.steps + n == total
        te = time.perf_counter()
        val = evaluate() if evaluating else val
        eval_s = time.perf_counter() - te
        st.reached = evaluating and target.reached(val)
        seconds, late, hit = _agree(denv, local_s, time.time() + local_s + eval_s > deadline, st.reached)
        _account(cfg, st, n, seconds, local_s, ms)
        st.eval_s += eval_s
        if not evaluating:
            continue
        train_loss = parity.global_loss(st.loss if par.reports_loss else None, par, denv)
        st.curve.append(_point(st, val, train_loss, time.time() - wall0))
        st.reason = None if st.reached else _why_stop(val, st.steps, total, late, cfg)
        if hit and not st.reached:
            st.reason = f"another rank's evaluation met the target; this rank's gave {val}"
        stop = hit or st.reached or st.reason is not None
        if time.time() - shown >= PROGRESS_S:
            shown = time.time()
            progress.phase("until", "progress", denv.rank, step=st.steps, of=total)


def _why_stop(val, steps: int, total: int, late: bool, cfg) -> str | None:
    if val is None:
        return f"strategy {cfg.strategy} gives no validation loss"
    if steps >= total:
        return f"not reached in {total} steps (warm-up {cfg.warmup} + max-steps {total - cfg.warmup})"
    if late:
        return (f"time limit: the next {cfg.eval_every} steps and evaluation would pass --time-limit "
                f"{cfg.time_limit:g} s (less the reserve for start-up and the record)")
    return None


def _point(st: _State, val, train_loss, wall_s: float) -> dict[str, Any]:
    return {"step": st.steps, "samples": st.steps * st.global_batch, "train_s": round(st.warm_s + st.window_s, 6),
            "wall_s": round(wall_s, 6), "val": val, "train_loss": train_loss}


def _fill_result(cfg, result, st: _State, target, ev) -> None:
    if not st.window_steps:  # stopped inside the warm-up: its steps are the only timed ones
        window_s, local_s, window_steps, step_ms = st.warm_s, st.warm_s, st.steps, st.warm_ms
    else:
        window_s, local_s, window_steps, step_ms = st.window_s, st.local_window_s, st.window_steps, st.step_ms
    now = time.time()
    result.update({
        "warmup_s": st.warm_s, "warmup_losses": st.warm_losses, "loss_scope": parity.LOSS_SCOPE,
        "status": "ok", "window_s": window_s, "local_window_s": local_s, "window_steps": window_steps,
        "window_wall": [st.window_wall[0] if st.window_wall else now - window_s, now], "step_times_ms": step_ms,
    })
    marks = result.setdefault("marks", {})
    marks.setdefault("warmed_up", now)
    marks["window_done"] = now
    last = st.curve[-1]
    vals = [p["val"] for p in st.curve if p["val"] is not None]
    reached, gb = st.reached, st.global_batch
    result["quality"] = {
        "target": target.text, "metric": target.metric, "reached": reached, "reason": st.reason,
        "seed": cfg.seed, "global_batch": gb, "max_steps": horizon(cfg) - cfg.warmup,
        "steps_to_target": last["step"] if reached else None,
        "samples_to_target": last["samples"] if reached else None,
        "time_to_target_s": last["train_s"] if reached else None,
        "wall_to_target_s": last["wall_s"] if reached else None,
        "steps_trained": st.steps, "samples_trained": st.steps * gb, "train_s": st.warm_s + st.window_s,
        "eval_s": st.eval_s, "final_val": last["val"], "best_val": min(vals) if vals else None,
        "window_includes_warmup": not st.window_steps,
        "eval": {"data": ev.path, "batches": cfg.eval_batches, "samples": ev.samples, "every": cfg.eval_every},
        "lr": {"peak": st.peak_lr, "schedule": cfg.lr_schedule, "warmup": cfg.lr_warmup, "scale": cfg.lr_scale,
               "ref_batch": cfg.lr_ref_batch or cfg.batch_size * cfg.grad_accum},
        "curve": st.curve,
    }

