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

The final metrics are rounded (``speed_metrics``: runtime to 4 decimals, rates to 3) and, from
transformers 5, printed to 4 significant digits, so runtime x steps/s is only near the step count
(1e-3 off at 4 digits: 20 steps in 20000) and the rates' ratio only near the batch. The step count
is read within the printed values' precision: the logging interval (and whether
``logging_first_step`` added a line) is the one whose step count, a multiple of it, lies nearest
the estimate; the samples per step are the workload's global batch where that lies within the
ratio's precision, else the ratio rounded.
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
PAIR = re.compile(r"['\"](?P<k>[\w./-]+)['\"]\s*:\s*(?P<q>['\"]?)(?P<v>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
                  r"|nan|inf|-inf)(?P=q)")
FINAL_KEYS = ("train_runtime", "train_samples_per_second", "train_steps_per_second")
# speed_metrics rounds the runtime to 4 decimals and the rates to 3 (transformers 4.x and 5)
DECIMALS = {"train_runtime": 4, "train_samples_per_second": 3, "train_steps_per_second": 3}


def _log_raw(text: str) -> dict[str, tuple[str, bool]]:
    """The numeric items of a printed log dict as printed: (number, printed as a string)."""
    m = DICT.search(text)
    if not m:
        return {}
    return {p.group("k"): (p.group("v"), bool(p.group("q"))) for p in PAIR.finditer(m.group(0))}


def _rel_precision(raw: dict[str, tuple[str, bool]], key: str) -> float:
    """How far (relative) the printed value may lie from the measured one: speed_metrics' decimal
    rounding (its keys), transformers 5's 4 significant digits, a bare float's printed digits (a
    whole unit of the last digit: a bound for two roundings together)."""
    text, quoted = raw[key]
    v = abs(float(text))
    if not v or not math.isfinite(v):
        return math.inf
    sig4 = 10.0 ** (math.floor(math.log10(v)) - 3)  # f"{v:.4g}" (trailing zeros dropped: 4 digits all the same)
    if key in DECIMALS:
        ulp = max(10.0 ** -DECIMALS[key], sig4 if quoted else 0.0)
    elif quoted:
        ulp = sig4
    else:  # a bare float: as precise as its printed digits
        mant, _, exp = text.lower().partition("e")
        ulp = 10.0 ** ((int(exp) if exp else 0) - len(mant.partition(".")[2]))
    return ulp / v


def _epoch_ratio(first: dict[str, tuple[str, bool]], last: dict[str, tuple[str, bool]]) -> tuple[float, float] | None:
    """The last step log's epoch over the first's (= their steps' ratio) and its relative precision."""
    if "epoch" not in first or "epoch" not in last:
        return None
    e1, e2 = float(first["epoch"][0]), float(last["epoch"][0])
    if not (e1 > 0 and e2 > 0 and math.isfinite(e1 / e2)):
        return None
    return e2 / e1, _rel_precision(first, "epoch") + _rel_precision(last, "epoch")


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
        raw_final: dict[str, tuple[str, bool]] = {}
        for ln in lines:
            raw = _log_raw(ln.text) if "{" in ln.text else {}
            if not raw:
                continue
            if all(k in raw for k in FINAL_KEYS):
                raw_final = raw
                self._final = {k: float(v) for k, (v, _) in raw.items()}
            elif "loss" in raw:
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
        total = fin["train_runtime"] * fin["train_steps_per_second"]
        total_tol = _rel_precision(raw_final, "train_runtime") + _rel_precision(raw_final, "train_steps_per_second")
        steps = _line_steps(len(logs), total, total_tol, opts.options.get("logging_steps"),
                            _epoch_ratio(_log_raw(logs[0].text), _log_raw(logs[-1].text)))
        if steps is None:
            raise self.error(f"{len(logs)} step log line(s) do not fit {total:.0f} steps at any logging_steps: give "
                             f"-o logging_steps=K")
        batch = fin["train_samples_per_second"] / fin["train_steps_per_second"]
        batch_tol = batch * (_rel_precision(raw_final, "train_samples_per_second")
                             + _rel_precision(raw_final, "train_steps_per_second"))
        gb: float = round(batch)
        self._batch_note = ""
        if opts.global_batch and abs(opts.global_batch - batch) <= max(batch_tol, 0.5):
            gb = opts.global_batch  # the printed ratio is that imprecise: the workload's figure is exact
            if round(batch) != gb:
                self._batch_note = f", the workload's global batch: the Trainer's printed rates give {batch:.2f}"
        elif batch_tol >= 0.5:
            self._batch_note = (f", rounded from {batch:.2f} (the Trainer's printed rates are only that precise: give "
                                f"--batch-size for the exact figure)")
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
                                 f"(train_samples_per_second / train_steps_per_second{self._batch_note})")
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


def _line_steps(lines: int, total: float, tol: float, given: Any,
                epoch_ratio: tuple[float, float] | None = None) -> list[int] | None:
    """The step each log line ends: k, 2k, ... (or 1, k, 2k, ... with logging_first_step).

    ``total``: the step count estimated from the final metrics, within ``tol`` (relative) and one
    step. A run of T steps logged every k prints T // k lines (one more with logging_first_step).
    The epochs the first and last lines print tell the two apart where they are precise enough
    (their ratio is the steps': L lines apart, or k (L - 1) from step 1); of the (k, first-step)
    pairs left that fit the estimate, the one whose multiple of k (a run's length usually is one)
    lies nearest it wins, the plain one on a tie.
    """
    if not (math.isfinite(total) and math.isfinite(tol) and total > 0):
        return None  # steps/s printed as 0: a run too slow for 3 decimals
    if lines < 2:  # one line: nothing to time, its step does not matter
        return [int(given) if given else max(1, round(total))]
    lo, hi = total * (1 - tol) - 1, total * (1 + tol) + 1
    if given:
        ks: Any = [int(given)]
    else:
        k_lo = max(1, math.floor(lo / (lines + 1)))
        k_hi = max(k_lo, math.ceil(hi / (lines - 1)))
        if k_hi - k_lo > 100_000:  # the estimate is too loose to tell the interval
            return None
        ks = range(k_lo, k_hi + 1)
    fits: list[tuple[float, int, bool]] = []
    for k in ks:
        for first in (False, True):
            n = lines - 1 if first else lines  # the lines at multiples of k
            if (first and k == 1) or n < 1:
                continue
            if k * n + k - 1 < lo or k * n > hi:  # T in [k n, k n + k - 1]
                continue
            fits.append((abs(total - k * n), k, first))
    if epoch_ratio is not None and epoch_ratio[1] < 0.1:
        ratio, rel = epoch_ratio
        agree = [f for f in fits if abs(ratio / (f[1] * (lines - 1) if f[2] else lines) - 1) <= rel + 0.02]
        fits = agree or fits
    if not fits:
        return None
    _, k, first = min(fits)
    return ([1] if first else []) + [k * (i + 1) for i in range(lines - 1 if first else lines)]


def _trainer_state(text: str) -> dict[str, Any] | None:
    s = text.lstrip()
    if not s.startswith("{") or '"log_history"' not in s:
        return None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("log_history"), list) else None


def _final_of(history: Any) -> dict[str, float] | None:
    for entry in reversed(history or []):
        if isinstance(entry, dict) and all(k in entry for k in FINAL_KEYS):
            return {k: float(v) for k, v in entry.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return None
