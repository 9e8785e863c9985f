"""A JAX profiler trace of a few training steps, and the time per op it shows.

``jax.profiler.trace`` writes a Perfetto/Chrome JSON trace (``create_perfetto_trace``); the
worker keeps rank 0's as ``trace.json`` (as the torch worker's profiler trace) and the record
gets the top ops: the complete events of the device timelines (GPU kernels, grouped by name)
or, on a CPU, of XLA's executor threads, summed over the profiled steps and divided by them.
``device_events``/``by_kind`` also read torch.profiler's Chrome traces, so the GPU benchmark
compares the two frameworks' kernels by kind (benchmarks/kernels.py).
"""
from __future__ import annotations

import gzip
import json
import re
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

PROFILE_STEPS = 3
TOP = 15


KINDS = (  # (kind, pattern of a lower-cased kernel name), first match wins
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa|softmax_warp")),
    ("convolution", re.compile(r"conv(?!ert)|fprop|dgrad|wgrad|implicit_?gemm|winograd")),
    ("matmul", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|matmul|\bdot\b|splitk")),
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter")),
    ("memcpy/memset", re.compile(r"memcpy|memset")),
)


def kind_of(name: str) -> str:
    """attention, convolution, matmul, communication, memcpy/memset or other (elementwise,
    reductions, normalisation, the optimizer update, fused loops)."""
    low = name.lower()
    return next((k for k, pat in KINDS if pat.search(low)), "other")


def device_events(trace: dict) -> list[dict]:
    """The complete events of the device timelines: GPU processes (``/device:GPU:0``, torch's
    kernel events), on their CUDA stream lines where the trace names them (JAX's trace also has
    derived per-op and per-module lines on the device, which would count the kernels twice).
    Empty when the trace has no device timeline (a CPU run)."""
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    procs = {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if any(e.get("cat") == "kernel" for e in complete):  # torch.profiler's trace
        return [e for e in complete if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    gpus = {pid for pid, n in procs.items() if "/device:gpu" in n.lower()}
    dev = [e for e in complete if e.get("pid") in gpus]
    streams = {k for k, n in threads.items() if k[0] in gpus and n.lower().startswith("stream")}
    return [e for e in dev if (e.get("pid"), e.get("tid")) in streams] if streams else dev


def _host_events(trace: dict) -> list[dict]:
    events = trace.get("traceEvents", trace if isinstance(trace, list) else [])
    out = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        name = str(e.get("name", ""))
        # XLA's ops only, not Python frames or the runtime's wrappers around them
        if name.startswith(("$", "Pjit", "PjRt")) or "::" in name or "python" in name.lower():
            continue
        out.append(e)
    return out


def top_ops(trace: dict, steps: int, top: int = TOP) -> list[dict[str, Any]]:
    """[{"name", "kind", "ms_per_step", "count_per_step", "share"}] of the device's ops, largest
    first (on a CPU: XLA's ops on the host threads)."""
    events = device_events(trace) or _host_events(trace)
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in events:
        name = str(e.get("name", ""))
        total[name] += float(e["dur"])
        count[name] += 1
    grand = sum(total.values()) or 1.0
    rows = sorted(total.items(), key=lambda kv: -kv[1])[:top]
    return [{"name": n[:160], "kind": kind_of(n), "ms_per_step": us / 1e3 / steps,
             "count_per_step": count[n] / steps, "share": us / grand} for n, us in rows]


def by_kind(trace: dict, steps: int) -> dict[str, dict[str, float]]:
    """Device time per step by kind of kernel: {kind: {"ms_per_step", "kernels_per_step"}}."""
    out: dict[str, dict[str, float]] = {}
    for e in device_events(trace):
        k = out.setdefault(kind_of(str(e.get("name", ""))), {"ms_per_step": 0.0, "kernels_per_step": 0.0})
        k["ms_per_step"] += float(e["dur"]) / 1e3 / steps
        k["kernels_per_step"] += 1.0 / steps
    return out


def read_trace(log_dir: Path) -> dict | None:
    found = sorted(log_dir.rglob("*.trace.json.gz")) + sorted(log_dir.rglob("perfetto_trace.json.gz"))
    if not found:
        return None
    with gzip.open(found[-1], "rt") as f:
        return json.load(f)


def profile_steps(step, state, batches, trace_path: Path | None, steps: int = PROFILE_STEPS):
    """Run ``steps`` more steps under the profiler; (new state, {"top_ops", "steps", "trace"})."""
    import jax  # optional: jax

    tmp = Path(tempfile.mkdtemp(prefix="dlscale-jax-profile-"))
    try:
        with jax.profiler.trace(str(tmp), create_perfetto_trace=True):
            for _ in range(steps):
                state, loss = step(state, batches)
            jax.block_until_ready((state, loss))
        trace = read_trace(tmp)
        info: dict[str, Any] = {"steps": steps, "top_ops": top_ops(trace, steps) if trace else None,
                                "by_kind": by_kind(trace, steps) if trace else None}
        if trace is not None and trace_path is not None:
            trace_path.write_text(json.dumps(trace))
            info["trace"] = trace_path.name
        return state, info
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
