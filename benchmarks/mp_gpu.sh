#!/usr/bin/env bash
# Issue 25 benchmark: the model-parallel workloads' sharded paths at sharding degree 1 against a
# bare single-process loop of the same model (target: within 2 %), and the face head against N.
# Usage: [TAGS="wdl face classes"] benchmarks/mp_gpu.sh OUTDIR
#   -> OUTDIR/store (dlscale records), OUTDIR/bare.jsonl (bare_mp.py lines), OUTDIR/log (this output)
# Table: python benchmarks/summarize_mp.py OUTDIR
# Through the device tool (everything under $OUT comes back in one archive):
#   benchmarks/pack_out.sh $OUT 580 mp bash benchmarks/mp_gpu.sh
#
# Tags (default "wdl face classes": 12 dlscale repeats and 8 bare runs, each mostly process
# start-up (~20 s), so an estimated 6-8 minutes on one H200, not yet timed there; W=15 warm-up,
# S=40 timed steps, bf16 autocast; the bare loop runs before and after its dlscale cases; 2
# repeats for the sharded cases, 1 for `single` and the classes sweep):
#   wdl      wide-deep full (DLPerf's shape: 26 fields x 16 + 13 dense, 7 x 1024, 2 crossed wide
#            features) at DLPerf's batch 16384: bare loop; `single` (dlscale's own loop, whole
#            tables); embedding-shard table and row at 1 GPU (groups of one rank: the exchange,
#            lookup and reverse exchange run, the all-to-alls are copies)
#   face     face full (iresnet50 112x112, ArcFace over MS1MV2's 85,742 classes) at batch 128:
#            bare loop; `single`; partial-fc at 1 GPU (all-gather, sharded softmax, reduce-scatter
#            on a group of one)
#   classes  face at N = 360,232 (Glint360K), 1 M, 4 M, 8 M classes: partial-fc at 1 GPU and the
#            bare loop; memory and throughput against N (records: peak_mem_allocated_bytes)
#   multi    (2+ GPUs only, not in the default) the same workloads at 2 GPUs: embedding-shard row
#            and table against ddp (whole tables all-reduced), partial-fc against ddp, and GPT-2's
#            rpc-pipeline against pipeline (gpipe, 4 micro-batches) and model, as DistributedTest did
# A CPU dry run of the whole script (minutes): W=1 S=2 WDL_B=64 FACE_B=8 CLASSES="100 200"
#   EXTRA="--flavor tiny --device cpu --precision fp32" BARE_EXTRA="--flavor tiny --precision fp32"
set -u
OUTDIR=$1
TAGS=${TAGS:-"wdl face classes"}
W=${W:-15}; S=${S:-40}
WDL_B=${WDL_B:-16384}; FACE_B=${FACE_B:-128}; CLASSES=${CLASSES:-"360232 1000000 4000000 8000000"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
exec > >(tee -a "$OUTDIR/log") 2>&1
has() { case " $TAGS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
bare() {  # bare_mp.py arguments
  echo "-- bare $* ($(date -u +%T))"
  local line
  # shellcheck disable=SC2086  # BARE_EXTRA is words
  line=$(python benchmarks/bare_mp.py --warmup "$W" --steps "$S" "$@" ${BARE_EXTRA:-} 2>>"$OUTDIR/bare.err" | grep '^{')
  if [ -n "$line" ]; then echo "$line" | tee -a "$OUTDIR/bare.jsonl"
  else echo "bare loop failed: $(grep -v '^\s*$' "$OUTDIR/bare.err" | tail -n 1)"; fi
}
run() {  # label model batch nproc repeats strategy [options...]
  local label=$1 model=$2 batch=$3 nproc=$4 reps=$5; shift 5
  echo "-- dlscale $label: $model b$batch x$nproc $* ($(date -u +%T))"
  # shellcheck disable=SC2068,SC2086  # the strategy, its options and EXTRA are words
  python -m dlscale run --store "$OUTDIR/store" --label "$label" --model "$model" --batch-size "$batch" \
    --nproc-per-node "$nproc" --repeats "$reps" --precision amp-bf16 --warmup "$W" --steps "$S" --time-limit 150 \
    ${EXTRA:-} --strategy $@ 2>&1 | grep -iE '^ +(wide-deep|face|gpt2) |error|repeat [0-9]|unsupported'
}
echo "== mp_gpu.sh $(date -u +%FT%T) tags: $TAGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

if has wdl; then
  bare --model wide-deep --batch-size "$WDL_B"
  run wdl wide-deep "$WDL_B" 1 1 single
  run wdl wide-deep "$WDL_B" 1 2 embedding-shard -o shard=table
  run wdl wide-deep "$WDL_B" 1 2 embedding-shard -o shard=row
  bare --model wide-deep --batch-size "$WDL_B"
fi
if has face; then
  bare --model face --batch-size "$FACE_B"
  run face face "$FACE_B" 1 1 single
  run face face "$FACE_B" 1 2 partial-fc
  bare --model face --batch-size "$FACE_B"
fi
if has classes; then
  for n in $CLASSES; do
    run classes face "$FACE_B" 1 1 partial-fc -o classes="$n"
    bare --model face --batch-size "$FACE_B" --classes "$n"
  done
fi
if has multi; then
  g=$(nvidia-smi -L | wc -l)
  if [ "$g" -lt 2 ]; then echo "multi: needs 2 GPUs, found $g"; else
    run multi wide-deep "$WDL_B" 2 2 ddp
    run multi wide-deep "$WDL_B" 2 2 embedding-shard -o shard=table
    run multi wide-deep "$WDL_B" 2 2 embedding-shard -o shard=row
    run multi wide-deep "$WDL_B" 2 1 embedding-shard -o shard=row -o vocab_scale=8
    run multi face "$FACE_B" 2 2 ddp
    run multi face "$FACE_B" 2 2 partial-fc
    run multi face "$FACE_B" 2 1 partial-fc -o classes=8000000
    run multi gpt2 16 2 2 pipeline -o schedule=gpipe -o microbatches=4
    run multi gpt2 16 2 2 rpc-pipeline -o microbatches=4
    run multi gpt2 16 2 1 model
  fi
fi
echo "== done $(date -u +%T)"
python benchmarks/summarize_mp.py "$OUTDIR" || true
