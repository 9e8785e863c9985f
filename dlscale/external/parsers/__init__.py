"""Log parsers: throughput from another training tool's own output, one file per tool.

A parser is a class in one file, registered by name::

    @register_parser("torchtitan")
    class TorchTitan(Parser):
        def observations(self, lines, opts) -> list[Obs]: ...

It turns the tool's log lines into observations (``Obs``: the steps a log line covers and what
it says about them), and the shared warm-up rule (``window``) picks the timed window: the
observations that cover only steps after the first ``warmup`` steps, up to ``steps`` steps in
all -- the same rule as native cases (docs/metrics.md: skip W, time the next N). A parser whose
tool reduces its logs differently (DLPerf's own scripts) says so and overrides ``reduce``.

Nothing in a log is ever executed: parsers match regular expressions and read numbers.
Errors are ``ParseError``: one line naming the parser and, where there is one, the file.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from dlscale import ConfigError, DlscaleError
from dlscale.registry import Registry

# what one sample is, in the table format and the records (docs/records.md)
UNITS = ("img", "seq", "tok")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"


class ParseError(DlscaleError):
    """A log that does not give a throughput: no matching lines, truncated, the wrong tool."""

    def __init__(self, parser: str, message: str, path: str | None = None):
        self.parser, self.message, self.path = parser, message, path
        where = f"{path}: " if path else ""
        super().__init__(f"{where}{parser} parser: {message}")

    def with_path(self, path: str) -> "ParseError":
        return type(self)(self.parser, self.message, path)


class ParseTimeout(ParseError):
    """The parse itself ran past what was left of the case's time limit (recorded ``timeout``)."""


@dataclass(frozen=True)
class LogLine:
    """One line of output; ``t``: when dlscale read it (epoch s), for live runs only."""

    text: str
    t: float | None = None


@dataclass
class ParseOptions:
    """What a parser may need beyond the log: the warm-up rule and the user's workload.

    ``global_batch``: samples per optimizer step over the whole job (per-device batch x
    data-parallel processes x accumulation) where known; ``world_size``: processes (devices)
    of the job; ``seq_len``: tokens per sample; ``metric``/``unit``: the regex parser's.
    """

    warmup: int = 20
    steps: int | None = 100
    global_batch: int | None = None
    world_size: int = 1
    seq_len: int | None = None
    metric: str | None = None
    unit: str | None = None
    options: dict[str, Any] = field(default_factory=dict)  # parser-specific KEY=VALUE
    deadline_s: float | None = None  # what is left of the case's time limit for the parse (live runs)


@dataclass
class Obs:
    """What one log line says about the steps ``(step - steps, step]``.

    ``samples_per_s``: the job's rate over those steps in the parser's unit; ``step_ms``: the
    mean step time; ``t``: when the line was read (live runs).
    """

    step: int
    steps: int = 1
    samples_per_s: float | None = None
    step_ms: float | None = None
    t: float | None = None
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def first(self) -> int:
        """The 0-based index of the first step this observation covers."""
        return self.step - self.steps


@dataclass
class ParseResult:
    """A parsed run: the window's throughput and how it was obtained.

    ``unit``: "sample" (one sample as the workload defines it: an image, a sequence) or "tok";
    ``samples_per_s``: the window figure for the whole job in that unit; ``per_step_samples_per_s``
    and ``step_times_ms``: per window observation (a step or a log interval); ``skipped_steps``:
    warm-up steps left out; ``window_steps``: steps in the window; ``window_s``: its length where
    the log says; ``window_t``: (start, end) wall clock of the window for the hardware sampler.
    """

    parser: str
    unit: str
    samples_per_s: float
    method: str
    per_step_samples_per_s: list[float] = field(default_factory=list)
    step_times_ms: list[float] = field(default_factory=list)
    steps_seen: int = 0
    skipped_steps: int = 0
    window_steps: int = 0
    window_s: float | None = None
    window_t: tuple[float, float] | None = None
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    seq_len: int | None = None  # tokens per sample as the log states it (None: the log does not say)

    def to_dict(self) -> dict[str, Any]:
        return {"parser": self.parser, "unit": self.unit, "samples_per_s": self.samples_per_s, "seq_len": self.seq_len,
                "method": self.method, "steps_seen": self.steps_seen, "skipped_steps": self.skipped_steps,
                "window_steps": self.window_steps, "window_s": self.window_s,
                "window_t": list(self.window_t) if self.window_t else None,
                "warnings": list(self.warnings), "extra": dict(self.extra)}


