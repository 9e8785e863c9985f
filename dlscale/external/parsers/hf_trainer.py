"""Hugging Face Trainer: its per-step log dicts, its final speed metrics, trainer_state.json.

Formats (transformers/trainer.py ``Trainer.log``, trainer_callback.py ``ProgressCallback.on_log``
and ``PrinterCallback``; trainer_utils.py ``speed_metrics``)::

    {'loss': '10.85', 'grad_norm': '3.21', 'learning_rate': '5e-05', 'epoch': '0.1'}
    {'train_runtime': '12.35', 'train_samples_per_second': '25.91', 'train_steps_per_second': '1.62', 'train_loss': '10.2', 'epoch': '1'}

(transformers 5 prints floats as 4-significant-digit strings; 4.x printed bare floats; both are
read.) One dict every ``logging_steps`` optimizer steps, and the final metrics once. The
Trainer's own ``train_samples_per_second`` is samples / seconds of the whole ``train()`` call:
the first steps (CUDA context, compilation, allocator warm-up) included. ``trainer_state.json``
(``log_history``: the same dicts with ``step``) carries the final metrics too.

Warm-up rule: in a live run (``dlscale run --command``), every log dict's arrival time is
known; line i ends step s_i = i x logging_steps (1, then multiples, with ``logging_first_step``),
and covers the steps since the previous line, at global batch B = train_samples_per_second /
train_steps_per_second (samples per optimizer step, from the final metrics, as the Trainer
counts them). Lines covering any of the first W steps are skipped (the first line is always
skipped: it has no start time), then lines up to N steps; the window figure is total samples /
total time between the two lines that bound it. ``logging_steps`` comes from ``-o
logging_steps=K``, else from the final metrics (total steps = runtime x steps/s) and the number of
lines. Without arrival times (a saved log, trainer_state.json) only the Trainer's whole-run
figure exists: it is used, with a warning that it includes the warm-up.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Sequence

from dlscale import ConfigError
from dlscale.external.parsers import (LogLine, Obs, ParseOptions, Parser, ParseResult, reduce_window,
                                      register_parser)

DICT = re.compile(r"\{.*\}")
PAIR = re.compile(r"['\"](?P<k>[\w./-]+)['\"]\s*:\s*['\"]?(?P<v>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
                  r"|nan|inf|-inf)['\"]?")
FINAL_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")


def log_dict(text: str) -> dict[str, float] | None:
    """The numeric items of a printed log dict (never evaluated: matched key by key)."""
    m = DICT.search(text)
    if not m:
        return None
    out = {p.group("k"): float(p.group("v")) for p in PAIR.finditer(m.group(0))}
    return out or None


@register_parser("hf-trainer")
class HFTrainer(Parser):
    description = ("Hugging Face Trainer log dicts {'loss': ...} and its final {'train_runtime': ..., "
                   "'train_samples_per_second': ..., 'train_steps_per_second': ...}, or a trainer_state.json")
    packages = ("transformers", "accelerate")

    def check(self, opts: ParseOptions) -> None:
        k = opts.options.get("logging_steps")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ConfigError(f"hf-trainer parser option logging_steps must be an integer >= 1, got {k!r}")

    def parse(self, lines, opts: ParseOptions) -> ParseResult:
        clean = [ln if isinstance(ln, LogLine) else LogLine(ln) for ln in lines]
        state = _trainer_state("\n".join(ln.text for ln in clean))
        if state is not None:
            return self._whole_run(_final_of(state.get("log_history")), opts, "trainer_state.json",
                                   int(state.get("global_step") or 0))
        return super().parse(clean, opts)

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        self._final: dict[str, float] | None = None
        out: list[Obs] = []
        logs: list[LogLine] = []
        for ln in lines:
            d = log_dict(ln.text) if "{" in ln.text else None
            if not d:
                continue
            if all(k in d for k in FINAL_KEYS):
                self._final = d
            elif "loss" in d:
                logs.append(ln)
        if self._final is None:
            if logs:
                raise self.error(f"{len(logs)} step log(s) but no final metrics ({', '.join(FINAL_KEYS)}): the "
                                 f"training did not finish (truncated log?)")
            return []
        if not logs or any(ln.t is None for ln in logs):
            # no live timing: the whole-run figure (reduce() turns this marker into the result)
            return [Obs(step=0, steps=0, extra={"whole_run": 1.0})]
        fin = self._final
        total = round(fin["train_runtime"] * fin["train_steps_per_second"])
        batch = fin["train_samples_per_second"] / fin["train_steps_per_second"]
        steps = _line_steps(len(logs), total, opts.options.get("logging_steps"))
        if steps is None:
            raise self.error(f"{len(logs)} step log line(s) do not fit {total} steps at any logging_steps: give "
                             f"-o logging_steps=K")
        gb = round(batch)
        prev_t, prev_step = logs[0].t, steps[0]
        for i in range(1, len(logs)):
            dt = logs[i].t - prev_t  # type: ignore[operator]
            if dt <= 0:
                continue  # read in one burst with the previous line: its steps go to the next interval
            k = steps[i] - prev_step
            out.append(Obs(step=steps[i], steps=k, samples_per_s=k * gb / dt, step_ms=dt / k * 1000.0, t=logs[i].t))
            prev_t, prev_step = logs[i].t, steps[i]
        if not out:
            raise self.error("the step log lines arrived without time between them (is the output buffered? "
                             "PYTHONUNBUFFERED=1 is set by dlscale)")
        out[0].extra["global_batch"] = float(gb)
        self._first = logs[0]  # the first line only starts the clock
        return out

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        fin = self._final or {}
        if "whole_run" in obs[0].extra:
            return self._whole_run(fin, opts, "final metrics", round(fin["train_runtime"] * fin["train_steps_per_second"]))
        gb = obs[0].extra["global_batch"]
        res = reduce_window(self.name, "sample", obs, opts,
                            note=f"arrival times of the Trainer's log lines, {gb:g} samples per step "
                                 f"(train_samples_per_second / train_steps_per_second)")
        if res.window_t is None and res.skipped_steps == obs[0].first:  # the window starts at the first line
            end = next((o.t for o in obs if o.step == res.skipped_steps + res.window_steps), None)
            if end is not None and self._first.t is not None:
                res.window_t = (self._first.t, end)
        res.extra["trainer_samples_per_s"] = fin.get("train_samples_per_second", math.nan)
        if opts.global_batch and abs(opts.global_batch - gb) > 0.01 * gb:
            res.warnings.append(f"the Trainer's samples per step ({gb:g}) differ from the workload's global batch "
                                f"({opts.global_batch}): check --batch-size, --nproc-per-node and accumulation")
        return res

    def _whole_run(self, fin: dict[str, float] | None, opts: ParseOptions, where: str, total: int) -> ParseResult:
        if not fin or any(k not in fin for k in FINAL_KEYS):
            raise self.error(f"no final metrics ({', '.join(FINAL_KEYS)}) in the {where}: the training did not "
                             f"finish (truncated?)")
        sps = fin["train_samples_per_second"]
        if not sps > 0 or not math.isfinite(sps):
            raise self.error(f"train_samples_per_second {sps!r} is not a positive number")
        res = ParseResult(self.name, "sample", sps,
                          method=f"the Trainer's train_samples_per_second ({where}): samples / seconds of the whole "
                                 f"train() call",
                          steps_seen=total, skipped_steps=0, window_steps=total, window_s=fin["train_runtime"])
        res.warnings.append("whole-run figure: the warm-up steps are included (no per-step timing in this log); "
                            "run it under 'dlscale run --command' for the warm-up rule")
        if opts.global_batch and fin.get("train_steps_per_second"):
            res.step_times_ms = [1000.0 / fin["train_steps_per_second"]]
        return res


def _line_steps(lines: int, total: int, given: Any) -> list[int] | None:
    """The step each log line ends: k, 2k, ... (or 1, k, 2k, ... with logging_first_step)."""
    cands = [int(given)] if given else sorted({max(1, round(total / lines)), max(1, round(total / max(lines - 1, 1)))})
    for k in cands:
        if total // k == lines:
            return [k * (i + 1) for i in range(lines)]
        if total // k + 1 == lines and k > 1:
            return [1] + [k * (i + 1) for i in range(lines - 1)]
    return None


def _trainer_state(text: str) -> dict[str, Any] | None:
    s = text.lstrip()
    if not s.startswith("{") or '"log_history"' not in s:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("log_history"), list) else None


def _final_of(history: Any) -> dict[str, float] | None:
    for entry in reversed(history or []):
        if isinstance(entry, dict) and all(k in entry for k in FINAL_KEYS):
            return {k: float(v) for k, v in entry.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return None
