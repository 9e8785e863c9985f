#!/usr/bin/env bash
# Issue 4 benchmark: gpt2 and bert-base, bf16, every strategy at 2 GPUs (plus the 1-GPU baseline).
# Usage: [TAGS="targets others"] benchmarks/strategies_gpu.sh OUTDIR  -> OUTDIR/store
# Table: python benchmarks/summarize_strategies.py OUTDIR/store
#
# Every case is one line of the table below: TAG MODEL BATCH REPEATS STRATEGY [OPTIONS...]; the
# tags in $TAGS run, in the table's order (default: all but "compiled"). Repeats: the cases with
# a target and the baselines 2, the others (and the unpipelined `model` split) 1 (device time). Common to all: bf16 autocast, 10
# warm-up + 30 timed steps, a 150 s limit per repeat. EXTRA is appended to every command (a CPU
# dry run: EXTRA="--flavor tiny --device cpu").
#   targets   the 1-GPU baselines and the data-parallel strategies with a target (ddp, fsdp
#             zero2, zero1)
#   pptarget  pipeline 1f1b with 8 micro-batches against the unpipelined `model` split
#   others    fsdp zero3, tensor, dp, pipeline gpipe
#   pipeline  what pipelining needs: GPT-2 at 1 GPU with the micro-batch sizes (2, 8), the
#             block-balanced split against the time-balanced default
#   pp64      pipeline 1f1b against `model` at GPT-2 batch 64 (micro-batches of 8)
#   ppbig     the same at GPT-2 batch 128 and BERT batch 1024 (micro-batches of 16 and 128: the
#             sizes at which one GPU trains within 10 % of its large-batch speed, see
#             benchmarks/batch_curve_gpu.sh)
#   fsdpdiag  BERT fsdp zero2 (0.68 of DDP in the 2nd session) with --profile --breakdown, without
#             FSDP's mixed-precision policy, and GPT-2's for comparison
#   compiled  pipeline and model at GPT-2 b16 and b64 under --compile
# hsdp and hybrid are left out: on one node of 2 GPUs they reduce to fsdp/ddp and tensor/pipeline.
# Memory: every CUDA record carries model_state_mem_bytes (allocated as the optimizer step begins,
# in one extra step after the window), compared there with the ZeRO model of docs/strategies.md.
set -u
OUTDIR=$1
TAGS=${TAGS:-"targets pptarget pp64 others pipeline fsdpdiag"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PP8="pipeline -o schedule=1f1b -o microbatches=8"
CASES="
targets  gpt2      16  2 single
targets  gpt2      16  2 ddp
targets  gpt2      16  2 fsdp -o shard=zero2
targets  gpt2      16  2 zero1
targets  bert-base 128 2 single
targets  bert-base 128 2 ddp
targets  bert-base 128 2 fsdp -o shard=zero2
targets  bert-base 128 2 zero1
pptarget gpt2      16  2 $PP8 --profile
pptarget gpt2      16  1 model --profile
pptarget bert-base 128 2 $PP8
pptarget bert-base 128 1 model
others   gpt2      16  1 fsdp -o shard=zero3
others   gpt2      16  1 tensor
others   gpt2      16  1 dp
others   gpt2      16  1 pipeline -o schedule=gpipe -o microbatches=8
others   bert-base 128 1 fsdp -o shard=zero3
others   bert-base 128 1 tensor
others   bert-base 128 1 dp
others   bert-base 128 1 pipeline -o schedule=gpipe -o microbatches=8
pipeline gpt2      2   1 single
pipeline gpt2      8   1 single
pipeline gpt2      16  1 $PP8 -o balance=blocks
pp64     gpt2      64  1 model
pp64     gpt2      64  2 $PP8
ppbig    gpt2      128 1 model
ppbig    gpt2      128 1 $PP8
ppbig    bert-base 1024 1 model
ppbig    bert-base 1024 1 $PP8
fsdpdiag bert-base 128 1 fsdp -o shard=zero2 --profile --breakdown
fsdpdiag bert-base 128 1 fsdp -o shard=zero2 -o mixed_precision=false
fsdpdiag gpt2      16  1 fsdp -o shard=zero2 --profile --breakdown
compiled gpt2      16  1 $PP8 --compile
compiled gpt2      16  1 model --compile
compiled gpt2      64  1 $PP8 --compile
compiled gpt2      64  1 model --compile
"
echo "$CASES" | while read -r tag model batch reps strategy; do
  [ -n "$tag" ] || continue
  case " $TAGS " in *" $tag "*) ;; *) continue ;; esac
  nproc=2; [ "${strategy%% *}" = single ] && nproc=1
  echo "== $tag: $model b$batch x$nproc $strategy ($(date -u +%T))"
  # shellcheck disable=SC2086  # the strategy's options are words
  python -m dlscale run --store "$OUTDIR/store" --precision amp-bf16 --warmup 10 --steps 30 --time-limit 150 \
    --model "$model" --batch-size "$batch" --repeats "$reps" --nproc-per-node $nproc --strategy $strategy \
    ${EXTRA:-} 2>&1 | grep -E '^ +(gpt2|bert)|error|repeat [0-9]'
done
echo "== done $(date -u +%T)"
