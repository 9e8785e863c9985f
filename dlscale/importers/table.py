"""``table``: published tables in the documented format ``dlscale-table/1`` (YAML or CSV).

The format (docs/external.md has it in full): a YAML mapping with ``format``, ``source``,
``tool`` (required), ``date``, ``framework``, ``model``, ``unit`` (img|seq|tok), ``seq_len``,
``params``, ``hardware`` (gpu, gpus_per_node, interconnect), ``system`` (prediction inputs),
``defaults`` (row values: precision, strategy, compile) and ``rows``: one case each, with
``batch_size`` (per device), ``nodes``, ``gpus_per_node`` and ``throughput`` (job samples/s, the
published median) or ``runs`` (per-run figures), or a ``status`` (oom, failed, ...) instead;
optional ``note``, ``mean`` (a published mean beside the median), ``precision``, ``strategy``,
``compile``. Keys starting with ``x-`` or ``x_`` are extensions and are ignored; any other unknown
key is an error (a typo must not drop a figure silently). A CSV holds the rows (same column
names, ``runs`` as numbers separated by spaces or ``;``) and takes the table-level fields from the
command line (--source, --tool, --model, --unit, --gpu, ...).
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.external.parsers import UNITS
from dlscale.importers import ImportOptions, Importer, register_importer
from dlscale.importers.records import (FORMAT_ID, MAX_PARAMS, check_batch, check_int, check_precision, check_rate,
                                       Figures, ImportedCase, Provenance, imported_record, registered_unit)
from dlscale.results.store import STATUSES

TOP_KEYS = {"format", "source", "tool", "date", "framework", "model", "unit", "seq_len", "params", "hardware",
            "system", "defaults", "rows", "note"}
ROW_KEYS = {"batch_size", "nodes", "gpus_per_node", "throughput", "runs", "mean", "status", "note", "precision",
            "strategy", "compile"}
DEFAULT_KEYS = {"precision", "strategy", "compile"}
HARDWARE_KEYS = {"gpu", "gpus_per_node", "interconnect"}
SYSTEM_KEYS = {"intra", "inter", "overlap", "bucket_mb", "grad_bytes_per_param", "source"}
LINK_KEYS = {"busbw_gbps", "latency_us", "source"}


def _known(d: dict, allowed: set[str], where: str) -> None:
    bad = sorted(k for k in d if k not in allowed and not str(k).startswith(("x-", "x_")))
    if bad:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, bad))}; allowed: {', '.join(sorted(allowed))}")


MAX_LINK = 1e6  # GB/s, microseconds, MB, bytes: bounds no link or bucket reaches (a bigger one is a typo)


def _number(v: Any, name: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0) \
            or v < 0 or v > MAX_LINK:
        raise ConfigError(f"{name} must be a {'positive' if positive else 'non-negative'} number up to {MAX_LINK:.0e}, "
                          f"got {v!r}")
    return float(v)


def _text(v: Any, name: str, required: bool = False) -> str | None:
    if v is None:
        if required:
            raise ConfigError(f"{name} is required")
        return None
    if not isinstance(v, (str, int, float)) or isinstance(v, bool) or str(v).strip() == "":
        raise ConfigError(f"{name} must be text, got {v!r}")
    return str(v)


def check_system(system: Any) -> dict[str, Any] | None:
    """The table's prediction inputs, validated (links in GB/s and us, each with a source)."""
    if system is None:
        return None
    if not isinstance(system, dict):
        raise ConfigError(f"system must be a mapping, got {type(system).__name__}")
    _known(system, SYSTEM_KEYS, "system")
    for name in ("intra", "inter"):
        link = system.get(name)
        if link is None:
            continue
        if not isinstance(link, dict):
            raise ConfigError(f"system.{name} must be a mapping with busbw_gbps, latency_us, source")
        _known(link, LINK_KEYS, f"system.{name}")
        bw = link.get("busbw_gbps")
        if isinstance(bw, dict):  # per number of GPUs the ring spans: {2: 21, 8: 130}
            if not bw:
                raise ConfigError(f"system.{name}.busbw_gbps: an empty mapping")
            for k, v in bw.items():
                check_int(k, f"system.{name}.busbw_gbps key (GPUs)")
                _number(v, f"system.{name}.busbw_gbps[{k}]")
        else:
            _number(bw, f"system.{name}.busbw_gbps")
        if link.get("latency_us") is not None:
            _number(link["latency_us"], f"system.{name}.latency_us", positive=False)
        _text(link.get("source"), f"system.{name}.source", required=True)
    ov = system.get("overlap")
    if ov is not None and ov not in ("none", "backward", "buckets") and not (
            isinstance(ov, (int, float)) and not isinstance(ov, bool) and 0 <= ov <= 1):
        raise ConfigError(f"system.overlap must be none, backward, buckets or a fraction in [0, 1], got {ov!r}")
    if system.get("bucket_mb") is not None:
        _number(system["bucket_mb"], "system.bucket_mb")
    g = system.get("grad_bytes_per_param")
    if isinstance(g, dict):  # per precision (the rows of one table may differ)
        for k, v in g.items():
            check_precision(k, "system.grad_bytes_per_param")
            _number(v, f"system.grad_bytes_per_param.{k}")
    elif g is not None:
        _number(g, "system.grad_bytes_per_param")
    return system


