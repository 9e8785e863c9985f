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
* order: the axes in the order of RunConfig's fields (models, flavors, precisions, compile with
  compile modes and inductor options, which apply to compiled cases only, batch sizes, grad_accum,
  threads, strategy options, strategies), then device counts innermost, so each table's 1-device
  baseline runs first.

Axes, settings, exclude/--filter keys and their checks all come from RunConfig's field metadata
(dlscale/case/config.py): a new field with an ``axis`` is a new suite axis.
"""
from __future__ import annotations

import dataclasses
import difflib
import itertools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dlscale import ConfigError
from dlscale.case import benchsuite
from dlscale.case.config import (
    AXES, BATCH_MAX, DEFAULTS, DEVICES, FIELDS, SETTINGS as CONFIG_SETTINGS, RunConfig, check_value,
    expected, validate_case,
)
from dlscale.fmt import yaml_number_hint
from dlscale.inputs import files_pending

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # dlscale/
SUITES_DIR = PACKAGE_DIR / "suites"

# run settings: suite-wide, not part of the matrix (each a RunConfig field, with its default)
SETTINGS = ("description",) + CONFIG_SETTINGS
SECTIONS = ("matrix", "exclude", "cases") + benchsuite.SECTIONS  # bare, compare: dlscale/case/benchsuite.py
_COUNT_AXES = ("devices", "nodes", "nproc_per_node")  # the device count: one node's, or nodes x per node
_FILE_KEY = {"nnodes": "nodes"}  # a field's name in a suite file, where it differs
# matrix axes in expansion order: RunConfig's field order, the device counts innermost
EXPANSION_ORDER = tuple(a for a in AXES if a not in _COUNT_AXES)
# keys of exclude entries and --filter: the fields marked match, and the device counts
MATCH_KEYS = tuple(_FILE_KEY.get(n, n) for n, o in FIELDS.items() if o.match and n not in ("nnodes",
                                                                                           "nproc_per_node")) \
    + _COUNT_AXES
# keys an explicit case may set: any field, and the device counts
CASE_KEYS = tuple(n for n in FIELDS if n not in ("nnodes", "nproc_per_node")) + _COUNT_AXES
MAX_CASES = 10_000  # a suite larger than this is a typo (--max-cases raises it)


@dataclass
class Suite:
    """A loaded suite: ``cases`` in run order, and the suite-wide ``settings``."""

    name: str
    path: Path
    cases: list[RunConfig]
    settings: dict[str, Any]
    duplicates: int = 0  # cases dropped because an earlier one had the same case_key
    bench: benchsuite.BenchSections = field(default_factory=benchsuite.BenchSections)  # bare runs, comparisons

    @property
    def description(self) -> str:
        return str(self.settings.get("description") or "")

    def with_device(self, device: str) -> "Suite":
        if device not in DEVICES:
            raise ConfigError(f"unknown device {device!r}; choose one of: {', '.join(DEVICES)}")
        return self.with_overrides(device=device)

    def with_overrides(self, **values: Any) -> "Suite":
        """Set fields of every case (None: keep the suite's); the batch-search fields apply to
        batch-search cases only.

        warmup and steps are part of a case's identity (a shorter window measures something
        slightly different), so a resumed sweep must use the same values to recognise the cases
        it already stored; repeats are not.
        """
        given = {k: v for k, v in values.items() if v is not None}
        for k, v in given.items():
            if k not in FIELDS:
                raise ConfigError(f"unknown case field {k!r}")
            check_value(k, v)
        if not given:
            return self
        search_only = {k: v for k, v in given.items() if k in ("max_batch_start", "max_batch_cap")}
        if search_only and not any(c.batch_search for c in self.cases):
            names = " and ".join("--" + k.replace("_", "-") for k in search_only)
            raise ConfigError(f"{names} applies to largest-batch cases (batch_sizes: [max]); suite {self.name} "
                              f"has none")
        every = {k: v for k, v in given.items() if k not in search_only}
        cases = [dataclasses.replace(c, **every, **(search_only if c.batch_search else {})) for c in self.cases]
        return dataclasses.replace(self, cases=cases, settings={**self.settings, **given},
                                   bench=self.bench.with_overrides(every))


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
        return "dlscale/" + str(path.resolve().relative_to(PACKAGE_DIR))
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
    return repr(v) if not isinstance(v, str) else f"'{v}'{yaml_number_hint(v)}"


def _unknown_keys(where: _Where, prefix: str, got: Iterable[str], allowed: Iterable[str]) -> None:
    allowed = list(allowed)
    for k in got:
        if k not in allowed:
            hint = difflib.get_close_matches(str(k), allowed, n=1)
            more = f" (did you mean '{hint[0]}'?)" if hint else ""
            raise where.error(f"{prefix}{k}", f"unknown key{more}; allowed: {', '.join(allowed)}")


def _field(key: str) -> str:
    """The RunConfig field of an axis, a case key or a setting ("models" -> "model", "nodes" -> "nnodes")."""
    if key in AXES:
        return AXES[key]
    return {v: k for k, v in _FILE_KEY.items()}.get(key, key)


def _values(where: _Where, key: str, name: str, value: Any, many: bool = True) -> list[Any]:
    """Validate one axis's values (a scalar counts as a one-element list), or one value
    (``many=False``), against the field's own check (dlscale/case/config.py)."""
    o = FIELDS[name]
    if not many and isinstance(value, list):
        raise where.error(key, f"a case takes one value, got a list {value!r} (use a matrix block for several)")
    items = list(value) if isinstance(value, list) else [value]
    if not items:
        raise where.error(key, f"expected {expected(name, many)}, got an empty list")
    for v in items:
        if v is None and not o.optional:
            raise where.error(key, f"expected {expected(name, many)}, got null")
        try:
            check_value(name, v)
        except ConfigError as e:
            if (o.choices is not None or o.validator is not None) and isinstance(v, str) and v.strip():
                raise where.error(key, str(e)) from None  # "unknown model 'gpt3'; choose one of: ..."
            # a number past the maximum (or inf/nan): say the maximum, not only the minimum
            big = _is_number(v, o.type) and (not math.isfinite(v) or (o.maximum is not None and v > o.maximum))
            raise where.error(key, f"expected {expected(name, many, bounded=big)}, got {_show(v)}") from None
    return [dict(v) if isinstance(v, dict) else v for v in items]


