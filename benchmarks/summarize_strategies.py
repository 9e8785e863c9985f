"""Issue 4 tables from a strategies_gpu.sh store: python benchmarks/summarize_strategies.py STORE

Per model: throughput, speedup over the 1-GPU `single` case, ratio to DDP, peak memory per GPU,
and the model-state memory measured as the optimizer step begins (record field
model_state_mem_bytes, the largest rank) against the ZeRO prediction of dlscale/strategies/_memory.py.
Pipelines: the blocks per stage (and the timed cost of each stage with balance=time), and every
pipeline's ratio to the unpipelined `model` split of the same batch. Profiled records: rank 0's
top device ops per step and the step breakdown.
"""
import sys

from dlscale.store import ResultStore
from dlscale.strategies._memory import predicted_model_state_bytes

GIB = 2 ** 30


def name(r):
    c = r["config"]
    opts = c.get("strategy_options") or {}
    return c["strategy"] + "".join(f" {k}={v}" for k, v in sorted(opts.items()))


def median(r):
    s = r.get("summary") or {}
    return (s.get("samples_per_s") or {}).get("median")


recs = [r for r in ResultStore(sys.argv[1]).load("run").records if not (r.get("label") or "").startswith("mem-")]
def group(r):
    c = r["config"]
    return c["model"], c["batch_size"], bool(c.get("compile"))


for model, b, compiled in sorted({group(r) for r in recs}):
    rows = [r for r in recs if group(r) == (model, b, compiled)]
    single = next((median(r) for r in rows if r["config"]["strategy"] == "single" and r["status"] == "ok"), None)
    ddp = next((median(r) for r in rows if r["config"]["strategy"] == "ddp" and r["status"] == "ok"), None)
    print(f"\n### {model}, bf16 autocast{', compiled' if compiled else ''}, batch {b} per data-parallel rank\n")
    print("| strategy | GPUs | samples/s | speedup vs 1 GPU | vs ddp | peak alloc / GPU | model state / GPU "
          "(measured) | predicted (ZeRO model) | gap | stages: blocks (ms) | status |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, s = r["config"], r.get("summary") or {}
        m = median(r) if r["status"] == "ok" else None
        params = (r.get("model") or {}).get("params")
        world = r.get("world_size") or 1
        meas = s.get("model_state_mem_bytes")
        try:
            pred = predicted_model_state_bytes(c["strategy"], params, world, options=c.get("strategy_options"),
                                               deepspeed_mixed=False) if params else None
        except ValueError:
            pred = None
        gap = f"{(meas - pred) / pred * 100:+.0f} %" if (meas and pred) else "—"
        info = r.get("strategy_info") or {}
        stages = "—"
        if info.get("blocks_per_stage"):
            stages = "/".join(map(str, info["blocks_per_stage"]))
            if info.get("stage_cost_ms"):
                stages += " (" + "/".join(f"{x:.1f}" for x in info["stage_cost_ms"]) + ")"
        fmt = (lambda v, d=1: f"{v:,.{d}f}" if v is not None else "—")
        print(f"| {name(r)} | {world} | {fmt(m)} | {fmt(m / single if m and single else None, 2)} | "
              f"{fmt(m / ddp if m and ddp else None, 3)} | "
              f"{fmt((s.get('peak_mem_allocated_bytes') or 0) / GIB or None, 2)} GiB | "
              f"{fmt(meas / GIB if meas else None, 2)} GiB | {fmt(pred / GIB if pred else None, 2)} GiB | {gap} | "
              f"{stages} | "
              f"{r['status']}{': ' + (r.get('error') or '')[:80] if r['status'] != 'ok' else ''} |")
    split = next((median(r) for r in rows if r["config"]["strategy"] == "model" and r["status"] == "ok"), None)
    for r in rows:
        if r["config"]["strategy"] == "pipeline" and r["status"] == "ok" and split:
            print(f"\n{name(r)} / model = {median(r) / split:.2f}x")
    for r in rows:
        if r.get("profile_top_ops"):
            bd = r.get("breakdown") or {}
            print(f"\n{name(r)}: rank 0's top device ops per step (profile of 3 steps after the window)"
                  + (f"; breakdown: step {bd.get('step_ms', 0):.2f} ms = data {bd.get('data_ms', 0):.2f} + forward "
                     f"{bd.get('forward_ms', 0):.2f} + backward {bd.get('backward_ms', 0):.2f} + optimizer "
                     f"{bd.get('optimizer_ms', 0):.2f}" if bd.get("supported") else "") + "\n")
            print("| op | calls/step | ms/step |\n|---|---|---|")
            for o in r["profile_top_ops"]:
                print(f"| `{o['name'][:90]}` | {o['calls_per_step']:g} | {o['self_ms_per_step']:.3f} |")
