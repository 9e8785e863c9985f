#!/usr/bin/env bash
# Issue 4 benchmark: gpt2 and bert-base, bf16, every strategy at 2 GPUs (plus the 1-GPU baseline).
# Usage: benchmarks/strategies_gpu.sh OUTDIR  -> OUTDIR/store; then `dlscale report OUTDIR/store`.
# Memory: each case also runs at batch 1 (label mem-b1) for the model-state estimate of docs/strategies.md.
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
R=${R:-3}
run() { python -m dlscale run --store "$OUTDIR/store" --precision amp-bf16 --warmup 10 --steps 30 --repeats $R "$@" \
          2>&1 | grep -E '^ +(gpt2|bert)|error'; }
for m in gpt2:16 bert-base:128; do
  model=${m%%:*}; b=${m##*:}
  run --model $model --strategy single --batch-size $b
  for s in "ddp" "dp" "zero1" "fsdp -o shard=zero2" "fsdp -o shard=zero3" "tensor" "model" \
           "pipeline -o schedule=1f1b -o microbatches=8" "pipeline -o schedule=gpipe -o microbatches=8"; do
    run --model $model --nproc-per-node 2 --batch-size $b --strategy $s
    run --model $model --nproc-per-node 2 --batch-size 1 --strategy $s --label mem-b1 --steps 5 --repeats 1 --no-monitor
  done
done
