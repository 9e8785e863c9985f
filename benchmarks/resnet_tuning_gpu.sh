#!/usr/bin/env bash
# Issue 2: ResNet-50 bf16 b256 compiled on one GPU is 2.6 % under DESIGN.md's 6,776 img/s on the
# H200s lent so far (dlscale 6,603; torchvision's own model in the bare loop 6,600, same call).
# Which of torch's own switches close it? The bare loop (benchmarks/bare_loop.py) over dlscale's
# ResNet-50, one variant per process, in one call, baseline first and again last (drift):
#   foreach      SGD as torch builds it by default (foreach kernels), compile mode "default"
#   fused        SGD(fused=True): one kernel pass over parameters, gradients and momentum
#   cdt          + TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 (inductor tunes each Triton
#                kernel's block sizes: BatchNorm, ReLU, residual adds)
#   graphs       + compile mode reduce-overhead (CUDA graphs: the step's kernels replayed, not launched)
#   cdt+graphs   both
#   autotune     + compile mode max-autotune-no-cudagraphs (Triton templates against cuDNN for
#                each convolution; long compile, so last and under its own limit)
# PART=dlscale: the winner through dlscale itself (SGD is fused by default now), each R repeats:
#   default      dlscale run --compile
#   tuned        --compile-mode reduce-overhead --inductor-option coordinate_descent_tuning=true
#   bare-tuned   the bare loop with the same settings, after it (the overhead check)
#   ddp1-tuned   the same under ddp with one process (DDP's hooks beside CUDA graphs; correctness)
# Usage: [PART=bare|dlscale] [R=2] [STEPS=100] benchmarks/resnet_tuning_gpu.sh OUTDIR   (one GPU)
# Result: OUTDIR/bare.jsonl (one JSON line per variant, with its label), OUTDIR/bare.err;
# PART=dlscale also OUTDIR/store (records labelled as above). Fifth session's figures:
# docs/benchmarks.md. A cold machine spends six to over seven minutes compiling the tuned case (inductor then
# caches it): give the tuned case a call of its own, or run it twice on a warm machine.
# CPU dry run: PART=dlscale R=1 WARMUP=1 STEPS=2 EXTRA="--flavor tiny --device cpu --batch-size 4"
#   BARE_EXTRA="--flavor tiny --batch-size 4" (later options win)
set -u
OUTDIR=$1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
B="--model resnet50 --batch-size 256 --compile --warmup ${WARMUP:-15} --steps ${STEPS:-100} ${BARE_EXTRA:-}"
bare() {  # label limit_s [args...]
  local label=$1 limit=$2; shift 2
  echo "== $label $* $(date -u +%T)"
  timeout "$limit" python benchmarks/bare_loop.py $B "$@" 2>>"$OUTDIR/bare.err" | grep '^{' \
    | sed "s/^{/{\"label\": \"$label\", /" >> "$OUTDIR/bare.jsonl"
  tail -n 1 "$OUTDIR/bare.jsonl" | grep -o '"label": "[^"]*"\|"samples_per_s": [0-9.]*' | paste -sd' '
}
if [ "${PART:-bare}" = dlscale ]; then
  TUNED="--compile-mode reduce-overhead --inductor-option coordinate_descent_tuning=true"
  drun() {  # label strategy [args...]
    local label=$1 strat=$2; shift 2
    echo "== dlscale $label $strat $* $(date -u +%T)"
    python -m dlscale run --model resnet50 --strategy "$strat" --batch-size 256 --precision amp-bf16 --compile \
      --warmup ${WARMUP:-15} --steps ${STEPS:-100} --store "$OUTDIR/store" --label "$label" ${EXTRA:-} "$@" 2>&1 \
      | grep -E 'repeat [0-9]|^ +resnet|error'
  }
  drun default single --repeats ${R:-2}
  drun tuned single $TUNED --repeats ${R:-2} --time-limit 420
  TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bare bare-tuned 150 --sgd fused --compile-mode reduce-overhead
  drun ddp1-tuned ddp $TUNED --repeats 1 --time-limit 200
  echo "== done $(date -u +%T)"; exit 0
fi
bare foreach 150 --sgd foreach
bare fused 150 --sgd fused
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bare cdt 200 --sgd fused
bare graphs 150 --sgd fused --compile-mode reduce-overhead
TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 bare cdt+graphs 200 --sgd fused --compile-mode reduce-overhead
bare foreach-again 150 --sgd foreach
bare autotune 240 --sgd fused --compile-mode max-autotune-no-cudagraphs
echo "== done $(date -u +%T)"