def row_system(system: dict[str, Any] | None, precision: str) -> dict[str, Any] | None:
    """A record's system block: a per-precision grad_bytes_per_param resolved to the row's number."""
    if not system or not isinstance(system.get("grad_bytes_per_param"), dict):
        return system
    out = dict(system)
    g = out.pop("grad_bytes_per_param")
    if precision in g:
        out["grad_bytes_per_param"] = g[precision]
    return out


def table_records(table: dict[str, Any], file: str, label: str | None = None) -> list[dict[str, Any]]:
    """Records of a parsed table (YAML mapping), every field validated first."""
    if not isinstance(table, dict):
        raise ConfigError("not a mapping at the top")
    _known(table, TOP_KEYS, "table")
    if table.get("format") != FORMAT_ID:
        raise ConfigError(f"format must be {FORMAT_ID!r}, got {table.get('format')!r}")
    source = _text(table.get("source"), "source", required=True)
    tool = _text(table.get("tool"), "tool", required=True)
    model = _text(table.get("model"), "model", required=True)
    unit = table.get("unit")
    if unit not in UNITS:
        raise ConfigError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    seq_len = check_int(table["seq_len"], "seq_len") if table.get("seq_len") is not None else None
    params = check_int(table["params"], "params", maximum=MAX_PARAMS) if table.get("params") is not None else None
    framework = _text(table.get("framework"), "framework")
    hw = table.get("hardware")
    if not isinstance(hw, dict):
        raise ConfigError("hardware must be a mapping with gpu (required), gpus_per_node, interconnect")
    _known(hw, HARDWARE_KEYS, "hardware")
    gpu = _text(hw.get("gpu"), "hardware.gpu", required=True)
    gpn = check_int(hw["gpus_per_node"], "hardware.gpus_per_node") if hw.get("gpus_per_node") is not None else None
    system = check_system(table.get("system"))
    defaults = table.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError("defaults must be a mapping")
    _known(defaults, DEFAULT_KEYS, "defaults")
    rows = table.get("rows")
    if not isinstance(rows, list) or not rows:
        raise ConfigError("rows must be a non-empty list of cases")
    prov = Provenance(source=source, tool=tool, date=_text(table.get("date"), "date"), fmt="table",
                      file=file, gpu=gpu, gpus_per_node=gpn, interconnect=_text(hw.get("interconnect"),
                                                                                   "hardware.interconnect"))
    out, seen = [], set()
    for i, row in enumerate(rows, 1):
        where = f"row {i}"
        if not isinstance(row, dict):
            raise ConfigError(f"{where}: must be a mapping, got {row!r}")
        _known(row, ROW_KEYS, where)
        r = {**defaults, **row}
        try:
            batch, nodes, per_node, precision, status, runs, tput, mean, compile_, strategy = _row_fields(r, gpn)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        key = (batch, nodes, per_node, precision, strategy, compile_)
        if key in seen:
            raise ConfigError(f"{where}: a second row for batch {batch}, {nodes}x{per_node}, {precision}, {strategy}"
                              f"{', compiled' if compile_ else ''}")
        seen.add(key)
        case = ImportedCase(model=model, precision=precision, batch_size=batch, nnodes=nodes, gpus_per_node=per_node,
                            unit=unit, strategy=strategy, compile=compile_, framework=framework, seq_len=seq_len,
                            params=params)
        figures = Figures(runs=runs, median=tput, mean=mean, status=status,
                          error=f"{status} as published" if status != "ok" else None)
        out.append(imported_record(case, figures, prov, system=row_system(system, precision), label=label,
                                   note=_text(r.get("note"), "note")))
    return out


