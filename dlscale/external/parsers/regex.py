"""Any script: a user's regular expression with a named group ``value`` (a rate).

``--metric 'samples/sec: (?P<value>[0-9.]+)' --unit img`` makes every line the expression
matches one observation of the job's throughput (img/s, seq/s or tok/s as ``--unit`` says), in
order: line i covers step i (Hugging Face Accelerate scripts, plain torchrun scripts, JAX
trainers). Make it match one line per step, on one rank (print on rank 0), with the figure for
the whole job; a per-rank figure needs the script to multiply, or ``-o scale=N``.
``-o steps_per_line=K`` says each matched line covers K steps (a script that prints every K).

The expression is only compiled and matched (Python ``re``), never run as code; it must compile
and hold the group ``value``, checked before anything starts. After a live run the matching runs
in a child process bounded by what is left of ``--time-limit``: an expression that backtracks
without end (nested quantifiers such as ``(a+)+b``) ends the case as ``timeout``, not a hang.

Warm-up rule: the lines covering the first W steps are skipped, then the next N steps; the
window figure is the harmonic mean of their values (total samples / total time when every
step holds the same samples).
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from typing import Sequence

from dlscale import ConfigError
from dlscale.external.parsers import (UNITS, LogLine, Obs, ParseOptions, Parser, ParseResult, ParseTimeout,
                                      float_of, reduce_window, register_parser)

# the child that matches: Python's re cannot be interrupted from a thread, so a bound needs a process
_CHILD = ("import json, re, sys\n"
          "pat, texts = json.load(sys.stdin)\n"
          "p = re.compile(pat)\n"
          "json.dump([(m.group('value') if m else None) for m in map(p.search, texts)], sys.stdout)\n")


def compile_metric(metric: str | None) -> re.Pattern:
    """The user's expression, compiled; ConfigError when it does not compile or lacks ``value``."""
    if not metric:
        raise ConfigError("the regex parser needs --metric 'REGEX' with a named group value, "
                          "e.g. --metric 'samples/sec: (?P<value>[0-9.]+)'")
    try:
        pat = re.compile(metric)
    except re.error as e:
        raise ConfigError(f"--metric {metric!r} is not a valid regular expression: {e}") from None
    if "value" not in pat.groupindex:
        raise ConfigError(f"--metric {metric!r} has no named group 'value': write (?P<value>...) around the number")
    return pat


@register_parser("regex")
class Regex(Parser):
    description = "lines matching --metric (a regular expression with a named group value)"

    def check(self, opts: ParseOptions) -> None:
        compile_metric(opts.metric)
        if opts.unit not in UNITS:
            raise ConfigError(f"the regex parser needs --unit, one of {', '.join(UNITS)} (what the value counts "
                              f"per second), got {opts.unit!r}")
        for key in ("scale", "steps_per_line"):
            v = opts.options.get(key, 1)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 or not math.isfinite(v):
                raise ConfigError(f"regex parser option {key} must be a number > 0, got {v!r}")
        k = opts.options.get("steps_per_line", 1)
        if int(k) != k:
            raise ConfigError(f"regex parser option steps_per_line must be an integer, got {k!r}")

    def expects(self) -> str:
        return "lines matching the --metric expression"

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        self.check(opts)
        pat = compile_metric(opts.metric)
        scale = float(opts.options.get("scale", 1))
        k = int(opts.options.get("steps_per_line", 1))
        out: list[Obs] = []
        for ln, found in zip(lines, self._values(pat, [ln.text for ln in lines], opts.deadline_s)):
            if found is None:
                continue
            try:
                v = float_of(found)
            except ValueError:
                raise self.error(f"--metric matched {found!r}, which is not a number") from None
            out.append(Obs(step=(len(out) + 1) * k, steps=k, samples_per_s=v * scale, t=ln.t))
        return out

    def _values(self, pat: re.Pattern, texts: list[str], deadline_s: float | None) -> list[str | None]:
        """The group ``value`` each text matched (None: no match); within ``deadline_s`` seconds when given."""
        if deadline_s is None:
            return [(m.group("value") if m else None) for m in map(pat.search, texts)]
        try:
            done = subprocess.run([sys.executable, "-I", "-c", _CHILD], input=json.dumps([pat.pattern, texts]),
                                  capture_output=True, text=True, timeout=max(deadline_s, 1.0))
        except subprocess.TimeoutExpired:
            raise ParseTimeout(self.name, f"matching --metric over {len(texts)} log line(s) ran past the time limit "
                                          f"({max(deadline_s, 1.0):.0f} s left); nested quantifiers such as (a+)+ "
                                          f"backtrack without end: write the expression without them") from None
        if done.returncode != 0:
            raise self.error(f"matching --metric failed: {done.stderr.strip().splitlines()[-1:]}")
        return json.loads(done.stdout)

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        unit = "tok" if opts.unit == "tok" else "sample"
        return reduce_window(self.name, unit, obs, opts, note=f"one matched line per {obs[0].steps} step(s)")
