"""Minimal reader of published tables (format dlscale-table/1, docs/perfmodel.md) into
record dicts of kind ``imported``, for the tests and the validation script only.

``dlscale import --format table`` is the real importer (another branch); until it is on main this
stands in for it, producing the record shape that importer writes (the fields the performance
model reads). It also reads the older ``published_*.yaml`` series format.
"""
from __future__ import annotations

import hashlib
import statistics
from pathlib import Path
from typing import Any

import yaml

RECORD_SCHEMA = "dlscale.record/1"


def _stats(values: list[float]) -> dict[str, Any]:
    n = len(values)
    return {"median": statistics.median(values), "mean": statistics.fmean(values), "min": min(values),
            "max": max(values), "stdev": statistics.stdev(values) if n > 1 else None, "n": n}


def _record(table: dict[str, Any], row: dict[str, Any], path: str, index: int) -> dict[str, Any]:
    defaults = table.get("defaults") or {}
    get = lambda k, d=None: row.get(k, defaults.get(k, d))  # noqa: E731
    nodes, gpn = int(row["nodes"]), int(row["gpus_per_node"])
    cfg = {"model": table.get("model"), "flavor": "full", "strategy": get("strategy", "ddp"),
           "nproc_per_node": gpn, "nnodes": nodes, "batch_size": int(row["batch_size"]),
           "precision": get("precision", "fp32"), "compile": bool(get("compile", False)), "device": "cuda",
           "framework": table.get("framework"), "grad_accum": 1}
    status = row.get("status", "ok")
    runs = [float(x) for x in row.get("runs") or []] or ([float(row["throughput"])] if "throughput" in row else [])
    summary: dict[str, Any] = {"device_name": (table.get("hardware") or {}).get("gpu")}
    if status == "ok" and runs:
        st = _stats(runs)
        if "throughput" in row:  # the published median is the figure; runs (if any) only give the spread
            st["median"] = float(row["throughput"])
        summary["samples_per_s"] = st
        summary["samples_per_s_per_device"] = st["median"] / (nodes * gpn)
    key = f"{path}:{index}"
    hw = table.get("hardware") or {}
    return {
        "schema": RECORD_SCHEMA, "kind": "imported", "id": hashlib.sha1(key.encode()).hexdigest()[:16],
        "created": str(table.get("date") or ""), "case_key": key, "label": None, "config": cfg,
        "world_size": nodes * gpn, "device_type": "cuda", "status": status, "error": None,
        "repeats": [{"repeat": i, "status": "ok", "samples_per_s": x} for i, x in enumerate(runs)],
        "summary": summary,
        "model": {"unit": table.get("unit"), "seq_len": table.get("seq_len"), "params": table.get("params")},
        "env": {"gpus": [{"name": hw.get("gpu")}] * int(hw.get("gpus_per_node") or gpn)},
        "provenance": {"source": table.get("source"), "tool": table.get("tool"), "date": table.get("date"),
                       "hardware": hw, "format": table.get("format"), "file": str(path),
                       "note": row.get("note")},
        "system": table.get("system") or {},
    }


def _old_series(data: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The older published-figures format (series of [nodes, gpus per node, samples/s])."""
    links = data.get("links") or {}
    out = []
    for s in data.get("series") or []:
        table = {"model": data.get("model"), "framework": "mxnet", "unit": "seq", "seq_len": 128,
                 "params": data.get("params"), "source": data.get("source"), "date": None,
                 "format": "published-series", "hardware": {"gpu": "Tesla V100-SXM2-16GB", "gpus_per_node": 8},
                 "system": {"intra": links.get("intra"), "inter": links.get("inter"),
                            "bucket_mb": data.get("bucket_mb"), "overlap": data.get("overlap"),
                            "grad_bytes_per_param": s.get("grad_bytes_per_param")},
                 "defaults": {"precision": {"fp16": "amp-fp16"}.get(s.get("precision"), s.get("precision"))}}
        for i, (m, g, v) in enumerate(s["points"]):
            out.append(_record(table, {"nodes": m, "gpus_per_node": g, "batch_size": s["batch_size"],
                                       "throughput": v}, f"{path}#{s.get('name')}", i))
    return out


def load_table(path: str | Path) -> list[dict[str, Any]]:
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if "series" in data:
        return _old_series(data, str(path))
    return [_record(data, row, str(path), i) for i, row in enumerate(data.get("rows") or [])]


def load_tables(paths: list[str | Path]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for p in paths:
        p = Path(p)
        files = sorted(p.glob("*.yaml")) if p.is_dir() else [p]
        for f in files:
            out += load_table(f)
    return out