def _row_fields(r: dict[str, Any], gpn: int | None) -> tuple:
    """One row's case and figures, validated: (batch, nodes, GPUs per node, precision, status, runs,
    published median, mean, compile, strategy)."""
    batch = check_batch(r.get("batch_size"), "batch_size")
    nodes = check_int(r.get("nodes"), "nodes")
    per_node = check_int(r.get("gpus_per_node"), "gpus_per_node")
    precision = check_precision(r.get("precision"), "precision")
    status = r.get("status", "ok")
    if status not in STATUSES:
        raise ConfigError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    if gpn is not None and nodes > 1 and per_node > gpn:
        raise ConfigError(f"{per_node} GPUs per node, more than the {gpn} of hardware.gpus_per_node")
    runs = r.get("runs")
    tput = r.get("throughput")
    if status == "ok":
        if (runs is None) == (tput is None):
            raise ConfigError("give throughput (the published median) or runs (per-run figures), one of them")
        if runs is not None:
            if not isinstance(runs, list) or not runs:
                raise ConfigError(f"runs must be a non-empty list of samples/s, got {runs!r}")
            runs = [check_rate(x, "runs[]") for x in runs]
        else:
            tput = check_rate(tput, "throughput")
    elif runs is not None or tput is not None:
        raise ConfigError(f"status {status} with a throughput: a failed case has no figure")
    mean = check_rate(r["mean"], "mean") if r.get("mean") is not None else None
    compile_ = r.get("compile", False)
    if not isinstance(compile_, bool):
        raise ConfigError(f"compile must be true or false, got {compile_!r}")
    strategy = _text(r.get("strategy", "ddp"), "strategy")
    return batch, nodes, per_node, precision, status, runs, tput, mean, compile_, strategy


