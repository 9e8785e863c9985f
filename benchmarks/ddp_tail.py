"""Where a data-parallel step loses time after its backward: read a torch.profiler (Kineto) trace
of one rank and, for each profiled step, print the GPU's idle gap between the last backward
kernel and the optimizer's first kernel, the collective kernels running in that gap, and when
the host began the optimizer step (GPT-2's DDP step at 2 GPUs grows by more than its all-reduce).

    python benchmarks/ddp_tail.py OUT/store/traces/TRACE.json.gz   # a profiled record's trace (suite two-gpu-ddp)

With ``--against BASE`` (the 1-GPU trace of the same model), where the data-parallel step's extra
GPU time goes: each part of the step against the base's, and the kernel classes whose time differs
most in one step (suite two-gpu-account: the 1-GPU and 2-GPU steps, each profiled):

    python benchmarks/ddp_tail.py OUT/store/traces/TWO_GPU.json.gz --against OUT/store/traces/ONE_GPU.json.gz

Read it only where the host runs ahead of the GPU in both traces (the last column of the first
table negative): a host that the profiler slows makes gaps of its own, and a rank it slows makes
the other rank's collectives wait.

A step is the stretch of GPU time that ends where the GPU annotation of its optimizer step
(``Optimizer.step#...``) ends. Collective kernels are those whose name has ``nccl``; every other
kernel, memcpy and memset is compute. Gaps are the GPU's idle time between compute kernels: long
(over ``LONG_GAP_US``) or short. Times in ms.
"""
from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from dataclasses import dataclass

LONG_GAP_US = 30.0  # a compute-idle stretch longer than this is a wait, not a launch-to-launch gap


@dataclass
class Tail:
    step: int
    step_ms: float  # GPU time from the previous optimizer's end to this one's end
    compute_busy_ms: float  # summed compute kernel time in the step
    idle_before_optimizer_ms: float  # GPU gap between the last compute kernel and the optimizer's first
    collective_in_gap_ms: float  # collective kernel time inside that gap
    host_late_ms: float | None  # host's optimizer-step start after the last backward kernel ended
    kernels: int = 0  # compute kernels (and memcpy/memset) in the step
    long_gaps_ms: float = 0.0  # compute-idle stretches over LONG_GAP_US
    short_gaps_ms: float = 0.0  # the rest of the compute-idle time between kernels
    collective_ms: float = 0.0  # collective kernel time in the step
    classes: dict | None = None  # compute kernel name -> (count, ms)


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
        colls = [k for k in step_k if "nccl" in k["name"].lower()]
        comp = [k for k in step_k if "nccl" not in k["name"].lower()]
        before = [k for k in comp if k["ts"] + k["dur"] <= opt["ts"]]
        first_opt = next((k for k in comp if k["ts"] >= opt["ts"]), None)
        if not before or first_opt is None:
            prev_end = end
            continue
        last_bwd_end = before[-1]["ts"] + before[-1]["dur"]
        gap = (last_bwd_end, first_opt["ts"])
        coll = sum(max(0.0, min(gap[1], k["ts"] + k["dur"]) - max(gap[0], k["ts"])) for k in colls)
        # the host's optimizer step that launched this one: the last to begin before it ran
        host = next((h for h in reversed(host_opt) if h["ts"] <= opt["ts"]), None)
        long_us, short_us, busy_end = 0.0, 0.0, start
        classes: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for k in comp:
            idle = k["ts"] - busy_end
            if idle > LONG_GAP_US:
                long_us += idle
            elif idle > 0:
                short_us += idle
            busy_end = max(busy_end, k["ts"] + k["dur"])
            c = classes[k["name"]]
            c[0] += 1
            c[1] += k["dur"] / 1e3
        out.append(Tail(i + 1, (end - start) / 1e3, sum(k["dur"] for k in comp) / 1e3,
                        (gap[1] - gap[0]) / 1e3, coll / 1e3,
                        None if host is None else (host["ts"] - last_bwd_end) / 1e3,
                        kernels=len(comp), long_gaps_ms=long_us / 1e3, short_gaps_ms=short_us / 1e3,
                        collective_ms=sum(k["dur"] for k in colls) / 1e3,
                        classes={n: (c[0], c[1]) for n, c in classes.items()}))
        prev_end = end
    return out


