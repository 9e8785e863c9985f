"""Tables of an mp_gpu.sh output folder: the sharded paths at 1 GPU against the bare loop, the face head
against N, and (tag multi) the 2-GPU cases.

    python benchmarks/summarize_mp.py OUTDIR
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from dlscale.store import ResultStore

GIB = 2.0 ** 30


def _opts(rec: dict) -> str:
    o = rec["config"].get("strategy_options") or {}
    return " ".join(f"{k}={v}" for k, v in sorted(o.items()))


def _gib(v) -> str:
    return f"{v / GIB:.2f}" if v else "-"


def main(outdir: str) -> None:
    out = Path(outdir)
    bare: dict[tuple, list[dict]] = {}
    path = out / "bare.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        b = json.loads(line)
        bare.setdefault((b["model"], b["batch_size"], b["knobs"].get("classes")), []).append(b)
    recs = ResultStore(out / "store").load("run").records if (out / "store").exists() else []
    device = next((r["summary"].get("device_name") for r in recs if r.get("summary")), None)
    print(f"device: {device}\n")

    def bare_of(model, batch, n):
        bs = bare.get((model, batch, n), [])
        return (statistics.mean(b["samples_per_s"] for b in bs), bs) if bs else (None, bs)

    def classes_of(rec):  # None: the flavour's own
        return (rec["config"].get("strategy_options") or {}).get("classes")

    def classes_shown(rec):
        return (rec.get("strategy_info") or {}).get("classes") or classes_of(rec) or 0

    print("Sharded paths at sharding degree 1 (one GPU) against the bare loop (target: within 2 %)\n")
    print("| model | strategy | batch | dlscale samples/s (median, n) | bare loop (mean of runs) | dlscale/bare | "
          "step p50 ms (dlscale / bare) | peak mem GiB (dlscale / bare) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in recs:
        if r.get("label") not in ("wdl", "face") or r["status"] != "ok":
            if r.get("label") in ("wdl", "face"):
                print(f"| {r['config']['model']} | {r['config']['strategy']} {_opts(r)} | | {r['status']}: "
                      f"{(r.get('error') or '')[:80]} | | | | |")
            continue
        c, s = r["config"], r["summary"]
        ref, bs = bare_of(c["model"], c["batch_size"], classes_of(r))
        med = s["samples_per_s"]["median"]
        ratio = f"{med / ref:.3f}" if ref else "-"
        bp50 = statistics.median(b["step_ms_p50"] for b in bs) if bs else None
        bmem = max((b["peak_mem_bytes"] or 0) for b in bs) if bs else None
        runs = " / ".join(f"{b['samples_per_s']:,.0f}" for b in bs)
        print(f"| {c['model']} | {c['strategy']} {_opts(r)} | {c['batch_size']} | {med:,.0f} ({s['samples_per_s']['n']}) | "
              f"{ref:,.0f} ({runs}) | {ratio} | {s['step_ms_p50']:.2f} / {bp50:.2f} | "
              f"{_gib(s['peak_mem_allocated_bytes'])} / {_gib(bmem)} |" if ref else
              f"| {c['model']} | {c['strategy']} {_opts(r)} | {c['batch_size']} | {med:,.0f} | - | - | "
              f"{s['step_ms_p50']:.2f} / - | {_gib(s['peak_mem_allocated_bytes'])} / - |")

    print("\nFace head against N, one GPU (partial-fc at degree 1 and the bare loop)\n")
    print("| classes | partial-fc img/s | bare img/s | partial-fc/bare | peak mem GiB partial-fc | bare | status |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    rows = [r for r in recs if r.get("label") in ("face", "classes") and r["config"]["strategy"] == "partial-fc"]
    for r in sorted(rows, key=classes_shown):
        n = classes_shown(r)
        ref, bs = bare_of("face", r["config"]["batch_size"], classes_of(r))
        bmem = max((b["peak_mem_bytes"] or 0) for b in bs) if bs else None
        if r["status"] != "ok":
            print(f"| {n:,} | {r['status']} | {ref or '-'} | | | {_gib(bmem)} | {(r.get('error') or '')[:80]} |")
            continue
        s = r["summary"]
        med = s["samples_per_s"]["median"]
        print(f"| {n:,} | {med:,.0f} | {f'{ref:,.0f}' if ref else 'missing (OOM?)'} | "
              f"{f'{med / ref:.3f}' if ref else '-'} | {_gib(s['peak_mem_allocated_bytes'])} | {_gib(bmem)} | ok |")

    multi = [r for r in recs if r.get("label") == "multi"]
    if multi:
        print("\nTwo GPUs\n")
        print("| model | strategy | samples/s (median) | step p50 / p90 ms | exchange MB/step/rank | peak mem GiB/GPU | status |")
        print("|---|---|---:|---|---:|---:|---|")
        for r in multi:
            c = r["config"]
            if r["status"] != "ok":
                print(f"| {c['model']} | {c['strategy']} {_opts(r)} | | | | | {r['status']}: {(r.get('error') or '')[:80]} |")
                continue
            s = r["summary"]
            ex = ((r.get("strategy_info") or {}).get("exchange_bytes_per_step") or {}).get("max_per_rank")
            print(f"| {c['model']} | {c['strategy']} {_opts(r)} | {s['samples_per_s']['median']:,.0f} | "
                  f"{s['step_ms_p50']:.2f} / {s['step_ms_p90']:.2f} | {f'{ex / 1e6:.1f}' if ex else '-'} | "
                  f"{_gib(s['peak_mem_allocated_bytes'])} | ok |")


if __name__ == "__main__":
    main(sys.argv[1])
