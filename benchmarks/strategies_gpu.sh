#!/usr/bin/env bash
# Issue 4 benchmark: gpt2 and bert-base, bf16, every strategy at 2 GPUs (plus the 1-GPU baseline).
# Usage: benchmarks/strategies_gpu.sh OUTDIR  -> OUTDIR/store; table: python benchmarks/summarize_strategies.py OUTDIR/store
# The strategies with a target (ddp, fsdp zero2, zero1, pipeline 1f1b, model) and the 1-GPU
# baselines run R repeats (default 2), first; the others R_OTHER (default 1); last, GPT-2 at batch 64
# for pipeline vs model, eager and compiled. hsdp and hybrid are
# left out: on one node of 2 GPUs they reduce to fsdp/ddp and tensor/pipeline.
# Memory: every CUDA record carries model_state_mem_bytes (allocated as the optimizer step begins,
# in one extra step after the window), compared there with the ZeRO model of docs/strategies.md.
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
run() { python -m dlscale run --store "$OUTDIR/store" --precision amp-bf16 --warmup 10 --steps 30 \
          --time-limit 120 "$@" 2>&1 | grep -E '^ +(gpt2|bert)|error'; }
MODELS="gpt2:16 bert-base:128"
for m in $MODELS; do
  model=${m%%:*}; b=${m##*:}
  echo "== $model, strategies with a target $(date -u +%T)"
  run --model $model --strategy single --batch-size $b --repeats ${R:-2}
  for s in "ddp" "fsdp -o shard=zero2" "zero1" "pipeline -o schedule=1f1b -o microbatches=8" "model"; do
    run --model $model --nproc-per-node 2 --batch-size $b --repeats ${R:-2} --strategy $s
  done
done
for m in $MODELS; do
  model=${m%%:*}; b=${m##*:}
  echo "== $model, the other strategies $(date -u +%T)"
  for s in "fsdp -o shard=zero3" "tensor" "dp" "pipeline -o schedule=gpipe -o microbatches=8"; do
    run --model $model --nproc-per-node 2 --batch-size $b --repeats ${R_OTHER:-1} --strategy $s
  done
done
# Pipelining wants micro-batches large enough to keep the GPU busy: GPT-2 at batch 64 (8
# micro-batches of 8), eager and compiled, against the unpipelined split.
echo "== gpt2 b64, pipeline vs model $(date -u +%T)"
for s in "model" "pipeline -o schedule=1f1b -o microbatches=8"; do
  run --model gpt2 --nproc-per-node 2 --batch-size 64 --repeats ${R_OTHER:-1} --strategy $s
  run --model gpt2 --nproc-per-node 2 --batch-size 64 --repeats ${R_OTHER:-1} --strategy $s --compile
done
