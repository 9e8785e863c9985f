"""DeepSpeed: the engine's throughput timer, and ``samples/sec`` lines.

Formats:

* ``ThroughputTimer.stop`` (deepspeed/utils/timer.py), every ``steps_per_print`` steps::

      [timer.py:260:stop] epoch=0/micro_step=40/global_step=10, RunningAvgSamplesPerSec=25.03, CurrSamplesPerSec=25.70, MemAllocated=4.32GB, MaxMemAllocated=38.49GB

  older releases print ``0/20, RunningAvgSamplesPerSec=...`` (epoch/global step) or
  ``0/10, SamplesPerSec=...``. Both rates are for the whole job (the timer's batch is the
  global train batch). RunningAvg is the mean since the timer's ``start_step`` (2 by default):
  global batch x (step - start_step) / time spent in the timed steps; Curr covers the printed
  step only. Recent releases (0.19 here) log at WARNING by default: the script must raise
  DeepSpeed's level to INFO (``deepspeed.utils.logging.set_log_level_from_string("info")``) for
  the timer lines to appear.
* ``Samples/sec: X`` (DeepSpeed-Chat's ``print_throughput``, Megatron-DeepSpeed's
  ``samples per second: X``), one line per step, counted in order.

Warm-up rule: with timer lines, the window runs from the last printed step <= W (the anchor)
to the last printed step <= W + N; its throughput comes from the two running averages:
(s2 - s1) / ((s2 - start)/R2 - (s1 - start)/R1), which covers every step in between (the
global batch cancels). Without an anchor (no print at or before step W) it is the harmonic
mean of CurrSamplesPerSec over the printed steps after W (a sample of the steps, said in a
warning). ``Samples/sec`` lines: skip the first W, harmonic mean of the next N.
``-o start_step=K`` overrides DeepSpeed's start_step.
"""
from __future__ import annotations

import re
from typing import Sequence

from dlscale import ConfigError
from dlscale.external.parsers import (NUMBER, LogLine, Obs, ParseOptions, Parser, ParseResult, harmonic_rate,
                                      reduce_window, register_parser, window)

TIMER = re.compile(rf"(?:global_step=|(?<![\w./])\d+/)(?P<step>\d+),\s*(?P<kind>RunningAvgSamplesPerSec|SamplesPerSec)="
                   rf"(?P<avg>{NUMBER})(?:,\s*CurrSamplesPerSec=(?P<curr>{NUMBER}))?")
PER_SEC = re.compile(rf"\b(?:samples/sec|samples per second):\s*(?P<v>{NUMBER})", re.IGNORECASE)
START_STEP = 2  # ThroughputTimer(start_step=2) in DeepSpeedEngine


@register_parser("deepspeed")
class DeepSpeed(Parser):
    description = ("DeepSpeed timer lines 'global_step=N, RunningAvgSamplesPerSec=R, CurrSamplesPerSec=C' "
                   "or 'samples/sec: X' lines")
    packages = ("deepspeed",)

    def check(self, opts: ParseOptions) -> None:
        v = opts.options.get("start_step", START_STEP)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"deepspeed parser option start_step must be an integer >= 0, got {v!r}")

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        timer: list[Obs] = []
        per_sec: list[Obs] = []
        for ln in lines:
            m = TIMER.search(ln.text)
            if m:
                step = int(m.group("step"))
                if timer and step <= timer[-1].step:
                    raise self.error(f"global step {step} follows step {timer[-1].step}: not one run's log")
                curr = m.group("curr")
                timer.append(Obs(step=step, steps=step - (timer[-1].step if timer else 0),
                                 samples_per_s=float(curr) if curr is not None else None, t=ln.t,
                                 extra={"running_avg": float(m.group("avg"))}))
                continue
            m = PER_SEC.search(ln.text)
            if m:
                per_sec.append(Obs(step=len(per_sec) + 1, samples_per_s=float(m.group("v")), t=ln.t))
        return timer or per_sec

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        if "running_avg" not in obs[0].extra:
            return reduce_window(self.name, "sample", obs, opts, note="one 'samples/sec' line per step")
        start = int(opts.options.get("start_step", START_STEP))
        w, n = opts.warmup, opts.steps
        anchors = [o for o in obs if start <= o.step <= w]
        inside = [o for o in obs if o.step > w and (n is None or o.step <= w + n)]
        if not inside:
            # window() raises the shared "nothing left after the warm-up" error
            window([Obs(step=o.step) for o in obs], w, n, self.name)
            raise self.error(f"no printed step between {w + 1} and {w + (n or 0)}")
        last = inside[-1]
        # the anchor: the last print inside the warm-up; when the warm-up ends before the timer's
        # start step, the timer's own start (its running average then covers exactly the window)
        a_step, a_avg, a_t = ((anchors[-1].step, anchors[-1].extra["running_avg"], anchors[-1].t) if anchors
                              else (start, None, None) if w <= start else (None, None, None))
        if a_step is not None and last.step > a_step:
            t_a = (a_step - start) / a_avg if a_avg else 0.0
            t_b = (last.step - start) / last.extra["running_avg"]
            if t_b <= t_a:
                raise self.error(f"running averages at steps {a_step} and {last.step} give no positive window time")
            rate = (last.step - a_step) / (t_b - t_a)
            res = ParseResult(self.name, "sample", rate,
                              method=(f"from RunningAvgSamplesPerSec at steps {a_step} and {last.step}: "
                                      f"(s2 - s1) / ((s2 - {start})/R2 - (s1 - {start})/R1), every step between"),
                              per_step_samples_per_s=[o.samples_per_s for o in inside if o.samples_per_s],
                              steps_seen=obs[-1].step, skipped_steps=a_step, window_steps=last.step - a_step,
                              window_t=(a_t, last.t) if a_t is not None and last.t is not None else None)
        else:
            curr = [o for o in inside if o.samples_per_s]
            if not curr:
                raise self.error(f"no printed step at or before step {w} to anchor the running average, and no "
                                 f"CurrSamplesPerSec after it")
            sampled = [Obs(step=o.step, samples_per_s=o.samples_per_s) for o in curr]
            res = ParseResult(self.name, "sample", harmonic_rate(sampled),
                              method=(f"harmonic mean of CurrSamplesPerSec at the {len(curr)} printed step(s) "
                                      f"{curr[0].step}-{curr[-1].step}"),
                              per_step_samples_per_s=[o.samples_per_s for o in curr],  # type: ignore[misc]
                              steps_seen=obs[-1].step, skipped_steps=w, window_steps=last.step - w)
            res.warnings.append("no printed step at or before the warm-up end: the figure samples only the printed "
                                "steps (one in steps_per_print)")
        if opts.global_batch:
            res.step_times_ms = [opts.global_batch / r * 1000.0 for r in res.per_step_samples_per_s]
            res.window_s = res.window_steps * opts.global_batch / res.samples_per_s
        if n is not None and res.window_steps < n:
            res.warnings.append(f"window holds {res.window_steps} step(s), fewer than the {n} asked for "
                                f"(the log ends at step {res.steps_seen})")
        return res
