"""RunConfig <-> command-line options, derived from the fields' metadata (dlscale/case/config.py).

``add_case_arguments`` adds one option per field, ``config_from_args`` reads them back, and
``to_cli_args`` is its exact inverse (every field round-trips; tests check it), used for the
command stored in a record, the Slurm job's ``dlscale run`` lines and anything else that must
rebuild a case from options.
"""
from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from dlscale import ConfigError, DlscaleError
from dlscale.case.config import BATCH_MAX, DEFAULTS, FIELDS, SECTION_OF, RunConfig, choices_of
from dlscale.cli import build_parser


def parse_options(items: list[str] | None, flag: str = "--option") -> dict[str, Any]:
    """KEY=VALUE pairs -> dict, values parsed as JSON where they parse (ints, bools)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} must look like KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def option_args(flag: str, options: dict[str, Any]) -> list[str]:
    """The inverse of parse_options: ``[flag, "KEY=VALUE", ...]`` that parse back to ``options``."""
    out: list[str] = []
    for k, v in options.items():
        text = v if isinstance(v, str) and not _parses_as_json(v) else json.dumps(v)
        out += [flag, f"{k}={text}"]
    return out


def _parses_as_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def batch_size_arg(value: str) -> int | str:
    """argparse type of --batch-size: an integer (RunConfig checks its range) or "max"."""
    if value.strip().lower() == BATCH_MAX:
        return BATCH_MAX
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'max', got {value!r}") from None


def _number(kind: type, optional: bool = False):
    def parse(value: str):
        if optional and value.strip().lower() == "auto":
            return None
        try:
            return kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {value!r}") from None
    parse.__name__ = kind.__name__
    return parse


def add_case_arguments(p: argparse.ArgumentParser, defaults: dict[str, Any] | None = None,
                       default_notes: dict[str, str] | None = None, exclude: tuple[str, ...] = ()) -> None:
    """One option per RunConfig field. ``defaults`` overrides what an option parses to when not
    given, ``default_notes`` what the help says of that default (for defaults decided later).
    The options are grouped by the field's section (``--help`` lists them so)."""
    shown = {**DEFAULTS, **(defaults or {})}
    groups: dict[type, Any] = {}
    for name, o in FIELDS.items():
        flag = o.option(name)
        if flag is None or name in exclude:
            continue
        sec = SECTION_OF[name]
        if sec not in groups:
            groups[sec] = p.add_argument_group(f"{sec.title} options", (sec.__doc__ or "").strip())
        _add_option(groups[sec], name, flag, shown[name], default_notes)


def _add_option(p: Any, name: str, flag: str, default: Any, default_notes: dict[str, str] | None) -> None:
    o = FIELDS[name]
    names = [flag] + ([o.short] if o.short else [])
    kw: dict[str, Any] = {"dest": name, "help": o.help}
    if o.kind == "flag":
        p.add_argument(*names, action="store_true", **kw)
        return
    if o.kind == "negflag":
        p.add_argument("--no-" + flag[2:], action="store_false", dest=name,
                       help=f"turn off (on by default): {o.help}")
        return
    if o.kind == "options":
        p.add_argument(*names, action="append", metavar=o.metavar, **kw)
        return
    kw["default"] = default
    if o.kind == "batch":
        kw["type"] = batch_size_arg
    elif o.type in (int, float):
        kw["type"] = _number(o.type, o.optional)
    if o.metavar:
        kw["metavar"] = o.metavar
    if isinstance(o.choices, tuple):  # checked by RunConfig, with its one-line message
        kw["help"] = f"{o.help}; one of: {', '.join(map(str, choices_of(name)))}"
    if default_notes and name in default_notes:
        kw["help"] += f" (default: {default_notes[name]})"
    p.add_argument(*names, **kw)


def config_from_args(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    """The RunConfig of parsed options (``overrides`` win)."""
    values: dict[str, Any] = {}
    for name, o in FIELDS.items():
        if not hasattr(args, name):
            continue
        v = getattr(args, name)
        if o.kind == "options":
            v = parse_options(v, o.option(name) or name)
        values[name] = v
    values.update(overrides)
    return RunConfig(**values)


def to_cli_args(cfg: RunConfig) -> list[str]:
    """`dlscale run` options that rebuild ``cfg`` exactly: the workload fields always, the
    procedure fields where they differ from their defaults."""
    out: list[str] = []
    for name, o in FIELDS.items():
        flag = o.option(name)
        if flag is None:
            continue
        v = getattr(cfg, name)
        if o.procedure and v == DEFAULTS[name]:
            continue
        if o.kind == "flag":
            out += [flag] if v else []
        elif o.kind == "negflag":
            out += [] if v else ["--no-" + flag[2:]]
        elif o.kind == "options":
            out += option_args(flag, dict(sorted(v.items())))
        elif v is not None:
            out += [flag, repr(float(v)) if o.type is float else str(v)]
    return out


def command_line(cfg: RunConfig) -> str:
    """The shell-quoted `dlscale run` command that measures this case alone (kept in its record)."""
    return " ".join(shlex.quote(a) for a in ["dlscale", "run", *to_cli_args(cfg)])


def check_round_trip(cfg: RunConfig) -> None:
    """``to_cli_args`` must rebuild ``cfg``: parse what it gives and compare (before a job runs it)."""
    ns = build_parser().parse_args(["run", *to_cli_args(cfg)])
    got = config_from_args(ns).to_dict()
    want = cfg.to_dict()
    diff = sorted(k for k in want if got.get(k) != want[k])
    if diff:
        raise DlscaleError(f"the options of `dlscale run` cannot carry {', '.join(diff)} "
                           f"(see dlscale/case/caseargs.py to_cli_args)")
