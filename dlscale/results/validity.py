"""Is a measured number sound? Checks computed from a record's own data, and from a comparison.

``assess(record) -> Validity`` is a pure function of one run record: the launcher stores its
result under ``record["validity"]`` and the reports recompute it (so records written before a
check existed are checked too, with today's thresholds). ``compare_flags(case, baseline, ...)``
judges a speedup or scaling efficiency between two records. Every threshold is in
``THRESHOLDS`` and documented in docs/metrics.md ("Validity").

A flag of severity ``warn`` says the number may be wrong (above-ideal scaling, competing load,
throttling, drift, a stall, a noisy or too short window, a non-finite loss); ``note`` says a claim is
weak (a spread from too few repeats or steps) or the run is not what it seems (a loss that rose far).
A check that cannot run (no utilisation sampled, an old record) is listed under ``unchecked`` with
the reason, never passed silently.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from dlscale.train import ranktimes
from dlscale.results.store import MEASURED_STATUSES

WARN = "warn"
NOTE = "note"


@dataclass(frozen=True)
class Thresholds:
    """The bounds a sound measurement stays within (docs/metrics.md explains each)."""

    min_window_s: float = 1.0  # shortest timed window of a repeat: a few tenths of a second is noise
    min_steps: int = 10  # timed steps per repeat for step-time percentiles and the drift check
    min_repeats: int = 3  # repeats for a spread (stdev, min–max) to be an estimate
    max_cv: float = 0.05  # coefficient of variation of samples/s over the repeats
    max_drift: float = 0.10  # |median step time, 2nd half / 1st half - 1| within one repeat's window
    min_drift_steps: int = 8  # fewer timed steps: the drift and stall checks do not run
    stall_factor: float = 3.0  # a step longer than this x its repeat's median step is a stall
    max_stall_share: float = 0.02  # stalls' time beyond the median, share of the repeat's window
    max_other_cpu_pct: float = 10.0  # CPU used by processes outside the case, % of the case's cores
    max_steal_pct: float = 5.0  # CPU time the hypervisor gave other guests, % of the host's CPU time
    max_throttle_frac: float = 0.05  # share of GPU samples with a thermal/hardware clock slowdown
    noise_k: float = 2.0  # above-ideal scaling counts when efficiency - 1 > noise_k x combined CV
    max_breakdown_gap: float = 0.05  # |breakdown's step / the window's median step - 1|
    loss_diverged_factor: float = 10.0  # loss_after over the first warm-up loss (medians over repeats)
    straggler_gap: float = 0.10  # slowest rank's median step / the others' median - 1 (and the two separate)


THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Flag:
    """One reason a number is not plain: ``check`` names the check, ``reason`` says it with numbers."""

    check: str
    reason: str
    severity: str = WARN
    value: float | None = None
    limit: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Flag":
        return cls(str(d.get("check")), str(d.get("reason")), str(d.get("severity") or WARN),
                   _num(d.get("value")), _num(d.get("limit")))

    @property
    def marker(self) -> str:
        """A short mark for table cells: ``!`` for warn, ``?`` for note."""
        return "!" if self.severity == WARN else "?"


@dataclass
class Validity:
    flags: list[Flag] = field(default_factory=list)
    unchecked: dict[str, str] = field(default_factory=dict)  # check -> why it could not run
    thresholds: dict[str, Any] = field(default_factory=lambda: asdict(THRESHOLDS))

    @property
    def sound(self) -> bool:
        """No warn flag (notes allowed)."""
        return not any(f.severity == WARN for f in self.flags)

    @property
    def warnings(self) -> list[Flag]:
        return [f for f in self.flags if f.severity == WARN]

    def to_dict(self) -> dict[str, Any]:
        return {"sound": self.sound, "flags": [f.to_dict() for f in self.flags],
                "unchecked": dict(self.unchecked), "thresholds": dict(self.thresholds)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Validity":
        return cls([Flag.from_dict(f) for f in d.get("flags") or [] if isinstance(f, dict)],
                   dict(d.get("unchecked") or {}), dict(d.get("thresholds") or {}))


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _nonfinite(x: Any) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def _ok_repeats(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in rec.get("repeats") or [] if isinstance(r, dict) and r.get("status", "ok") == "ok"
            and _num(r.get("samples_per_s")) is not None]


def _cfg(rec: dict[str, Any]) -> dict[str, Any]:
    c = rec.get("config")
    return c if isinstance(c, dict) else {}


def spread(rec: dict[str, Any]) -> tuple[int, float | None]:
    """(n, coefficient of variation) of samples/s over the ok repeats; CV None for n < 2."""
    xs = [_num(r.get("samples_per_s")) for r in _ok_repeats(rec)]
    xs = [x for x in xs if x is not None and x > 0]
    if len(xs) < 2:
        return len(xs), None
    return len(xs), statistics.stdev(xs) / statistics.fmean(xs)


def drift(step_times_ms: list[float]) -> float | None:
    """Median step time of the window's second half over its first half, minus 1 (>0: slowed down)."""
    xs = [x for x in (_num(t) for t in step_times_ms) if x is not None]
    if len(xs) < 2:
        return None
    half = len(xs) // 2
    first, second = statistics.median(xs[:half]), statistics.median(xs[len(xs) - half:])
    return None if first <= 0 else second / first - 1.0


