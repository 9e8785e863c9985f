#!/usr/bin/env bash
# Third session's follow-up on 2 GPUs, after the vocabulary head was aligned (one call):
# 1. ResNet-50 bf16 b256 compiled, bare loop over dlscale's model (GPU 0) and torchvision's (GPU 1)
#    at the same time, then swapped; 2. GPT-2 eager DDP b16 with DDP/NCCL variants (is the
#    exposed all-reduce reducible?); 3. BERT compiled DDP with --breakdown (why compiled DDP scales
#    worse); 4. GPT-2 b64 pipeline vs model, compiled; 5. core compiled GPT-2/BERT 1 and 2 GPUs
#    with the bare loop (last: it is the longest).
# Usage: benchmarks/followup_gpu.sh OUTDIR   (records in OUTDIR/store, bare results OUTDIR/bare.jsonl)
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
run() { python -m dlscale run --store "$OUTDIR/store" --precision amp-bf16 "$@" 2>&1 | grep -E '^ +(gpt2|bert|resnet)|error'; }
RN="--model resnet50 --batch-size 256 --compile --warmup 15 --steps 40"
rn_pair() {  # GPU of dlscale's model, GPU of torchvision's
  CUDA_VISIBLE_DEVICES=$1 python benchmarks/bare_loop.py $RN 2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl" &
  CUDA_VISIBLE_DEVICES=$2 python benchmarks/bare_loop.py $RN --torchvision 2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"
  wait
}
echo "== 1. resnet50 compiled bare: dlscale model vs torchvision, side by side $(date -u +%T)"
rn_pair 0 1; rn_pair 1 0; cat "$OUTDIR/bare.jsonl"
echo "== 2. gpt2 b16 eager ddp variants $(date -u +%T)"
G="--model gpt2 --batch-size 16 --warmup 10 --steps 40 --repeats 1 --nproc-per-node 2 --strategy ddp"
run $G --label ddp-default
run $G --label ddp-static -o static_graph=true
run $G --label ddp-bucket100 -o bucket_cap_mb=100
NCCL_MAX_NCHANNELS=4 run $G --label ddp-nccl4ch
echo "== 3. bert compiled ddp breakdown $(date -u +%T)"
run --model bert-base --batch-size 128 --compile --warmup 15 --steps 40 --repeats 1 --nproc-per-node 2 \
  --strategy ddp --breakdown --label compiled-breakdown
echo "== 4. gpt2 b64 pipeline vs model, compiled $(date -u +%T)"
P="--model gpt2 --batch-size 64 --compile --warmup 10 --steps 30 --repeats 1 --nproc-per-node 2"
run $P --strategy pipeline -o schedule=1f1b -o microbatches=8
run $P --strategy model
echo "== 5. core compiled $(date -u +%T)"
R=1 BARE_AFTER=0 bash benchmarks/core_gpu.sh "$OUTDIR/core" compiled gpt2:16 bert-base:128
echo "== done $(date -u +%T)"
