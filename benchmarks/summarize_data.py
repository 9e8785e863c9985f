"""The issue-23 table from a data_gpu.sh store: synthetic vs real data, and what the loader costs.

    python benchmarks/summarize_data.py STORE

For each model and mode: samples/s with synthetic batches, with real data (CPU- or GPU-decoded
images, token files), the ratio, the data wait (whole window and its second half), the loader's
CPU cores and samples per loader-core-second, and for CPU decode the cores it would need to feed
the synthetic rate (synthetic samples/s / samples per loader-core-second, rounded up).
Targets (issue 23): token loading < 1 % of the step; GPU-decoded images >= 90 % of synthetic.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from dlscale.store import ResultStore

TOKEN_TARGET = 0.01
GPU_DECODE_TARGET = 0.90


def _pct(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x * 100:.{nd}f} %"


def _num(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def _kind(cfg: dict) -> str:
    data = cfg.get("data", "synthetic")
    if data == "synthetic":
        return "synthetic"
    if data.startswith("imagefolder:"):
        return f"images, {cfg.get('data_decode', 'cpu').upper()} decode"
    return "token file"


def main(store: str) -> int:
    loaded = ResultStore(Path(store)).load()
    runs = [r for r in loaded.records if r.get("kind") == "run" and r.get("label") == "data-gpu"]
    if not runs:
        print(f"no data-gpu records in {store}")
        return 1
    device = next(((r.get("summary") or {}).get("device_name") for r in runs if r.get("summary")), None)
    env = runs[0].get("env") or {}
    print(f"device: {device}; host: {env.get('cpu')} ({env.get('cpu_count')} logical CPUs); torch {env.get('torch')}\n")
    print("| model | mode | data | status | samples/s | vs synthetic | data wait (window / 2nd half) | verdict "
          "| loader workers | loader cores | samples/s per loader core | cores to feed synthetic | target |")
    print("|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|")
    newest: dict[tuple, dict] = {}
    for r in sorted(runs, key=lambda r: r.get("created", "")):
        c = r["config"]
        newest[(c["model"], bool(c["compile"]), _kind(c))] = r
    order = ["synthetic", "images, CPU decode", "images, GPU decode", "token file"]
    for key in sorted(newest, key=lambda k: (k[0], k[1], order.index(k[2]))):
        model, compiled, kind = key
        r = newest[key]
        s = r.get("summary") or {}
        tput = (s.get("samples_per_s") or {}).get("median")
        syn = newest.get((model, compiled, "synthetic"))
        syn_t = ((syn or {}).get("summary") or {}).get("samples_per_s", {}).get("median") if syn else None
        ratio = tput / syn_t if tput and syn_t and kind != "synthetic" else None
        d = r.get("data") or {}
        loader = d.get("loader") or {}
        per_core = d.get("samples_per_loader_core_s")
        need = math.ceil(syn_t / per_core) if (per_core and syn_t and kind == "images, CPU decode") else None
        wait = d.get("data_wait_share_max")
        verdict = "-" if kind == "synthetic" else ("input-bound" if d.get("input_bound") else "not input-bound")
        if d.get("wait_may_be_understated"):
            verdict += " (window < 10x prefetch buffer)"
        target = "-"
        if kind == "token file" and wait is not None:
            target = f"wait < {TOKEN_TARGET:.0%}: {'met' if wait < TOKEN_TARGET else 'NOT met'}"
        elif kind == "images, GPU decode" and ratio is not None:
            target = f">= {GPU_DECODE_TARGET:.0%} of synthetic: {'met' if ratio >= GPU_DECODE_TARGET else 'NOT met'}"
        elif kind == "images, CPU decode" and need is not None:
            target = f"needs {need} cores for {syn_t:,.0f}/s"
        waits = "-" if kind == "synthetic" else f"{_pct(wait, 2)} / {_pct(d.get('data_wait_share_last_half'), 2)}"
        print(f"| {model} | {'compiled' if compiled else 'eager'} | {kind} | {r['status']} | {_num(tput)} "
              f"| {_pct(ratio)} | {waits} | {verdict} | {loader.get('workers', '-')} "
              f"| {_num(d.get('loader_cpu_cores_total'), 2)} | {_num(per_core)} | {need if need else '-'} | {target} |")
        if r["status"] != "ok":
            print(f"|  | | | error: {str(r.get('error'))[:200]} | | | | | | | | | |")
    micro = [r for r in loaded.records if r.get("kind") == "micro" and r.get("micro") == "io"]
    if micro:
        print("\nmicro io (loader alone, no model):\n")
        print("| pipeline | workers | batch | samples/s | per worker | loader cores | samples/s per core | decoder |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        for rec in micro:
            for row in rec.get("results") or []:
                print(f"| {row['pipeline']} | {row['workers']} | {row['batch']} | {_num(row.get('samples_per_s'))} "
                      f"| {_num(row.get('samples_per_s_per_worker'))} | {_num(row.get('loader_cpu_cores'), 2)} "
                      f"| {_num(row.get('samples_per_core_s'))} | {row.get('decoder') or row.get('reason')} |")
    ds = next((r.get("data_set") for r in runs if r.get("data_set") and r["data_set"]["kind"] == "imagefolder"), None)
    if ds:
        print(f"\nimage set: {ds['n_files']} files, {ds['size_bytes'] / 1e9:.2f} GB "
              f"(mean {ds['size_bytes'] / ds['n_files'] / 1e3:.1f} KB), fits in memory: {ds['fits_in_memory']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