class Parser:
    """Base of the registered parsers; subclasses set ``name`` and implement ``observations``."""

    name = "?"
    description = ""
    # the tool's packages whose versions a record notes when they are importable here
    packages: tuple[str, ...] = ()
    # a line where the tool states its sequence length (group ``n``); None: it never prints it
    seq_len_line: "re.Pattern[str] | None" = None

    def check(self, opts: ParseOptions) -> None:
        """Raise ConfigError for options this parser cannot work with (before anything runs)."""

    def observations(self, lines: Sequence[LogLine], opts: ParseOptions) -> list[Obs]:
        raise NotImplementedError

    def reduce(self, obs: list[Obs], opts: ParseOptions) -> ParseResult:
        """The shared warm-up rule and the window's throughput (total samples / total time)."""
        return reduce_window(self.name, "sample", obs, opts)

    def parse(self, lines: Iterable[LogLine | str], opts: ParseOptions) -> ParseResult:
        clean = [line if isinstance(line, LogLine) else LogLine(line) for line in lines]
        clean = [LogLine(ANSI.sub("", ln.text).rstrip("\r\n"), ln.t) for ln in clean]
        obs = self.observations(clean, opts)
        if not obs:
            raise ParseError(self.name, f"no throughput lines found ({self.expects()})")
        res = self.reduce(obs, opts)
        res.seq_len = log_seq_len(self.seq_len_line, clean)
        return res

    def expects(self) -> str:
        """A short description of the lines this parser reads (for its error messages)."""
        return self.description

    def error(self, message: str) -> ParseError:
        return ParseError(self.name, message)


_PARSERS: Registry[Callable[[], Parser]] = Registry("parser", __name__)


def register_parser(name: str):
    """Class decorator: register a Parser subclass under ``name``."""

    def deco(cls):
        _PARSERS.add(name, cls)
        cls.name = name
        return cls

    return deco


def parser_names() -> list[str]:
    return _PARSERS.names()


def get_parser(name: str) -> Parser:
    return _PARSERS.get(name)()


# ----------------------------------------------------------------------------- the warm-up rule

def window(obs: list[Obs], warmup: int, steps: int | None, parser: str) -> tuple[list[Obs], int]:
    """The observations of the timed window and the number of warm-up steps skipped.

    An observation is in the window when every step it covers comes after the first ``warmup``
    steps (``first >= warmup``); the window ends once it covers ``steps`` steps (None: every
    remaining observation). A log interval that straddles the end of the warm-up is skipped
    whole, so the window may start a little after step ``warmup``: ``skipped`` says where.
    """
    obs = sorted(obs, key=lambda o: o.step)
    inside = [o for o in obs if o.first >= warmup]
    if not inside:
        last = obs[-1].step if obs else 0
        raise ParseError(parser, f"the log covers {last} step(s); none is left after skipping the first {warmup} "
                                 f"warm-up step(s) (lower --warmup, or run the tool for more steps)")
    out, covered = [], 0
    for o in inside:
        if steps is not None and covered >= steps:
            break
        out.append(o)
        covered += o.steps
    return out, out[0].first


def log_seq_len(pattern: "re.Pattern[str] | None", lines: Sequence[LogLine]) -> int | None:
    """The sequence length the log states (its first statement), or None."""
    if pattern is None:
        return None
    for ln in lines:
        m = pattern.search(ln.text)
        if m and int(m.group("n")) > 0:
            return int(m.group("n"))
    return None


def harmonic_rate(obs: Sequence[Obs]) -> float:
    """Steps-weighted harmonic mean of the rates: total samples / total time when every step
    holds the same number of samples."""
    total = sum(o.steps for o in obs)
    time = sum(o.steps / o.samples_per_s for o in obs)
    return total / time


