"""What cannot fit is not run: the memory plan of every candidate against the device's memory.

The plan (dlscale/planner/memplan.py) predicts allocated bytes per device; the capacity keeps a headroom
(``Headroom``) free for the CUDA context and the allocator's cache. As the search measures, the
headroom is checked: a measured peak above the plan's (GPUs: ``max_memory_allocated``; the CPU
records the process's RSS, not comparable, so not checked) scales every later plan up by that
ratio, and a candidate that ran out of memory although planned to fit scales the plan so that it
would not have fit. Gradient accumulation keeps the gradients alive through the next forward: its
plan adds them where the plan's peak is the start of the backward.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale import ConfigError
from dlscale.case.batchsearch import default_cap
from dlscale.case.config import resolve_device
from dlscale.planner.memplan import Workload, plan_memory

KEEP_BATCHES = 3  # without a requested batch: the largest per-device batches that fit, per configuration
OOM_MARGIN = 1.05  # after an OOM, the plan scaled so that the case it missed is 5 % over the capacity


@dataclass
class Headroom:
    """The capacity the plan is held to, and how it has been widened by measurements."""

    memory_bytes: float
    fraction: float = 0.10
    scale: float = 1.0  # planned peaks are multiplied by this (>= 1)
    events: list[str] = field(default_factory=list)

    @property
    def capacity(self) -> float:
        return self.memory_bytes * (1 - self.fraction)

    def fits(self, planned: float) -> bool:
        return planned * self.scale <= self.capacity

    def after_measured(self, planned: float | None, measured: float | None, what: str) -> bool:
        """A measured peak above the plan widens it; True when it did."""
        if not planned or not measured or measured <= planned * self.scale:
            return False
        self.scale = measured / planned
        self.events.append(f"{what}: measured peak {measured / 2**30:.2f} GiB over the plan's "
                           f"{planned / 2**30:.2f} GiB: later plans x{self.scale:.2f}")
        return True

    def after_oom(self, planned: float | None, what: str) -> bool:
        """An out-of-memory run the plan said would fit widens it; True when it did."""
        if not planned or planned * self.scale > self.capacity:
            return False
        self.scale = OOM_MARGIN * self.capacity / planned
        self.events.append(f"{what}: out of memory although planned at {planned / 2**30:.2f} GiB: "
                           f"later plans x{self.scale:.2f}")
        return True


def workload_of(cfg) -> Any:
    """The plan's Workload of a case (ConfigError: the model has no memory plan)."""
    from dlscale.models import get_model  # torch: keeps start-up light

    return Workload(get_model(cfg.model, cfg.flavor), cfg.precision, cfg.activation_checkpointing,
                    compiled=cfg.compile, device_type=resolve_device(cfg.device))


def planned_peak(cand) -> float | None:
    """The plan's bytes per device for a candidate, None where there is none."""
    if cand.layout is None:
        return None
    try:
        work = workload_of(cand.cfg)
        plan = plan_memory(work, cand.layout, cand.cfg.batch_size)
    except (ConfigError, KeyError, ValueError, ZeroDivisionError):
        return None
    peak = plan.peak
    if cand.cfg.grad_accum > 1 and plan.peak_at == "backward start":
        peak += plan.params - plan.grads  # the accumulated gradients beside the next micro-batch's activations
    return peak


def prune_memory(cands: list, headroom: Headroom) -> None:
    """Mark the runnable candidates whose plan does not fit (sets planned_peak once)."""
    for c in cands:
        if c.pruned is not None:
            continue
        if c.planned_peak is None:
            c.planned_peak = planned_peak(c)
        if c.planned_peak is None:
            continue
        if headroom.fits(c.planned_peak):
            continue
        c.pruned, c.pruned_by = (f"planned {c.planned_peak * headroom.scale / 2**30:.2f} GiB per device, over "
                                 f"{headroom.capacity / 2**30:.2f} GiB usable"), "memory"


def keep_largest_batches(cands: list, given_batch: bool) -> None:
    """Without a requested batch or global batch: of each configuration, only the KEEP_BATCHES
    largest per-device batches that fit are run (a smaller batch is rarely faster per sample)."""
    if given_batch:
        return
    groups: dict[tuple, list] = {}
    for c in cands:
        if c.pruned is None:
            cfg = c.cfg
            key = (cfg.strategy, str(sorted(cfg.strategy_options.items())), cfg.precision, cfg.compile,
                   cfg.compile_mode, cfg.activation_checkpointing, cfg.grad_accum)
            groups.setdefault(key, []).append(c)
    for group in groups.values():
        group.sort(key=lambda c: -c.cfg.batch_size)
        for c in group[KEEP_BATCHES:]:
            c.pruned, c.pruned_by = (f"batch {c.cfg.batch_size}: {KEEP_BATCHES} larger batches of it fit "
                                     f"(--batch-size asks for it)"), "smaller batch"


def default_batches(device_type: str, planned: bool) -> tuple[int, ...]:
    """Per-device batches tried when none is asked for: powers of two up to the batch search's cap
    where the memory plan prunes them; a few small ones where there is no plan."""
    cap = default_cap(device_type)
    if not planned:
        return (8, 16, 32)
    out, b = [], 1
    while b <= cap:
        out.append(b)
        b *= 2
    return tuple(out)