def stalls(step_times_ms: list[float], factor: float = THRESHOLDS.stall_factor) -> tuple[int, float, float]:
    """(count, longest ms, share of the window) of steps longer than ``factor`` x the median step;
    the share is their time beyond the median over the sum of all steps (what the stalls cost)."""
    xs = [x for x in (_num(t) for t in step_times_ms) if x is not None and x >= 0]
    total = sum(xs)
    if len(xs) < 2 or total <= 0:
        return 0, 0.0, 0.0
    med = statistics.median(xs)
    long = [x for x in xs if x > factor * med]
    return len(long), max(long, default=0.0), sum(x - med for x in long) / total


def rank_threads(rec: dict[str, Any]) -> tuple | None:
    """CPU threads each rank used, as a comparable tuple; None when the record does not say.

    Read from ``ranks[i]["threads"]`` (an int, or a dict of thread settings), else the config's
    ``threads``, else the launcher's ``omp_num_threads`` (the same for every rank).
    """
    ranks = [r for r in rec.get("ranks") or [] if isinstance(r, dict)]
    per = [r.get("threads") for r in ranks if r.get("threads") is not None]
    if per:
        return tuple(sorted({tuple(sorted(t.items())) if isinstance(t, dict) else t for t in per}, key=str))
    for v in (_cfg(rec).get("threads"), rec.get("omp_num_threads")):
        if v is not None:
            try:
                return (int(v),)
            except (TypeError, ValueError):
                return (str(v),)
    return None


def _threads_number(t: tuple | None) -> int | None:
    """The largest per-rank thread count in ``rank_threads``'s tuple (int entries or dict values)."""
    if not t:
        return None
    vals: list[int] = []
    for x in t:
        if isinstance(x, int):
            vals.append(x)
        elif isinstance(x, tuple):  # dict items
            vals += [v for _, v in x if isinstance(v, int) and not isinstance(v, bool)]
    return max(vals) if vals else None


def _local_ranks(rec: dict[str, Any]) -> int:
    cfg = _cfg(rec)
    try:
        return max(1, int(cfg.get("nproc_per_node") or 1))
    except (TypeError, ValueError):
        return 1


