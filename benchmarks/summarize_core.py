"""Table of dlscale vs bare-loop throughput from a core_gpu.sh output folder.

    python benchmarks/summarize_core.py OUTDIR [OUTDIR ...]
"""
from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from dlscale.store import ResultStore

# plain-PyTorch reference (DESIGN.md, one/two H200, 2026-11-21): (model, devices, compiled) -> samples/s
REFERENCE = {("resnet50", 1, False): 4714, ("resnet50", 2, False): 9167, ("resnet50", 1, True): 6776,
             ("resnet50", 2, True): 12638, ("bert-base", 1, False): 2621, ("bert-base", 2, False): 5041,
             ("bert-base", 1, True): 3395, ("bert-base", 2, True): 5081, ("gpt2", 1, False): 147,
             ("gpt2", 2, False): 289, ("gpt2", 1, True): 339, ("gpt2", 2, True): 630}


def fmt_pct(x):
    return f"{x * 100:.1f} %" if x is not None else "-"


def main(dirs: list[str]) -> None:
    bare = defaultdict(list)
    runs = {}
    device = None
    for d in dirs:
        for line in (Path(d) / "bare.jsonl").read_text().splitlines() if (Path(d) / "bare.jsonl").exists() else []:
            b = json.loads(line)
            bare[(b["model"], b["world"], b["compile"])].append(b["samples_per_s"])
        for r in ResultStore(Path(d) / "store").load("run").records:
            c = r["config"]
            runs[(c["model"], r["world_size"], c["compile"])] = r
            device = device or (r.get("summary") or {}).get("device_name")
    print(f"device: {device}\n")
    print("| model | GPUs | mode | dlscale samples/s (median, n) | bare loop (median, n) | dlscale/bare | reference | vs reference | scaling eff. | MFU | mem/GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in sorted(runs, key=lambda k: (k[0], k[2], k[1])):
        r = runs[key]
        s = r.get("summary")
        if not s:
            print(f"| {key[0]} | {key[1]} | {'compiled' if key[2] else 'eager'} | {r['status']}: {r['error']} |"
                  " | | | | | | |")
            continue
        med = s["samples_per_s"]["median"]
        b = bare.get(key, [])
        bmed = statistics.median(b) if b else None
        ref = REFERENCE.get(key)
        one = runs.get((key[0], 1, key[2]))
        eff = med / (one["summary"]["samples_per_s"]["median"] * key[1]) if one and one.get("summary") else None
        print(f"| {key[0]} | {key[1]} | {'compiled' if key[2] else 'eager'} | {med:,.1f} (n={s['samples_per_s']['n']}, "
              f"sd {s['samples_per_s']['stdev']:.1f}) | {f'{bmed:,.1f} (n={len(b)})' if bmed else '-'} | "
              f"{f'{med / bmed:.3f}' if bmed else '-'} | {ref or '-'} | {f'{med / ref:.3f}' if ref else '-'} | "
              f"{f'{eff * 100:.1f} %' if eff else '-'} | {fmt_pct(s.get('mfu'))} | "
              f"{s['peak_mem_allocated_bytes'] / 2**30:.1f} GiB |")


if __name__ == "__main__":
    main(sys.argv[1:])