PARTS = (("GPU step", "step_ms"), ("compute kernels, busy", "compute_busy_ms"), ("compute kernels", "kernels"),
         ("GPU idle before the optimizer", "idle_before_optimizer_ms"),
         ("collective kernels in that idle time", "collective_in_gap_ms"),
         (f"long gaps (over {LONG_GAP_US:g} us) between compute kernels", "long_gaps_ms"),
         ("short gaps between compute kernels", "short_gaps_ms"), ("collective kernels, all", "collective_ms"))


def _mean(rows: list[Tail], attr: str) -> float:
    return sum(getattr(t, attr) for t in rows) / len(rows)


def steady(rows: list[Tail]) -> list[Tail]:
    """The profiled steps after the first (the first still carries the profiler's start-up)."""
    return rows[1:] or rows


def compare(rows: list[Tail], base: list[Tail], top: int) -> tuple[list[tuple], list[tuple]]:
    """Each part's mean over the steady steps of ``rows`` and ``base`` with the difference, and the
    ``top`` kernel classes whose time differs most between the first steady step of each."""
    parts = [(label, _mean(steady(base), a), _mean(steady(rows), a)) for label, a in PARTS]
    mine, theirs = steady(rows)[0].classes or {}, steady(base)[0].classes or {}
    diff = []
    for name in set(mine) | set(theirs):
        (n_b, ms_b), (n_a, ms_a) = theirs.get(name, (0, 0.0)), mine.get(name, (0, 0.0))
        diff.append((ms_a - ms_b, n_b, n_a, ms_b, ms_a, name))
    diff.sort(key=lambda d: -abs(d[0]))
    return parts, diff[:top]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("trace", help="a Chrome trace JSON (or .json.gz) written by torch.profiler")
    p.add_argument("--against", metavar="BASE", default=None,
                   help="a trace of the same model on one GPU: where the step's extra GPU time goes (default: none)")
    p.add_argument("--top", type=int, default=8, help="kernel classes listed with --against (default: 8)")
    args = p.parse_args(argv)
    rows = tails(load(args.trace))
    base = tails(load(args.against)) if args.against else None
    for path, got in ((args.trace, rows), (args.against, base)):
        if got is not None and not got:
            print(f"{path}: no step with an Optimizer.step annotation on the GPU")
            return 1
    print("| step | GPU step (ms) | compute busy (ms) | GPU idle before optimizer (ms) | collective in that gap (ms) "
          "| host starts optimizer after last backward kernel (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for t in rows:
        late = "—" if t.host_late_ms is None else f"{t.host_late_ms:.2f}"
        print(f"| {t.step} | {t.step_ms:.2f} | {t.compute_busy_ms:.2f} | {t.idle_before_optimizer_ms:.2f} "
              f"| {t.collective_in_gap_ms:.2f} | {late} |")
    if base is None:
        return 0
    parts, classes = compare(rows, base, args.top)
    print(f"\nMeans over the steady profiled steps (all but the first): this trace against {args.against}\n")
    print("| part | base | this trace | difference |")
    print("|---|---:|---:|---:|")
    for label, b, a in parts:
        fmt = "{:.0f}" if label == "compute kernels" else "{:.2f}"
        print(f"| {label} | {fmt.format(b)} | {fmt.format(a)} | {'+' if a >= b else ''}{fmt.format(a - b)} |")
    print("\nKernel classes whose time differs most (first steady step of each; ms):\n")
    print("| difference | count base -> this | base -> this | kernel |")
    print("|---:|---:|---:|---|")
    for d, n_b, n_a, ms_b, ms_a, name in classes:
        print(f"| {d:+.3f} | {n_b} -> {n_a} | {ms_b:.3f} -> {ms_a:.3f} | {name[:100]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