def reduce_window(parser: str, unit: str, obs: list[Obs], opts: ParseOptions,
                  note: str = "") -> ParseResult:
    """The window's throughput = steps x samples per step / seconds, from the observations' rates.

    With per-line rates r_i over k_i steps each: sum(k_i) / sum(k_i / r_i) (each step holds
    the same samples). Per-step times come from ``step_ms`` where the log gives them, else from
    the rates and the global batch where it is known.
    """
    bad = [o for o in obs if o.samples_per_s is None or not math.isfinite(o.samples_per_s) or o.samples_per_s <= 0]
    if bad:
        raise ParseError(parser, f"step {bad[0].step}: throughput {bad[0].samples_per_s!r} is not a positive number")
    win, skipped = window(obs, opts.warmup, opts.steps, parser)
    n = sum(o.steps for o in win)
    step_ms = [o.step_ms for o in win if o.step_ms is not None]
    timed = len(step_ms) == len(win)
    # with step times, samples / time exactly (the batch may change); else every step alike
    rate = (sum(o.steps * o.step_ms * o.samples_per_s for o in win) / sum(o.steps * o.step_ms for o in win)  # type: ignore[operator]
            if timed else harmonic_rate(win))
    if not step_ms and opts.global_batch and unit == "sample":
        step_ms = [opts.global_batch / o.samples_per_s * 1000.0 for o in win]
    window_s = sum(o.steps * o.step_ms for o in win) / 1000.0 if timed else None  # type: ignore[operator]
    if window_s is None and opts.global_batch and unit == "sample":
        window_s = n * opts.global_batch / rate
    res = ParseResult(parser, unit, rate,
                      method=(f"total samples / total time over steps {skipped + 1}-{skipped + n} "
                              + ("(per-line step times)" if timed else "(steps-weighted harmonic mean of the "
                                 "per-line rates)") + (f"; {note}" if note else "")),
                      per_step_samples_per_s=[o.samples_per_s for o in win],  # type: ignore[misc]
                      step_times_ms=step_ms, steps_seen=max(o.step for o in obs), skipped_steps=skipped,
                      window_steps=n, window_s=window_s, window_t=_window_t(obs, win))
    _short_window(res, opts)
    return res


def _window_t(obs: list[Obs], win: list[Obs]) -> tuple[float, float] | None:
    """Wall-clock bounds of the window: the line before its first observation to its last line."""
    before = [o for o in obs if o.step <= win[0].first and o.t is not None]
    start = before[-1].t if before else None
    end = win[-1].t
    return (start, end) if start is not None and end is not None and end > start else None


def _short_window(res: ParseResult, opts: ParseOptions) -> None:
    if opts.steps is not None and res.window_steps < opts.steps:
        res.warnings.append(f"window holds {res.window_steps} step(s), fewer than the {opts.steps} asked for "
                            f"(the log ends at step {res.steps_seen})")


def weighted_extra(win: Sequence[Obs], key: str) -> float | None:
    """Steps-weighted mean of an extra value (MFU, TFLOP/s) over the window, where logged."""
    vals = [(o.steps, o.extra[key]) for o in win if key in o.extra]
    if not vals:
        return None
    return sum(k * v for k, v in vals) / sum(k for k, _ in vals)


def float_of(text: str) -> float:
    """A logged number, thousands separators allowed ("12,345.6")."""
    return float(text.replace(",", ""))


def read_log(path: str) -> list[LogLine]:
    """A saved log's lines (no arrival times); unreadable bytes replaced, never fatal."""
    try:
        with open(path, "r", encoding="utf-8", errors="replace") as f:
            return [LogLine(line.rstrip("\n")) for line in f]
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None


def parse_file(parser: Parser, path: str, opts: ParseOptions) -> ParseResult:
    """Parse a saved log; a ParseError names the file."""
    try:
        return parser.parse(read_log(path), opts)
    except ParseError as e:
        raise e.with_path(path) from None
