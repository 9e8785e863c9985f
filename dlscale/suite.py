"""Benchmark suites: a YAML matrix of cases, validated completely before anything runs.

A suite file holds run settings, one or more ``matrix`` blocks (each expanded as a cartesian
product), ``exclude`` entries that drop matrix cases, and an explicit ``cases`` list appended to
the matrix. docs/sweeps.md documents the format; the shipped suites live in dlscale/suites/.

Expansion rules:

* each matrix block is the product of its axes; blocks are expanded in order and concatenated,
  then the explicit ``cases`` follow; a case equal to an earlier one (same case_key) is dropped;
* the device count is ``devices`` (one node, that many processes) or ``nodes`` x
  ``nproc_per_node``; a block gives one or the other, never both (default: devices [1]);
* strategies run as listed: ``ddp`` at 1 device is DDP with one process, a fine 1-device
  baseline; ``single`` at more than one device is an impossible case and an error (add an
  ``exclude`` entry or put single and ddp in separate blocks);
* order: models, flavors, precisions, compile (with compile modes and inductor options, which
  apply to compiled cases only), batch sizes, grad_accum, strategy options,
  strategies, then device counts innermost, so each table's 1-device baseline runs first.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dlscale import ConfigError
from dlscale.compiling import COMPILE_MODES
from dlscale.config import DEVICES, PRECISIONS, RunConfig, validate_case

SUITES_DIR = Path(__file__).parent / "suites"

# run settings: suite-wide, not part of the matrix (defaults from RunConfig where it has one)
SETTINGS = ("description", "device", "warmup", "steps", "repeats", "time_limit", "collective_timeout", "seed",
            "label", "max_batch_start", "max_batch_cap")
SECTIONS = ("matrix", "exclude", "cases")
# matrix axis -> case key it sets
AXES = {"models": "model", "flavors": "flavor", "strategies": "strategy", "devices": "devices",
        "nodes": "nodes", "nproc_per_node": "nproc_per_node", "batch_sizes": "batch_size",
        "precisions": "precision", "compile": "compile", "compile_modes": "compile_mode",
        "inductor_options": "inductor_options", "grad_accum": "grad_accum",
        "strategy_options": "strategy_options"}
# keys a case (explicit) may set; exclude entries and --filter match the first group
MATCH_KEYS = ("model", "flavor", "strategy", "devices", "nodes", "nproc_per_node", "batch_size", "precision",
              "compile", "grad_accum")
CASE_KEYS = MATCH_KEYS + ("compile_mode", "inductor_options", "strategy_options", "warmup", "steps", "repeats",
                          "time_limit", "inject_failure")
EXPANSION_ORDER = ("models", "flavors", "precisions", "compile", "compile_modes", "inductor_options", "batch_sizes",
                   "grad_accum", "strategy_options",
                   "strategies")


@dataclass
class Suite:
    """A loaded suite: ``cases`` in run order, and the suite-wide ``settings``.

    ``batch_max[i]`` is True where case i asks for the largest batch that fits (its
    ``cases[i].batch_size`` is then the search start, ``settings["max_batch_start"]``).
    """

    name: str
    path: Path
    cases: list[RunConfig]
    settings: dict[str, Any]
    batch_max: list[bool] = field(default_factory=list)
    duplicates: int = 0  # cases dropped because an earlier one had the same case_key

    def __post_init__(self) -> None:
        if not self.batch_max:
            self.batch_max = [False] * len(self.cases)

    @property
    def description(self) -> str:
        return str(self.settings.get("description") or "")

    def sweep_key(self, i: int) -> str:
        """What a sweep resumes on: case_key, or for a "max" case the key of the batch search."""
        return sweep_key(self.cases[i], self.batch_max[i])

    def with_device(self, device: str) -> "Suite":
        if device not in DEVICES:
            raise ConfigError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
        cases = [dataclasses.replace(c, device=device) for c in self.cases]
        return dataclasses.replace(self, cases=cases, settings={**self.settings, "device": device})

    def with_run_lengths(self, **lengths: int | None) -> "Suite":
        """Override warmup / steps / repeats for every case (a shorter or longer look at a suite).

        Repeats are not part of a case's identity (case_key); warmup and steps are, because a
        shorter window measures something slightly different, so a resumed sweep must use the
        same warmup and steps to recognise the cases it already stored.
        """
        given = {k: v for k, v in lengths.items() if v is not None}
        minimum = {"warmup": 0, "steps": 1, "repeats": 1}
        for k, v in given.items():
            if k not in minimum:
                raise ConfigError(f"unknown run length {k!r}; allowed: {', '.join(minimum)}")
            if isinstance(v, bool) or not isinstance(v, int) or v < minimum[k]:
                raise ConfigError(f"--{k} must be an integer >= {minimum[k]}, got {v!r}")
        if not given:
            return self
        cases = [dataclasses.replace(c, **given) for c in self.cases]
        return dataclasses.replace(self, cases=cases, settings={**self.settings, **given})


def sweep_key(cfg: RunConfig, batch_max: bool = False) -> str:
    if batch_max:
        from dlscale.batchsearch import max_case_key

        return max_case_key(cfg)
    return cfg.case_key()


# ----------------------------------------------------------------------------- locating

def shipped_suites() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.yaml"))


def resolve_suite_path(name_or_path: str | os.PathLike) -> Path:
    """A shipped suite name ("quick") or a path to a .yaml file."""
    s = str(name_or_path)
    p = Path(s)
    if p.suffix in (".yaml", ".yml") or os.sep in s or "/" in s or p.is_file():
        if not p.is_file():
            raise ConfigError(f"suite file {s} does not exist")
        return p
    shipped = SUITES_DIR / f"{s}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"unknown suite {s!r}; shipped suites: {', '.join(shipped_suites())} "
                      f"(or give the path of a .yaml file)")


def display_path(path: Path) -> str:
    """The path as the user knows it: relative to the current directory or the package, if inside."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        pass
    try:
        return "dlscale/" + str(path.resolve().relative_to(Path(__file__).parent.resolve()))
    except ValueError:
        return str(path)


