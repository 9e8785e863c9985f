"""The table of benchmarks/llama_gpu.sh: dlscale's Llama cases against the Hugging Face peer and the plan.

    python benchmarks/summarize_llama.py OUTDIR     # reads OUTDIR/store, OUTDIR/peer.jsonl, OUTDIR/plan-*.json

One row per case: tokens/s, MFU, measured peak allocated memory, the plan's prediction and its
error, and the speed against the peer of the same flavour (the issue's targets: >= 1.05x the peer,
MFU >= 47 % for bf16, the plan within 10 % of the measured peak, FP8 >= 1.2x bf16 where it pays).
"""
from __future__ import annotations

import glob
import json
import os
import sys

GiB = 1024 ** 3


def _jsonl(pattern: str) -> list[dict]:
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as fh:
            out += [json.loads(line) for line in fh if line.strip().startswith("{")]
    return out


def _plan_peak(outdir: str, flavor: str, ac: str) -> float | None:
    path = os.path.join(outdir, f"plan-{flavor}-{ac}.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        rows = json.load(fh)["rows"]
    return rows[0]["peak_bytes"] if rows else None


def main(outdir: str) -> None:
    peers = {p["flavor"]: p for p in _jsonl(os.path.join(outdir, "peer.jsonl"))}
    rows = ["| case | tokens/s | MFU % | peak GiB (measured) | plan GiB | plan error % | vs HF peer | vs bf16 |",
            "|---|---|---|---|---|---|---|---|"]
    bf16: dict[str, float] = {}
    records = [r for r in _jsonl(os.path.join(outdir, "store", "*.jsonl")) if r.get("label")]
    for flavor, peer in sorted(peers.items()):
        rows.append(f"| HF LlamaForCausalLM {flavor} (peer) | {peer['tokens_per_s']:,.0f} | "
                    f"{100 * (peer['mfu'] or 0):.1f} | {(peer['peak_mem_allocated_bytes'] or 0) / GiB:.1f} | | | 1.00 | |")
    for rec in records:
        label, cfg, s = rec["label"], rec["config"], rec.get("summary") or {}
        if rec["status"] != "ok":
            rows.append(f"| {label} | {rec['status']}: {(rec.get('error') or '')[:80]} | | | | | | |")
            continue
        tok = s["tokens_per_s"]
        if cfg["precision"] == "amp-bf16" and cfg["activation_checkpointing"] == "none":
            bf16[cfg["flavor"]] = tok
        peak = s.get("peak_mem_allocated_bytes")
        ac = cfg.get("activation_checkpointing", "none")
        plan = _plan_peak(outdir, cfg["flavor"], ac)
        err = f"{100 * (plan - peak) / peak:+.1f}" if (plan and peak) else ""
        peer = peers.get(cfg["flavor"])
        vs = f"{tok / peer['tokens_per_s']:.2f}" if peer else ""
        vb = f"{tok / bf16[cfg['flavor']]:.2f}" if cfg["flavor"] in bf16 and label != f"{cfg['flavor']}-bf16" else ""
        rows.append(f"| {label} | {tok:,.0f} | {100 * (s.get('mfu') or 0):.1f} | "
                    f"{(peak or 0) / GiB:.1f} | {(plan or 0) / GiB:.1f} | {err} | {vs} | {vb} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main(sys.argv[1])