def _utilisations(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every ok repeat's utilisation summary (node 0), or the record's top-level one."""
    out = [r["utilisation"] for r in _ok_repeats(rec) if isinstance(r.get("utilisation"), dict)]
    if not out and isinstance(rec.get("utilisation"), dict):
        out = [rec["utilisation"]]
    return out


# ----------------------------------------------------------------------------- one record

def _check_window(rec, t: Thresholds, v: Validity) -> None:
    ws = [_num(r.get("window_s")) for r in _ok_repeats(rec)]
    ws = [w for w in ws if w is not None]
    if not ws:
        v.unchecked["short_window"] = "no window length recorded"
        return
    if min(ws) < t.min_window_s:
        v.flags.append(Flag("short_window", f"timed window {min(ws):.3g} s is shorter than {t.min_window_s:g} s: "
                            "timer and scheduling noise are a large share of it; raise --steps",
                            WARN, min(ws), t.min_window_s))


def _check_counts(rec, t: Thresholds, v: Validity) -> None:
    steps = _cfg(rec).get("steps")
    if isinstance(steps, int) and steps < t.min_steps:
        v.flags.append(Flag("few_steps", f"{steps} timed steps per repeat (fewer than {t.min_steps}): step-time "
                            "percentiles and drift are not estimable", NOTE, steps, t.min_steps))
    n, _ = spread(rec)
    if n < t.min_repeats:
        what = "no spread at all" if n < 2 else "the spread is one difference, not an estimate"
        v.flags.append(Flag("few_repeats", f"{n} repeat(s) (fewer than {t.min_repeats}): {what}; raise --repeats",
                            NOTE, n, t.min_repeats))


def _check_cv(rec, t: Thresholds, v: Validity) -> None:
    n, cv = spread(rec)
    if cv is None:
        v.unchecked["high_cv"] = f"{n} repeat(s): no coefficient of variation"
        return
    if cv > t.max_cv:
        v.flags.append(Flag("high_cv", f"repeats disagree: coefficient of variation {cv * 100:.1f} % over {n} "
                            f"repeats (limit {t.max_cv * 100:g} %)", WARN, cv, t.max_cv))


def _check_drift(rec, t: Thresholds, v: Validity) -> None:
    worst: float | None = None
    for r in _ok_repeats(rec):
        times = r.get("step_times_ms") or []
        if len(times) < t.min_drift_steps:
            continue
        d = drift(times)
        if d is not None and (worst is None or abs(d) > abs(worst)):
            worst = d
    if worst is None:
        v.unchecked["drift"] = f"fewer than {t.min_drift_steps} timed steps per repeat"
        return
    if abs(worst) > t.max_drift:
        how = "slower" if worst > 0 else "faster"
        v.flags.append(Flag("drift", f"throughput drifts inside the window: the second half's median step is "
                            f"{abs(worst) * 100:.1f} % {how} than the first half's (limit {t.max_drift * 100:g} %); "
                            "warm-up too short, throttling, or load changing", WARN, worst, t.max_drift))


def _check_stalls(rec, t: Thresholds, v: Validity) -> None:
    worst: tuple[int, float, float, float] | None = None  # (count, longest, share, median)
    for r in _ok_repeats(rec):
        times = r.get("step_times_ms") or []
        if len(times) < t.min_drift_steps:
            continue
        n, longest, share = stalls(times, t.stall_factor)
        if worst is None or share > worst[2]:
            worst = (n, longest, share, statistics.median([x for x in times if _num(x) is not None]))
    if worst is None:
        v.unchecked["stall"] = f"fewer than {t.min_drift_steps} timed steps per repeat"
        return
    n, longest, share, med = worst
    if share > t.max_stall_share:
        v.flags.append(Flag("stall", f"{n} step(s) over {t.stall_factor:g} x the median step ({med:.3g} ms; longest "
                            f"{longest:.3g} ms) hold {share * 100:.1f} % of a window beyond the median (limit "
                            f"{t.max_stall_share * 100:g} %): one event may set the figure; raise --steps or "
                            "--repeats to see whether it recurs", WARN, share, t.max_stall_share))


def _check_load(rec, t: Thresholds, v: Validity) -> None:
    utils = _utilisations(rec)
    gpu_checks = () if str(rec.get("device_type")) == "cpu" else ("throttled", "competing_gpu")
    if not utils:
        reason = "no utilisation sampled (--no-monitor)" if _cfg(rec).get("monitor") is False \
            else "no utilisation in the record"
        for check in ("competing_cpu", "cpu_steal") + gpu_checks:
            v.unchecked[check] = reason
        return
    other = [(_num(u.get("other_cpu_pct_mean")), _num(u.get("other_cpu_cores_mean"))) for u in utils]
    other = [o for o in other if o[0] is not None]
    if not other:
        v.unchecked["competing_cpu"] = "the sampler did not separate the case's CPU time (older record)"
    else:
        pct, cores = max(other, key=lambda o: o[0])
        if pct > t.max_other_cpu_pct:
            extra = f" ({cores:.2f} cores)" if cores is not None else ""
            v.flags.append(Flag("competing_cpu", f"other processes used {pct:.1f} % of the case's CPU cores{extra} "
                                f"during the window (limit {t.max_other_cpu_pct:g} %)", WARN, pct,
                                t.max_other_cpu_pct))
    steal = [_num(u.get("cpu_steal_pct_mean")) for u in utils]
    steal = [x for x in steal if x is not None]
    if not steal:
        v.unchecked["cpu_steal"] = "no steal time sampled (not Linux, or an older record)"
    elif max(steal) > t.max_steal_pct:
        v.flags.append(Flag("cpu_steal", f"the hypervisor gave {max(steal):.1f} % of the host's CPU time to other "
                            f"guests during the window (limit {t.max_steal_pct:g} %): a figure bound by the host "
                            "may be low", WARN, max(steal), t.max_steal_pct))
    if not gpu_checks:
        return
    gpu_utils = [u for u in utils if u.get("nvml") and (u.get("n_gpus") or 0) > 0]
    if not gpu_utils:
        for check in gpu_checks:
            v.unchecked[check] = "no GPU sampled (no NVML)"
        return
    fr = [(_num(u.get("gpu_throttle_frac")), u.get("gpu_throttle_reasons")) for u in gpu_utils]
    fr = [f for f in fr if f[0] is not None]
    if not fr:
        v.unchecked["throttled"] = "no clock-event reasons sampled (older record or unsupported)"
    else:
        frac, reasons = max(fr, key=lambda f: f[0])
        if frac > t.max_throttle_frac:
            names = ", ".join(reasons) if isinstance(reasons, list) and reasons else "thermal/hardware slowdown"
            v.flags.append(Flag("throttled", f"GPU clocks throttled ({names}) in {frac * 100:.0f} % of the window's "
                                f"samples (limit {t.max_throttle_frac * 100:g} %)", WARN, frac, t.max_throttle_frac))
    comparable = [u for u in gpu_utils if u.get("gpu_pids_comparable") is True]
    if not comparable:
        why = ("NVML's process ids are not this process namespace's (container)"
               if any(u.get("gpu_pids_comparable") is False for u in gpu_utils)
               else "no GPU process list sampled (older record or unsupported)")
        v.unchecked["competing_gpu"] = why
    else:
        worst = max(comparable, key=lambda u: _num(u.get("gpu_foreign_procs_max")) or 0)
        n = int(_num(worst.get("gpu_foreign_procs_max")) or 0)
        if n > 0:
            pids = worst.get("gpu_foreign_pids") or []
            v.flags.append(Flag("competing_gpu", f"{n} process(es) outside the case ran on the case's GPUs during "
                                f"the window (pids {', '.join(map(str, pids[:8]))})", WARN, n, 0))


def _check_threads(rec, t: Thresholds, v: Validity) -> None:
    if str(rec.get("device_type")) != "cpu":
        return
    threads = _threads_number(rank_threads(rec))
    env = rec.get("env") if isinstance(rec.get("env"), dict) else {}
    cores = _num(env.get("cpu_affinity_count")) or _num(env.get("cpu_count"))
    if threads is None or cores is None:
        v.unchecked["oversubscribed"] = "thread count or core count not recorded"
        return
    used = threads * _local_ranks(rec)
    if used > cores:
        v.flags.append(Flag("oversubscribed", f"{_local_ranks(rec)} rank(s) x {threads} thread(s) = {used} threads "
                            f"on {cores:.0f} cores: ranks compete for cores", WARN, used, cores))


def window_step_ms(rec) -> float | None:
    """The window's step of a run record: the median over its ok repeats of rank 0's median step (ms)."""
    medians = []
    for r in _ok_repeats(rec):
        xs = [x for x in (_num(s) for s in r.get("step_times_ms") or []) if x is not None]
        if xs:
            medians.append(statistics.median(xs))
    return statistics.median(medians) if medians else None


def breakdown_gap(rec) -> tuple[float, float, float] | None:
    """A record's supported step breakdown against its window: (the phases' sum, the window's step, the
    sum / the step - 1), ms; None without a breakdown, its sum or step times in the window."""
    b = rec.get("breakdown")
    if not isinstance(b, dict) or not b.get("supported"):
        return None
    step, window = _num(b.get("step_ms")), window_step_ms(rec)
    if step is None or window is None or window <= 0:
        return None
    return step, window, step / window - 1


def _check_breakdown(rec, t: Thresholds, v: Validity) -> None:
    """The step breakdown (after the window) against the window it explains: its parts are only as
    good as their sum's agreement with the window's step. Only records with a breakdown are checked."""
    b = rec.get("breakdown")
    if not isinstance(b, dict) or not b.get("supported"):
        return
    got = breakdown_gap(rec)
    if got is None:
        v.unchecked["breakdown_gap"] = "no step times in the window to hold the breakdown against"
        return
    step, window, gap = got
    if abs(gap) > t.max_breakdown_gap:
        limit = t.max_breakdown_gap * 100
        v.flags.append(Flag("breakdown_gap", f"the step breakdown's phases sum to {step:.3g} ms against the window's "
                            f"median step of {window:.3g} ms ({gap * 100:+.1f} %, limit ±{limit:g} %): the steps "
                            "after the window did not run as the window's did, so its parts (exposed communication "
                            "above all) may be off by as much", NOTE, gap, t.max_breakdown_gap))


def _check_decode_process(rec, t: Thresholds, v: Validity) -> None:
    """GPU decode in a process of its own on a GPU without MPS: the two processes' CUDA contexts
    share the GPU by time slices, so the decode costs the step more than it would on a thread."""
    if not _cfg(rec).get("data_decode_process") or str(rec.get("device_type")) != "cuda":
        return
    env = rec.get("env") if isinstance(rec.get("env"), dict) else {}
    if "mps_daemon" not in env or env["mps_daemon"] is None:
        v.unchecked["decode_process_time_sliced"] = "whether MPS ran is not recorded"
    elif env["mps_daemon"] is False:
        v.flags.append(Flag("decode_process_time_sliced", "the decode process and the training process shared the "
                            "GPU without MPS, by time slices: its decode cost the step more than on a thread "
                            "(docs/data.md: start nvidia-cuda-mps-control -d first)", NOTE))


def _warmup_losses(r: dict[str, Any]) -> list:
    w = r.get("warmup_losses")
    return w if isinstance(w, list) else []


def _check_loss_nonfinite(rec, t: Thresholds, v: Validity) -> None:
    """A NaN or infinite loss in an ok repeat. The workers record a non-finite loss as null
    (parity.global_loss) and the store writes NaN as null, so a null counts where the record shows
    the loss is read: a null warm-up loss beside numbers, a null loss_after beside another repeat's;
    and where the worker counted them (``nonfinite_losses``), a repeat whose every loss is null.
    Records without losses (external, imported, strategies that do not report one) pass."""
    reps = _ok_repeats(rec)
    after_read = any(_num(r.get("loss_after")) is not None for r in reps)
    beside = "not finite (recorded as null beside finite ones)"
    found: list[tuple[int, str]] = []  # (repeat, what was not finite)
    for i, r in enumerate(reps):
        n = (r["repeat"] if isinstance(r.get("repeat"), int) else i) + 1
        warm = _warmup_losses(r)
        warm_read = any(_num(x) is not None for x in warm)
        found += [(n, f"warm-up step {k + 1}'s loss is {beside if x is None else x}") for k, x in enumerate(warm)
                  if _nonfinite(x) or (x is None and warm_read)]
        a = r.get("loss_after")
        if _nonfinite(a) or (a is None and "loss_after" in r and after_read):
            found.append((n, f"loss after the window is {beside if a is None else a}"))
        counted = r.get("nonfinite_losses")
        if isinstance(counted, int) and counted > 0 and not any(m == n for m, _ in found):
            found.append((n, f"{counted} of the losses the worker read were not finite (recorded as null)"))
    if not found:
        return
    n, what = found[0]
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    if _cfg(rec).get("precision") == "amp-fp16":
        why = ("the model diverged; with amp-fp16 the loss scaler skips the optimizer step of an overflowing "
               "step, so the window may time less work")
    else:
        why = "the model diverged: the steps ran on non-finite numbers and do not train"
    v.flags.append(Flag("loss_nonfinite", f"repeat {n}: {what}{more}: {why}", WARN))


def _check_loss_diverged(rec, t: Thresholds, v: Validity) -> None:
    """loss_after far above the first warm-up loss, over the repeats that have both. loss_after is
    read in eval mode: where the window's last training step (loss_last) stayed within the factor,
    training did not diverge and nothing is flagged (stored ResNet-50 runs that fit their one
    synthetic batch read 5.1 in training and 45-990 in eval mode: likely BatchNorm's running
    statistics lagging weights that move fast)."""
    rows = []
    for r in _ok_repeats(rec):
        warm = _warmup_losses(r)
        first, after = _num(warm[0]) if warm else None, _num(r.get("loss_after"))
        if first is not None and after is not None and first > 0 and after > 0:
            rows.append((first, after, _num(r.get("loss_last"))))
    if not rows:
        return
    first, after = statistics.median(x[0] for x in rows), statistics.median(x[1] for x in rows)
    limit = t.loss_diverged_factor
    if after <= limit * first:
        return
    lasts = [x[2] for x in rows if x[2] is not None]
    last = statistics.median(lasts) if lasts else None
    if last is not None and last <= limit * first:
        return  # only the eval-mode reading rose: the training itself did not diverge
    seen = f"; the window's last training step read {last:.4g}" if last is not None else ""
    v.flags.append(Flag("loss_diverged", f"loss rose from {first:.4g} (first warm-up step) to {after:.4g} after the "
                                         f"window (median of repeats{seen}): the model diverges with this recipe on "
                                         f"this data; the steps run the same kernels, but it does not train", NOTE,
                        after / first, limit))


def _check_skipped_steps(rec, t: Thresholds, v: Validity) -> None:
    """amp-fp16: optimizer steps the loss scaler skipped inside the window (an overflow halves its
    scale; the worker reads the scale before and after the window). A skipped step does no update,
    so the window timed less work than its steps."""
    reps = _ok_repeats(rec)
    unknown = [r for r in reps if r.get("loss_scale") is not None and r.get("skipped_steps") is None]
    if unknown:
        v.flags.append(Flag("skipped_steps", f"the loss scale both grew and fell inside the window of {len(unknown)} "
                                             f"repeat(s): its readings cannot count the skipped updates (the window "
                                             f"crossed the scaler's growth interval)", NOTE))
    hit = [(r, k) for r in reps if isinstance(k := r.get("skipped_steps"), int) and k > 0]
    if not hit:
        return
    r, k = max(hit, key=lambda x: x[1])
    n = _cfg(rec).get("steps")
    scale = [_num(x) for x in (r.get("loss_scale") or [])]
    of = f" of {n}" if isinstance(n, int) else ""
    was = f"scale {scale[0]:g} -> {scale[1]:g}; " if len(scale) == 2 and None not in scale else ""
    v.flags.append(Flag("skipped_steps", f"the loss scaler skipped the optimizer update of {k}{of} timed step(s) "
                                         f"({was}{len(hit)} repeat(s)): the window timed less work than its steps; "
                                         f"raise --warmup so the scale settles first", WARN, float(k), 0.0))


def _check_interrupted(rec, t: Thresholds, v: Validity) -> None:
    if rec.get("status") == "interrupted":
        n, asked = len(_ok_repeats(rec)), _cfg(rec).get("repeats")
        of = f" of the {asked}" if isinstance(asked, int) else ""
        v.flags.append(Flag("interrupted", f"a signal ended the case after {n}{of} repeat(s): its figures are of "
                            "those (a sweep measures it again in full)", NOTE, n, asked))


def _check_straggler(rec, t: Thresholds, v: Validity) -> None:
    """One rank slower than the others (dlscale/train/ranktimes.py): its median step over the median of the
    others' by more than ``straggler_gap``, and beyond their noise (its 25th percentile above every other
    rank's 75th). Multi-rank records only; those without per-rank steps are listed as unchecked."""
    if (rec.get("world_size") or 1) < 2:
        return
    s = ranktimes.record_slowest(rec)
    if s is None or s.get("gap") is None:
        v.unchecked["straggler"] = "no per-rank step times in the record"
        return
    if s["gap"] > t.straggler_gap and s["separated"]:
        what = "solo steps (no gradient sync)" if s["basis"] == "solo" else "window steps"
        v.flags.append(Flag("straggler", f"rank {s['rank']} ({s['host']}, {s['device']}) is {s['gap'] * 100:.0f} % "
                            f"slower than the other ranks' median in its {what}: {s['median_ms']:.3g} ms against "
                            f"{s['others_median_ms']:.3g} ms (limit {t.straggler_gap * 100:g} %); every rank waits "
                            "for it", WARN, s["gap"], t.straggler_gap))


