"""Measure the ranked candidates for real, within the budget, resumably.

Each candidate is one ordinary case (``launch.measure``: its repeats in fresh processes, warm-up
skipped, validity assessed), appended to the store as a record labelled ``tune:<id>``. A case
whose record with that label is already there (status ok, oom or unsupported) is read back, not
measured again: an interrupted or budget-stopped tune carries on where it stopped. The first
``top`` runnable candidates are measured; after them, a candidate is measured only while it could
still win: its predicted throughput times the largest measured/predicted ratio seen so far (how
far the model has under-predicted) reaches the best measured median less that one's spread.
Before each case, the mean duration of the cases measured so far must fit in the budget left.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dlscale import DlscaleError
from dlscale.console import validity_suffix
from dlscale.fmt import fmt_hms
from dlscale.report.data import Row, rec_label
from dlscale.results import validity
from dlscale.results.record import newest_per_key
from dlscale.results.store import StoreError
from dlscale.tune.prune import Headroom, prune_memory

MIN_CASE_LIMIT_S = 60.0  # the shortest per-repeat time limit the budget gives a case (starting alone takes seconds)
RESUMED_STATUSES = ("ok", "oom", "unsupported")  # results; interrupted, failed and timeout cases run again
# flags that make a measurement no answer (not just a noisy one): the loss broke, steps were skipped,
# fewer repeats than asked for
INVALID_CHECKS = ("loss_nonfinite", "loss_diverged", "skipped_steps", "interrupted")


@dataclass
class Measurement:
    ranked: Any  # rank.Ranked
    record: dict[str, Any]
    resumed: bool = False
    seconds: float = 0.0
    global_batch: int | None = None  # the global batch asked for (None: any)

    # the record never changes once measured: its median and verdict are read once, not per access
    @functools.cached_property
    def median(self) -> float | None:
        row = Row(self.record)
        return row.median if row.ok else None

    @functools.cached_property
    def invalid(self) -> str | None:
        """Why this measurement cannot be the answer (None: it can)."""
        if self.record.get("status") != "ok":
            return f"status {self.record.get('status')}: {' '.join(str(self.record.get('error') or '').split())[:160]}"
        if self.median is None:
            return "no throughput measured"
        bad = [f for f in validity.assess(self.record).flags if f.check in INVALID_CHECKS]
        if bad:
            return f"{bad[0].check}: {bad[0].reason}"
        return _global_batch_kept(self.record, self.global_batch)


def _global_batch_kept(rec: dict[str, Any], wanted: int | None) -> str | None:
    got = rec.get("global_batch")
    if wanted is None or got is None or got == wanted:
        return None
    return f"trained a global batch of {got}, not the {wanted} asked for"


@dataclass
class Search:
    """The state of one tune's measurements (what the result reads)."""

    label: str
    ranked: list  # rank.Ranked, best predicted first
    headroom: Headroom
    top: int
    budget_s: float
    global_batch: int | None = None
    measured: list[Measurement] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # case key -> why it was not measured
    stopped: str | None = None  # "budget", "interrupted" or None (every contender measured)
    spent_s: float = 0.0  # seconds of the cases measured by this invocation
    interrupt: BaseException | None = None  # the signal that stopped it (launch.Interrupted keeps a record)

    def valid(self) -> list[Measurement]:
        out = [m for m in self.measured if m.invalid is None]
        return sorted(out, key=lambda m: -(m.median or 0.0))

    def could_win(self, r) -> bool:
        best = self.valid()
        if not best or r.predicted_samples_per_s is None:
            return True
        top = best[0]
        ratios = [m.median / m.ranked.predicted_samples_per_s for m in best if m.ranked.predicted_samples_per_s]
        if not ratios:
            return True
        stats = (top.record.get("summary") or {}).get("samples_per_s") or {}
        spread = ((stats.get("max") or top.median) - (stats.get("min") or top.median)) / top.median
        return r.predicted_samples_per_s * max(ratios) >= top.median * (1 - spread)

    def mean_s(self) -> float | None:
        """Seconds a case has taken here so far (None: none measured yet by this invocation)."""
        fresh = [m.seconds for m in self.measured if not m.resumed]
        return sum(fresh) / len(fresh) if fresh else None

    def eta_s(self, remaining: int) -> float | None:
        mean = self.mean_s()
        return None if mean is None else min(mean * remaining, max(0.0, self.budget_s - self.spent_s))


def resumable(records: list[dict[str, Any]], label: str) -> dict[str, dict[str, Any]]:
    """Case key -> the newest record of this tune with a result (what a rerun reads back)."""
    return newest_per_key(records, lambda r: [r.get("case_key")] if (
        r.get("kind") == "run" and rec_label(r) == label and r.get("status") in RESUMED_STATUSES) else [])


