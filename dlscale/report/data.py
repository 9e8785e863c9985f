"""From a result store to DLPerf tables: loading, filtering, case selection, grouping, baselines.

Rules (docs/reports.md says the same for users):

* A *case* is one ``case_key`` (with its label and resolved device type). When a case has several
  records, the report uses the **newest ok record** (by ``created``); when it has no ok record, the
  newest interrupted record with finished repeats (its numbers shown, flagged ``interrupted``), else
  the newest record of any status. Older records are not pooled; each row says how many it superseded.
* A *table* (group) is everything in the case key except ``nnodes`` and ``nproc_per_node``, plus
  the label and device type: one row per device count.
* The *baseline* of a table is the 1-device (``nnodes * nproc_per_node == 1``) ok case with the same
  workload: everything in the config except strategy, strategy options, node/process counts and
  how it was run (warmup, steps, seed, device request, repeats, time limits), with the same label
  and device type. Candidates are ranked: same table, same strategy, ``single``, ``ddp``, then
  newest. Without one, speedup and efficiency stay missing.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
import gzip
import hashlib
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from dlscale import ConfigError
from dlscale.results import validity
from dlscale.case.config import LATE_FIELD_DEFAULTS, RunConfig, workload_fields
from dlscale.results.metrics import scaling_efficiency, speedup, summarize
from dlscale.report import sources
from dlscale.report.fields import rec_config, rec_device_type
from dlscale.results.store import MEASURED_STATUSES, STATUSES, LoadResult, ResultStore

# a table holds one row per device count: every other case-key field is the same within it
TABLE_EXCLUDE = frozenset({"nnodes", "nproc_per_node"})
# fields that make a run a variant of its strategy (a strategy's options, the optimizer step replayed as
# a graph): measured against the plain 1-device run, and never a shape's measured point where the
# strategy's default run exists (perfmodel)
VARIANT_FIELDS = ("strategy_options", "optimizer_graph")
# the 1-device baseline may also differ in how it was run (not what is computed)
BASELINE_EXCLUDE = TABLE_EXCLUDE | {"strategy", *VARIANT_FIELDS, "warmup", "steps", "seed", "device"}
MAIN_KEYS = ("model", "flavor", "precision", "compile", "strategy", "batch_size")
BASELINE_STRATEGY_PREFERENCE = ("single", "ddp")
STATUS_TEXT = {"oom": "OOM", "timeout": "TIMEOUT", "failed": "FAILED", "unsupported": "UNSUPPORTED",
               "interrupted": "INTERRUPTED"}
SELECTION_RULE = ("each row is the newest ok record of its case (case_key), else its newest interrupted one "
                  "(the repeats that finished); older records of the same case are not pooled")


def num(v: Any) -> float | None:
    """A finite number or None (bools, strings, NaN are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def freeze(v: Any) -> str:
    """A canonical JSON string of ``v`` (sorted keys): a hashable identity for dicts and lists."""
    return json.dumps(v, sort_keys=True, default=str)


def rec_label(rec: dict[str, Any]) -> str | None:
    if "label" in rec:
        return rec.get("label")
    cfg = rec.get("config")
    return cfg.get("label") if isinstance(cfg, dict) else None


def rec_counts(rec: dict[str, Any]) -> tuple[int, int]:
    cfg = rec_config(rec)
    return int(cfg.get("nnodes") or 1), int(cfg.get("nproc_per_node") or 1)


def rec_created(rec: dict[str, Any]) -> float:
    try:
        dt = _dt.datetime.fromisoformat(str(rec.get("created")))
    except ValueError:
        return float("-inf")
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=_dt.timezone.utc)
    return dt.timestamp()


def case_key_of(rec: dict[str, Any]) -> str:
    key = rec.get("case_key")
    if isinstance(key, str) and key:
        return key
    cfg = workload_fields(rec_config(rec))
    return "cfg-" + hashlib.sha1(freeze(cfg).encode()).hexdigest()[:16]


def repeat_samples(rec: dict[str, Any]) -> list[float]:
    """samples/s of the record's ok repeats (what compare resamples)."""
    out = []
    for r in rec.get("repeats") or []:
        if not isinstance(r, dict) or r.get("status", "ok") != "ok":
            continue
        v = num(r.get("samples_per_s"))
        if v is not None and v > 0:
            out.append(v)
    return out


