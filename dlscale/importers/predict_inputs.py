"""What ``predict`` takes from imported tables: the table as a published-figures fixture, and the
link figures of an imported record's ``system`` block.

Hooks for dlscale/commands/predict.py (kept here so the prediction code stays one place):
``table_as_fixture`` turns a ``dlscale-table/1`` file into the shape ``validate_published``
reads (one series per precision x batch x strategy x compile, points [nodes, GPUs per node,
median samples/s]); ``fill_links`` gives ``predict --validate STORE`` the intra/inter-node links
of an imported record when the command line gives none.
"""
from __future__ import annotations

import statistics
from typing import Any

from dlscale.importers.records import FORMAT_ID


def is_table(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT_ID


def table_as_fixture(table: dict[str, Any], path: str) -> dict[str, Any]:
    """A dlscale-table/1 mapping (validated) as a published-figures fixture."""
    from dlscale.importers.table import table_records

    records = table_records(table, path)  # validates every field (ConfigError otherwise)
    system = table.get("system") or {}
    gb = system.get("grad_bytes_per_param")
    series: dict[tuple, dict[str, Any]] = {}
    for r in records:
        if r["status"] != "ok":
            continue
        c = r["config"]
        key = (c["precision"], c["batch_size"], c["strategy"], c["compile"])
        s = series.setdefault(key, {"name": f"{c['precision']}-b{c['batch_size']}"
                                            + (f"-{c['strategy']}" if c["strategy"] != "ddp" else "")
                                            + ("-compiled" if c["compile"] else ""),
                                    "precision": c["precision"], "batch_size": c["batch_size"], "points": []})
        if isinstance(gb, dict) and c["precision"] in gb:
            s["grad_bytes_per_param"] = gb[c["precision"]]
        elif isinstance(gb, (int, float)):
            s["grad_bytes_per_param"] = gb
        s["points"].append([c["nnodes"], c["nproc_per_node"], r["summary"]["samples_per_s"]["median"]])
    out: dict[str, Any] = {"source": table["source"], "model": table["model"], "params": table.get("params"),
                           "series": list(series.values()),
                           "links": {k: system[k] for k in ("intra", "inter") if system.get(k)}}
    if system.get("overlap") is not None:
        out["overlap"] = system["overlap"]
    if system.get("bucket_mb") is not None:
        out["bucket_mb"] = system["bucket_mb"]
    return out


def fill_links(links: Any, record: dict[str, Any]) -> None:
    """Intra/inter-node links from an imported record's system block where ``links`` has none."""
    from dlscale.perfmodel import Link

    system = record.get("system") if isinstance(record.get("system"), dict) else None
    if not system or record.get("kind") != "imported":
        return
    for name in ("intra", "inter"):
        d = system.get(name)
        if getattr(links, name) is None and isinstance(d, dict) and d.get("busbw_gbps"):
            setattr(links, name, Link(float(d["busbw_gbps"]) * 1e9, float(d.get("latency_us") or 0.0) * 1e-6))
            links.sources[name] = (f"imported table's system.{name}: {d['busbw_gbps']:g} GB/s, latency "
                                   f"{d.get('latency_us') or 0:g} us ({d.get('source')})")


