#!/usr/bin/env bash
# Issue 4: FSDP2's host time. On one GPU (no communication to wait for) fsdp zero2 ran GPT-2 at
# 303 seq/s and BERT at 2,364 against single's 368 and 3,230 (2026-11-23, H200): the step is
# bound by the host (FSDP hooks per unit, the optimizer's DTensor dispatch), which the head fix
# made visible by shortening the GPU's step. This compares, on N GPUs (default 1), the wrappings
# and optimizers: optimizer_on_shards=false (torch's optimizer on the DTensors, the old default),
# the new default (on the shards), and blocks_per_unit 2, 4.
# Usage: [NPROC=1] [R=1] benchmarks/fsdp_host_gpu.sh OUTDIR   -> OUTDIR/store (label fsdp-host)
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
N=${NPROC:-1}
for c in gpt2:16 bert-base:128; do
  m=${c%%:*}; b=${c##*:}
  for s in "single" "ddp" "fsdp -o shard=zero2 -o optimizer_on_shards=false" "fsdp -o shard=zero2" \
           "fsdp -o shard=zero2 -o blocks_per_unit=2" "fsdp -o shard=zero2 -o blocks_per_unit=4"; do
    n=$N; [ "$s" = single ] && n=1
    [ "$s" = ddp ] && [ "$N" = 1 ] && continue
    echo "== $m b$b x$n $s $(date -u +%T)"
    # shellcheck disable=SC2086
    python -m dlscale run --model "$m" --batch-size "$b" --precision amp-bf16 --warmup 10 --steps 30 \
      --repeats ${R:-1} --nproc-per-node "$n" --store "$OUTDIR/store" --label fsdp-host --strategy $s \
      ${EXTRA:-} 2>&1 | grep -E '^ +(gpt2|bert)|error'
  done
done
echo "== done $(date -u +%T)"
