#!/usr/bin/env bash
# Issue 22 on the GPU: fresh 1-GPU / N-GPU DDP pairs, the all-reduce they ran on, and the model's
# held-out check of them (each N-GPU record predicted from its 1-GPU record only).
# Usage: bash benchmarks/perfmodel_gpu.sh OUTDIR [NPROCS ...]     (default: 1 2, plus 4 8 when present)
# Writes OUTDIR/store (records), OUTDIR/breakdown (one --breakdown run per model at the largest N),
# OUTDIR/validate.md and validate.json (dlscale predict --validate), OUTDIR/overlap.txt, OUTDIR/log.
# What it should show: every 2-GPU record within 5 % of its prediction (docs/perfmodel.md); at 4 and
# 8 GPUs the from-1-gpu errors of one switched node, and the measured overlap ratio at the largest N.
set -u
OUTDIR=$1; shift
NPROCS=("$@")
if [ ${#NPROCS[@]} -eq 0 ]; then
  G=$(nvidia-smi -L 2>/dev/null | wc -l)
  NPROCS=(1 2); [ "$G" -ge 4 ] && NPROCS+=(4); [ "$G" -ge 8 ] && NPROCS+=(8)
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
W=${W:-15}; S=${S:-40}; R=${R:-3}
CASES=${CASES:-"resnet50:256 bert-base:128 gpt2:16"}
mkdir -p "$OUTDIR"
exec > >(tee -a "$OUTDIR/log") 2>&1
NMAX=${NPROCS[-1]}
echo "== micro comm all_reduce at ${NMAX} and 2 GPUs $(date -u +%T)"
python -m dlscale micro comm --op all_reduce --nproc-per-node "$NMAX" --store "$OUTDIR/store"
for c in $CASES; do
  model=${c%%:*}; batch=${c##*:}
  for n in "${NPROCS[@]}"; do
    strat=single; [ "$n" -gt 1 ] && strat=ddp
    echo "== $model b$batch x$n $(date -u +%T)"
    python -m dlscale run --model "$model" --strategy $strat --nproc-per-node "$n" --batch-size "$batch" \
      --precision amp-bf16 --warmup $W --steps $S --repeats $R --store "$OUTDIR/store" --label perfmodel \
      2>&1 | grep -E 'repeat|samples/s|error'
  done
  echo "== $model b$batch x$NMAX --breakdown $(date -u +%T)"
  python -m dlscale run --model "$model" --strategy ddp --nproc-per-node "$NMAX" --batch-size "$batch" \
    --precision amp-bf16 --warmup $W --steps $S --repeats 1 --breakdown --store "$OUTDIR/breakdown" \
    --label perfmodel-breakdown 2>&1 | grep -E 'breakdown|overlap|error'
done
python -m dlscale predict --validate "$OUTDIR/store" > "$OUTDIR/validate.md"
python -m dlscale predict --validate "$OUTDIR/store" --format json > "$OUTDIR/validate.json"
cat "$OUTDIR/validate.md"
python - "$OUTDIR/breakdown" > "$OUTDIR/overlap.txt" <<'EOF'
import sys
from dlscale.report.data import load_records
for r in load_records(sys.argv[1]).records:
    b = r.get("breakdown") or {}
    if r.get("kind") == "run":
        print(r["config"]["model"], r["config"]["nproc_per_node"], "overlap_ratio", b.get("overlap_ratio"),
              "exposed_comm_ms", b.get("exposed_comm_ms"), "comm_ms", b.get("comm_ms"))
EOF
cat "$OUTDIR/overlap.txt"
