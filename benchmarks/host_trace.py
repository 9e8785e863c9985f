"""Is a profiled step bound by its host? Read a torch.profiler (Kineto) trace of one rank and, for
each profiled step, set the host's time beside the GPU's (FSDP at two GPUs, tensor parallelism).

    python benchmarks/host_trace.py OUT/store/traces/TRACE.json.gz [--top 8]   # a profiled record's trace

Per step (the host's ``ProfilerStep#N`` range): its host duration; the GPU's busy time on the
compute streams (kernels, memcpy and memset whose name has no ``nccl``) and on the collective
streams (``nccl`` kernels: they include the time a rank waits for its peer); and the host time
spent in the ranges whose name starts with one of ``--prefix`` (default FSDP's and DDP's hook
annotations and the optimizer step), summed per name with the parent range counted once (nested
ranges of the same prefix are not added twice). A host step much longer than the compute
stream's busy time means the GPU waited for the host. The profiler's own cost per op inflates host
times (the timed window, unprofiled, is what the record's throughput is taken from). Times in ms.
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field

PREFIXES = ("FSDP::", "DDP::", "Optimizer.step", "autograd::engine::evaluate_function: RegisterPostBackward")


@dataclass
class HostStep:
    name: str
    host_ms: float
    compute_ms: float
    collective_ms: float
    ranges: dict[str, tuple[int, float]] = field(default_factory=dict)  # name -> (count, ms)


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _group(name: str, prefixes: tuple[str, ...]) -> str | None:
    for p in prefixes:
        if name.startswith(p):
            # "FSDP::pre_forward (blocks.3)" -> "FSDP::pre_forward": one row per hook, not per unit
            return name.split(" (", 1)[0]
    return None


def host_steps(events: list[dict], prefixes: tuple[str, ...] = PREFIXES) -> list[HostStep]:
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    steps = sorted((e for e in spans if e.get("cat") == "user_annotation"
                    and str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    gpu = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = sorted((e for e in spans if e.get("cat") in ("cpu_op", "user_annotation")
                   and not str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: (e["ts"], -e["dur"]))
    out = []
    for s in steps:
        a, b = s["ts"], s["ts"] + s["dur"]
        comp = sum(e["dur"] for e in gpu if a <= e["ts"] < b and "nccl" not in str(e.get("name", "")).lower())
        coll = sum(e["dur"] for e in gpu if a <= e["ts"] < b and "nccl" in str(e.get("name", "")).lower())
        ranges: dict[str, list] = defaultdict(lambda: [0, 0.0])
        open_until: dict[tuple, float] = {}  # (thread, group) -> end of the outermost range counted
        for e in host:
            if not a <= e["ts"] < b:
                continue
            g = _group(str(e.get("name", "")), prefixes)
            if g is None:
                continue
            key = (e.get("pid"), e.get("tid"), g)
            if e["ts"] < open_until.get(key, -1.0):
                continue  # nested inside a range of the same group already counted
            open_until[key] = e["ts"] + e["dur"]
            ranges[g][0] += 1
            ranges[g][1] += e["dur"] / 1000.0
        out.append(HostStep(s["name"], s["dur"] / 1000.0, comp / 1000.0, coll / 1000.0,
                            {k: (v[0], v[1]) for k, v in ranges.items()}))
    return out


def render(steps: list[HostStep], top: int = 8) -> str:
    lines = ["| step | host (ms) | GPU compute busy (ms) | GPU collectives (ms) | host / compute |",
             "|---|---:|---:|---:|---:|"]
    for s in steps:
        ratio = f"{s.host_ms / s.compute_ms:.2f}" if s.compute_ms > 0 else "—"
        lines.append(f"| {s.name} | {s.host_ms:.2f} | {s.compute_ms:.2f} | {s.collective_ms:.2f} | {ratio} |")
    names = sorted({n for s in steps for n in s.ranges}, key=lambda n: -sum(s.ranges.get(n, (0, 0.0))[1] for s in steps))
    if names:
        lines += ["", "Host ranges per step (count, ms; nested ranges of the same name counted once):", "",
                  "| range | " + " | ".join(s.name for s in steps) + " |",
                  "|---|" + "---:|" * len(steps)]
        for n in names[:top]:
            cells = [f"{s.ranges[n][0]} / {s.ranges[n][1]:.2f}" if n in s.ranges else "—" for s in steps]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a torch.profiler Chrome trace (.json or .json.gz) of one rank")
    ap.add_argument("--top", type=int, default=8, help="host ranges to list (default: 8)")
    ap.add_argument("--prefix", action="append", default=None,
                    help="count host ranges whose name starts with this (repeatable; default: FSDP::, DDP::, "
                         "Optimizer.step, FSDP's post-backward autograd node)")
    args = ap.parse_args(argv)
    steps = host_steps(load(args.trace), tuple(args.prefix) if args.prefix else PREFIXES)
    if not steps:
        print(f"{args.trace}: no ProfilerStep# range in the trace (not a torch.profiler trace of training steps)")
        return 2
    print(render(steps, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
