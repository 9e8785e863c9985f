#!/usr/bin/env bash
# Issue 18 on GPUs: loss parity of every strategy at 2 GPUs, and the GPU validity checks.
# Usage: [TAGS="parity validity fp32"] benchmarks/validity_parity_gpu.sh OUTDIR
#   parity    gpt2 amp-bf16, global batch 16: single (1 GPU) beside ddp, fsdp zero2, zero1 (b8 x 2),
#             tensor and pipeline 1f1b/4 micro-batches (b16 on 2 GPUs); resnet50 single vs ddp
#             (BatchNorm: expected to differ). -> OUTDIR/parity.md, parity.json: the measured
#             max rel. diff per strategy, against the bf16 tolerance 3e-2 of dlscale/parity.py
#   fp32      the same single/ddp/tensor gpt2 pair in fp32 (TF32): checks the 5e-3 CUDA fp32 tolerance
#   validity  ddp gpt2 on 2 GPUs, then again while another process runs matmuls on GPU 0:
#             the second record must carry competing_gpu (when NVML shares the pid namespace:
#             see unchecked) and show its throughput loss; both records' validity, the clock-event
#             fields (gpu_throttle_frac, gpu_power_cap_frac) and the peak-FLOPS row of this GPU
#             -> OUTDIR/validity.md, OUTDIR/report.md
# 10 warm-up + 20 timed steps, 1 repeat for parity (losses are what is compared), 3 for validity.
set -u
OUTDIR=$1
TAGS=${TAGS:-"parity validity"}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
COMMON="--warmup 10 --steps 20 --time-limit 300"

run() {  # STORE LOGNAME ARGS...
  local store=$1 log=$2
  shift 2
  echo "== dlscale run $*" | tee -a "$OUTDIR/$log.log"
  python -m dlscale run "$@" $COMMON --store "$OUTDIR/$store" >> "$OUTDIR/$log.log" 2>&1
  echo "   exit $?" | tee -a "$OUTDIR/$log.log"
}

has() { [[ " $TAGS " == *" $1 "* ]]; }

if has parity; then
  P="--model gpt2 --precision amp-bf16 --repeats 1"
  run parity parity $P --strategy single --batch-size 16
  run parity parity $P --strategy ddp --nproc-per-node 2 --batch-size 8
  run parity parity $P --strategy fsdp -o shard=zero2 --nproc-per-node 2 --batch-size 8
  run parity parity $P --strategy zero1 --nproc-per-node 2 --batch-size 8
  run parity parity $P --strategy tensor --nproc-per-node 2 --batch-size 16
  run parity parity $P --strategy pipeline -o microbatches=4 --nproc-per-node 2 --batch-size 16
  R="--model resnet50 --precision amp-bf16 --repeats 1"
  run parity parity $R --strategy single --batch-size 128
  run parity parity $R --strategy ddp --nproc-per-node 2 --batch-size 64
fi
if has fp32; then
  F="--model gpt2 --precision fp32 --repeats 1"
  run parity parity $F --strategy single --batch-size 16
  run parity parity $F --strategy ddp --nproc-per-node 2 --batch-size 8
  run parity parity $F --strategy tensor --nproc-per-node 2 --batch-size 16
fi
if has parity || has fp32; then
  python -m dlscale parity "$OUTDIR/parity" -o "$OUTDIR/parity.md"
  echo "parity exit $? (0: every strategy within tolerance)"
  python -m dlscale parity "$OUTDIR/parity" --format json -o "$OUTDIR/parity.json"
  cat "$OUTDIR/parity.md"
fi

if has validity; then
  V="--model gpt2 --precision amp-bf16 --strategy ddp --nproc-per-node 2 --batch-size 16 --repeats 3"
  run validity validity $V --label alone
  # a competing process on GPU 0 for the whole second case (bf16 matmuls in a loop)
  python - <<'EOF' > "$OUTDIR/competitor.log" 2>&1 &
import time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 600:
    a @ a
    torch.cuda.synchronize()
EOF
  COMPETITOR=$!
  sleep 15  # its CUDA context is up before the case starts
  run validity validity $V --label with-competitor
  kill "$COMPETITOR" 2>/dev/null
  wait "$COMPETITOR" 2>/dev/null
  python - "$OUTDIR/validity" > "$OUTDIR/validity.md" <<'EOF'
import sys
import torch
from dlscale.metrics import peak_entry
from dlscale.store import ResultStore

name = torch.cuda.get_device_name(0)
e = peak_entry(name)
print(f"device {name!r}: peak row {e.name if e else None} ({e.source if e else 'no peak: MFU unknown'})")
for r in ResultStore(sys.argv[1]).load().records:
    u = r.get("utilisation") or {}
    print(f"\n## {r['label']}: {r['summary']['samples_per_s']['median']:.1f} samples/s, MFU "
          f"{(r['summary'].get('mfu') or 0) * 100:.1f} %")
    print({k: u.get(k) for k in ("gpu_throttle_frac", "gpu_power_cap_frac", "gpu_throttle_reasons",
                                 "gpu_pids_comparable", "gpu_foreign_procs_max", "gpu_foreign_pids",
                                 "other_cpu_pct_mean", "case_cpu_cores_mean")})
    for f in r["validity"]["flags"]:
        print(f"  {f['severity']}: {f['check']}: {f['reason']}")
    for k, why in r["validity"]["unchecked"].items():
        print(f"  unchecked {k}: {why}")
EOF
  cat "$OUTDIR/validity.md"
  python -m dlscale report "$OUTDIR/validity" -o "$OUTDIR/report.md"
fi
