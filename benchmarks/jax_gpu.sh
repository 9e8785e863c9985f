#!/usr/bin/env bash
# Issue 21: PyTorch eager, PyTorch compiled and JAX (XLA) side by side on one GPU, with the JAX
# bare loop as the yardstick of dlscale's JAX runs, in one call.
# For each model (default: gpt2 bert-base resnet50; GPT-2 first, it carries the profile):
#   1. benchmarks/bare_loop_jax.py          (hand-written JAX loop over dlscale's JAX model)
#   2. dlscale run --framework jax          (strategy single, 1 repeat)
#   3. dlscale run (torch eager), 4. dlscale run --compile (torch compiled)
# all bf16 (amp-bf16), ResNet-50 b256, BERT-base b128, GPT-2 b16, short windows (W warm-up, S timed
# steps). GPT-2 also gets a profile on both sides: the JAX bare loop's jax.profiler trace (top GPU
# kernels) and the torch compiled run's torch.profiler top ops (--profile), summarised by kind of
# kernel by benchmarks/summarize_jax_gpu.py, which prints the table at the end.
# Time: XLA's compile of the full models' steps took 91-137 s each on a loaded 2-core CPU (GPT-2,
# BERT-base, ResNet-50); on the GPU host expect ~0.5-1 min per JAX compile and ~1-1.5 min per
# torch.compile, so ~3-4 min per model: if one call must stay under 10 min, run gpt2 alone, then
# bert-base resnet50 (with pack_out, NAMEs jaxgpu1 and jaxgpu2), and summarise both afterwards:
#   python benchmarks/summarize_jax_gpu.py jaxgpu1 jaxgpu2
# Usage: [W=5] [S=30] bash benchmarks/jax_gpu.sh OUTDIR [MODEL...]
#   FLAVOR=tiny: a smoke test of the script itself on a CPU (tiny models, batch 4, --device cpu)
#   on the device tool: bash benchmarks/pack_out.sh $OUT 590 jaxgpu bash benchmarks/jax_gpu.sh
set -u
OUTDIR=$1; shift
MODELS=${*:-gpt2 bert-base resnet50}
W=${W:-5}; S=${S:-30}; FLAVOR=${FLAVOR:-full}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR/prof"
T0=$(date +%s)
stamp() { echo "== $* (+$(( $(date +%s) - T0 )) s, $(date -u +%T))"; }
python - <<'PY' > "$OUTDIR/versions.txt" 2>&1
import jax, jaxlib, optax, torch
print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "optax", optax.__version__, "torch", torch.__version__)
print("jax devices", jax.devices())
PY
cat "$OUTDIR/versions.txt"
COMMON="--strategy single --precision amp-bf16 --repeats 1 --store $OUTDIR/store --label jax-gpu --flavor $FLAVOR"
[ "$FLAVOR" = tiny ] && COMMON="$COMMON --device cpu"
for m in $MODELS; do
  case $m in
    gpt2) B=16; PROF=1 ;;
    bert-base) B=128; PROF=0 ;;
    resnet50) B=256; PROF=0 ;;
    *) echo "unknown model $m"; continue ;;
  esac
  [ "$FLAVOR" = tiny ] && B=4
  stamp "$m b$B: JAX bare loop"
  extra=""; [ "$PROF" = 1 ] && extra="--profile $OUTDIR/prof"
  python benchmarks/bare_loop_jax.py --model "$m" --flavor "$FLAVOR" --batch-size "$B" --warmup "$W" --steps "$S" $extra \
    2>>"$OUTDIR/bare.err" | grep '^{' | tee -a "$OUTDIR/bare.jsonl" | cut -c1-400
  stamp "$m b$B: dlscale --framework jax"
  python -m dlscale run --framework jax --model "$m" --batch-size "$B" --warmup "$W" --steps "$S" $COMMON \
    2>&1 | grep -E 'repeat [0-9]|error|Error' | cut -c1-300
  stamp "$m b$B: dlscale torch eager"
  python -m dlscale run --model "$m" --batch-size "$B" --warmup "$W" --steps "$S" $COMMON \
    2>&1 | grep -E 'repeat [0-9]|error|Error' | cut -c1-300
  stamp "$m b$B: dlscale torch compiled"
  extra=""; [ "$PROF" = 1 ] && extra="--profile"
  python -m dlscale run --model "$m" --batch-size "$B" --warmup $((W + 5)) --steps "$S" --compile $extra $COMMON \
    2>&1 | grep -E 'repeat [0-9]|error|Error' | cut -c1-300
done
stamp "summary"
python benchmarks/summarize_jax_gpu.py "$OUTDIR" | tee "$OUTDIR/summary.md"
stamp "done"
