"""Table of benchmarks/ddp_overlap_gpu.sh: DDP scaling per label, breakdown, bare loop.

    python benchmarks/summarize_ddp_overlap.py OUTDIR
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dlscale.store import ResultStore


def f(x, fmt="{:.2f}"):
    return fmt.format(x) if isinstance(x, (int, float)) else "-"


def main(outdir: str) -> None:
    out = Path(outdir)
    recs = ResultStore(out / "store").load("run").records
    bare = defaultdict(list)
    if (out / "bare.jsonl").exists():
        for line in (out / "bare.jsonl").read_text().splitlines():
            b = json.loads(line)
            bare[(b["model"], b["label"])].append(b["samples_per_s"])
    base = {r["config"]["model"]: r["summary"]["samples_per_s"]["median"] for r in recs
            if r["label"] == "base" and r.get("summary")}
    print(f"device: {next((r['summary']['device_name'] for r in recs if r.get('summary')), None)}\n")
    print("| model | case | GPUs | samples/s (median) | repeats | scaling eff. | bare loop | exposed comm ms |"
          " all-reduce alone ms | overlap | step ms (breakdown) | env |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        c, s, bd = r["config"], r.get("summary") or {}, r.get("breakdown") or {}
        thr = (s.get("samples_per_s") or {}).get("median")
        reps = [x["samples_per_s"] for x in r["repeats"] if x.get("samples_per_s")]
        eff = thr / (r["world_size"] * base[c["model"]]) if thr and c["model"] in base and r["world_size"] > 1 else None
        b = bare.get((c["model"], r["label"]))
        env = " ".join(f"{k}={v}" for k, v in (r["env"].get("env_vars") or {}).items()
                       if k.startswith("TORCH_NCCL") or k == "NCCL_MAX_NCHANNELS")
        opts = " ".join(f"{k}={v}" for k, v in (c.get("strategy_options") or {}).items())
        if r["status"] != "ok":
            opts += f" ({r['status']})"
        print(f"| {c['model']} | {r['label']} {opts} | {r['world_size']} | {f(thr, '{:,.1f}')} | "
              f"{', '.join(f'{x:,.1f}' for x in reps)} | {f(eff * 100 if eff else None, '{:.1f} %')} | "
              f"{f(statistics.median(b) if b else None, '{:,.1f}')} | {f(bd.get('exposed_comm_ms'))} | "
              f"{f(bd.get('comm_ms'))} | {f(bd.get('overlap_ratio'))} | {f(bd.get('step_ms'))} | {env or '-'} |")


if __name__ == "__main__":
    main(sys.argv[1])
