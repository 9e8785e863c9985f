"""DLPerf-style logs, reduced the way DLPerf's own scripts reduce them.

Two styles, told apart by their lines:

* MXNet/gluon-nlp BERT (DLPerf's ``MxNet/BERT/extract_mxnet_logs.py``): every rank logs
  ``[step N]<TAB>mlm_loss=...<TAB>throughput=X.XK tks/s<TAB>lr=...`` (gluon-nlp's
  ``run_pretraining.py``: X thousand tokens/s of that rank). DLPerf turns each line into job
  samples/s as X x 1000 / seq_len x devices, takes the median over the ranks of each iteration
  and the *arithmetic* mean of that over the window. Needs the sequence length (DLPerf: 128)
  and the device count.
* OneFlow (DLPerf's ``OneFlow/BERT_base/extract_result.py``): header lines
  ``batch_size_per_device = B``, ``gpu_num_per_node = G``, ``num_nodes = M`` and
  ``step: N, ... throughput: X <epoch seconds>``; the figure is B x G x M x (end - start) /
  (t_end - t_start) between two logged steps.

Warm-up rule: the first W iterations are skipped and the next N form the window (DLPerf's
MXNet BERT page: 200 iterations, the first 100 discarded). For OneFlow logs, whose step numbers
start at 0, the window runs from the line of step W-1 (the end of the warm-up) to that of step
W-1+N. Unlike ``reduce_window`` (total samples / total time), the MXNet style keeps DLPerf's
arithmetic mean of per-iteration rates, so imported figures match the published ones.
"""
from __future__ import annotations

import re
import statistics
from typing import Sequence

from dlscale.external.parsers import (NUMBER, LogLine, Obs, ParseOptions, Parser, ParseResult, register_parser,
                                      window)

MXNET = re.compile(rf"throughput=(?P<v>{NUMBER})K tks/s")
MXNET_STEP = re.compile(r"\[step (?P<step>\d+)\]")
ONEFLOW = re.compile(rf"^\s*step:\s*(?P<step>\d+),.*\bthroughput:\s*(?P<v>{NUMBER})\s+(?P<t>{NUMBER})\s*$")
HEADER = re.compile(r"^\s*(?P<k>batch_size_per_device|gpu_num_per_node|num_nodes)\s*=\s*(?P<v>\d+)\s*$")


@register_parser("dlperf")
class DLPerf(Parser):
    description = ("DLPerf logs: gluon-nlp '[step N] ... throughput=X.XK tks/s' lines (MXNet) or OneFlow "
                   "'step: N, ... throughput: X T' lines")

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        mx = [ln for ln in lines if MXNET.search(ln.text)]
        if mx:
            return self._mxnet(mx, opts)
        return self._oneflow(lines)

    # -- MXNet/gluon-nlp ----------------------------------------------------------------------

    def _mxnet(self, lines: list[LogLine], opts: ParseOptions) -> list[Obs]:
        if not opts.seq_len:
            raise self.error("MXNet throughput lines count tokens: give the sequence length (--seq-len; DLPerf "
                             "used 128)")
        ranks = opts.world_size
        per_step: dict[int, list[float]] = {}
        order: list[int] = []
        for i, ln in enumerate(lines):
            m = MXNET_STEP.search(ln.text)
            # without [step N], DLPerf's reshape: consecutive groups of one line per rank
            step = int(m.group("step")) if m else i // ranks + 1
            if step not in per_step:
                per_step[step] = []
                order.append(step)
            per_step[step].append(float(MXNET.search(ln.text).group("v")) * 1000.0 / opts.seq_len * ranks)
        out = []
        for n, step in enumerate(order, 1):
            vals = per_step[step]
            if len(vals) != ranks:
                raise self.error(f"iteration {step} has {len(vals)} throughput line(s), expected one per rank "
                                 f"({ranks}): truncated log, or a wrong device count")
            out.append(Obs(step=n, samples_per_s=statistics.median(vals), extra={"mxnet": 1.0}))
        return out

    # -- OneFlow ------------------------------------------------------------------------------

    def _oneflow(self, lines: Sequence[LogLine]) -> list[Obs]:
        head: dict[str, int] = {}
        out: list[Obs] = []
        for ln in lines:
            h = HEADER.match(ln.text)
            if h:
                head[h.group("k")] = int(h.group("v"))
                continue
            m = ONEFLOW.match(ln.text)
            if m:
                # printed steps are 0-based: "step: 19" ends the 20th step
                out.append(Obs(step=int(m.group("step")) + 1, extra={"t": float(m.group("t"))}))
        if out:
            missing = [k for k in ("batch_size_per_device", "gpu_num_per_node", "num_nodes") if k not in head]
            if missing:
                raise self.error(f"OneFlow log without its header line(s) {', '.join(missing)} = N")
            gb = head["batch_size_per_device"] * head["gpu_num_per_node"] * head["num_nodes"]
            for o in out:
                o.extra["global_batch"] = float(gb)
        return out

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        if "mxnet" in obs[0].extra:
            win, skipped = window(obs, opts.warmup, opts.steps, self.name)
            rates = [o.samples_per_s for o in win]
            res = ParseResult(self.name, "sample", statistics.fmean(rates),  # type: ignore[arg-type]
                              method=(f"DLPerf MXNet BERT: per iteration the median over {opts.world_size} rank(s) "
                                      f"of throughput x 1000 / {opts.seq_len} x {opts.world_size}, arithmetic mean "
                                      f"over iterations {skipped + 1}-{skipped + len(win)}"),
                              per_step_samples_per_s=rates, steps_seen=obs[-1].step,  # type: ignore[arg-type]
                              skipped_steps=skipped, window_steps=len(win))
        else:
            w, n = opts.warmup, opts.steps
            by_step = {o.step: o for o in obs}
            if w not in by_step and w > 0:
                raise self.error(f"no line for step {w - 1} (the end of the {w} warm-up step(s)) to start the window")
            ends = [o for o in obs if o.step > w and (n is None or o.step <= w + n)]
            if not ends:
                window(obs, w, n, self.name)  # the shared "nothing after the warm-up" error
                raise self.error(f"no line after step {w - 1}")
            end = ends[-1]
            gb = end.extra["global_batch"]
            t0 = by_step[w].extra["t"] if w > 0 else None
            if t0 is None:
                raise self.error("the window needs a logged step before it: use --warmup >= 1")
            dt = end.extra["t"] - t0
            if dt <= 0:
                raise self.error(f"timestamps of steps {w - 1} and {end.step - 1} do not increase")
            rate = gb * (end.step - w) / dt
            res = ParseResult(self.name, "sample", rate,
                              method=(f"DLPerf OneFlow: {gb:g} samples x {end.step - w} steps / time between the "
                                      f"lines of steps {w - 1} and {end.step - 1}"),
                              steps_seen=obs[-1].step, skipped_steps=w, window_steps=end.step - w, window_s=dt)
        if opts.steps is not None and res.window_steps < opts.steps:
            res.warnings.append(f"window holds {res.window_steps} step(s), fewer than the {opts.steps} asked for "
                                f"(the log ends at step {res.steps_seen})")
        return res
