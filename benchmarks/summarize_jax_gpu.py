"""The table of benchmarks/jax_gpu.sh: torch eager, torch compiled, JAX (dlscale) and the JAX bare loop.

Reads OUTDIR/store (dlscale records, label jax-gpu), OUTDIR/bare.jsonl (bare_loop_jax.py lines)
and, for the GPT-2 profile, the JAX bare loop's trace (OUTDIR/prof/gpt2-jax-trace.json) and the
torch compiled record's profiler trace (in the store): device time per step by kind of kernel
(dlscale.frameworks.jax.profile.by_kind), side by side.

    python benchmarks/summarize_jax_gpu.py OUTDIR [OUTDIR...]   # several: the calls of one table
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dlscale.frameworks.jax.profile import by_kind, top_ops
from dlscale.store import ResultStore

ORDER = ("resnet50", "bert-base", "gpt2")


def _records(out: Path) -> dict[tuple[str, str], dict]:
    """(model, torch|torch-compiled|jax) -> the newest ok record of the run."""
    from dlscale.report.frameworks import framework_label

    got: dict[tuple[str, str], dict] = {}
    store = out / "store"
    if not store.exists():
        return got
    for rec in ResultStore(store).load().records:
        if rec.get("kind") == "run" and rec.get("label") == "jax-gpu":
            got[(rec["config"]["model"], framework_label(rec))] = rec
    return got


def _bare(out: Path) -> dict[str, dict]:
    p = out / "bare.jsonl"
    lines = p.read_text().splitlines() if p.exists() else []
    return {d["model"]: d for d in (json.loads(x) for x in lines if x.startswith("{"))}


def _num(rec: dict | None, key: str):
    if not rec or rec.get("status") != "ok":
        return None
    s = rec.get("summary") or {}
    return s["samples_per_s"]["median"] if key == "sps" else s.get(key)


def _f(v, nd=1, pct=False):
    return "—" if v is None else f"{v * 100 if pct else v:.{nd}f}"


def main(outs: list[Path]) -> None:
    recs: dict = {}
    bare: dict = {}
    for o in outs:  # later directories win
        recs.update(_records(o))
        bare.update(_bare(o))
    out = next((o for o in outs if (o / "prof" / "gpt2-jax-trace.json").exists()), outs[0])
    print("| model | batch | torch eager | torch compiled | JAX (dlscale) | JAX bare | dlscale/bare (JAX) | "
          "JAX / torch compiled | MFU % eager / compiled / JAX / JAX bare | JAX compile (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in ORDER:
        e, c, j = recs.get((m, "torch")), recs.get((m, "torch-compiled")), recs.get((m, "jax"))
        b = bare.get(m)
        if not any((e, c, j, b)):
            continue
        se, sc, sj = _num(e, "sps"), _num(c, "sps"), _num(j, "sps")
        sb = b.get("samples_per_s") if b else None
        batch = next((r["config"]["batch_size"] for r in (e, c, j) if r), b.get("batch_size") if b else None)
        unit = next(((r.get("model") or {}).get("unit") for r in (e, c, j) if r), "")
        print(f"| {m} | {batch} | {_f(se)} | {_f(sc)} | {_f(sj)} | {_f(sb)} | "
              f"{_f(sj / sb if sj and sb else None, 3)} | {_f(sj / sc if sj and sc else None, 3)} | "
              f"{_f(_num(e, 'mfu'), 1, True)} / {_f(_num(c, 'mfu'), 1, True)} / {_f(_num(j, 'mfu'), 1, True)} / "
              f"{_f(b.get('mfu') if b else None, 1, True)} | {_f(b.get('compile_s') if b else None)} |")
        for r in (e, c, j):
            if r and r.get("status") != "ok":
                print(f"|  | {r['status']}: {(r.get('error') or '')[:150]} ({unit}) |")
    print("\nthroughput in samples/s (img/s, seq/s); one repeat each; MFU against the datasheet peak of the "
          "device (dlscale.metrics.PEAK_FLOPS)")
    # GPT-2 kernels by kind
    c = recs.get(("gpt2", "torch-compiled"))
    jt = out / "prof" / "gpt2-jax-trace.json"
    tt = (out / "store" / c["trace"]) if c and c.get("trace") else None
    if not (jt.exists() and tt and tt.exists()):
        print("\nno GPT-2 profile pair (JAX bare trace and torch compiled trace) to compare")
        return
    jax_trace, torch_trace = json.loads(jt.read_text()), json.loads(tt.read_text())
    jk, tk = by_kind(jax_trace, 3), by_kind(torch_trace, 3)
    print("\nGPT-2 b16, device time per step by kind of kernel (3 profiled steps each)\n")
    print("| kind | torch compiled (ms) | kernels | JAX (ms) | kernels | JAX − torch (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for k in sorted(set(jk) | set(tk), key=lambda k: -max(jk.get(k, {}).get("ms_per_step", 0),
                                                        tk.get(k, {}).get("ms_per_step", 0))):
        a, b = tk.get(k, {}), jk.get(k, {})
        am, bm = a.get("ms_per_step", 0.0), b.get("ms_per_step", 0.0)
        print(f"| {k} | {am:.2f} | {a.get('kernels_per_step', 0):.0f} | {bm:.2f} | {b.get('kernels_per_step', 0):.0f} "
              f"| {bm - am:+.2f} |")
    ta, ja = sum(v["ms_per_step"] for v in tk.values()), sum(v["ms_per_step"] for v in jk.values())
    print(f"| total kernel time | {ta:.2f} | | {ja:.2f} | | {ja - ta:+.2f} |")
    for name, trace in (("torch compiled", torch_trace), ("JAX", jax_trace)):
        print(f"\n{name}: top kernels (ms per step)")
        for op in top_ops(trace, 3, 12):
            print(f"  {op['ms_per_step']:8.3f}  {op['kind']:<12} {op['name'][:110]}")


if __name__ == "__main__":
    main([Path(a) for a in sys.argv[1:]])
