#!/usr/bin/env bash
# Issue 3: does the sweep move the medians? The same case (DLPerf BERT-base AMP b128, 1 GPU,
# eager, 10 warm-up + 40 steps) through `dlscale sweep` and through `dlscale run`, alternated
# (sweep, run, sweep, run; R repeats each, default 2) in one call, each block in its own store.
# Usage: benchmarks/sweep_overhead_gpu.sh OUTDIR ; verdict: python benchmarks/summarize_overhead.py OUTDIR
set -u
OUTDIR=$1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
L="--warmup 10 --steps 40 --repeats ${R:-2}"
for i in 1 2; do
  echo "== block $i: sweep $(date -u +%T)"
  python -m dlscale sweep dlperf-bert --filter precision=amp-fp16 --filter devices=1 --filter batch_size=128 \
    --filter compile=false $L --store "$OUTDIR/sweep-$i" 2>&1 | grep -E "ok|fail|error" | tail -n 3
  echo "== block $i: run $(date -u +%T)"
  python -m dlscale run --model bert-base --strategy ddp --nproc-per-node 1 --batch-size 128 --precision amp-fp16 \
    $L --store "$OUTDIR/run-$i" 2>&1 | grep -E "repeat [0-9]|^ +bert|error"
done
echo "== done $(date -u +%T)"
