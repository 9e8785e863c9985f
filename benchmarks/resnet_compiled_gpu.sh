#!/usr/bin/env bash
# Issue 2 follow-up: ResNet-50 bf16 b256 compiled.
# 1. On GPU 0, the bare loop over dlscale's ResNet-50 against the same loop over torchvision's
#    (order alternated: ours, tv, tv, ours), to tell the model definition from the runner and
#    the card (dlscale's 1-GPU compiled figure is 1.8 % below the reference of DESIGN.md).
#    Meanwhile GPU 1 runs $SIDE_JOB if given (a 1-GPU job; the third session ran
#    benchmarks/sweep_overhead_gpu.sh there, to save device time).
#    With ONE_GPU=1 (a one-GPU machine): dlscale's own 1-GPU run (R repeats) follows the bare
#    loops, and part 2 is skipped.
# 2. On 2 GPUs: the bare loop under DDP, then dlscale (DDP, R repeats, default 1), in one call.
# Usage: [R=1] [ONE_GPU=1] [SIDE_JOB="bash benchmarks/sweep_overhead_gpu.sh DIR"] benchmarks/resnet_compiled_gpu.sh OUTDIR
# Table: python benchmarks/summarize_core.py OUTDIR ; the bare records are OUTDIR/bare.jsonl
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
B="--model resnet50 --batch-size 256 --compile --warmup 15 --steps 40"
bare1() { CUDA_VISIBLE_DEVICES=0 python benchmarks/bare_loop.py $B "$@" 2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"; }
echo "== resnet50 b256 x1 compiled, dlscale model vs torchvision, GPU 0 $(date -u +%T)"
side=""
if [ -n "${SIDE_JOB:-}" ]; then
  echo "   beside it on GPU 1: $SIDE_JOB"
  CUDA_VISIBLE_DEVICES=1 bash -c "$SIDE_JOB" > "$OUTDIR/side.log" 2>&1 &
  side=$!
fi
bare1; bare1 --torchvision; bare1 --torchvision; bare1
[ -n "$side" ] && wait "$side"
if [ "${ONE_GPU:-0}" = 1 ]; then
  echo "== resnet50 b256 x1 compiled, dlscale $(date -u +%T)"
  CUDA_VISIBLE_DEVICES=0 python -m dlscale run --model resnet50 --strategy single --batch-size 256 \
    --precision amp-bf16 --compile --warmup 15 --steps 40 --repeats ${R:-1} --store "$OUTDIR/store" \
    --label core-compiled 2>&1 | grep -E 'repeat [0-9]|^ +resnet|error'
  cat "$OUTDIR/bare.jsonl"; echo "== done $(date -u +%T)"; exit 0
fi
echo "== resnet50 b256 x2 compiled, bare then dlscale $(date -u +%T)"
python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bare_loop.py $B \
  2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"
python -m dlscale run --model resnet50 --strategy ddp --nproc-per-node 2 --batch-size 256 --precision amp-bf16 \
  --compile --warmup 15 --steps 40 --repeats ${R:-1} --store "$OUTDIR/store" --label core-compiled \
  2>&1 | grep -E 'repeat [0-9]|^ +resnet|error'
cat "$OUTDIR/bare.jsonl"
echo "== done $(date -u +%T)"
