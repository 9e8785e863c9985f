"""A benchmark suite's ``external`` section: other stacks' training commands, measured by the driver
as `dlscale run --command` measures them, beside the suite's own cases.

An entry is one external case (dlscale/external/case.py): the command as an argument list
(``command: [ARG, ...]``, any program; or ``script: [NAME.py, ARG, ...]``, a script of benchmarks/
run by the driver's Python), the ``parser`` that reads its throughput, and the workload it trains
as the user describes it (``model``, ``batch_size`` per device, ``precision``, ``devices``,
``strategy``, ``compile``, ...). The suite's settings (warm-up, steps, repeats, time limit,
device, monitor, label) apply unless the entry sets its own. Arguments may hold the driver's
placeholders (``{out}``, ``{python}``, ...); nothing is passed to a shell. Every key is checked
when the suite is loaded; the program itself is looked up when the driver runs it.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from dlscale import ConfigError
from dlscale.external.case import ExternalCase

# keys of an entry -> ExternalCase field (the workload's description, the window, the procedure)
FIELDS = {"parser": "parser", "stack": "framework", "model": "model", "batch_size": "batch_size",
          "precision": "precision", "devices": "nproc_per_node", "strategy": "strategy", "compile": "compile",
          "grad_accum": "grad_accum", "seq_len": "seq_len", "unit": "unit", "metric": "metric",
          "parser_options": "parser_options", "warmup": "warmup", "steps": "steps", "repeats": "repeats",
          "time_limit": "time_limit", "label": "label", "monitor": "monitor", "device": "device"}
REQUIRED = ("parser", "model", "batch_size", "precision")
KEYS = ("command", "script") + tuple(FIELDS)
# suite settings an external case takes unless its entry sets them
SETTINGS = ("warmup", "steps", "repeats", "time_limit", "label", "monitor", "device")
_TYPES: dict[str, tuple[type, ...]] = {"parser": (str,), "stack": (str,), "model": (str,), "precision": (str,),
                                       "strategy": (str,), "unit": (str,), "metric": (str,), "label": (str,),
                                       "device": (str,), "compile": (bool,), "monitor": (bool,),
                                       "parser_options": (dict,), "time_limit": (int, float)}


# the benchmark driver's placeholders in a command's arguments (benchmarks/run.py fills them)
PLACES = ("out", "store", "bare", "variants", "python")
_PLACE = re.compile(r"\{(" + "|".join(PLACES) + r")\}")


def resolve_args(argv: Sequence[str], places: dict[str, str]) -> list[str]:
    """Arguments with ``{out}``, ``{store}``, ``{bare}``, ``{variants}``, ``{python}`` replaced."""
    return [_PLACE.sub(lambda m: places[m.group(1)], a) for a in argv]


@dataclass(frozen=True)
class ExternalRun:
    """One external case of a suite; its command still holds the driver's placeholders."""

    case: ExternalCase
    script: bool = False  # command[0] names a benchmarks/ script, run by the driver's Python

    def resolved(self, places: dict[str, str], bench_dir: Path, python: str) -> ExternalCase:
        """The case as it runs: placeholders replaced, a script as ``python benchmarks/NAME.py``."""
        argv = resolve_args(self.case.command, {**places, "python": python})
        if self.script:
            argv = [python, str(bench_dir / argv[0]), *argv[1:]]
        return dataclasses.replace(self.case, command=argv)

    def with_overrides(self, values: dict[str, Any]) -> "ExternalRun":
        given = {k: v for k, v in values.items() if k in ("warmup", "steps", "repeats", "device")}
        return dataclasses.replace(self, case=dataclasses.replace(self.case, **given)) if given else self

    def describe(self) -> str:
        c = self.case
        return (f"external {c.framework} {c.model} b{c.batch_size} {c.precision} {c.strategy} x{c.world_size}"
                + (" compiled" if c.compile else "") + (f" [{c.label}]" if c.label else ""))


def parse_external(value: Any, error: Callable[[str | None, str], ConfigError],
                   unknown_keys: Callable[[str, Any, tuple], None], argv: Callable[[str, Any], tuple[str, ...]],
                   settings: dict[str, Any]) -> list[ExternalRun]:
    """The validated ``external`` section; ``argv(key, value)`` checks an argument list."""
    if not isinstance(value, list):
        raise error("external", f"expected a list of external cases (command or script, parser, model, ...), "
                                f"got {value!r}")
    runs: list[ExternalRun] = []
    for i, entry in enumerate(value):
        run = _entry(f"external[{i}]", entry, error, unknown_keys, argv, settings)
        if any(r.case.case_key() == run.case.case_key() and r.case.label == run.case.label for r in runs):
            raise error(f"external[{i}]", "the same external case as an earlier entry (same command and workload)")
        runs.append(run)
    return runs


def _entry(key: str, entry: Any, error, unknown_keys, argv, settings: dict[str, Any]) -> ExternalRun:
    if not isinstance(entry, dict):
        raise error(key, f"expected a mapping (command or script, parser, model, batch_size, precision, ...), "
                         f"got {entry!r}")
    unknown_keys(f"{key}.", entry, KEYS)
    if ("command" in entry) == ("script" in entry):
        raise error(key, "give one of command: [PROGRAM, ARG, ...] or script: [NAME.py, ARG, ...]")
    script = "script" in entry
    args = argv(f"{key}.{'script' if script else 'command'}", entry["script" if script else "command"])
    if script and not (args[0].endswith(".py") and "/" not in args[0]):
        raise error(f"{key}.script[0]", f"expected the file name of a benchmarks/ script (NAME.py), got {args[0]!r}")
    for name in REQUIRED:
        if name not in entry:
            raise error(key, f"an external case needs {name} (what the command trains: "
                             f"{', '.join(REQUIRED[1:])}; parser: how to read its throughput)")
    for name, kinds in _TYPES.items():
        v = entry.get(name)
        if v is not None and (not isinstance(v, kinds) or (bool not in kinds and isinstance(v, bool))):
            raise error(f"{key}.{name}", f"expected {' or '.join(k.__name__ for k in kinds)}, got {v!r}")
    fields = {FIELDS[k]: v for k, v in entry.items() if k in FIELDS}
    for name in SETTINGS:
        if name not in entry and settings.get(name) is not None:
            fields[name] = settings[name]
    fields.setdefault("strategy", "single" if fields.get("nproc_per_node", 1) == 1 else "ddp")
    try:
        case = ExternalCase(command=list(args), **fields)
    except (ConfigError, TypeError) as e:
        raise error(key, str(e)) from None
    return ExternalRun(case, script)
