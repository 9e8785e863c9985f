"""A JAX profiler trace of a few training steps, and the time per op it shows.

``jax.profiler.trace`` writes a Perfetto/Chrome JSON trace (``create_perfetto_trace``); the
worker keeps rank 0's as ``trace.json`` (as the torch worker's profiler trace) and the record
gets the top ops: the complete events of the device timelines (GPU kernels, grouped by name)
or, on a CPU, of XLA's executor threads, summed over the profiled steps and divided by them.
"""
from __future__ import annotations

import gzip
import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

PROFILE_STEPS = 3
TOP = 15


def _events(trace: dict) -> tuple[list[dict], dict[int, str]]:
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    names = {e.get("pid"): e.get("args", {}).get("name", "") for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    return events, names


def top_ops(trace: dict, steps: int, top: int = TOP) -> list[dict[str, Any]]:
    """[{"name", "ms_per_step", "count_per_step", "share"}] of the device's ops, largest first.

    Device timelines are the processes whose name says GPU (``/device:GPU:0`` ...); without one
    (a CPU run) every complete event outside Python's own (``$``-prefixed) frames counts.
    """
    events, names = _events(trace)
    device_pids = {pid for pid, n in names.items() if "gpu" in n.lower() or "/device:" in n.lower()}
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        if device_pids and e.get("pid") not in device_pids:
            continue
        name = str(e.get("name", ""))
        if not device_pids and (name.startswith("$") or "python" in name.lower()):
            continue
        total[name] += float(e["dur"])
        count[name] += 1
    grand = sum(total.values()) or 1.0
    rows = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": n, "ms_per_step": us / 1e3 / steps, "count_per_step": count[n] / steps, "share": us / grand}
            for n, us in rows]


def read_trace(log_dir: Path) -> dict | None:
    found = sorted(log_dir.rglob("*.trace.json.gz")) + sorted(log_dir.rglob("perfetto_trace.json.gz"))
    if not found:
        return None
    with gzip.open(found[-1], "rt") as f:
        return json.load(f)


def profile_steps(step, state, batches, trace_path: Path | None, steps: int = PROFILE_STEPS):
    """Run ``steps`` more steps under the profiler; (new state, {"top_ops", "steps", "trace"})."""
    import jax

    tmp = Path(tempfile.mkdtemp(prefix="dlscale-jax-profile-"))
    try:
        with jax.profiler.trace(str(tmp), create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = step(state, batches)
            jax.block_until_ready((state, loss))
        trace = read_trace(tmp)
        info: dict[str, Any] = {"steps": steps, "top_ops": top_ops(trace, steps) if trace else None}
        if trace is not None and trace_path is not None:
            trace_path.write_text(json.dumps(trace))
            info["trace"] = trace_path.name
        return state, info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