def run(search: Search, done: dict[str, dict[str, Any]], measure_case: Callable, say: Callable[[str], None]) -> None:
    """Walk the ranking: read back, measure, or skip each candidate. Ctrl-C (or SIGTERM) stops the
    walk: ``search.interrupt`` keeps the signal (and the running case's finished repeats, for the
    caller to store); what was measured stays."""
    todo = [r for r in search.ranked if r.candidate.pruned is None]
    try:
        _walk(search, todo, done, measure_case, say)
    except KeyboardInterrupt as e:
        search.stopped, search.interrupt = "interrupted", e
    why = {"budget": "not measured: the budget was spent", "interrupted": "not measured: interrupted"}
    for r in todo:
        if r.candidate.pruned is None and r.candidate.key not in search.skipped and \
                not any(m.ranked is r for m in search.measured):
            search.skipped[r.candidate.key] = why.get(search.stopped or "", "not measured")


def _walk(search: Search, todo: list, done: dict[str, dict[str, Any]], measure_case: Callable,
          say: Callable[[str], None]) -> None:
    for i, r in enumerate(todo):
        c = r.candidate
        if c.pruned is not None:  # pruned since: the headroom was widened
            continue
        if c.key in done:
            m = Measurement(r, done[c.key], resumed=True, global_batch=search.global_batch)
            search.measured.append(m)
            _check_headroom(search, m)  # a stored OOM or peak widens the plan as a fresh one does
            say(progress_line(search, m, len(todo) - i - 1))
            continue
        if len(search.valid()) >= search.top and not search.could_win(r):
            search.skipped[c.key] = "could not win: its prediction, corrected by the measured ones, is below the best"
            continue
        est = search.mean_s()
        if est is not None and search.spent_s + est > search.budget_s:
            search.stopped = "budget"
            return
        m = _measure(search, r, measure_case)
        if m is not None:
            say(progress_line(search, m, len(todo) - i - 1))


def adopt_stored(search: Search, records: list[dict[str, Any]]) -> None:
    """After an interrupt: a case whose record reached the store just before the signal (the signal
    came as it was being returned) counts as measured, as a rerun would read it back."""
    done = resumable(records, search.label)
    have = {m.ranked.candidate.key for m in search.measured}
    for r in search.ranked:
        k = r.candidate.key
        if k in done and k not in have:
            search.measured.append(Measurement(r, done[k], resumed=True, global_batch=search.global_batch))
            search.skipped.pop(k, None)


def _measure(search: Search, r, measure_case: Callable) -> Measurement | None:
    c = r.candidate
    t = time.monotonic()
    # a case that hangs must not take more than the budget left: each repeat gets its share of it
    share = max(MIN_CASE_LIMIT_S, (search.budget_s - search.spent_s) / c.cfg.repeats)
    cfg = dataclasses.replace(c.cfg, time_limit=min(c.cfg.time_limit, share))
    try:
        rec = measure_case(cfg)
    except StoreError:  # the store stopped taking records: the next ones would be lost too
        raise
    except DlscaleError as e:  # cannot start here after all: next candidate
        c.pruned, c.pruned_by = f"could not start: {e}", "invalid"
        return None
    finally:
        search.spent_s += time.monotonic() - t
    m = Measurement(r, rec, seconds=time.monotonic() - t, global_batch=search.global_batch)
    search.measured.append(m)
    _check_headroom(search, m)
    return m


def _check_headroom(search: Search, m: Measurement) -> None:
    """Widen the plan's headroom from what this case measured; prune again what no longer fits."""
    c = m.ranked.candidate
    rec = m.record
    widened = False
    if rec.get("status") == "oom":
        widened = search.headroom.after_oom(c.planned_peak, c.describe())
    elif rec.get("status") == "ok" and rec.get("device_type") == "cuda":
        peak = (rec.get("summary") or {}).get("peak_mem_allocated_bytes")
        widened = search.headroom.after_measured(c.planned_peak, peak, c.describe())
    if widened:
        prune_memory([r.candidate for r in search.ranked if not any(x.ranked is r for x in search.measured)],
                     search.headroom)


def progress_line(search: Search, m: Measurement, left: int) -> str:
    """One line per candidate: what it gave, the time spent and left against the budget."""
    c = m.ranked.candidate
    unit = ((m.record.get("model") or {}).get("unit") or "sample")
    what = f"{m.median:,.1f} {unit}/s" if m.median is not None else str(m.record.get("status")).upper()
    bad = m.invalid
    how = "resumed from the store" if m.resumed else f"{m.seconds:.1f} s"
    return (f"# tune [{len(search.measured)}] {c.describe()}: {what}{validity_suffix(m.record)}"
            f"{' (not valid: ' + bad + ')' if bad and m.median is not None else ''} [{how}]; "
            f"spent {fmt_hms(search.spent_s)} of {fmt_hms(search.budget_s)}, ETA {fmt_hms(search.eta_s(left))}")


def stderr_say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
