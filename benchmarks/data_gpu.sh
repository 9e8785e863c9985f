#!/usr/bin/env bash
# Issue 23: real input data on one GPU (about 8 minutes on one H200 with 16 host cores).
#  1. an ImageNet-like set (N_IMAGES JPEGs, ~110 KB each) and a token file (20M uint16 ids < 30522,
#     inside both BERT's and GPT-2's vocabulary) on the machine's local disk, DATA_DIR;
#  2. ResNet-50 bf16 b256, eager: synthetic | CPU-decoded (Pillow, every host core but one as
#     DataLoader workers) | GPU-decoded (nvJPEG through torchvision.io.decode_jpeg);
#  3. BERT-base b128 and GPT-2 b16, eager: synthetic | token file;
#  4. ResNet-50 compiled: synthetic | GPU-decoded | CPU-decoded;
#  5. micro io: decode+augment img/s with 1 and all-core workers, GPU decode, token batches;
#  6. the table: benchmarks/summarize_data.py OUTDIR/store (also written to OUTDIR/data_gpu.md).
# The CPU-decoded runs take 320 steps: the loader holds 15 workers x 2 + 2 = 32 batches ready when
# the window starts, and a window under 10x that may understate the wait (the record flags it).
# Usage: benchmarks/pack_out.sh $OUT 590 data bash benchmarks/data_gpu.sh
#    or: [N_IMAGES=16384] [DATA_DIR=/tmp/dlscale-data] [MICRO=1] benchmarks/data_gpu.sh OUTDIR
# SMOKE=1 checks this script on a CPU in a few minutes: tiny models, small data, no GPU cases.
set -u
OUTDIR=$1
DATA=${DATA_DIR:-/tmp/dlscale-data}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [ "${SMOKE:-0}" = 1 ]; then
  N=${N_IMAGES:-64}; TOKENS=200k; VOCAB=500; CLASSES=10; GPU=0; SECS=0.5
  CASE=(--flavor tiny --device cpu --precision fp32); RB=8; BB=4; GB=4; W=1; S=3; S_CPU=4; S_GPU=3; S_TOK=3
else
  N=${N_IMAGES:-16384}; TOKENS=20M; VOCAB=30522; CLASSES=1000; GPU=1; SECS=3
  CASE=(--precision amp-bf16); RB=256; BB=128; GB=16; W=15; S=40; S_CPU=320; S_GPU=120; S_TOK=60
fi
mkdir -p "$OUTDIR" "$DATA"
STORE="$OUTDIR/store"
echo "== $(date -u +%T) host: $(nproc) cores; $($PY -c 'import torch, PIL; print("torch", torch.__version__, "Pillow", PIL.__version__)' 2>&1 | tail -1); torchvision $($PY -c 'import torchvision; print(torchvision.__version__)' 2>/dev/null || echo none)"
[ "$GPU" = 1 ] && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== $(date -u +%T) data sets in $DATA"
[ -f "$DATA/imgs/dlscale-data.json" ] || $PY -m dlscale data make imagenet-like --out "$DATA/imgs" --size "$N" \
  --classes "$CLASSES" || exit 1
[ -f "$DATA/tok/tokens.bin" ] || $PY -m dlscale data make tokens --out "$DATA/tok" --size "$TOKENS" \
  --vocab "$VOCAB" || exit 1
cp "$DATA/imgs/dlscale-data.json" "$OUTDIR/imgs-manifest.json"
IMG="imagefolder:$DATA/imgs"
TOK="tokens:$DATA/tok/tokens.bin:uint16"

run() {  # the data spec and decode device tell the cases apart (one label for all)
  echo "-- $(date -u +%T) $*"
  $PY -m dlscale run --strategy single "${CASE[@]}" --repeats 1 --store "$STORE" --label data-gpu "$@" \
    2>&1 | grep -E 'repeat [0-9]|data:|error|Error'
}
R50=(--model resnet50 --batch-size "$RB")
echo "== $(date -u +%T) ResNet-50 eager"
run "${R50[@]}" --warmup "$W" --steps "$S"
run "${R50[@]}" --warmup "$W" --steps "$S_CPU" --data "$IMG"
[ "$GPU" = 1 ] && run "${R50[@]}" --warmup "$W" --steps "$S_GPU" --data "$IMG" --data-decode gpu
echo "== $(date -u +%T) BERT-base b$BB, GPT-2 b$GB from a token file"
run --model bert-base --batch-size "$BB" --warmup "$W" --steps "$S"
run --model bert-base --batch-size "$BB" --warmup "$W" --steps "$S_TOK" --data "$TOK"
run --model gpt2 --batch-size "$GB" --warmup "$W" --steps "$S"
run --model gpt2 --batch-size "$GB" --warmup "$W" --steps "$S_TOK" --data "$TOK"
if [ "$GPU" = 1 ]; then
  echo "== $(date -u +%T) ResNet-50 compiled"
  run "${R50[@]}" --compile --warmup "$W" --steps "$S"
  run "${R50[@]}" --compile --warmup "$W" --steps "$S_GPU" --data "$IMG" --data-decode gpu
  run "${R50[@]}" --compile --warmup "$W" --steps "$S_CPU" --data "$IMG"
fi
if [ "${MICRO:-1}" = 1 ]; then
  echo "== $(date -u +%T) micro io"
  FL=(); [ "${SMOKE:-0}" = 1 ] && FL=(--flavor tiny --device cpu --batch-size 8)
  $PY -m dlscale micro io "${FL[@]}" --data "$IMG" --data "$TOK" --workers 1,"$(nproc)" \
    --pipeline image-cpu,gpt,bert --seconds "$SECS" --store "$STORE" 2>&1 | tail -n 14
  [ "$GPU" = 1 ] && $PY -m dlscale micro io --data "$IMG" --workers 4 --pipeline image-gpu --seconds "$SECS" \
    --store "$STORE" 2>&1 | tail -n 8
fi
echo "== $(date -u +%T) table"
$PY benchmarks/summarize_data.py "$STORE" | tee "$OUTDIR/data_gpu.md"
echo "== $(date -u +%T) done"