def _is_number(v: Any, kind: type) -> bool:
    """A value of a numeric field's own kind (an int for an integer field; any number for a float one)."""
    if isinstance(v, bool) or kind not in (int, float):
        return False
    return isinstance(v, int) if kind is int else isinstance(v, (int, float))


def _settings(where: _Where, data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"description": ""}
    out.update({k: DEFAULTS[k] for k in CONFIG_SETTINGS})
    for k in SETTINGS:
        if k not in data:
            continue
        if k == "description":
            if data[k] is not None and not isinstance(data[k], str):
                raise where.error(k, f"expected a string, got {_show(data[k])}")
            out[k] = data[k]
            continue
        v = _values(where, k, k, data[k], many=False)[0]
        out[k] = float(v) if FIELDS[k].type is float and v is not None else v
    return out


# ----------------------------------------------------------------------------- expansion

def _counts(where: _Where, prefix: str, block: dict[str, Any], many: bool = True) -> list[tuple[int, int]]:
    """(nnodes, nproc_per_node) pairs of a matrix block or case."""
    has_dev = "devices" in block
    has_nodes = "nodes" in block or "nproc_per_node" in block
    if has_dev and has_nodes:
        raise where.error(f"{prefix}devices", "give either devices (processes on one node) or nodes and "
                                              "nproc_per_node, not both")
    if has_dev:
        return [(1, d) for d in _values(where, f"{prefix}devices", "nproc_per_node", block["devices"], many)]
    nodes = _values(where, f"{prefix}nodes", "nnodes", block.get("nodes", 1), many)
    nproc = _values(where, f"{prefix}nproc_per_node", "nproc_per_node", block.get("nproc_per_node", 1), many)
    return [(n, p) for n in nodes for p in nproc]


