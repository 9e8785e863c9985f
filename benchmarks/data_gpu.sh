#!/usr/bin/env bash
# Issue 23: real input data on one GPU (about 8 minutes on one H200 with 16 host cores).
#  1. an ImageNet-like set (N_IMAGES JPEGs, ~110 KB each) and a token file (20M uint16 ids < 30522,
#     inside both BERT's and GPT-2's vocabulary) on the machine's local disk, DATA_DIR;
#  2. ResNet-50 bf16 b256, eager: synthetic | CPU-decoded (Pillow, every host core but one as
#     DataLoader workers) | GPU-decoded (nvJPEG through torchvision.io.decode_jpeg);
#  3. BERT-base b128 and GPT-2 b16, eager: synthetic | token file;
#  4. ResNet-50 compiled: synthetic | GPU-decoded | CPU-decoded;
#  5. micro io: decode+augment img/s with 1 and 16 workers, GPU decode, token batches;
#  6. the table: benchmarks/summarize_data.py OUTDIR/store (also written to OUTDIR/data_gpu.md).
# The CPU-decoded runs take 320 steps: the loader holds 15 workers x 2 + 2 = 32 batches ready when
# the window starts, and a window under 10x that may understate the wait (the record flags it).
# Usage: benchmarks/pack_out.sh $OUT 590 data bash benchmarks/data_gpu.sh
#    or: [N_IMAGES=16384] [DATA_DIR=/tmp/dlscale-data] [MICRO=1] benchmarks/data_gpu.sh OUTDIR
set -u
OUTDIR=$1
DATA=${DATA_DIR:-/tmp/dlscale-data}
N=${N_IMAGES:-16384}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR" "$DATA"
STORE="$OUTDIR/store"
echo "== $(date -u +%T) host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; $($PY -c 'import torch, torchvision, PIL; print("torch", torch.__version__, "torchvision", torchvision.__version__, "Pillow", PIL.__version__)' 2>&1 | tail -1)"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader

echo "== $(date -u +%T) data sets in $DATA"
[ -f "$DATA/imgs/dlscale-data.json" ] || $PY -m dlscale data make imagenet-like --out "$DATA/imgs" --size "$N" \
  --classes 1000 || exit 1
[ -f "$DATA/tok/tokens.bin" ] || $PY -m dlscale data make tokens --out "$DATA/tok" --size 20M --vocab 30522 || exit 1
cp "$DATA/imgs/dlscale-data.json" "$OUTDIR/imgs-manifest.json"
IMG="imagefolder:$DATA/imgs"
TOK="tokens:$DATA/tok/tokens.bin:uint16"

run() {  # label-free: the data spec and decode tell the cases apart
  echo "-- $(date -u +%T) $*"
  $PY -m dlscale run --strategy single --precision amp-bf16 --repeats 1 --store "$STORE" --label data-gpu "$@" \
    2>&1 | grep -E 'repeat [0-9]|data:|error|Error'
}
R50="--model resnet50 --batch-size 256"
echo "== $(date -u +%T) ResNet-50 eager"
run $R50 --warmup 15 --steps 40
run $R50 --warmup 20 --steps 320 --data "$IMG"
run $R50 --warmup 20 --steps 120 --data "$IMG" --data-decode gpu
echo "== $(date -u +%T) BERT-base b128, GPT-2 b16 from a token file"
run --model bert-base --batch-size 128 --warmup 15 --steps 40
run --model bert-base --batch-size 128 --warmup 15 --steps 60 --data "$TOK"
run --model gpt2 --batch-size 16 --warmup 15 --steps 40
run --model gpt2 --batch-size 16 --warmup 15 --steps 60 --data "$TOK"
echo "== $(date -u +%T) ResNet-50 compiled"
run $R50 --compile --warmup 15 --steps 40
run $R50 --compile --warmup 20 --steps 120 --data "$IMG" --data-decode gpu
run $R50 --compile --warmup 20 --steps 320 --data "$IMG"
if [ "${MICRO:-1}" = 1 ]; then
  echo "== $(date -u +%T) micro io"
  $PY -m dlscale micro io --data "$IMG" --data "$TOK" --workers 1,"$(nproc)" --pipeline image-cpu,gpt,bert \
    --seconds 3 --store "$STORE" 2>&1 | tail -n 14
  $PY -m dlscale micro io --data "$IMG" --workers 4 --pipeline image-gpu --seconds 3 --store "$STORE" 2>&1 | tail -n 8
fi
echo "== $(date -u +%T) table"
$PY benchmarks/summarize_data.py "$STORE" | tee "$OUTDIR/data_gpu.md"
echo "== $(date -u +%T) done"
