#!/usr/bin/env bash
# An external stack beside dlscale's own model on the same workload, in one store and one report:
# the Hugging Face Trainer's GPT-2 124M (benchmarks/hf_gpt2_train.py: config built in code, random
# init, bf16 autocast, batch 16, seq 1024, no downloads) under `dlscale run --command --parser
# hf-trainer`, beside `dlscale run --model gpt2 --batch-size 16 --precision amp-bf16`, eager and
# --compile (strategy single: one GPU, no DDP wrapper, as the Trainer on one GPU).
# Usage: benchmarks/external_gpu.sh [OUTDIR]   (default: $OUT, else ./external-gpu)
# Env: W (warm-up steps, 15), S (window steps, 40), R (repeats, 3), HF_COMPILE=1 adds the Trainer
#      with torch_compile (one more case); PART=eager|compiled|hf|report runs one part (the same
#      OUTDIR collects them: a device call of 10 minutes may not hold all four).
# Writes OUTDIR/store (records), OUTDIR/log, OUTDIR/report.md, OUTDIR/report.html.
set -u
OUTDIR=${1:-${OUT:-external-gpu}}
W=${W:-15}; S=${S:-40}; R=${R:-3}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG="$OUTDIR/log"
STORE="$OUTDIR/store"
# the Trainer logs every 5 steps: W and W+S are multiples of 5, so the window is steps W+1..W+S
STEPS=$((W + S + 10))
say() { echo "== $* $(date -u +%T)" | tee -a "$LOG"; }
python -m dlscale env >> "$LOG" 2>&1
python -c "import transformers, accelerate; print('transformers', transformers.__version__, 'accelerate', accelerate.__version__)" 2>&1 | tee -a "$LOG"

part() { [ -z "${PART:-}" ] || [ "$PART" = "$1" ]; }
if part eager; then
say "dlscale gpt2 eager"
python -m dlscale run --model gpt2 --strategy single --batch-size 16 --precision amp-bf16 --warmup $W --steps $S \
  --repeats $R --store "$STORE" 2>&1 | tee -a "$LOG" | grep -E 'repeat|samples/s|^ +[a-z]|error'
fi
if part compiled; then
say "dlscale gpt2 compiled"
python -m dlscale run --model gpt2 --strategy single --batch-size 16 --precision amp-bf16 --compile --warmup $W \
  --steps $S --repeats $R --store "$STORE" 2>&1 | tee -a "$LOG" | grep -E 'repeat|samples/s|^ +[a-z]|error'
fi
if part hf; then
say "hf-trainer gpt2 eager"
python -m dlscale run --command "python benchmarks/hf_gpt2_train.py --batch-size 16 --seq-len 1024 --steps $STEPS --logging-steps 5 --out $OUTDIR/hf-out" \
  --parser hf-trainer --stack "hf-trainer" --model gpt2 --batch-size 16 --precision amp-bf16 --strategy single \
  --warmup $W --steps $S --repeats $R --time-limit 1200 --store "$STORE" 2>&1 | tee -a "$LOG" \
  | grep -E 'repeat|samples/s|^ +[a-z]|warning|error|method'
if [ "${HF_COMPILE:-0}" = 1 ]; then
  say "hf-trainer gpt2 torch_compile"
  python -m dlscale run --command "python benchmarks/hf_gpt2_train.py --batch-size 16 --seq-len 1024 --steps $STEPS --logging-steps 5 --compile --out $OUTDIR/hf-out" \
    --parser hf-trainer --stack "hf-trainer" --model gpt2 --batch-size 16 --precision amp-bf16 --strategy single \
    --compile --warmup $W --steps $S --repeats $R --time-limit 1800 --store "$STORE" 2>&1 | tee -a "$LOG" \
    | grep -E 'repeat|samples/s|^ +[a-z]|warning|error|method'
fi
fi
if part report || [ -z "${PART:-}" ]; then
say "report"
python -m dlscale report "$STORE" --format md --output "$OUTDIR/report.md" 2>&1 | tee -a "$LOG"
python -m dlscale report "$STORE" --format html --output "$OUTDIR/report.html" 2>&1 | tee -a "$LOG"
sed -n '/^## Stacks side by side/,/^## [A-Z]/p' "$OUTDIR/report.md" | tee -a "$LOG"
fi