def _describe(case: dict[str, Any]) -> str:
    parts = [f"{k}={case[k]}" for k in ("model", "flavor", "strategy") if k in case]
    n, p = case.get("nnodes", 1), case.get("nproc_per_node", 1)
    parts.append(f"devices={p}" if n == 1 else f"nodes={n} nproc_per_node={p}")
    parts += [f"{k}={case[k]}" for k in ("batch_size", "precision", "compile", "grad_accum") if k in case]
    if case.get("strategy_options"):
        parts.append(f"strategy_options={case['strategy_options']}")
    return "{" + ", ".join(parts) + "}"


OPTION_KEY = "strategy_options."  # --filter strategy_options.NAME=V: a strategy option the case sets


def _option_text(v: Any) -> str:
    """A strategy option's value as a --filter compares it ("" where the case does not set it)."""
    return "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def _match_value(case: dict[str, Any], key: str) -> Any:
    """A case's value for an exclude/--filter key (devices: the world size; strategy_options.NAME: that
    option as the case sets it, as text)."""
    if key == "devices":
        return case["nnodes"] * case["nproc_per_node"]
    if key.startswith(OPTION_KEY):
        opts = case.get("strategy_options")
        return _option_text(opts.get(key[len(OPTION_KEY):]) if isinstance(opts, dict) else None)
    return case.get(_field(key), DEFAULTS.get(_field(key)))


def _matches(case: dict[str, Any], entry: dict[str, list[Any]]) -> bool:
    """Does a case (field -> value) match every key of an exclude/filter entry?"""
    return all(_match_value(case, k) in values for k, values in entry.items())


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
        out.append({k: _values(where, f"{key}.{k}", "nproc_per_node" if k == "devices" else _field(k), v)
                    for k, v in e.items()})
    return out


def _build(where: _Where, key: str, case: dict[str, Any], settings: dict[str, Any], in_matrix: bool) -> RunConfig:
    """A RunConfig from an expanded case; impossible combinations raise naming the case."""
    fields = {k: v for k, v in settings.items() if k in FIELDS}
    fields.update(case)
    if fields.get("batch_size") != BATCH_MAX:  # the search settings apply to batch-search cases
        fields["max_batch_start"] = fields["max_batch_cap"] = None
    how = "; leave it out with an exclude: entry" if in_matrix else ""
    try:
        cfg = RunConfig(**fields)
        validate_case(cfg)
    except ConfigError as e:
        shown = {**{AXES[a]: fields.get(AXES[a], DEFAULTS[AXES[a]]) for a in EXPANSION_ORDER}, **case} \
            if in_matrix else case  # a matrix case named by every axis, as it was expanded
        raise where.error(key, f"impossible case {_describe(shown)}: {e}{how}") from None
    return cfg


_UNSET = object()  # an axis a matrix block does not give


def _block_axes(where: _Where, key: str, block: Any) -> tuple[dict[str, list[Any]], list[tuple[int, int]]]:
    if not isinstance(block, dict):
        raise where.error(key, f"expected a mapping of axes (models, strategies, devices, batch_sizes, ...), "
                               f"got {_show(block)}")
    _unknown_keys(where, f"{key}.", block, list(EXPANSION_ORDER) + list(_COUNT_AXES))
    for required in ("models", "batch_sizes"):
        if required not in block:
            raise where.error(f"{key}.{required}", "missing (every matrix block needs models and batch_sizes)")
    # an axis the block leaves out takes the suite's setting of that field (threads: 1), else its default
    axes = {a: _values(where, f"{key}.{a}", AXES[a], block[a]) if a in block else [_UNSET]
            for a in EXPANSION_ORDER}
    return axes, _counts(where, f"{key}.", block)


def _expand_block(axes: dict[str, list[Any]], counts: list[tuple[int, int]]) -> Iterable[dict[str, Any]]:
    for combo in itertools.product(*(axes[a] for a in EXPANSION_ORDER), counts):
        case = {AXES[a]: v for a, v in zip(EXPANSION_ORDER, combo[:-1]) if v is not _UNSET}
        case["nnodes"], case["nproc_per_node"] = combo[-1]
        if not case.get("compile", DEFAULTS["compile"]):  # modes and inductor options apply to compiled cases
            case["compile_mode"], case["inductor_options"] = DEFAULTS["compile_mode"], {}
        yield case


