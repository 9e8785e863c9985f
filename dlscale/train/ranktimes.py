"""Every rank's step times, and which rank is slow: gathered after the timed window, never inside it.

In synchronous data-parallel training every rank's step boundary waits for the slowest rank's
gradients, so the window's step times are the same on every rank: they show *that* the job is slow,
not *which* rank made it so. Each rank therefore also times a few *solo* steps after the window:
forward and backward under the strategy's ``no_sync`` (no gradient communication, no optimizer step),
each step closed by a device sync. For strategies whose forward and backward have no collective under
``no_sync`` (``Capabilities.solo_steps``) these are the rank's own compute speed; for the others (FSDP's
all-gathers, tensor and pipeline parallel) no attribution is possible and none is claimed.

``gather`` (worker, after the window) collects one ``RankSteps`` per rank on rank 0; ``slowest``
(pure) names the slowest rank against the median of the others; ``validity`` flags a ``straggler``
where the gap passes ``Thresholds.straggler_gap`` and the two step distributions separate.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from dlscale.results.metrics import percentile
from dlscale.results.record import median_repeat_with

SOLO_STEPS = 5  # solo steps timed per rank after the window (the first one more, untimed)


@dataclass(frozen=True)
class RankSteps:
    """One rank's step times: the window's (summarised) and the solo steps' (ms)."""

    rank: int
    host: str
    device: str
    window_median_ms: float | None
    window_p90_ms: float | None
    solo_ms: list[float] | None = None  # None: no solo steps (strategy with collectives in its forward)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarise(rank: int, host: str, device: str, window_ms: list[float], solo_ms: list[float] | None) -> RankSteps:
    return RankSteps(rank, host, device, statistics.median(window_ms) if window_ms else None,
                     percentile(window_ms, 90) if window_ms else None, solo_ms)


@dataclass(frozen=True)
class SoloInputs:
    """What the solo steps run: the strategy's parallel model, this rank's batches and autocast context,
    ``before_step`` (the slow-rank injection's sleep, part of the rank's step) and ``module`` (default
    the strategy's; the worker passes the module before torch.compile)."""

    par: Any
    batches: list[tuple]
    autocast: Any
    before_step: Callable[[], None] | None = None
    module: Any = None


def solo_steps(run: SoloInputs, device, n: int = SOLO_STEPS) -> list[float] | None:
    """``n`` forward/backward steps of ``run.module`` under ``par.no_sync`` (no optimizer step), each timed
    to a device sync (ms); the gradients are dropped after. None where the strategy runs its own step."""
    import torch  # torch: keeps start-up light

    par, autocast, before_step = run.par, run.autocast, run.before_step
    if par.step is not None:
        return None
    module, opt = run.module if run.module is not None else par.module, par.optimizer
    out = []
    for i in range(n + 1):  # the first: no_sync's own first-use costs, untimed
        t = time.perf_counter()
        if before_step is not None:  # the slow-rank injection's sleep is part of the rank's step
            before_step()
        with par.no_sync():
            for b in run.batches:
                with autocast():
                    loss = module(*b)
                with par.backward_context():
                    loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i:
            out.append((time.perf_counter() - t) * 1e3)
    opt.zero_grad(set_to_none=True)  # what no_sync accumulated must not reach a later step
    return out


def gather(mine: RankSteps) -> list[dict[str, Any]] | None:
    """Every rank's ``RankSteps`` as dicts on rank 0 (a collective: every rank calls it, after the window);
    None on the other ranks."""
    import torch.distributed as dist  # torch: keeps start-up light

    world = dist.get_world_size()
    got: list[Any] = [None] * world
    dist.all_gather_object(got, mine.to_dict())
    return got if dist.get_rank() == 0 else None


def _stats(r: dict[str, Any], basis: str) -> tuple[float, float, float] | None:
    """(p25, median, p75) of a rank's steps on ``basis`` (solo: its solo steps; window: its median only)."""
    if basis == "solo":
        xs = [float(x) for x in r.get("solo_ms") or [] if isinstance(x, (int, float))]
        return (percentile(xs, 25), statistics.median(xs), percentile(xs, 75)) if xs else None
    m = r.get("window_median_ms")
    return (m, m, m) if isinstance(m, (int, float)) else None


def slowest(ranks: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The slowest rank against the others: its median step, the median of the others' medians, the gap
    (ratio - 1), and whether the distributions separate (its 25th percentile above every other rank's
    75th). Solo steps where every rank has them, else the window's medians. None for fewer than 2 ranks."""
    ranks = [r for r in ranks or [] if isinstance(r, dict)]
    if len(ranks) < 2:
        return None
    basis = "solo" if all(r.get("solo_ms") for r in ranks) else "window"
    stats = [(r, _stats(r, basis)) for r in ranks]
    stats = [(r, s) for r, s in stats if s is not None]
    if len(stats) < 2:
        return None
    slow, (p25, med, _) = max(stats, key=lambda x: x[1][1])
    others = [s for r, s in stats if r is not slow]
    rest = statistics.median(s[1] for s in others)
    return {"rank": slow.get("rank"), "host": slow.get("host"), "device": slow.get("device"), "basis": basis,
            "median_ms": med, "others_median_ms": rest, "gap": med / rest - 1 if rest > 0 else None,
            "separated": p25 > max(s[2] for s in others), "ranks": len(stats)}


def record_slowest(rec: dict[str, Any]) -> dict[str, Any] | None:
    """``slowest`` of the record's median repeat (or the first ok repeat with per-rank steps)."""
    rep = median_repeat_with(rec, "rank_steps", ok_only=True, test=bool)
    return slowest(rep.get("rank_steps")) if rep else None


def gap_pct(rec: dict[str, Any]) -> float | None:
    """The slowest rank's gap over the others' median, % (the report's per-rank column)."""
    s = record_slowest(rec)
    return None if s is None or s.get("gap") is None else s["gap"] * 100.0


def measure(cfg, denv, result: dict[str, Any], run: SoloInputs) -> None:
    """Worker hook after the window: time the solo steps where they run alone, gather every rank's steps,
    and keep them in rank 0's result (``rank_steps``). Single-process cases have no other rank. The solo
    steps run ``run.module``, the module before torch.compile (no_sync would make a compiled one
    recompile); every rank runs the same, so the ranks compare alike."""
    if denv.world_size < 2:
        return
    from dlscale.strategies import get_strategy  # the registry imports torch; reports read this module without it

    solo = solo_steps(run, denv.device) if get_strategy(cfg.strategy).caps.solo_steps else None  # alone: no_sync
    mine = summarise(denv.rank, str(result.get("host")), str(denv.device), list(result.get("step_times_ms") or []),
                     solo)
    got = gather(mine)
    if got is not None:
        result["rank_steps"] = got
