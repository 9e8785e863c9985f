#!/usr/bin/env bash
# Issue 5 benchmark: sampler overhead (interleaved on/off) and the DDP step breakdown at 2 GPUs,
# eager and compiled (the compiled one tests why compiled DDP scales worse, issue 2).
# Usage: benchmarks/util_gpu.sh OUTDIR   (then: python benchmarks/summarize_util.py OUTDIR/store)
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
S="--store $OUTDIR/store --precision amp-bf16 --warmup 10 --steps 40 --repeats 1"
for i in 1 2; do
  python -m dlscale run --model gpt2 --strategy single --batch-size 16 $S --no-monitor --label monitor-off | grep -E '^ +gpt2'
  python -m dlscale run --model gpt2 --strategy single --batch-size 16 $S --label monitor-on | grep -E '^ +gpt2'
done
for m in bert-base:128 gpt2:16; do
  python -m dlscale run --model ${m%%:*} --strategy ddp --nproc-per-node 2 --batch-size ${m##*:} $S \
    --breakdown --label breakdown | grep -E '^ +(bert|gpt2)|error'
done
python -m dlscale run --model bert-base --strategy ddp --nproc-per-node 2 --batch-size 128 $S --compile \
  --breakdown --label breakdown | grep -E '^ +bert|error'