def _explicit_case(where: _Where, key: str, entry: Any) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise where.error(key, f"expected a mapping (model, strategy, devices, batch_size, ...), got {_show(entry)}")
    _unknown_keys(where, f"{key}.", entry, CASE_KEYS)
    for required in ("model", "batch_size"):
        if required not in entry:
            raise where.error(f"{key}.{required}", "missing (every case needs model and batch_size)")
    case = {k: _values(where, f"{key}.{k}", k, v, many=False)[0]
            for k, v in entry.items() if k not in _COUNT_AXES}
    (case["nnodes"], case["nproc_per_node"]), = _counts(where, f"{key}.", entry, many=False)
    return case


def parse_suite(data: Any, path: Path, name: str | None = None, max_cases: int = MAX_CASES) -> Suite:
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

    parsed = []
    planned = len(raw_cases or [])
    for bi, block in enumerate(blocks):
        key = f"matrix[{bi}]" if isinstance(matrix, list) else "matrix"
        axes, counts = _block_axes(where, key, block)
        size = len(counts)
        for values in axes.values():
            size *= len(values)
        planned += size
        parsed.append((key, axes, counts))
    if planned > max_cases:  # counted before expanding: a typo must not take minutes and gigabytes
        raise where.error(None, f"the suite expands to {planned:,} cases, more than the limit of {max_cases:,} "
                                f"(split it, or raise the limit with --max-cases)")
    expanded: list[tuple[str, dict[str, Any], bool]] = []
    for key, axes, counts in parsed:
        for case in _expand_block(axes, counts):
            if not any(_matches(case, e) for e in excludes):
                expanded.append((key, case, True))
    for ci, entry in enumerate(raw_cases or []):
        key = f"cases[{ci}]"
        expanded.append((key, _explicit_case(where, key, entry), False))
    if not expanded:
        raise where.error(None, "the suite defines no cases (give a matrix:, a cases: list, or exclude less)")

    cases, seen, dups = [], set(), 0
    for key, case, in_matrix in expanded:
        cfg = _build(where, key, case, settings, in_matrix)
        k = cfg.case_key()
        if k in seen:
            dups += 1
            continue
        seen.add(k)
        cases.append(cfg)
    bench = benchsuite.parse_sections(data, benchsuite.Context(
        error=where.error, unknown_keys=lambda prefix, got, allowed: _unknown_keys(where, prefix, got, allowed),
        case=lambda key, entry: _build(where, key, _explicit_case(where, key, entry), settings, False),
        case_keys=CASE_KEYS, filters=parse_filters, matches=lambda c, f: matches(case_fields(c), f), cases=cases))
    return Suite(name or data.get("name") or path.stem, path, cases, settings, dups, bench)


_LOADER: Any = None


def _unique_key_loader() -> Any:
    """yaml's SafeLoader, except that a key given twice in one mapping is an error (plain
    SafeLoader keeps the last one: a suite would silently run something else than it reads)."""
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    import yaml  # yaml: keeps the CLI start-up light

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                first: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge":
                        continue  # "<<: *base" then a key: an override, as YAML means it
                    key = self.construct_object(key_node, deep=True)
                    try:
                        seen = first.setdefault(key, key_node.start_mark)
                    except TypeError:
                        continue  # an unhashable key: SafeLoader's own error names it
                    if seen is not key_node.start_mark:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first at line {seen.line + 1}); give each key once",
                            key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    _LOADER = UniqueKeyLoader
    return _LOADER


def add_max_cases_option(parser) -> None:
    """``--max-cases`` for every command that expands a suite (sweep, slurm)."""
    parser.add_argument("--max-cases", type=int, default=MAX_CASES, metavar="N",
                        help="refuse a suite that expands to more cases than this (a typo in an axis can mean "
                             "millions)")


def load_suite(name_or_path: str | os.PathLike, max_cases: int = MAX_CASES) -> Suite:
    """Load a shipped suite by name ("quick") or a suite file by path, validated and expanded."""
    import yaml  # yaml: keeps the CLI start-up light

    if max_cases < 1:
        raise ConfigError(f"--max-cases must be >= 1, got {max_cases}")

    path = resolve_suite_path(name_or_path)
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read suite file {shown}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"suite file {shown} is not UTF-8 text (byte {e.start})") from None
    try:
        data = yaml.load(text, Loader=_unique_key_loader())  # noqa: S506 (a SafeLoader subclass)
    except RecursionError:
        raise ConfigError(f"{shown}: nested too deeply to read (lists or mappings over a few hundred levels deep)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{shown}: not valid YAML{at}: {problem}") from None
    return parse_suite(data, path, max_cases=max_cases)


