"""torchtitan: the metrics line its trainer logs every ``metrics.log_freq`` steps.

Format (torchtitan/components/metrics.py, ``MetricsProcessor.log``; colours stripped)::

    step: 10  loss:  8.1234  grad_norm:  1.2345  memory: 12.34GiB(15.50%)  tps: 12,345  tflops: 123.45  mfu: 12.45%

``tps`` is tokens per second *per device* over the steps since the previous line (older
releases call it ``wps``); ``mfu`` is in %. Lines starting ``validate step:`` are evaluation and
are ignored.

Warm-up rule: each line covers the steps since the previous logged step (the first line covers
steps 1..step); lines covering any of the first W steps are skipped (with log_freq 10 and W 20,
the window starts at step 21), then lines up to N steps. Job tokens/s = tps x world size; the
window figure is the steps-weighted harmonic mean (total tokens / total time), in tokens; a
record converts it to sequences with the workload's sequence length.
"""
from __future__ import annotations

import re
from typing import Sequence

from dlscale.external.parsers import (NUMBER, LogLine, Obs, ParseOptions, Parser, ParseResult, float_of,
                                      reduce_window, register_parser, weighted_extra, window)

LINE = re.compile(r"\bstep:\s*(?P<step>\d+)\s.*?\b(?:tps|wps):\s*(?P<tps>[\d,]+(?:\.\d+)?)")
VALIDATE = re.compile(r"validat\w*\s+step:")
MFU = re.compile(rf"\bmfu:\s*(?P<v>{NUMBER})%")
TFLOPS = re.compile(r"\btflops:\s*(?P<v>[\d,]+(?:\.\d+)?)")


@register_parser("torchtitan")
class TorchTitan(Parser):
    description = "torchtitan metrics lines 'step: N  loss: ...  tps: T  tflops: F  mfu: M%'"
    packages = ("torchtitan",)
    # its trainer's start line: "Training starts at step 1, ..., sequence length 2048, total steps ..."
    seq_len_line = re.compile(r"\bsequence length (?P<n>\d+)\b")

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        out: list[Obs] = []
        prev = 0
        for ln in lines:
            if VALIDATE.search(ln.text):
                continue
            m = LINE.search(ln.text)
            if not m:
                continue
            step = int(m.group("step"))
            if step <= prev:  # a restarted run or a repeated line: the log is not one run
                raise self.error(f"step {step} follows step {prev}: not one run's log")
            extra = {}
            mm, tf = MFU.search(ln.text), TFLOPS.search(ln.text)
            if mm:
                extra["mfu_pct"] = float(mm.group("v"))
            if tf:
                extra["tflops_per_device"] = float_of(tf.group("v"))
            tps = float_of(m.group("tps"))
            out.append(Obs(step=step, steps=step - prev, samples_per_s=tps * opts.world_size, t=ln.t, extra=extra))
            prev = step
        return out

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        res = reduce_window(self.name, "tok", obs, opts,
                            note=f"tps per device x {opts.world_size} device(s)")
        win, _ = window(obs, opts.warmup, opts.steps, self.name)
        for key in ("mfu_pct", "tflops_per_device"):
            v = weighted_extra(win, key)
            if v is not None:
                res.extra[key] = v
        return res
