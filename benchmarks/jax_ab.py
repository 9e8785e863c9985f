"""A/B of the JAX layer formulations on one device: the bare JAX loop with and without ``--legacy``.

Runs ``bare_loop_jax.py`` once per variant (a fresh process each, so each compiles its own
program), then prints a Markdown table: seq/s, step ms, MFU and the ratio to the default
formulation. What each legacy formulation is: ``bare_loop_jax.py --help`` and its docstring.

    python benchmarks/jax_ab.py --out $OUT/jax-ab      # GPT-2 b16 bf16, 4 variants, ~2-3 min on an H200

Writes DIR/ab.jsonl (one bare-loop JSON line per variant) and DIR/ab.md (the table).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# the bare loop imports dlscale (metrics, the JAX models): this checkout first on its path, installed or not
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
VARIANTS = {  # name -> bare_loop_jax.py --legacy values
    "default": [],
    "legacy both": ["matmul-f32-out", "gather-ce"],
    "legacy matmul-f32-out": ["matmul-f32-out"],
    "legacy gather-ce": ["gather-ce"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="gpt2", help="bare_loop_jax.py --model")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    ap.add_argument("--out", required=True, metavar="DIR", help="where ab.jsonl and ab.md go")
    args = ap.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        print(f"--variants: unknown {bad or 'none given'}; allowed: {', '.join(VARIANTS)}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    with open(out / "ab.jsonl", "a") as log:
        for name in names:
            cmd = [sys.executable, str(HERE / "bare_loop_jax.py"), "--model", args.model, "--batch-size",
                   str(args.batch_size), "--warmup", str(args.warmup), "--steps", str(args.steps)]
            for legacy in VARIANTS[name]:
                cmd += ["--legacy", legacy]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=ENV)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"bench": "bare_loop_jax"')]
            if proc.returncode != 0 or not lines:
                print(f"{name}: failed (exit {proc.returncode}): {proc.stderr.strip()[-800:]}", file=sys.stderr)
                continue
            rows[name] = json.loads(lines[-1])
            log.write(json.dumps({"variant": name, **rows[name]}) + "\n")
            log.flush()
            print(f"{name}: {rows[name]['samples_per_s']:.4g} samples/s", flush=True)
    base = rows.get("default")
    device = next(iter(rows.values()))["device"] if rows else "?"
    md = [f"{args.model} b{args.batch_size}, bare JAX loop, one device ({device}); ratio: samples/s / the default's",
          "", "| variant | samples/s | step ms | MFU | compile s | loss | ratio |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") else "-"
        ratio = f"{r['samples_per_s'] / base['samples_per_s']:.3f}" if base else "-"
        md.append(f"| {name} | {r['samples_per_s']:.4g} | {r['step_ms']:.4g} | {mfu} | {r['compile_s']:.1f} "
                  f"| {r['loss']:.4f} | {ratio} |")
    (out / "ab.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0 if len(rows) == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
