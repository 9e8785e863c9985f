#!/usr/bin/env bash
# Issue 2 follow-up: ResNet-50 bf16 b256 compiled. dlscale on 2 GPUs (DDP) against the bare loop,
# and, on 1 GPU, the bare loop over dlscale's ResNet-50 against the same loop over torchvision's
# (order alternated), to tell the model definition from the runner.
# Usage: benchmarks/resnet_compiled_gpu.sh OUTDIR   (tables: python benchmarks/summarize_core.py OUTDIR)
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
B="--model resnet50 --batch-size 256 --compile --warmup 15 --steps 40"
bare1() { python benchmarks/bare_loop.py $B "$@" 2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"; }
echo "== resnet50 b256 x2 compiled $(date -u +%T)"
python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/bare_loop.py $B \
  2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"
python -m dlscale run --model resnet50 --strategy ddp --nproc-per-node 2 --batch-size 256 --precision amp-bf16 \
  --compile --warmup 15 --steps 40 --repeats ${R:-2} --store "$OUTDIR/store" --label core-compiled \
  2>&1 | grep -E 'repeat [0-9]|^ +resnet|error'
echo "== resnet50 b256 x1 compiled, dlscale model vs torchvision $(date -u +%T)"
bare1; bare1 --torchvision; bare1 --torchvision; bare1
cat "$OUTDIR/bare.jsonl"
