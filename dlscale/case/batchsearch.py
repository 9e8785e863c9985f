"""The largest per-device batch that fits: ``dlscale run --batch-size max`` and ``batch_sizes: [max]``.

The search doubles the batch from a start value until a probe runs out of memory (or the cap is
reached), then bisects between the last batch that fit and the first that did not. Each probe is
one short ``torchrun`` of the case (warm-up 2, steps 2, one repeat). Probes are *not* stored as run
records: the case is then measured at the batch found, and that one record carries
``batch_search = {start, cap, probes: [{batch_size, status, seconds, error}], max, capped, case_key}``
and ``config.batch_size`` the batch found. ``case_key`` there is the identity of the "max" case
(``RunConfig.case_key`` of the config with batch size "max"), which a resumed sweep matches on.

Rules (docs/sweeps.md says the same for users):

* a probe with status ``oom`` or ``timeout`` means "does not fit"; ``ok`` means it fits;
* a probe that fails in any other way (``failed``, ``unsupported``) stops the search, and the case
  is run once at that batch so that its record says what went wrong;
* nothing fits (batch 1 runs out of memory): the case is run at batch 1 and recorded ``oom``;
* the search never goes above the cap (default 4096 on GPUs; 64 on the CPU, where memory is
  virtual and runs never fail with OOM in practice, so the cap is the answer).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dlscale import ConfigError
from dlscale.case.config import RunConfig, resolve_device

DEFAULT_START = 8
DEFAULT_CAP = {"cuda": 4096, "cpu": 64}
PROBE_WARMUP, PROBE_STEPS = 2, 2
FIT = ("ok",)
NO_FIT = ("oom", "timeout")


def default_cap(device: str) -> int:
    return DEFAULT_CAP["cuda" if resolve_device(device) == "cuda" else "cpu"]


@dataclass
class SearchResult:
    start: int
    cap: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    max: int | None = None
    capped: bool = False  # the cap fitted: the real limit may be higher
    stopped: str | None = None  # why the search stopped early (a probe failed for another reason)
    stopped_at: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def search_max_batch(probe: Callable[[int], tuple[str, str | None, float]], start: int, cap: int,
                     on_probe: Callable[[dict[str, Any]], None] | None = None) -> SearchResult:
    """Double from ``start`` until a probe does not fit (or ``cap``), then bisect.

    ``probe(batch) -> (status, error, seconds)``; statuses as in run records.
    """
    if start < 1 or cap < 1:
        raise ConfigError(f"batch search: start and cap must be >= 1, got start {start}, cap {cap}")
    res = SearchResult(start=start, cap=cap)

    def attempt(b: int) -> str:
        status, error, seconds = probe(b)
        entry = {"batch_size": b, "status": status, "seconds": round(seconds, 2), "error": error}
        res.probes.append(entry)
        if on_probe:
            on_probe(entry)
        if status not in FIT + NO_FIT:
            res.stopped, res.stopped_at = f"probe at batch {b} {status}: {error}", b
        return status

    fit, no_fit = 0, None  # largest batch known to fit (0: none), smallest known not to
    b = min(start, cap)
    while True:
        s = attempt(b)
        if res.stopped:
            return res
        if s in FIT:
            fit = b
            if b >= cap:
                res.capped = True
                break
            b = min(b * 2, cap)
        else:
            no_fit = b
            break
    if no_fit is not None:
        while no_fit - fit > 1:
            mid = (fit + no_fit) // 2
            s = attempt(mid)
            if res.stopped:
                return res
            if s in FIT:
                fit = mid
            else:
                no_fit = mid
    res.max = fit or None
    return res


def probe_config(cfg: RunConfig, batch: int) -> RunConfig:
    """A short run at ``batch``; no utilisation sampling, breakdown, trace or checkpoint phase."""
    return dataclasses.replace(cfg, batch_size=batch, warmup=PROBE_WARMUP, steps=PROBE_STEPS, repeats=1,
                               monitor=False, breakdown=False, profile=False, max_batch_start=None,
                               max_batch_cap=None, checkpoint_every=None, checkpoint_mode="sync", checkpoint_dir=None)


def measure_max_batch(case, spawner, *, files_root=None, command: str | None = None,
                      on_event: Callable[[str, Any], None] | None = None,
                      on_probe: Callable[[dict[str, Any]], None] | None = None):
    """Find the largest batch that fits, then measure the case at it; returns the Record
    (``batch_search`` set), stored by the caller. ``case``: resolved (dlscale/case/resolve.py), or a
    RunConfig resolved here; its batch size is "max"; one node only. The probes' shape (few steps,
    one repeat) is checked once; each probe and the final run reuse the resolution."""
    from dlscale.case import launch  # torch: keeps start-up light
    from dlscale.case.resolve import ResolvedCase, resolve  # torch: keeps start-up light

    case = case if isinstance(case, ResolvedCase) else resolve(case)
    cfg = case.cfg
    start = cfg.max_batch_start or DEFAULT_START
    cap = cfg.max_batch_cap or default_cap(case.device_type)
    if cap < start:
        raise ConfigError(f"max-batch-cap {cap} is below max-batch-start {start}")
    probes = resolve(probe_config(cfg, start))

    def probe(b: int) -> tuple[str, str | None, float]:
        t = time.monotonic()
        try:
            rec = launch.measure(probes.with_config(probe_config(cfg, b)), spawner,
                                 command=command or "batch-size probe")
        except launch.Interrupted as e:  # a probe's record is never stored, interrupted or not
            raise KeyboardInterrupt(*e.args) from None
        return rec.status, rec.error, time.monotonic() - t

    result = search_max_batch(probe, start, cap, on_probe)
    final = result.max or result.stopped_at or min(p["batch_size"] for p in result.probes)
    info = result.to_dict()
    info["case_key"] = cfg.case_key()
    found = case.with_config(dataclasses.replace(cfg, batch_size=final, max_batch_start=None, max_batch_cap=None))
    try:
        rec = launch.measure(found, spawner, files_root=files_root, command=command, on_event=on_event)
    except launch.Interrupted as e:  # its finished repeats are stored with the search that chose the batch
        e.record.batch_search = info
        raise
    rec.batch_search = info
    return rec
