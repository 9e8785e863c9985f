"""Sampler overhead and step breakdown from a util_gpu.sh store: python benchmarks/summarize_util.py STORE"""
import statistics
import sys

from dlscale.store import ResultStore

recs = ResultStore(sys.argv[1]).load("run").records
by = {}
for r in recs:
    by.setdefault(r["label"], []).append(r)
off = [r["summary"]["samples_per_s"]["median"] for r in by.get("monitor-off", []) if r.get("summary")]
on = [r["summary"]["samples_per_s"]["median"] for r in by.get("monitor-on", []) if r.get("summary")]
if off and on:
    print(f"sampler off: {off}  on: {on}  on/off = {statistics.median(on) / statistics.median(off):.4f}")
for r in by.get("monitor-on", [])[:1]:
    u = r["utilisation"] or {}
    print("utilisation (gpt2 1 GPU):", {k: u.get(k) for k in ("gpu_util_pct_mean", "gpu_power_w_mean",
          "gpu_sm_clock_mhz_mean", "gpu_mem_used_bytes_mean", "cpu_util_pct_mean", "n_samples", "sampling_error")})
print("| model | GPUs | samples/s | step p50 ms | data | forward | backward (compute) | exposed comm | optimizer | all-reduce alone | overlap |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in by.get("breakdown", []):
    b, s = r.get("breakdown") or {}, r.get("summary") or {}
    if not b.get("supported"):
        print(r["config"]["model"], r["status"], r.get("error"), b)
        continue
    print(f"| {r['config']['model']} | {r['world_size']} | {s['samples_per_s']['median']:,.1f} | {s['step_ms_p50']:.2f} | "
          f"{b['data_ms']:.3f} | {b['forward_ms']:.2f} | {b['backward_ms']:.2f} ({b['backward_compute_ms']:.2f}) | "
          f"{b['exposed_comm_ms']:.2f} | {b['optimizer_ms']:.2f} | {b['comm_ms']:.2f} | {b['overlap_ratio'] * 100:.0f} % |")