CHECKS = (_check_window, _check_counts, _check_cv, _check_drift, _check_stalls, _check_load, _check_threads,
          _check_breakdown, _check_decode_process, _check_loss_nonfinite, _check_loss_diverged, _check_skipped_steps,
          _check_interrupted, _check_straggler)


def assess(record: dict[str, Any], thresholds: Thresholds = THRESHOLDS) -> Validity:
    """The validity of one run record, from its own data only. Records with nothing measured (not ok or
    interrupted, or no finished repeat) get no flags."""
    v = Validity(thresholds=asdict(thresholds))
    if record.get("status") not in MEASURED_STATUSES or not _ok_repeats(record):
        v.unchecked["all"] = f"status {record.get('status')}: nothing measured"
        return v
    for check in CHECKS:
        check(record, thresholds, v)
    return v


# ----------------------------------------------------------------------------- micro-benchmarks

def _micro_spread(rec, t: Thresholds, v: Validity) -> None:
    timed = [r for r in rec.get("results") or [] if isinstance(r, dict) and r.get("status", "ok") == "ok"
             and _num(r.get("time_cv")) is not None]
    if not timed:
        v.unchecked["spread"] = "no per-sample spread in the rows"
        return
    wide = [r for r in timed if r["time_cv"] > t.max_cv]
    if wide:
        worst = max(wide, key=lambda r: r["time_cv"])
        label = " ".join(str(worst.get(k)) for k in ("shape", "size", "dtype", "op", "pipeline") if worst.get(k))
        v.flags.append(Flag("spread", f"{len(wide)} of {len(timed)} row(s) vary by more than CV "
                            f"{t.max_cv * 100:g} % between samples (worst {label or 'row'}: "
                            f"{worst['time_cv'] * 100:.1f} %): the medians are noisy", WARN, worst["time_cv"],
                            t.max_cv))