def throughput_stats(rec: dict[str, Any]) -> dict[str, Any] | None:
    """n, median, mean, min, max, stdev of samples/s: the stored summary, gaps filled from repeats."""
    samples = repeat_samples(rec)
    computed = summarize(samples) if samples else None
    summ = rec.get("summary") if isinstance(rec.get("summary"), dict) else {}
    stored = summ.get("samples_per_s")
    if isinstance(stored, dict) and num(stored.get("median")) is not None:
        out = {k: stored.get(k) for k in ("n", "median", "mean", "min", "max", "stdev")}
        if computed:
            for k, v in computed.items():
                if out.get(k) is None:
                    out[k] = v
    else:
        out = computed
    if out is not None and (num(out.get("n")) or 0) < 2:
        out["stdev"] = None  # records written before: 0.0 for one repeat, which is no spread at all
    return out


def step_times(rec: dict[str, Any]) -> list[list[float]]:
    """Per ok repeat, its per-step times in ms."""
    out = []
    for r in rec.get("repeats") or []:
        if isinstance(r, dict) and r.get("status", "ok") == "ok":
            xs = [float(x) for x in (r.get("step_times_ms") or []) if num(x) is not None]
            if xs:
                out.append(xs)
    return out


def median_repeat_entry(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The repeat the record's ``utilisation``/``breakdown``/``trace`` come from.

    ``record["median_repeat"]`` (a repeat number) when the runner stored it; otherwise the ok
    repeat with the median samples/s (the lower middle one for an even count), as the runner picks it.
    """
    reps = [r for r in rec.get("repeats") or [] if isinstance(r, dict)]
    idx = rec.get("median_repeat")
    if isinstance(idx, int) and not isinstance(idx, bool):
        for r in reps:
            if r.get("repeat") == idx:
                return r
    ok = sorted((r for r in reps if r.get("status", "ok") == "ok" and num(r.get("samples_per_s")) is not None),
                key=lambda r: num(r.get("samples_per_s")))
    return ok[(len(ok) - 1) // 2] if ok else None


def series_paths(rec: dict[str, Any]) -> list[str]:
    """The median repeat's utilisation series files (relative to the store directory), node 0 first."""
    rep = median_repeat_entry(rec)
    paths = [p for p in (rep.get("series") or []) if isinstance(p, str) and p] if rep else []

    def rank_of(p: str) -> tuple[int, str]:
        m = re.search(r"rank(\d+)", Path(p).name)
        return (int(m.group(1)) if m else 1 << 30, p)

    return sorted(paths, key=rank_of)


def resolve_store_path(store_dir: str | Path | None, rel: str) -> Path:
    """A path the record gives relative to the store directory (absolute paths stay as they are); its
    gzipped copy (``NAME.gz``) where only that is there: an archived store may keep its
    traces and series gzipped."""
    path = Path(rel) if store_dir is None else Path(store_dir) / rel
    gz = path.with_name(path.name + ".gz")
    return gz if not path.exists() and gz.exists() else path


def open_text(path: str | Path):
    """A text file for reading, through gzip where its name ends in .gz."""
    return gzip.open(path, "rt", encoding="utf-8", errors="replace") if str(path).endswith(".gz") \
        else open(path, "r", encoding="utf-8", errors="replace")


def read_series(path: str | Path) -> list[dict[str, Any]]:
    """The samples of a utilisation series file (JSON lines with a numeric "t"), in time order.

    Never raises: a missing or unreadable file gives [], unreadable lines are skipped.
    """
    out = []
    try:
        with open_text(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    s = json.loads(line)
                except ValueError:
                    continue
                if isinstance(s, dict) and num(s.get("t")) is not None:
                    out.append(s)
    except OSError:
        return []
    out.sort(key=lambda s: s["t"])
    return out


def _check_record(rec: dict[str, Any]) -> str | None:
    """Why a schema-tagged record cannot be reported, or None."""
    kind = rec.get("kind")
    if kind == "micro":
        return None if isinstance(rec.get("micro"), str) else "micro record without 'micro' name"
    if kind not in sources.CASE_KINDS:
        return f"unknown record kind {kind!r}"
    cfg = rec.get("config")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), str):
        return "run record without config.model"
    for k in ("nnodes", "nproc_per_node", "batch_size"):
        v = cfg.get(k, 1)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"run record with bad config.{k} {v!r}"
    if rec.get("status") not in STATUSES:
        return f"run record with unknown status {rec.get('status')!r}"
    return None