def read_csv_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a CSV table, cells typed: integers, numbers, runs lists, booleans; blanks dropped."""
    try:
        return _csv_rows(path)
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}): a table is a YAML or CSV text file") from None
    except csv.Error as e:
        raise ConfigError(f"not a CSV table: {e}") from None


def _csv_rows(path: Path) -> list[dict[str, Any]]:
    with open(path, newline="", encoding="utf-8") as f:
        # '# key: value' lines are comments, not table fields (those come from the command line)
        reader = csv.DictReader(line for line in f if not line.lstrip().startswith("#"))
        if not reader.fieldnames:
            raise ConfigError("empty CSV (no header row)")
        _known({k: None for k in reader.fieldnames if k}, ROW_KEYS, "CSV header")
        rows = []
        for n, raw in enumerate(reader, 2):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if k is None:
                    raise ConfigError(f"row {n - 1}: more cells than header columns")
                v = (v or "").strip()
                if v == "":
                    continue
                try:
                    if k in ("batch_size", "nodes", "gpus_per_node"):
                        row[k] = int(v)
                    elif k in ("throughput", "mean"):
                        row[k] = float(v)
                    elif k == "runs":
                        row[k] = [float(x) for x in v.replace(";", " ").split()]
                    elif k == "compile":
                        if v.lower() not in ("true", "false", "1", "0", "yes", "no"):
                            raise ValueError(v)
                        row[k] = v.lower() in ("true", "1", "yes")
                    else:
                        row[k] = v
                except ValueError:
                    raise ConfigError(f"row {n - 1}: column {k}: {v!r} is not a "
                                      f"{'number' if k != 'compile' else 'boolean'}")
            rows.append(row)
    return rows


def csv_table(path: Path, opts: ImportOptions) -> dict[str, Any]:
    """A table mapping from a CSV file and the command line's table-level fields."""
    rows = read_csv_rows(path)
    unit = opts.unit or (registered_unit(opts.model)[0] if opts.model else None)
    missing = [flag for flag, v in (("--source", opts.source), ("--tool", opts.tool), ("--model", opts.model),
                                    ("--unit", unit), ("--gpu", opts.gpu)) if not v]
    if missing:
        raise ConfigError(f"a CSV table takes its table-level fields from the command line: give {', '.join(missing)}")
    defaults = {k: v for k, v in (("precision", opts.precision), ("strategy", opts.strategy),
                                  ("compile", opts.compile)) if v is not None}
    hw = {"gpu": opts.gpu, "gpus_per_node": opts.gpus_per_node, "interconnect": opts.interconnect}
    return {"format": FORMAT_ID, "source": opts.source, "tool": opts.tool, "date": opts.date,
            "framework": opts.framework, "model": opts.model, "unit": unit, "seq_len": opts.seq_len,
            "params": opts.params, "hardware": {k: v for k, v in hw.items() if v is not None},
            "defaults": defaults, "rows": rows}


def load_table(path: str | Path) -> dict[str, Any]:
    """A YAML table file, parsed with yaml.safe_load (never executed)."""
    import yaml  # yaml: keeps the CLI start-up light

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"not UTF-8 text (byte {e.start}): a table is a YAML or CSV text file") from None
    try:
        return yaml.safe_load(text)
    except ValueError:  # an integer of thousands of digits (Python's conversion limit)
        raise ConfigError("a number of more than 4300 digits cannot be read (no figure has that many)") from None
    except RecursionError:
        raise ConfigError("nested too deeply to read (lists or mappings over a few hundred levels deep)") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"not YAML: {' '.join(str(e).split())[:200]}") from None


def yaml_table_records(paths: list[str | Path]) -> list[dict[str, Any]]:
    """The records of YAML tables, as ``dlscale import --format table`` writes them: each path a table file,
    or a directory whose ``*.yaml`` files are read in name order. A bad table raises naming its file."""
    out: list[dict[str, Any]] = []
    for p in map(Path, paths):
        for f in (sorted(p.glob("*.yaml")) if p.is_dir() else [p]):
            try:
                out += table_records(load_table(f), str(f))
            except ConfigError as e:
                raise ConfigError(f"{f}: {e}") from None
    return out


@register_importer("table")
class Table(Importer):
    description = f"published tables in the {FORMAT_ID} format (YAML, or CSV rows with table fields as options)"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        if path.is_dir():
            raise self.fail(path, "give one table file (.yaml, .yml or .csv), not a directory")
        try:
            if path.suffix.lower() == ".csv":
                table = csv_table(path, opts)
            else:
                table = load_table(path)
                given = [flag for flag, v in (("--source", opts.source), ("--tool", opts.tool), ("--model", opts.model),
                                              ("--gpu", opts.gpu), ("--unit", opts.unit)) if v]
                if given:
                    raise ConfigError(f"{', '.join(given)}: a YAML table states its own fields (edit the file)")
            return table_records(table, str(path), label=opts.label)
        except ConfigError as e:
            raise self.fail(path, str(e)) from None