def _micro_one_rank(rec, v: Validity) -> None:
    """Collectives on one rank move nothing between devices: what they time is each call's floor."""
    if rec.get("micro") == "comm" and _num(rec.get("nranks")) == 1:
        v.flags.append(Flag("one_rank", "one rank: no data crosses a link, so the times are each call's "
                            "floor and the bandwidths are not a link's", WARN, 1, 2))


def _micro_load(rec, t: Thresholds, v: Validity) -> None:
    load = rec.get("load") if isinstance(rec.get("load"), dict) else None
    if load is None or _num(load.get("other_cpu_pct_mean")) is None:
        v.unchecked["competing_cpu"] = "no CPU load watched (older record)"
    elif load["other_cpu_pct_mean"] > t.max_other_cpu_pct:
        v.flags.append(Flag("competing_cpu", f"other processes used {load['other_cpu_pct_mean']:.1f} % of this "
                            f"process's {load.get('cores')} CPU core(s) ({_num(load.get('other_cpu_cores_mean')) or 0:.2f} "
                            f"cores) while it measured (limit {t.max_other_cpu_pct:g} %)", WARN,
                            load["other_cpu_pct_mean"], t.max_other_cpu_pct))
    threads, cores = _num((load or {}).get("threads")), _num((load or {}).get("cores"))
    procs = _num(_cfg(rec).get("nproc_per_node")) or 1
    if rec.get("micro") == "comm" or threads is None or cores is None:
        v.unchecked["oversubscribed"] = "thread count or core count not recorded"
    elif threads * procs > cores:
        v.flags.append(Flag("oversubscribed", f"{procs:.0f} process(es) x {threads:.0f} thread(s) on {cores:.0f} "
                            "core(s): threads compete for cores", WARN, threads * procs, cores))