@dataclass
class Loaded:
    store: str
    records: list[dict[str, Any]]
    load: LoadResult
    malformed: list[str] = field(default_factory=list)

    @property
    def store_dir(self) -> str:
        """The directory that record paths (series files, traces) are relative to."""
        p = Path(self.store)
        return str(p.parent if p.is_file() else p)

    @property
    def skipped_lines(self) -> int:
        return len(self.load.skipped)

    def warnings(self) -> list[str]:
        out = []
        w = self.load.warning()
        if w:
            out.append(w)
        if self.malformed:
            out.append(f"ignored {len(self.malformed)} malformed record(s) (first: {self.malformed[0]})")
        return out


def load_records(store_path: str | Path) -> Loaded:
    """Read a store (a directory of .jsonl files, or one .jsonl file). Bad input -> ConfigError."""
    path = Path(store_path)
    if not path.exists():
        raise ConfigError(f"result store {path} does not exist (give the results directory, "
                          f"or one .jsonl file)")
    store = ResultStore(path)
    if not store.files():
        raise ConfigError(f"result store {path} holds no .jsonl files")
    try:
        load = store.load()
    except OSError as e:
        raise ConfigError(f"cannot read result store {path}: {e.strerror or e}") from None
    good, malformed = [], []
    for rec in load.records:
        why = _check_record(rec)
        if why:
            malformed.append(f"record {str(rec.get('id'))[:12]}: {why}")
        else:
            good.append(rec)
    if not good:
        extra = f" ({len(load.skipped)} unreadable line(s) skipped)" if load.skipped else ""
        raise ConfigError(f"result store {path} holds no dlscale records{extra}")
    return Loaded(str(path), good, load, malformed)


def _split(values: Iterable[str] | None) -> list[str] | None:
    if not values:
        return None
    out = [v.strip() for item in values for v in str(item).split(",") if v.strip()]
    return out or None


@dataclass
class Filters:
    models: list[str] | None = None
    labels: list[str] | None = None
    precisions: list[str] | None = None
    strategies: list[str] | None = None

    @classmethod
    def from_args(cls, args: Any) -> "Filters":
        return cls(_split(getattr(args, "model", None)), _split(getattr(args, "label", None)),
                   _split(getattr(args, "precision", None)), _split(getattr(args, "strategy", None)))

    @property
    def workload_only(self) -> bool:
        return not (self.models or self.precisions or self.strategies)

    def match_label(self, rec: dict[str, Any]) -> bool:
        return not self.labels or str(rec_label(rec)) in self.labels

    def match_group(self, g: "Group") -> bool:
        return ((not self.models or g.model in self.models)
                and (not self.precisions or g.get("precision") in self.precisions)
                and (not self.strategies or g.strategy in self.strategies)
                and (not self.labels or str(g.label) in self.labels))

    def match_run(self, rec: dict[str, Any]) -> bool:
        """Record-level filter; strategy is applied to tables so baselines of any strategy stay."""
        cfg = rec_config(rec)
        if self.models and cfg.get("model") not in self.models:
            return False
        if self.precisions and cfg.get("precision") not in self.precisions:
            return False
        return self.match_label(rec)

    def describe(self) -> str:
        parts = [f"--{n} {','.join(v)}" for n, v in (("model", self.models), ("label", self.labels),
                                                      ("precision", self.precisions),
                                                      ("strategy", self.strategies)) if v]
        return " ".join(parts)


