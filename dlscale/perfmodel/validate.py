"""Checking the model against measured or published multi-device points, through the same code path as
``predict`` (the same inputs, buckets and options), under three protocols:

* ``from-1-gpu``: only the 1-device point of the series is known; every multi-device point is predicted.
* ``from-node``: the series' single-node points are known (one server measured); every multi-node point
  is predicted.
* ``from-multinode``: the single-node points and the multi-node points of fewer nodes (same GPUs per node)
  are known; every multi-node point that has such a smaller one is predicted (measure 2 nodes, predict 4).

A predicted point never informs its own prediction (not its throughput, not its breakdown).

A series with a point above ideal scaling past its noise (``validity.compare_flags``: "a measurement problem
until proven otherwise") is no test of the model: its rows carry the flag, the summaries leave them out (and
count them) and the law's fit does not use the series.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from dlscale import ConfigError
from dlscale.results import validity
from dlscale.perfmodel.core import Shape, error_pct
from dlscale.perfmodel.inputs import (ModelOptions, Query, Workload, build_model, group_workloads, model_info,
                                      shape_of, short_id, source_of, usable)
from dlscale.perfmodel.law import PROTOCOLS, OverheadLaw
from dlscale.report.data import rec_config


@dataclass
class ValidationRow:
    series: str
    group: str  # what leave-one-out holds out together: the source table, or the store
    framework: str
    shape: str
    devices: int
    protocol: str
    measured: float
    predicted: float
    low: float
    high: float
    error_pct: float
    overhead_ms: float
    exposed_ms: float
    step_ms: float
    limiting: str
    record: str
    flags: str = ""  # a measurement flag of the series ("above_ideal"): left out of the summaries

    @property
    def in_band(self) -> bool:
        return self.low <= self.measured <= self.high


@dataclass
class Summary:
    n: int
    mean_abs_error_pct: float | None
    max_abs_error_pct: float | None
    mean_error_pct: float | None
    over: int  # predicted faster than measured
    under: int
    in_band: int
    p80_abs_error_pct: float | None


def summarize_rows(rows: list[ValidationRow]) -> Summary:
    errs = [r.error_pct for r in rows]
    if not errs:
        return Summary(0, None, None, None, 0, 0, 0, None)
    abs_e = sorted(abs(e) for e in errs)
    p80 = abs_e[min(len(abs_e) - 1, math.ceil(0.8 * len(abs_e)) - 1)]
    return Summary(len(errs), statistics.fmean(abs_e), abs_e[-1], statistics.fmean(errs),
                   sum(e > 0 for e in errs), sum(e < 0 for e in errs), sum(r.in_band for r in rows), p80)


@dataclass
class Validation:
    rows: list[ValidationRow] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    law: str = ""

    def select(self, protocol: str | None = None, groups: Iterable[str] | None = None,
               flagged: bool = False) -> list[ValidationRow]:
        """The rows of ``protocol`` and ``groups``: unflagged ones, or (``flagged``) only the flagged ones."""
        gs = set(groups) if groups is not None else None
        return [r for r in self.rows if (protocol is None or r.protocol == protocol)
                and (gs is None or r.group in gs) and bool(r.flags) == flagged]

    def summary(self, protocol: str | None = None, groups: Iterable[str] | None = None) -> Summary:
        """Over the unflagged rows (``select``)."""
        return summarize_rows(self.select(protocol, groups))

    def to_dict(self) -> dict[str, Any]:
        return {"law": self.law, "rows": [asdict(r) | {"in_band": r.in_band} for r in self.rows],
                "skipped": self.skipped,
                "summary": {p: asdict(self.summary(p)) for p in PROTOCOLS}}


def group_of(rec: dict[str, Any]) -> str:
    prov = rec.get("provenance")
    if isinstance(prov, dict) and prov.get("file"):
        return Path(str(prov["file"]).split("#")[0]).name
    return source_of(rec) or "measured"


def series_name(w: Workload) -> str:
    base = w.baseline or w.rows[0]
    cfg = rec_config(base.record)
    parts = [group_of(base.record) if base.record.get("kind") == "imported" else "", str(cfg.get("model")),
             str(cfg.get("precision")), f"b{cfg.get('batch_size')}", "compile" if cfg.get("compile") else "eager"]
    if cfg.get("framework") not in (None, "torch"):  # another framework: another series, always compiled (XLA)
        parts[1:] = [str(cfg.get("framework")), *parts[1:-1]]
    if cfg.get("flavor") not in (None, "full"):
        parts.insert(2, str(cfg.get("flavor")))
    if base.record.get("label") is not None:
        parts.append(f"label {base.record.get('label')}")
    return " ".join(p for p in parts if p)


def series_flags(w: Workload, strategy: str) -> str:
    """"above_ideal" where a multi-device point of the series scales above ideal past the noise of it and of
    the 1-device point (the check ``dlscale report`` and ``compare`` apply; without one, the node's point against
    the points of several nodes), else ""."""
    base, node = w.baseline, w.node_reference(strategy)
    ref = base or node
    if ref is None or not ref.median:
        return ""
    per = ref.devices  # without a 1-device point: the node's, against its multi-node points
    for sh, row in w.measured(strategy).items():
        if not row.median or row is ref or sh.devices % per:
            continue
        eff = float(row.median) * per / (sh.devices * float(ref.median))
        if any(f.check == "above_ideal" for f in validity.compare_flags(row.record, ref.record, eff)):
            return "above_ideal"
    return ""


def targets(w: Workload, strategy: str, protocol: str) -> list:
    rows = w.measured(strategy)
    if protocol == "from-node":
        return [r for sh, r in sorted(rows.items()) if sh.nodes > 1]
    if protocol == "from-multinode":  # those with a smaller multi-node shape to calibrate on
        return [r for sh, r in sorted(rows.items()) if any(s.nodes > 1 for s in calibration(rows, sh, protocol))]
    return [r for _, r in sorted(rows.items())]


def calibration(measured: Iterable[Shape], target: Shape, protocol: str) -> list[Shape]:
    """The measured shapes a protocol may calibrate on when predicting ``target``: none (from-1-gpu), the
    single-node ones (from-node), and those with the multi-node ones of fewer nodes at the target's GPUs per
    node (from-multinode; the node first)."""
    if protocol == "from-1-gpu":
        return []
    single = [s for s in measured if s.nodes == 1 and s != target]
    if protocol == "from-node":
        return single
    return single + sorted(s for s in measured if 1 < s.nodes < target.nodes
                           and s.gpus_per_node == target.gpus_per_node)


def validate_workload(w: Workload, records: list[dict[str, Any]], opts: ModelOptions,
                      protocols: Iterable[str] = PROTOCOLS) -> tuple[list[ValidationRow], list[str]]:
    out: list[ValidationRow] = []
    skipped: list[str] = []
    name = series_name(w)
    base = w.baseline
    flags = series_flags(w, opts.strategy)
    measured = w.measured(opts.strategy)
    for protocol in protocols:
        tgt = targets(w, opts.strategy, protocol)
        if not tgt:
            continue
        if base is None and (protocol == "from-1-gpu" or w.node_reference(opts.strategy) is None):
            skipped += [f"{name} {shape_of(t).label}: no 1-device baseline ({protocol}); skipped" for t in tgt]
            continue
        for t in tgt:
            sh = shape_of(t)
            calib = calibration(measured, sh, protocol)
            if protocol != "from-1-gpu" and Shape(1, sh.gpus_per_node) not in calib:
                skipped.append(f"{name} {sh.label}: no measured 1x{sh.gpus_per_node} point ({protocol}); skipped")
                continue
            try:
                built = build_model(w, records, opts, calibrate_on=calib, exclude=t)
                host = built.model.host
                if host is not None and host.other_host:
                    raise ConfigError(f"--host-cores {host.cores} asks about another host than the records' "
                                      f"({host.record_cores} cores): nothing measured there to compare")
                if sh.nodes > 1 and built.model.links.inter is None:
                    raise ConfigError("needs the inter-node link (--inter-busbw, or the source's system.inter)")
                if sh.gpus_per_node > 1 and built.model.links.intra_for(sh.gpus_per_node) is None:
                    raise ConfigError("needs the intra-node link (--intra-busbw, a micro comm record, or the "
                                      "source's system.intra)")
                p = built.model.predict(sh)
            except ConfigError as e:
                skipped.append(f"{name} {sh.label} ({protocol}): {e}; skipped")
                continue
            meas = float(t.median)  # type: ignore[arg-type]
            out.append(ValidationRow(
                name, group_of(t.record), str(rec_config(t.record).get("framework") or "dlscale"), sh.label,
                sh.devices, protocol, meas, p.samples_per_s, p.low, p.high, error_pct(p.samples_per_s, meas),
                p.overhead_s * 1e3, p.overlap.exposed_s * 1e3, p.step_s * 1e3, p.limiting, short_id(t.record),
                flags))
    return out, skipped


def validate(records: list[dict[str, Any]], query: Query, opts: ModelOptions,
             protocols: Iterable[str] = PROTOCOLS,
             law_for: Callable[[str], OverheadLaw] | None = None) -> Validation:
    """Every multi-device ok point of ``opts.strategy`` predicted under each protocol. ``law_for(group)``
    gives the law to use for a group (leave-one-out); default: ``opts.law``."""
    recs = usable(records, query)
    if not recs:
        raise ConfigError("no run or imported records matching the filters to validate")
    val = Validation(law=opts.law.describe())
    n_targets = 0
    for key, w in sorted(group_workloads(recs).items()):
        if not w.measured(opts.strategy):
            continue
        n_targets += 1
        o = opts
        if law_for is not None:
            o = ModelOptions(**{**opts.__dict__, "law": law_for(group_of((w.baseline or w.rows[0]).record))})
        rows, skipped = validate_workload(w, records, o, protocols)
        val.rows += rows
        val.skipped += skipped
    if n_targets == 0:
        raise ConfigError(f"no multi-device ok {opts.strategy} record to validate")
    return val


def unit_of(records: list[dict[str, Any]]) -> str:
    units = {str(model_info(r).get("unit") or "sample") for r in records}
    return units.pop() if len(units) == 1 else "sample"
