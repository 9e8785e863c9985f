#!/usr/bin/env bash
# Issue 24 on one H200: dlscale's Llama-style 1B and 3B, bf16, compiled, 2,048-token sequences, batch 4:
# tokens/s, MFU and peak memory with selective activation checkpointing off and on, and FP8 (torchao
# float8, tensorwise) against bf16; beside them, in the same call, the peer: Hugging Face's
# LlamaForCausalLM on the same shapes trained by a plain loop (bf16 autocast, fused AdamW, compiled,
# benchmarks/bare_llama_hf.py), and `dlscale plan` for the same cases (predicted peak vs measured).
#
# Usage: [PART=all|1b|3b] [B=4] [WARMUP=5] [STEPS=10] benchmarks/llama_gpu.sh OUTDIR
#   FP8: torchao must import. The script installs .whl/torchao-*.whl (no deps) when it does not:
#   the wheel for torch 2.11 (+ CUDA 13, Python 3.12) is torchao 0.17.0 (built against torch 2.11;
#   abi3, so any CPython >= 3.10), fetched beforehand with
#     pip download --no-deps torchao==0.17.0 --index-url https://download.pytorch.org/whl/cu130 -d .whl
#   (the PyPI wheel torchao-0.17.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl also
#   works for float8 training, which is pure Python over torch._scaled_mm; only its optional C++
#   kernels, unused here, are built for another CUDA). Carry .whl/ to the GPU machine.
# Output: OUTDIR/store (dlscale records, labelled 1b-bf16, 1b-bf16-sac, 1b-fp8, ...),
#   OUTDIR/peer.jsonl (one JSON line per peer run), OUTDIR/plan-*.json, OUTDIR/run.log, and the
#   summary table OUTDIR/summary.md (benchmarks/summarize_llama.py).
# Time: each case compiles once in its own process (about a minute for 1B, more for 3B); with 5 + 10
#   steps the whole script should stay under 10 minutes; PART=1b / PART=3b split it if not.
# CPU dry run (tiny flavour, no compile, fp8 refused as unsupported):
#   FLAVORS=tiny EXTRA="--device cpu" BARE_EXTRA="" COMPILE="" B=2 WARMUP=1 STEPS=2 benchmarks/llama_gpu.sh /tmp/llama
set -u
OUTDIR=$1
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
LOG="$OUTDIR/run.log"
B=${B:-4}; WARMUP=${WARMUP:-5}; STEPS=${STEPS:-10}; COMPILE=${COMPILE---compile}
case "${PART:-all}" in 1b) DEFAULT="1b";; 3b) DEFAULT="3b";; *) DEFAULT="1b 3b";; esac
FLAVORS=${FLAVORS:-$DEFAULT}
say() { echo "== $* $(date -u +%T)" | tee -a "$LOG"; }

if ! python -c "import torchao.float8" 2>/dev/null; then
  WHL=$(ls .whl/torchao-*.whl 2>/dev/null | head -n 1)
  if [ -n "$WHL" ]; then say "installing $WHL"; pip install -q --no-deps "$WHL" >>"$LOG" 2>&1; fi
fi
python - <<'EOF' 2>&1 | tee -a "$LOG"
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
for mod in ("torchao", "transformers"):
    try:
        print(mod, __import__(mod).__version__)
    except Exception as e:  # noqa: BLE001
        print(mod, "not importable:", type(e).__name__, str(e)[:200])
EOF

drun() {  # label flavor [args...]
  local label=$1 flavor=$2; shift 2
  say "dlscale $label"
  python -m dlscale run --model llama --flavor "$flavor" --strategy single --batch-size "$B" --precision amp-bf16 \
    $COMPILE --warmup "$WARMUP" --steps "$STEPS" --repeats 1 --store "$OUTDIR/store" --label "$label" \
    --time-limit 540 ${EXTRA:-} "$@" 2>&1 | grep -E 'repeat [0-9]|^ +llama|error|unsupported' | tee -a "$LOG"
}
peer() {  # flavor
  say "peer hf $1"
  timeout 400 python benchmarks/bare_llama_hf.py --impl hf --flavor "$1" --batch-size "$B" ${COMPILE:+--compile} \
    --warmup "$WARMUP" --steps "$STEPS" ${BARE_EXTRA:-} 2>>"$LOG" | grep '^{' | tee -a "$OUTDIR/peer.jsonl"
}
EAGER=$([ -z "$COMPILE" ] && echo --eager)
plan() {  # flavor checkpointing
  python -m dlscale plan --model llama --flavor "$1" --gpus 1 --gpu-memory "${GPU_MEMORY:-139GiB}" --gpu H200 \
    --batch-size "$B" --activation-checkpointing "$2" $EAGER --format json > "$OUTDIR/plan-$1-$2.json" 2>>"$LOG"
}

for f in $FLAVORS; do
  plan "$f" none; plan "$f" selective
  peer "$f"
  drun "$f-bf16" "$f"
  drun "$f-bf16-sac" "$f" --activation-checkpointing selective
  drun "$f-fp8" "$f" --precision fp8
done
say "summary"
python benchmarks/summarize_llama.py "$OUTDIR" | tee "$OUTDIR/summary.md"
say "done"