@dataclass
class Row:
    record: dict[str, Any]
    superseded: list[dict[str, Any]] = field(default_factory=list)
    speedup: float | None = None
    efficiency: float | None = None
    borrowed: bool = False  # the baseline of another strategy, shown as this table's 1-device row
    speedup_flags: list[validity.Flag] = field(default_factory=list)  # on speedup and efficiency

    def __post_init__(self) -> None:
        self.nnodes, self.nproc_per_node = rec_counts(self.record)
        self.status: str = self.record.get("status", "failed")
        self.stats = throughput_stats(self.record) if self.status in MEASURED_STATUSES else None
        if not self.stats or num(self.stats.get("median")) is None:
            self.stats = None

    @property
    def devices(self) -> int:
        return self.nnodes * self.nproc_per_node

    @functools.cached_property
    def validity(self) -> validity.Validity:
        """Recomputed from the record (today's checks and thresholds, old records too)."""
        return validity.assess(self.record)

    @property
    def flags(self) -> list[validity.Flag]:
        """The record's own flags, then those on its speedup and efficiency."""
        return self.validity.flags + self.speedup_flags

    @property
    def loss_after(self) -> float | None:
        """The trained model's loss (global batch mean, dlscale/results/parity.py) of the median repeat."""
        rep = median_repeat_entry(self.record)
        return num(rep.get("loss_after")) if rep else None

    @property
    def ok(self) -> bool:
        """Measured: an ok record with samples/s, or an interrupted one with finished repeats (flagged)."""
        return self.status in MEASURED_STATUSES and self.stats is not None

    @property
    def node_gpu(self) -> str:
        return f"{self.nnodes}n{self.nproc_per_node}g"

    @property
    def strategy(self) -> str:
        return str(rec_config(self.record).get("strategy"))

    def stat(self, key: str) -> float | None:
        return num(self.stats.get(key)) if self.stats else None

    @property
    def median(self) -> float | None:
        return self.stat("median")

    def summary(self, key: str) -> Any:
        summ = self.record.get("summary")
        return summ.get(key) if isinstance(summ, dict) else None

    @property
    def mfu(self) -> float | None:
        return num(self.summary("mfu"))

    @property
    def peak_mem(self) -> float | None:
        """Peak allocated device memory (max over ranks); on CPU runs the peak RSS of a process."""
        key = "peak_mem_allocated_bytes" if rec_device_type(self.record) == "cuda" else "peak_rss_bytes"
        v = num(self.summary(key))
        if v is None:  # fall back to the largest repeat peak
            vs = [num(r.get(key)) for r in self.record.get("repeats") or [] if isinstance(r, dict)]
            vs = [x for x in vs if x is not None]
            v = max(vs) if vs else None
        return v

    @property
    def unit(self) -> str | None:
        m = self.record.get("model")
        return m.get("unit") if isinstance(m, dict) else None

    @property
    def exchange_bytes(self) -> float | None:
        """Bytes the busiest rank sends per step, as a sharding strategy recorded them (else None)."""
        info = self.record.get("strategy_info")
        ex = info.get("exchange_bytes_per_step") if isinstance(info, dict) else None
        return num(ex.get("max_per_rank")) if isinstance(ex, dict) else None

    def util(self, key: str) -> float | None:
        """A flat key of the record's ``utilisation`` summary (median repeat, node 0), or None."""
        u = self.record.get("utilisation")
        return num(u.get(key)) if isinstance(u, dict) else None

    @property
    def breakdown(self) -> dict[str, Any] | None:
        """The record's step-time breakdown when it was measured (``supported`` not false)."""
        b = self.record.get("breakdown")
        return b if isinstance(b, dict) and b.get("supported", True) is not False else None

    @property
    def exposed_comm_pct(self) -> float | None:
        """Exposed (not overlapped) gradient communication, % of the breakdown's step time."""
        b = self.breakdown
        if not b:
            return None
        exposed, step = num(b.get("exposed_comm_ms")), num(b.get("step_ms"))
        return None if exposed is None or not step or step <= 0 else exposed / step * 100.0

    @property
    def overlap_pct(self) -> float | None:
        """Share of the all-reduce time hidden behind backward computation, in %."""
        b = self.breakdown
        r = num(b.get("overlap_ratio")) if b else None
        return None if r is None else r * 100.0

    @property
    def data(self) -> dict[str, Any] | None:
        """The record's real-data measurements (median repeat; dlscale/inputs), None for synthetic data."""
        d = self.record.get("data")
        return d if isinstance(d, dict) else None

    def _data_pct(self, key: str) -> float | None:
        v = num((self.data or {}).get(key))
        return None if v is None else v * 100.0

    @property
    def data_wait_pct(self) -> float | None:
        """Share of the timed window the steps waited for data (slowest rank), in %."""
        return self._data_pct("data_wait_share_max")

    @property
    def data_gpu_idle_pct(self) -> float | None:
        """Share of the timed window the GPU idled waiting for data (slowest rank), in %; None off GPUs."""
        return self._data_pct("data_gpu_idle_share_max")

    @property
    def loader_cores(self) -> float | None:
        """CPU cores the data loaders of all ranks kept busy over the window."""
        return num((self.data or {}).get("loader_cpu_cores_total"))

    @property
    def trace(self) -> str | None:
        t = self.record.get("trace")
        return t if isinstance(t, str) and t else None

    @property
    def error(self) -> str | None:
        e = self.record.get("error")
        return str(e) if e else None

    def supersede_note(self) -> str | None:
        if not self.superseded:
            return None
        n_ok = sum(1 for r in self.superseded if r.get("status") == "ok")
        n_other = len(self.superseded) - n_ok
        bits = []
        if n_ok:
            bits.append(f"{n_ok} older ok")
        if n_other:
            bits.append(f"{n_other} non-ok")
        return f"newest of {len(self.superseded) + 1} records of this case ({', '.join(bits)} not used)"


