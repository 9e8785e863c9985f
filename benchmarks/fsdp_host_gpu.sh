#!/usr/bin/env bash
# Issue 4: FSDP2's host time. On lent H200s (2026-11-23) fsdp zero2 ran GPT-2 and BERT at
# 0.95-0.96 of single on a steady host and 18-27 % under it while the VM's host ran slow: FSDP's
# host work (hooks per unit, the optimizer's DTensor dispatch) sits just under the GPU's step
# since the head fix shortened it. This compares, on N GPUs (default 1), the wrappings
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