# ----------------------------------------------------------------------------- validation helpers

class _Where:
    """Error prefix: the file, and the key inside it."""

    def __init__(self, file: str):
        self.file = file

    def error(self, key: str | None, message: str) -> ConfigError:
        return ConfigError(f"{self.file}: key '{key}': {message}" if key else f"{self.file}: {message}")


def _show(v: Any) -> str:
    return repr(v) if not isinstance(v, str) else f"'{v}'"


def _unknown_keys(where: _Where, prefix: str, got: Iterable[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for k in got:
        if k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            more = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise where.error(f"{prefix}{k}", f"unknown key{more}; allowed: {', '.join(allowed)}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _as_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else [v]


def _check_list(where: _Where, key: str, value: Any, ok: Callable[[Any], bool], expected: str) -> list[Any]:
    """A list (a scalar counts as a one-element list) whose every element passes ``ok``."""
    items = _as_list(value)
    if not items:
        raise where.error(key, f"expected {expected}, got an empty list")
    for v in items:
        if not ok(v):
            raise where.error(key, f"expected {expected}, got {_show(v)}")
    return items


def _one_of(where: _Where, key: str, value: Any, choices: Iterable[str], what: str) -> list[str]:
    choices = list(choices)
    items = _check_list(where, key, value, lambda v: isinstance(v, str) and bool(v), f"a list of {what} names")
    for v in items:
        if v not in choices:
            raise where.error(key, f"unknown {what} {_show(v)}; allowed: {', '.join(choices)}")
    return items


def _model_names() -> list[str]:
    from dlscale.models import model_names

    return model_names()


def _strategy_names() -> list[str]:
    from dlscale.strategies import strategy_names

    return strategy_names()


def _flavors() -> tuple[str, ...]:
    from dlscale.models import all_flavors

    return all_flavors()


POS_INTS = "a list of positive integers"
BATCHES = 'a list of positive integers or "max"'


def _batch_ok(v: Any) -> bool:
    return (_is_int(v) and v >= 1) or v == "max"


def _axis_values(where: _Where, key: str, axis: str, value: Any) -> list[Any]:
    """Validate one matrix axis (or one case value, wrapped in a list)."""
    if axis in ("models", "model"):
        return _one_of(where, key, value, _model_names(), "model")
    if axis in ("flavors", "flavor"):
        return _one_of(where, key, value, _flavors(), "flavor")
    if axis in ("strategies", "strategy"):
        return _one_of(where, key, value, _strategy_names(), "strategy")
    if axis in ("precisions", "precision"):
        return _one_of(where, key, value, PRECISIONS, "precision")
    if axis in ("devices", "nodes", "nproc_per_node", "grad_accum"):
        return _check_list(where, key, value, lambda v: _is_int(v) and v >= 1, POS_INTS)
    if axis in ("batch_sizes", "batch_size"):
        return _check_list(where, key, value, _batch_ok, BATCHES)
    if axis == "compile":
        return _check_list(where, key, value, lambda v: isinstance(v, bool), "a list of true/false")
    if axis in ("compile_modes", "compile_mode"):
        return _one_of(where, key, value, COMPILE_MODES, "compile mode")
    if axis in ("strategy_options", "inductor_options"):
        items = _check_list(where, key, value, lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
                            "a mapping of option names to values, or a list of such mappings")
        return [dict(v) for v in items]
    raise AssertionError(axis)


def _settings(where: _Where, data: dict[str, Any]) -> dict[str, Any]:
    d = RunConfig()
    out: dict[str, Any] = {"description": "", "device": d.device, "warmup": d.warmup, "steps": d.steps,
                           "repeats": d.repeats, "time_limit": d.time_limit,
                           "collective_timeout": d.collective_timeout, "seed": d.seed, "label": None,
                           "max_batch_start": None, "max_batch_cap": None}
    for k in SETTINGS:
        if k not in data:
            continue
        v = data[k]
        if k in ("description", "label"):
            if v is not None and not isinstance(v, str):
                raise where.error(k, f"expected a string, got {_show(v)}")
        elif k == "device":
            if v not in DEVICES:
                raise where.error(k, f"expected one of {', '.join(DEVICES)}, got {_show(v)}")
        elif k in ("warmup", "seed"):
            if not _is_int(v) or v < 0:
                raise where.error(k, f"expected an integer >= 0, got {_show(v)}")
        elif k in ("steps", "repeats", "max_batch_start", "max_batch_cap"):
            if not _is_int(v) or v < 1:
                raise where.error(k, f"expected a positive integer, got {_show(v)}")
        elif k in ("time_limit", "collective_timeout"):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise where.error(k, f"expected a positive number of seconds, got {_show(v)}")
            v = float(v)
        out[k] = v
    if out["max_batch_start"] and out["max_batch_cap"] and out["max_batch_cap"] < out["max_batch_start"]:
        raise where.error("max_batch_cap", f"{out['max_batch_cap']} is below max_batch_start "
                                           f"{out['max_batch_start']}")
    return out


# ----------------------------------------------------------------------------- expansion

def _counts(where: _Where, prefix: str, block: dict[str, Any]) -> list[tuple[int, int]]:
    """(nnodes, nproc_per_node) pairs of a matrix block or case."""
    has_dev = "devices" in block
    has_nodes = "nodes" in block or "nproc_per_node" in block
    if has_dev and has_nodes:
        raise where.error(f"{prefix}devices", "give either devices (processes on one node) or nodes and "
                                              "nproc_per_node, not both")
    if has_dev:
        return [(1, d) for d in _axis_values(where, f"{prefix}devices", "devices", block["devices"])]
    nodes = _axis_values(where, f"{prefix}nodes", "nodes", block.get("nodes", 1))
    nproc = _axis_values(where, f"{prefix}nproc_per_node", "nproc_per_node", block.get("nproc_per_node", 1))
    return [(n, p) for n in nodes for p in nproc]


def _describe(case: dict[str, Any]) -> str:
    parts = [f"{k}={case[k]}" for k in ("model", "flavor", "strategy") if k in case]
    n, p = case.get("nnodes", 1), case.get("nproc_per_node", 1)
    parts.append(f"devices={p}" if n == 1 else f"nodes={n} nproc_per_node={p}")
    parts += [f"{k}={case[k]}" for k in ("batch_size", "precision", "compile", "grad_accum") if k in case]
    if case.get("strategy_options"):
        parts.append(f"strategy_options={case['strategy_options']}")
    return "{" + ", ".join(parts) + "}"


def _matches(case: dict[str, Any], entry: dict[str, list[Any]]) -> bool:
    """Does a case (model, ..., nnodes, nproc_per_node) match every key of an exclude/filter entry?"""
    for k, values in entry.items():
        if k == "devices":
            v = case["nnodes"] * case["nproc_per_node"]
        elif k == "nodes":
            v = case["nnodes"]
        else:
            v = case.get(k)
        if v not in values:
            return False
    return True


def _exclude_entries(where: _Where, value: Any) -> list[dict[str, list[Any]]]:
    if not isinstance(value, list):
        raise where.error("exclude", f"expected a list of mappings (e.g. - {{model: gpt2, devices: 8}}), "
                                     f"got {_show(value)}")
    out = []
    for i, e in enumerate(value):
        key = f"exclude[{i}]"
        if not isinstance(e, dict) or not e:
            raise where.error(key, f"expected a mapping of case keys to values, got {_show(e)}")
        _unknown_keys(where, f"{key}.", e, MATCH_KEYS)
        out.append({k: _axis_values(where, f"{key}.{k}", k, v) for k, v in e.items()})
    return out


def _settings_fields(settings: dict[str, Any]) -> dict[str, Any]:
    return {k: settings[k] for k in ("device", "warmup", "steps", "repeats", "time_limit", "collective_timeout",
                                     "seed", "label")}


def _build(where: _Where, key: str, case: dict[str, Any], settings: dict[str, Any], in_matrix: bool) -> RunConfig:
    """A RunConfig from an expanded case; impossible combinations raise naming the case."""
    fields = _settings_fields(settings)
    fields.update(case)
    batch = fields.get("batch_size")
    if batch == "max":
        from dlscale.batchsearch import DEFAULT_START

        fields["batch_size"] = settings.get("max_batch_start") or DEFAULT_START
    how = "; leave it out with an exclude: entry" if in_matrix else ""
    try:
        cfg = RunConfig(**fields)
        validate_case(cfg)
    except ConfigError as e:
        raise where.error(key, f"impossible case {_describe(case)}: {e}{how}") from None
    return cfg


def _expand_block(where: _Where, key: str, block: Any, settings: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(block, dict):
        raise where.error(key, f"expected a mapping of axes (models, strategies, devices, batch_sizes, ...), "
                               f"got {_show(block)}")
    _unknown_keys(where, f"{key}.", block, AXES)
    for required in ("models", "batch_sizes"):
        if required not in block:
            raise where.error(f"{key}.{required}", "missing (every matrix block needs models and batch_sizes)")
    axes: dict[str, list[Any]] = {}
    defaults = {"flavors": ["full"], "strategies": ["ddp"], "precisions": [RunConfig().precision],
                "compile": [False], "compile_modes": ["default"], "inductor_options": [{}], "grad_accum": [1],
                "strategy_options": [{}]}
    for axis in EXPANSION_ORDER:
        if axis in block:
            axes[axis] = _axis_values(where, f"{key}.{axis}", axis, block[axis])
        else:
            axes[axis] = defaults[axis]
    counts = _counts(where, f"{key}.", block)
    out = []
    for combo in itertools.product(*(axes[a] for a in EXPANSION_ORDER), counts):
        case = {AXES[a]: v for a, v in zip(EXPANSION_ORDER, combo[:-1])}
        case["nnodes"], case["nproc_per_node"] = combo[-1]
        if not case["compile"]:  # compile modes and inductor options apply to the compiled cases
            case["compile_mode"], case["inductor_options"] = "default", {}
        out.append(case)
    return out


def _explicit_case(where: _Where, key: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise where.error(key, f"expected a mapping (model, strategy, devices, batch_size, ...), got {_show(entry)}")
    _unknown_keys(where, f"{key}.", entry, CASE_KEYS)
    for required in ("model", "batch_size"):
        if required not in entry:
            raise where.error(f"{key}.{required}", "missing (every case needs model and batch_size)")
    case: dict[str, Any] = {}
    for k in ("model", "flavor", "strategy", "batch_size", "precision", "compile", "compile_mode", "inductor_options",
              "grad_accum", "strategy_options"):
        if k in entry:
            if isinstance(entry[k], list):
                raise where.error(f"{key}.{k}", f"a case takes one value, got a list {entry[k]!r} "
                                                f"(use a matrix block for several)")
            case[k] = _axis_values(where, f"{key}.{k}", k, entry[k])[0]
    for k in ("devices", "nodes", "nproc_per_node"):
        if isinstance(entry.get(k), list):
            raise where.error(f"{key}.{k}", f"a case takes one value, got a list {entry[k]!r}")
    (case["nnodes"], case["nproc_per_node"]), = _counts(where, f"{key}.", entry)
    checks = {"warmup": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
              "steps": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
              "repeats": (lambda v: _is_int(v) and v >= 1, "a positive integer"),
              "time_limit": (lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and v > 0,
                             "a positive number of seconds"),
              "inject_failure": (lambda v: isinstance(v, str), "a string KIND@N[:RANK] (testing hook)")}
    for k, (ok, expected) in checks.items():
        if k in entry:
            if not ok(entry[k]):
                raise where.error(f"{key}.{k}", f"expected {expected}, got {_show(entry[k])}")
            if k == "inject_failure":
                from dlscale.config import parse_injection

                try:
                    parse_injection(entry[k])
                except ConfigError as e:
                    raise where.error(f"{key}.{k}", str(e)) from None
            case[k] = float(entry[k]) if k == "time_limit" else entry[k]
    return case


def parse_suite(data: Any, path: Path, name: str | None = None) -> Suite:
    """Validate and expand a suite's parsed YAML. Every problem is a ConfigError naming file and key."""
    where = _Where(display_path(path))
    if not isinstance(data, dict):
        raise where.error(None, f"a suite is a mapping of keys (settings, matrix, exclude, cases), got "
                                f"{type(data).__name__}")
    _unknown_keys(where, "", data, SETTINGS + SECTIONS + ("name",))
    if "name" in data and not isinstance(data["name"], str):
        raise where.error("name", f"expected a string, got {_show(data['name'])}")
    settings = _settings(where, data)
    matrix = data.get("matrix")
    blocks = [] if matrix is None else (matrix if isinstance(matrix, list) else [matrix])
    if isinstance(matrix, list) and not matrix:
        raise where.error("matrix", "expected a mapping of axes or a list of them, got an empty list")
    excludes = _exclude_entries(where, data["exclude"]) if data.get("exclude") is not None else []
    raw_cases = data.get("cases")
    if raw_cases is not None and not isinstance(raw_cases, list):
        raise where.error("cases", f"expected a list of case mappings, got {_show(raw_cases)}")

    expanded: list[tuple[str, dict[str, Any], bool]] = []
    for bi, block in enumerate(blocks):
        key = f"matrix[{bi}]" if isinstance(matrix, list) else "matrix"
        for case in _expand_block(where, key, block, settings):
            if not any(_matches(case, e) for e in excludes):
                expanded.append((key, case, True))
    for ci, entry in enumerate(raw_cases or []):
        key = f"cases[{ci}]"
        expanded.append((key, _explicit_case(where, key, entry), False))
    if not expanded:
        raise where.error(None, "the suite defines no cases (give a matrix:, a cases: list, or exclude less)")

    cases, batch_max, seen, dups = [], [], set(), 0
    for key, case, in_matrix in expanded:
        cfg = _build(where, key, case, settings, in_matrix)
        is_max = case.get("batch_size") == "max"
        s = sweep_key(cfg, is_max)
        if s in seen:
            dups += 1
            continue
        seen.add(s)
        cases.append(cfg)
        batch_max.append(is_max)
    return Suite(name or data.get("name") or path.stem, path, cases, settings, batch_max, dups)


def load_suite(name_or_path: str | os.PathLike) -> Suite:
    """Load a shipped suite by name ("quick") or a suite file by path, validated and expanded."""
    import yaml

    path = resolve_suite_path(name_or_path)
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read suite file {shown}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{shown}: not valid YAML{at}: {problem}") from None
    return parse_suite(data, path)


# ----------------------------------------------------------------------------- filters

def case_fields(cfg: RunConfig, batch_max: bool = False) -> dict[str, Any]:
    """The keys exclude entries and --filter match on."""
    return {"model": cfg.model, "flavor": cfg.flavor, "strategy": cfg.strategy, "nnodes": cfg.nnodes,
            "nproc_per_node": cfg.nproc_per_node, "batch_size": "max" if batch_max else cfg.batch_size,
            "precision": cfg.precision, "compile": cfg.compile, "grad_accum": cfg.grad_accum}


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def parse_filters(items: Iterable[str] | None) -> list[dict[str, list[Any]]]:
    """--filter KEY=V1[,V2...] (repeatable; all must match) -> entries for ``filter_suite``."""
    out: dict[str, list[Any]] = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value.strip():
            raise ConfigError(f"--filter must look like KEY=VALUE[,VALUE...], got {item!r}")
        if key not in MATCH_KEYS:
            raise ConfigError(f"--filter key {key!r} is unknown; allowed: {', '.join(MATCH_KEYS)}")
        vals: list[Any] = []
        for raw in value.split(","):
            v = raw.strip()
            if key in ("devices", "nodes", "nproc_per_node", "grad_accum"):
                try:
                    vals.append(int(v))
                except ValueError:
                    raise ConfigError(f"--filter {key}: expected integers, got {v!r}") from None
            elif key == "batch_size":
                if v.lower() == "max":
                    vals.append("max")
                else:
                    try:
                        vals.append(int(v))
                    except ValueError:
                        raise ConfigError(f"--filter batch_size: expected integers or max, got {v!r}") from None
            elif key == "compile":
                if v.lower() not in _TRUE | _FALSE:
                    raise ConfigError(f"--filter compile: expected true or false, got {v!r}")
                vals.append(v.lower() in _TRUE)
            else:
                vals.append(v)
        out.setdefault(key, []).extend(vals)  # the same key twice: either value
    return [out] if out else []


def filter_suite(suite: Suite, filters: list[dict[str, list[Any]]]) -> list[int]:
    """Indices of the suite's cases matching every filter (all of them without filters)."""
    idx = [i for i, c in enumerate(suite.cases)
           if all(_matches(case_fields(c, suite.batch_max[i]), f) for f in filters)]
    if filters and not idx:
        f = filters[0]
        desc = " ".join(f"{k}={','.join(map(str, v))}" for k, v in f.items())
        seen = {k: sorted({str(_matches_value(case_fields(c, suite.batch_max[i]), k))
                           for i, c in enumerate(suite.cases)}) for k in f}
        have = "; ".join(f"{k}: {', '.join(v)}" for k, v in seen.items())
        raise ConfigError(f"no case of suite {suite.name} matches --filter {desc} (the suite has {have})")
    return idx


def _matches_value(case: dict[str, Any], key: str) -> Any:
    if key == "devices":
        return case["nnodes"] * case["nproc_per_node"]
    if key == "nodes":
        return case["nnodes"]
    return case.get(key)