def _table_fields(rec: dict[str, Any]) -> dict[str, Any]:
    d = {k: v for k, v in workload_fields(rec_config(rec)).items() if k not in TABLE_EXCLUDE}
    d["device_type"] = rec_device_type(rec)
    d["label"] = rec_label(rec)
    return sources.adjust_fields(rec, d)


def baseline_fields(rec: dict[str, Any]) -> dict[str, Any]:
    """The workload of a run record: what its 1-device baseline must share (config minus
    ``BASELINE_EXCLUDE``, plus device type and label)."""
    d = {k: v for k, v in workload_fields(rec_config(rec)).items() if k not in BASELINE_EXCLUDE}
    d["device_type"] = rec_device_type(rec)
    d["label"] = rec_label(rec)
    return sources.adjust_fields(rec, d)


@dataclass
class Group:
    fields: dict[str, Any]  # table identity: config minus counts/procedure, + device_type, label
    rows: list[Row] = field(default_factory=list)
    baseline: Row | None = None
    name: str = ""  # the DLPerf JSON key
    extras: dict[str, Any] = field(default_factory=dict)  # fields that tell this table from its model's others
    store_dir: str | None = None  # where the records' relative paths (series, traces) point

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def model(self) -> str:
        return str(self.fields.get("model"))

    @property
    def batch_size(self) -> int | None:
        return self.fields.get("batch_size")

    @property
    def strategy(self) -> str:
        return str(self.fields.get("strategy"))

    @property
    def device_type(self) -> str:
        return str(self.fields.get("device_type"))

    @property
    def label(self) -> str | None:
        return self.fields.get("label")

    @property
    def unit(self) -> str:
        for r in self.rows:
            m = r.record.get("model")
            if isinstance(m, dict) and m.get("unit"):
                return str(m["unit"])
        return "sample"

    @property
    def own_rows(self) -> list[Row]:
        return [r for r in self.rows if not r.borrowed]

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", self.name).strip("-") or "group"

    @property
    def title(self) -> str:
        f = self.fields
        parts = [self.model]
        if f.get("flavor") not in (None, "full"):
            parts[0] += f" ({f['flavor']})"
        how = sources.run_mode(f)
        parts += [str(f.get("precision")), how + (" (XLA)" if how == "jax" else ""), self.strategy,
                  f"batch {self.batch_size}/device"]
        if self.label is not None:
            parts.append(f"label {self.label}")
        if f.get("data") not in (None, "synthetic") and "data" not in self.extras:
            parts.append(f"data {f['data']}")
        if self.device_type != "cuda":
            parts.append(self.device_type)
        prefix = sources.title_prefix(self)  # external/imported tables name their stack there
        for k, v in self.extras.items():
            if k not in ("label", "device_type", "flavor") and not at_default(k, v) and (
                    k not in sources.TITLE_SKIP or (k == "framework" and prefix is None)):
                parts.append(f"{k}={_compact(v)}")
        return (prefix + " — " if prefix else "") + " · ".join(parts)

    def baseline_note(self) -> str:
        b = self.baseline
        if b is None:
            return "no 1-device ok record of this workload: speedup and efficiency are not computed"
        where = "this table's 1-device row" if not b.borrowed else f"the 1-device {b.strategy} record"
        return f"speedup baseline: {where} ({b.median:.2f} {self.unit}/s, record {str(b.record.get('id'))[:8]})"