def assess_micro(record: dict[str, Any], thresholds: Thresholds = THRESHOLDS) -> Validity:
    """The validity of a micro-benchmark record: the spread between its samples, other processes'
    CPU use while it measured and oversubscribed threads (CPU runs; the GPU checks need a sampler)."""
    v = Validity(thresholds=asdict(thresholds))
    _micro_spread(record, thresholds, v)
    _micro_one_rank(record, v)
    if str(record.get("device")) == "cpu":
        _micro_load(record, thresholds, v)
    return v


# ----------------------------------------------------------------------------- comparisons

PROCEDURE_KEYS = ("warmup", "steps", "monitor", "sample_interval")


def procedure_differences(case: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """How the two records were run differently where it can move throughput: window steps,
    warm-up, sampling (the sampler competes for CPU)."""
    a, b = _cfg(case), _cfg(base)
    out = []
    for k in PROCEDURE_KEYS:
        if k in a and k in b and a[k] != b[k]:
            if k == "sample_interval" and not (a.get("monitor", True) and b.get("monitor", True)):
                continue
            out.append(f"{k} {a[k]} vs {b[k]}")
    return out


def compare_flags(case: dict[str, Any], base: dict[str, Any], efficiency: float | None,
                  thresholds: Thresholds = THRESHOLDS, what: str = "speedup") -> list[Flag]:
    """Flags on a speedup/efficiency of ``case`` against the 1-device ``base`` record (same record:
    none). Above-ideal scaling counts only past the measured noise of both sides."""
    if case is base or case.get("id") is not None and case.get("id") == base.get("id"):
        return []
    out: list[Flag] = []
    if efficiency is not None:
        (nc, cvc), (nb, cvb) = spread(case), spread(base)
        if cvc is None or cvb is None or min(nc, nb) < thresholds.min_repeats:
            if efficiency > 1.0:
                out.append(Flag("above_ideal", f"scaling efficiency {efficiency * 100:.1f} % is above 100 % and the "
                                f"noise is not estimable ({min(nc, nb)} repeat(s) on a side, fewer than "
                                f"{thresholds.min_repeats}): a measurement problem until proven otherwise", WARN,
                                efficiency, 1.0))
        else:
            noise = thresholds.noise_k * math.hypot(cvc, cvb)
            if efficiency - 1.0 > noise:
                out.append(Flag("above_ideal", f"scaling efficiency {efficiency * 100:.1f} % is above 100 % by more "
                                f"than the measured noise (±{noise * 100:.1f} %, {thresholds.noise_k:g} x the combined "
                                "CV of both sides): a measurement problem until proven otherwise", WARN,
                                efficiency, 1.0 + noise))
    if str(case.get("device_type")) == "cpu" or str(base.get("device_type")) == "cpu":
        tc, tb = rank_threads(case), rank_threads(base)
        if tc is not None and tb is not None and tc != tb:
            out.append(Flag("baseline_threads", f"{what} against a baseline run with {_fmt_threads(tb)} thread(s) per "
                            f"rank, this case with {_fmt_threads(tc)}: not the same per-rank budget", WARN))
        elif tc is None or tb is None:
            out.append(Flag("baseline_threads", f"{what}: per-rank thread count not recorded for "
                            f"{'this case' if tc is None else 'the baseline'}; equal budgets unverified", NOTE))
    diffs = procedure_differences(case, base)
    if diffs:
        out.append(Flag("baseline_procedure", f"{what} against a baseline run differently ({'; '.join(diffs)})",
                        WARN))
    bv = assess(base, thresholds)
    if bv.warnings:
        out.append(Flag("baseline_flagged", f"{what} uses a baseline that is itself flagged: "
                        + ", ".join(f.check for f in bv.warnings), WARN))
    return out


def _fmt_threads(t: tuple) -> str:
    return "/".join(str(dict(x)) if isinstance(x, tuple) else str(x) for x in t)


def names(flags: list[Flag], warn_mark: str = "⚠", note_mark: str = "?", missing: str = "—") -> str:
    """Flag names for a table cell, warn first: "⚠ short_window, high_cv · ? few_repeats"."""
    warn = [f.check for f in flags if f.severity == WARN]
    note = [f.check for f in flags if f.severity != WARN]
    parts = ([f"{warn_mark} " + ", ".join(warn)] if warn else []) + ([f"{note_mark} " + ", ".join(note)] if note else [])
    return " · ".join(parts) or missing


def describe(flags: list[Flag]) -> str:
    """One line: the flags' reasons, warn first."""
    order = sorted(flags, key=lambda f: f.severity != WARN)
    return "; ".join(f"{f.check}: {f.reason}" for f in order)
