"""Megatron-LM / Megatron-Core: the iteration line ``training_log`` prints every log interval.

Format (megatron/training/training.py, ``training_log``)::

     [2025-04-13 23:41:12] iteration       20/    1000 | consumed samples:          320 | elapsed time per iteration (ms): 820.7 | throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: 4.000000E-05 | global batch size:    16 | lm loss: 1.072453E+01 | ...

``elapsed time per iteration (ms)`` is the mean over the iterations since the previous line;
``throughput per GPU`` (with ``--log-throughput``) is model TFLOP/s per GPU, not samples.
Samples/s of a line = global batch size / elapsed seconds per iteration (Megatron-DeepSpeed's
``samples per second`` is the same quotient).

Warm-up rule: a line covers the iterations since the previous line; lines covering any of the
first W iterations are skipped, then lines up to N iterations; window samples/s = sum(k x
global batch) / sum(k x elapsed s) over its lines (total samples / total time).
"""
from __future__ import annotations

import re
from typing import Sequence

from dlscale.external.parsers import (NUMBER, LogLine, Obs, ParseOptions, Parser, ParseResult, float_of,
                                      reduce_window, register_parser, weighted_extra, window)

ITER = re.compile(r"\biteration\s+(?P<it>\d+)\s*/\s*(?:\d+|infinity)\s*\|")
ELAPSED = re.compile(rf"elapsed time per iteration \(ms\):\s*(?P<v>{NUMBER})")
GBS = re.compile(r"global batch size:\s*(?P<v>\d+)")
TFLOPS = re.compile(rf"throughput per GPU \(TFLOP/s/GPU\):\s*(?P<v>{NUMBER})")


@register_parser("megatron")
class Megatron(Parser):
    description = ("Megatron lines 'iteration N/M | ... | elapsed time per iteration (ms): T | ... | "
                   "global batch size: B |'")
    packages = ("megatron-core",)
    # its argument dump at start-up: "  seq_length ...................... 1024"
    seq_len_line = re.compile(r"^\s*seq_length\s*\.{2,}\s*(?P<n>\d+)\s*$")

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        out: list[Obs] = []
        prev = 0
        for ln in lines:
            m = ITER.search(ln.text)
            if not m:
                continue
            e = ELAPSED.search(ln.text)
            if not e:
                continue
            it = int(m.group("it"))
            if it <= prev:
                raise self.error(f"iteration {it} follows iteration {prev}: not one run's log")
            g = GBS.search(ln.text)
            gbs = int(g.group("v")) if g else opts.global_batch
            if not gbs:
                raise self.error(f"iteration {it}: no 'global batch size' on the line and none given "
                                 f"(--batch-size with --nproc-per-node/--nnodes)")
            ms = float_of(e.group("v"))
            if ms <= 0:
                raise self.error(f"iteration {it}: elapsed time per iteration {ms} ms is not positive")
            extra = {"global_batch": float(gbs)}
            t = TFLOPS.search(ln.text)
            if t:
                extra["tflops_per_device"] = float(t.group("v"))
            out.append(Obs(step=it, steps=it - prev, samples_per_s=gbs / (ms / 1000.0), step_ms=ms, t=ln.t,
                           extra=extra))
            prev = it
        return out

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        res = reduce_window(self.name, "sample", obs, opts, note="samples/s of a line = global batch / elapsed s")
        win, _ = window(obs, opts.warmup, opts.steps, self.name)
        v = weighted_extra(win, "tflops_per_device")
        if v is not None:
            res.extra["tflops_per_device"] = v
        gb = {o.extra["global_batch"] for o in win}
        if len(gb) == 1:
            res.extra["global_batch"] = gb.pop()
        else:
            res.warnings.append(f"global batch size changes inside the window ({sorted(gb)}): rampup?")
        return res