def at_default(key: str, value: Any) -> bool:
    """Whether a case field's value is the one a case has when nobody sets it (unset, empty
    options, the RunConfig default): such a value says nothing in a table's key or title."""
    if value is None or value == {}:
        return True
    default = LATE_FIELD_DEFAULTS.get(key, _CASE_DEFAULTS.get(key, _NO_DEFAULT))
    return default is not _NO_DEFAULT and value == default and type(value) is type(default)


_NO_DEFAULT = object()
_CASE_DEFAULTS = {f.name: f.default for f in dataclasses.fields(RunConfig)
                  if f.default is not dataclasses.MISSING}


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return ",".join(f"{k}:{_compact(x)}" for k, x in sorted(v.items())) or "{}"
    return str(v)


@dataclass
class Report:
    loaded: Loaded
    filters: Filters
    records: list[dict[str, Any]]  # every record passing the filters (run and micro, superseded too)
    groups: list[Group]
    micro: list[dict[str, Any]]
    generated: str

    @property
    def store(self) -> str:
        return self.loaded.store

    def warnings(self) -> list[str]:
        return self.loaded.warnings()

    def selected_records(self) -> list[dict[str, Any]]:
        """Records the tables use (one per case), then micro records, in report order."""
        seen, out = set(), []
        for g in self.groups:
            for r in g.rows:
                if id(r.record) not in seen:
                    seen.add(id(r.record))
                    out.append(r.record)
        return out + list(self.micro)


def select_cases(records: list[dict[str, Any]], by_label: bool = True) -> list[Row]:
    """One row per case: the newest ok record, else the newest interrupted one with finished repeats,
    else the newest record; the rest are 'superseded'.

    A case is (case_key, device type) and, with ``by_label``, the label.
    """
    cases: dict[tuple, list[tuple[float, int, dict]]] = defaultdict(list)
    for i, rec in enumerate(records):
        key = (case_key_of(rec), rec_device_type(rec), freeze(rec_label(rec)) if by_label else "")
        cases[key].append((rec_created(rec), i, rec))
    rows = []
    for items in cases.values():
        items.sort(key=lambda t: (t[0], t[1]))
        oks = [t for t in items if t[2].get("status") == "ok"]
        partial = [t for t in items if t[2].get("status") == "interrupted" and repeat_samples(t[2])]
        chosen = (oks or partial or items)[-1]
        rows.append(Row(chosen[2], superseded=[t[2] for t in items if t is not chosen]))
    return rows


def _pick_baseline(group: Group, candidates: list[Row]) -> Row | None:
    if not candidates:
        return None
    tkey = freeze(group.fields)

    def rank(r: Row) -> tuple:
        same_table = freeze(_table_fields(r.record)) == tkey
        same_strategy = r.strategy == group.strategy
        pref = (BASELINE_STRATEGY_PREFERENCE.index(r.strategy)
                if r.strategy in BASELINE_STRATEGY_PREFERENCE else len(BASELINE_STRATEGY_PREFERENCE))
        return (not same_table, not same_strategy, pref, -rec_created(r.record))

    return min(candidates, key=rank)


def build_groups(rows: list[Row]) -> list[Group]:
    by_table: dict[str, Group] = {}
    for row in rows:
        fields = _table_fields(row.record)
        g = by_table.setdefault(freeze(fields), Group(fields))
        g.rows.append(row)
    pool: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.ok and row.devices == 1:
            pool[freeze(baseline_fields(row.record))].append(row)
    for g in by_table.values():
        some = g.rows[0].record
        base = _pick_baseline(g, pool.get(freeze(baseline_fields(some)), []))
        if base is not None and base not in g.rows:
            base = Row(base.record, superseded=base.superseded, borrowed=True)
            g.rows.append(base)
        g.baseline = base
        for r in g.rows:
            if r.ok and base is not None:
                r.speedup = speedup(r.median, base.median)
                r.efficiency = scaling_efficiency(r.speedup, r.devices)
                r.speedup_flags = validity.compare_flags(r.record, base.record, r.efficiency)
        g.rows.sort(key=lambda r: (r.devices, r.nnodes, not r.borrowed))
    return list(by_table.values())