# ----------------------------------------------------------------------------- filters

def case_fields(cfg: RunConfig) -> dict[str, Any]:
    """What exclude entries and --filter match on: the case's fields."""
    return cfg.to_dict()


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _filter_value(key: str, text: str) -> Any:
    if key.startswith(OPTION_KEY):  # compared as text with the case's option (true/false for a flag)
        return text.lower() if text.lower() in ("true", "false") else text
    name = "nproc_per_node" if key == "devices" else _field(key)
    o = FIELDS[name]
    if o.kind == "batch" and text.lower() == BATCH_MAX:
        return BATCH_MAX
    if o.type is bool:
        if text.lower() not in _TRUE | _FALSE:
            raise ConfigError(f"--filter {key}: expected true or false, got {text!r}")
        return text.lower() in _TRUE
    if o.type in (int, float):
        try:
            return o.type(text)
        except ValueError:
            more = " or max" if o.kind == "batch" else ""
            raise ConfigError(f"--filter {key}: expected {'integers' if o.type is int else 'numbers'}{more}, "
                              f"got {text!r}") from None
    return text


def parse_filters(items: Iterable[str] | None) -> list[dict[str, list[Any]]]:
    """--filter KEY=V1[,V2...] (repeatable; all must match) -> entries for ``filter_suite``."""
    out: dict[str, list[Any]] = {}
    for item in items or []:
        key, sep, value = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not value.strip():
            raise ConfigError(f"--filter must look like KEY=VALUE[,VALUE...], got {item!r}")
        option = key.startswith(OPTION_KEY) and key[len(OPTION_KEY):].isidentifier()
        if key not in MATCH_KEYS and not option:
            raise ConfigError(f"--filter key {key!r} is unknown; allowed: {', '.join(MATCH_KEYS)}, "
                              f"{OPTION_KEY}NAME (an option the case sets)")
        out.setdefault(key, []).extend(_filter_value(key, raw.strip()) for raw in value.split(","))
    return [out] if out else []


def matches(fields: dict[str, Any], filters: list[dict[str, list[Any]]]) -> bool:
    """Do a case's fields (a RunConfig's ``to_dict()``, or a stored record's config) match every filter?"""
    return all(_matches(fields, f) for f in filters)


def filter_suite(suite: Suite, filters: list[dict[str, list[Any]]]) -> list[int]:
    """Indices of the suite's cases matching every filter (all of them without filters)."""
    idx = [i for i, c in enumerate(suite.cases) if all(_matches(case_fields(c), f) for f in filters)]
    if filters and not idx:
        f = filters[0]
        desc = " ".join(f"{k}={','.join(map(str, v))}" for k, v in f.items())
        seen = {k: sorted({str(_match_value(case_fields(c), k)) for c in suite.cases}) for k in f}
        have = "; ".join(f"{k}: {', '.join(v)}" for k, v in seen.items())
        raise ConfigError(f"no case of suite {suite.name} matches --filter {desc} (the suite has {have})")
    return idx


def load_bench_suite(name_or_path: str | os.PathLike) -> Suite:
    """A benchmark suite (benchmarks/run.py), loaded and validated as `dlscale sweep` does, except that the data sets its
    ``before`` commands are still to make (their ``creates`` paths) are checked against the models
    only: their files do not exist before the driver has run those commands."""
    import yaml  # yaml: keeps the CLI start-up light

    try:
        raw = yaml.safe_load(resolve_suite_path(name_or_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = None  # load_suite names the problem
    commands = raw.get("commands") if isinstance(raw, dict) else None
    creates = [c.get("creates") for c in commands if isinstance(c, dict) and c.get("when") == "before"] \
        if isinstance(commands, list) else []
    pending = [p for p in creates if isinstance(p, str) and p.strip() and not os.path.exists(p)]
    with files_pending(pending):
        return load_suite(name_or_path)
