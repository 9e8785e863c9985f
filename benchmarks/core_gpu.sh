#!/usr/bin/env bash
# Issue 2 benchmark: dlscale run vs a bare hand-written loop, same models, same call.
# Usage: benchmarks/core_gpu.sh OUTDIR MODE [MODEL:BATCH ...] [-- NPROCS...]
#   MODE: eager | compiled.  Defaults: resnet50:256 bert-base:128 gpt2:16, devices 1 2.
# Writes OUTDIR/store (dlscale records), OUTDIR/bare.jsonl (bare-loop results), OUTDIR/log.
set -u
OUTDIR=$1; MODE=$2; shift 2
CASES=(); NPROCS=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; NPROCS=("$@"); break; fi
  CASES+=("$1"); shift
done
[ ${#CASES[@]} -gt 0 ] || CASES=(resnet50:256 bert-base:128 gpt2:16)
[ ${#NPROCS[@]} -gt 0 ] || NPROCS=(1 2)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# BARE_AFTER=0 skips the second bare run (saves a compile per case)
W=${W:-15}; S=${S:-40}; R=${R:-3}
CF=(); [ "$MODE" = compiled ] && CF=(--compile)
mkdir -p "$OUTDIR"
bare() {  # model batch nproc
  if [ "$3" -eq 1 ]; then python benchmarks/bare_loop.py --model "$1" --batch-size "$2" "${CF[@]}" --warmup $W --steps $S
  else python -m torch.distributed.run --standalone --nproc-per-node "$3" benchmarks/bare_loop.py \
         --model "$1" --batch-size "$2" "${CF[@]}" --warmup $W --steps $S; fi 2>>"$OUTDIR/bare.err" | grep '^{' >> "$OUTDIR/bare.jsonl"
}
for c in "${CASES[@]}"; do
  model=${c%%:*}; batch=${c##*:}
  for n in "${NPROCS[@]}"; do
    strat=single; [ "$n" -gt 1 ] && strat=ddp
    echo "== $model b$batch x$n $MODE $(date -u +%T)"
    bare "$model" "$batch" "$n"
    python -m dlscale run --model "$model" --strategy $strat --nproc-per-node "$n" --batch-size "$batch" \
      --precision amp-bf16 "${CF[@]}" --warmup $W --steps $S --repeats $R --store "$OUTDIR/store" \
      --label "core-$MODE" 2>&1 | grep -E 'repeat|samples/s|^ +[a-z]|error' 
    [ "${BARE_AFTER:-1}" = 1 ] && bare "$model" "$batch" "$n"
    tail -n 2 "$OUTDIR/bare.jsonl"
  done
done