def _name_part(key: str, value: Any) -> str:
    if key == "compile":
        s = "compile" if value else "eager"
    elif key in ("label", "device_type", "flavor", "strategy", "precision", "model", "compile_mode", "kind",
                 "framework", "parser"):
        s = str(value)
    elif key == "batch_size":
        s = f"b{value}"
    elif key == "source_id":  # an imported table's source (sources.py)
        s = f"src{value}"
    elif isinstance(value, dict):
        s = key + "-" + "-".join(f"{k}{_compact(v)}" for k, v in sorted(value.items()))
    else:
        s = f"{key}{value}"
    return re.sub(r"[\s/]+", "-", s)


def assign_names(groups: list[Group]) -> None:
    """DLPerf keys: the model name alone when the model has one table; otherwise
    model_precision_bBATCH, then whichever of flavor, compile, strategy, label, device type and
    other config fields differ between that model's tables (e.g. bert-base_amp-bf16_b128_ddp)."""
    by_model: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        by_model[g.model].append(g)
    used: set[str] = set()
    for model, gs in by_model.items():
        keys: list[str] = []
        for g in gs:
            keys += [k for k in g.fields if k not in keys]
        # a late field left out at its default (data, data_decode...) means that default, not None
        value = lambda g, k: g.fields.get(k, LATE_FIELD_DEFAULTS.get(k))  # noqa: E731
        varying = [k for k in keys if len({freeze(value(g, k)) for g in gs}) > 1]
        for g in gs:
            g.extras = {k: value(g, k) for k in varying if k not in MAIN_KEYS}
            if len(gs) == 1:
                name = model
            else:
                parts = [model]
                order = ["flavor", "precision", "compile", "batch_size", "strategy"]
                for k in order:
                    if k in ("precision", "batch_size") or k in varying:
                        parts.append(_name_part(k, g.fields.get(k)))
                # unset or default values (no label, no strategy options...) add nothing: the plain name
                # is the default, so a table's key does not change when another table sets the field
                parts += [_name_part(k, v) for k, v in g.extras.items() if k != "flavor" and not at_default(k, v)]
                name = "_".join(parts)
            base, n = name, 2
            while name in used:
                name = f"{base}_{n}"
                n += 1
            used.add(name)
            g.name = name


def _group_sort_key(g: Group) -> tuple:
    f = g.fields
    return (g.model, str(f.get("flavor")), str(f.get("precision")), bool(f.get("compile")), g.strategy,
            g.batch_size or 0, str(g.label), g.device_type, freeze(f))


def build_report(loaded: Loaded, filters: Filters | None = None) -> Report:
    filters = filters or Filters()
    # Tables and their names come from the whole store, then filters pick tables: the DLPerf keys
    # of a table do not change with the filters, and baselines of other strategies stay in reach.
    runs = [r for r in loaded.records if r.get("kind") in sources.CASE_KINDS]
    micro = [r for r in loaded.records if r.get("kind") == "micro"
             and filters.workload_only and filters.match_label(r)]
    groups = build_groups(select_cases(runs))
    groups.sort(key=_group_sort_key)
    assign_names(groups)
    groups = [g for g in groups if filters.match_group(g)]
    for g in groups:
        g.store_dir = loaded.store_dir
    if not groups and not micro:
        what = filters.describe()
        models = sorted({str(rec_config(r).get("model")) for r in loaded.records if r.get("kind") == "run"})
        labels = sorted({str(rec_label(r)) for r in loaded.records})
        raise ConfigError(f"no records in {loaded.store} match {what or 'the filters'} "
                          f"(models: {', '.join(models) or 'none'}; labels: {', '.join(labels)})")
    micro.sort(key=lambda r: (str(r.get("micro")), rec_created(r)))
    in_groups = {id(r.record) for g in groups for r in g.rows}
    in_groups |= {id(s) for g in groups for r in g.rows for s in r.superseded}
    in_groups |= {id(r) for r in micro}
    records = [r for r in loaded.records if id(r) in in_groups]
    generated = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return Report(loaded, filters, records, groups, micro, generated)
