#!/usr/bin/env bash
# Issue 3 benchmark: the DLPerf suites (dlperf-bert, dlperf-resnet50) at 1 and 2 GPUs, eager by
# default (COMPILE=true for the compiled half), R repeats of W warm-up + S timed steps (defaults
# 3, 10, 40), then the report (md, html, json, plots; REPORT=0 skips it, e.g. to build it elsewhere
# from OUTDIR/store with the same commands).
# BATCH_FP32 / BATCH_AMP (comma lists, default all) keep only those per-GPU batch sizes of each
# precision, e.g. BATCH_FP32=64,128 BATCH_AMP=128,256: BERT fp32 b64 and AMP b128, ResNet-50 fp32
# b128 and AMP b256 (the third session's compiled subset, for device time).
# The 1-GPU cases run as two sweeps side by side, one per GPU (CUDA_VISIBLE_DEVICES; each run's
# sampler reads only the GPU it uses), fp32 on GPU 0 and AMP on GPU 1; then the 2-GPU cases one
# sweep at a time.
# Usage: benchmarks/dlperf_gpu.sh OUTDIR
set -u
OUTDIR=$1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
L="--repeats ${R:-3} --warmup ${W:-10} --steps ${S:-40} --store $OUTDIR/store --filter compile=${COMPILE:-false}"
batches() { case $1 in fp32) b=${BATCH_FP32:-} ;; *) b=${BATCH_AMP:-} ;; esac; [ -n "$b" ] && echo "--filter batch_size=$b"; }
sweep() {  # suite precision devices
  # shellcheck disable=SC2046  # the batch filter is two words or none
  python -m dlscale sweep "$1" --filter precision="$2" --filter devices="$3" $(batches "$2") $L
}
one_gpu() {  # precision: both suites' 1-GPU cases of that precision
  sweep dlperf-bert "$1" 1
  sweep dlperf-resnet50 "$1" 1
}
echo "== 1 GPU, two sweeps side by side $(date -u +%T)"
CUDA_VISIBLE_DEVICES=0 one_gpu fp32 > "$OUTDIR/sweep-1gpu-fp32.log" 2>&1 &
CUDA_VISIBLE_DEVICES=1 one_gpu amp-fp16 > "$OUTDIR/sweep-1gpu-amp.log" 2>&1 &
wait
echo "== 2 GPUs $(date -u +%T)"
for p in fp32 amp-fp16; do
  sweep dlperf-resnet50 $p 2 >> "$OUTDIR/sweep-resnet-2gpu.log" 2>&1
  sweep dlperf-bert $p 2 >> "$OUTDIR/sweep-bert-2gpu.log" 2>&1
done
echo "== done $(date -u +%T)"
grep -h -E "^\[|ok|fail|oom" "$OUTDIR"/sweep-*.log | tail -n 40
if [ "${REPORT:-1}" = 1 ]; then
  python -m dlscale report "$OUTDIR/store" --format md -o "$OUTDIR/report.md" --plots-dir "$OUTDIR/plots"
  python -m dlscale report "$OUTDIR/store" --format html -o "$OUTDIR/report.html"
  python -m dlscale report "$OUTDIR/store" --format json -o "$OUTDIR/report.json"
fi
