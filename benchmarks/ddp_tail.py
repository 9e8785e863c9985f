"""Where a data-parallel step loses time after its backward: read a torch.profiler (Kineto) trace
of one rank and, for each profiled step, print the GPU's idle gap between the last backward
kernel and the optimizer's first kernel, the collective kernels running in that gap, and when
the host began the optimizer step (issue 26: GPT-2's DDP step at 2 GPUs grows by more than its
all-reduce).

    python benchmarks/ddp_tail.py docs/bench-data/s9-gpu/ddp2/trace-ddp-default-rank0.json.gz

A step is the stretch of GPU time that ends where the GPU annotation of its optimizer step
(``Optimizer.step#...``) ends. Collective kernels are those whose name has ``nccl``; every other
kernel, memcpy and memset is compute. Times in ms.
"""
from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass


@dataclass
class Tail:
    step: int
    step_ms: float  # GPU time from the previous optimizer's end to this one's end
    compute_busy_ms: float  # summed compute kernel time in the step
    idle_before_optimizer_ms: float  # GPU gap between the last compute kernel and the optimizer's first
    collective_in_gap_ms: float  # collective kernel time inside that gap
    host_late_ms: float | None  # host's optimizer-step start after the last backward kernel ended


def load(path: str) -> dict:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _spans(trace: dict, cats: tuple[str, ...]) -> list[dict]:
    return sorted((e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in cats),
                  key=lambda e: e["ts"])


def tails(trace: dict) -> list[Tail]:
    """One ``Tail`` per profiled step that has an optimizer annotation on the GPU."""
    kernels = _spans(trace, ("kernel", "gpu_memcpy", "gpu_memset"))
    gpu_opt = [e for e in _spans(trace, ("gpu_user_annotation",)) if e["name"].startswith("Optimizer.step")]
    host_opt = [e for e in _spans(trace, ("user_annotation",)) if e["name"].startswith("Optimizer.step")]
    out, prev_end = [], None
    for i, opt in enumerate(gpu_opt):
        end = opt["ts"] + opt["dur"]
        start = prev_end if prev_end is not None else (kernels[0]["ts"] if kernels else opt["ts"])
        step_k = [k for k in kernels if start <= k["ts"] < end]
        comp = [k for k in step_k if "nccl" not in k["name"].lower()]
        before = [k for k in comp if k["ts"] + k["dur"] <= opt["ts"]]
        first_opt = next((k for k in comp if k["ts"] >= opt["ts"]), None)
        if not before or first_opt is None:
            prev_end = end
            continue
        last_bwd_end = before[-1]["ts"] + before[-1]["dur"]
        gap = (last_bwd_end, first_opt["ts"])
        coll = sum(max(0.0, min(gap[1], k["ts"] + k["dur"]) - max(gap[0], k["ts"]))
                   for k in step_k if "nccl" in k["name"].lower())
        # the host's optimizer step that launched this one: the last to begin before it ran
        host = next((h for h in reversed(host_opt) if h["ts"] <= opt["ts"]), None)
        out.append(Tail(i + 1, (end - start) / 1e3, sum(k["dur"] for k in comp) / 1e3,
                        (gap[1] - gap[0]) / 1e3, coll / 1e3,
                        None if host is None else (host["ts"] - last_bwd_end) / 1e3))
        prev_end = end
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a Chrome trace JSON (or .json.gz) written by torch.profiler")
    args = p.parse_args(argv)
    rows = tails(load(args.trace))
    if not rows:
        print(f"{args.trace}: no step with an Optimizer.step annotation on the GPU")
        return 1
    print("| step | GPU step (ms) | compute busy (ms) | GPU idle before optimizer (ms) | collective in that gap (ms) "
          "| host starts optimizer after last backward kernel (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t in rows:
        late = "—" if t.host_late_ms is None else f"{t.host_late_ms:.2f}"
        print(f"| {t.step} | {t.step_ms:.2f} | {t.compute_busy_ms:.2f} | {t.idle_before_optimizer_ms:.2f} "
              f"| {t.collective_in_gap_ms:.2f} | {late} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
