#!/usr/bin/env bash
# Issue 4 diagnostic: one-GPU training throughput against the batch size, eager, bf16.
# A pipeline with M micro-batches runs each stage on batch/M samples at a time; how fast a model
# trains at that size on one GPU bounds what the pipeline can gain over the unpipelined `model`
# split (which runs the whole batch at once): ideal gain = pp * M / (M + pp - 1) x
# (throughput at batch/M) / (throughput at batch).
# Usage: [W=10] [S=20] benchmarks/batch_curve_gpu.sh OUTDIR [MODEL:B1,B2,... ...]
# Default cases: gpt2:2,4,8,16,32,64 bert-base:16,32,64,128,256,512,1024
# Records: OUTDIR/store (label batch-curve); table: python -m dlscale report OUTDIR/store
set -u
OUTDIR=$1; shift
CASES=("$@"); [ ${#CASES[@]} -gt 0 ] || CASES=(gpt2:2,4,8,16,32,64 bert-base:16,32,64,128,256,512,1024)
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
for c in "${CASES[@]}"; do
  model=${c%%:*}
  for b in $(echo "${c##*:}" | tr , ' '); do
    echo "== $model b$b $(date -u +%T)"
    python -m dlscale run --model "$model" --strategy single --batch-size "$b" --precision amp-bf16 \
      --warmup ${W:-10} --steps ${S:-20} --repeats ${R:-1} --store "$OUTDIR/store" --label batch-curve \
      2>&1 | grep -E '^ +[a-z]|error|oom'
  done
done
echo "== done $(date -u +%T)"
