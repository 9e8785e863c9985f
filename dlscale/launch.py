"""A RunConfig -> repeats of torchrun subprocesses -> one record in the store.

Each repeat is one ``torchrun`` process group bounded by ``cfg.time_limit`` seconds; its ranks
write ``rank<R>.json`` files that are merged here. The case's status is the first non-ok
repeat's (``timeout`` beats ``oom`` beats ``failed``) and stops further repeats; the record is
appended whatever the status, so an OOM batch size is on file like a result.
"""
from __future__ import annotations

import json
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from dlscale import envinfo, metrics
from dlscale.config import RunConfig, validate_for_launch
from dlscale.models import get_model
from dlscale.procs import Rendezvous, spawn_torchrun
from dlscale.store import ResultStore, new_record
from dlscale.strategies import get_strategy

WORKER_MODULE = "dlscale.worker"


def read_rank_files(out_dir: Path) -> list[dict[str, Any]]:
    ranks = []
    for p in sorted(out_dir.glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        try:
            ranks.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return ranks


def classify(proc_rc: int | None, timed_out: bool, ranks: list[dict], world: int, tail: str) -> tuple[str, str | None]:
    """(status, error) of one repeat from the process result and the ranks' own reports."""
    if timed_out:
        hung = sorted(set(range(world)) - {r["rank"] for r in ranks if r.get("status") == "ok"})
        return "timeout", f"time limit reached; ranks not finished: {hung}"
    bad = [r for r in ranks if r.get("status") != "ok"]
    oom = [r for r in bad if r.get("status") == "oom"]
    if oom:
        return "oom", f"rank {oom[0]['rank']}: {oom[0].get('error')}"
    if bad:
        return "failed", f"rank {bad[0]['rank']}: {bad[0].get('error')}"
    if proc_rc != 0 or len(ranks) < world:
        missing = sorted(set(range(world)) - {r["rank"] for r in ranks})
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["no output"]
        return "failed", f"torchrun exited {proc_rc}; ranks without a result: {missing}; last output: {last[0][:300]}"
    return "ok", None


def repeat_entry(i: int, cfg: RunConfig, ranks: list[dict], status: str, error: str | None,
                 seconds: float) -> dict[str, Any]:
    entry: dict[str, Any] = {"repeat": i, "status": status, "error": error, "process_s": round(seconds, 3)}
    r0 = next((r for r in ranks if r.get("rank") == 0), None)
    mems = [r.get("peak_mem_allocated_bytes") for r in ranks if r.get("peak_mem_allocated_bytes") is not None]
    res = [r.get("peak_mem_reserved_bytes") for r in ranks if r.get("peak_mem_reserved_bytes") is not None]
    rss = [r.get("peak_rss_bytes") for r in ranks if r.get("peak_rss_bytes") is not None]
    entry["peak_mem_allocated_bytes"] = max(mems) if mems else None
    entry["peak_mem_reserved_bytes"] = max(res) if res else None
    entry["per_rank_peak_mem_allocated_bytes"] = [r.get("peak_mem_allocated_bytes") for r in ranks]
    entry["peak_rss_bytes"] = max(rss) if rss else None
    if status == "ok" and r0 is not None:
        global_batch = cfg.batch_size * cfg.grad_accum * r0["dp_size"]
        entry.update({
            "samples_per_s": metrics.throughput(cfg.steps, global_batch, r0["window_s"]),
            "window_s": r0["window_s"],
            "warmup_s": r0.get("warmup_s"),
            "step_times_ms": r0["step_times_ms"],
            "loss_first": (r0.get("warmup_losses") or [None])[0],
            "loss_last": r0.get("loss_last"),
            "loss_after": r0.get("loss_after"),
            "warmup_losses": r0.get("warmup_losses"),
        })
    return entry


def summarize_case(cfg: RunConfig, spec, repeats: list[dict], ranks: list[dict], device_type: str) -> dict[str, Any]:
    ok = [r for r in repeats if r["status"] == "ok"]
    tput = metrics.summarize(r["samples_per_s"] for r in ok)
    steps = [t for r in ok for t in r["step_times_ms"]]
    median = tput["median"]
    per_device = median / cfg.world_size if median else None
    device_name = next((r.get("device_name") for r in ranks if r.get("device_name")), None)
    dtype = metrics.precision_dtype(cfg.precision, device_type)
    peak, source = metrics.peak_flops(device_name if device_type == "cuda" else None, dtype)
    mems = [r["peak_mem_allocated_bytes"] for r in repeats if r.get("peak_mem_allocated_bytes")]
    res = [r["peak_mem_reserved_bytes"] for r in repeats if r.get("peak_mem_reserved_bytes")]
    rss = [r["peak_rss_bytes"] for r in repeats if r.get("peak_rss_bytes")]
    return {
        "samples_per_s": tput,
        "samples_per_s_per_device": per_device,
        "tokens_per_s": median * spec.seq_len if (median and spec.seq_len) else None,
        "step_ms_p50": metrics.percentile(steps, 50) if steps else None,
        "step_ms_p90": metrics.percentile(steps, 90) if steps else None,
        "peak_mem_allocated_bytes": max(mems) if mems else None,
        "peak_mem_reserved_bytes": max(res) if res else None,
        "peak_rss_bytes": max(rss) if rss else None,
        "mfu": metrics.mfu(spec.flops_per_sample, per_device, peak) if per_device else None,
        "peak_flops": peak,
        "peak_flops_source": source,
        "dtype": dtype,
        "device_name": device_name,
    }


def run_case(cfg: RunConfig, store: ResultStore, *, command: str | None = None,
             rdzv: Rendezvous | None = None, env_extra: dict[str, str] | None = None,
             on_event: Callable[[str, Any], None] | None = None,
             verbose: bool = False) -> dict[str, Any]:
    """Measure one case (cfg.repeats torchrun runs) and append its record; returns the record.

    ``on_event(kind, payload)`` reports progress: ("repeat", entry) after each repeat and
    ("ranks", rank list) after the first. Bad input raises ConfigError before anything runs.
    """
    device_type = validate_for_launch(cfg)
    store.check_writable()
    spec = get_model(cfg.model, cfg.flavor)
    strat = get_strategy(cfg.strategy)
    env = envinfo.capture()
    base = dict(kind="run", case_key=cfg.case_key(), label=cfg.label,
                command=command or "dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                config=cfg.to_dict(), device_type=device_type, world_size=cfg.world_size, env=env)
    reason = strat.check(cfg, {"device_type": device_type}) if strat.check else None
    if reason:
        rec = new_record(status="unsupported", error=reason, ranks=[], repeats=[], summary=None, **base)
        store.append(rec)
        return rec

    repeats: list[dict] = []
    ranks: list[dict] = []
    ranks_last: list[dict] = []
    status, error = "ok", None
    emit = on_event or (lambda kind, payload: None)
    for i in range(cfg.repeats):
        with tempfile.TemporaryDirectory(prefix="dlscale-case-") as tmp:
            tmp_path = Path(tmp)
            (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
            proc = spawn_torchrun(WORKER_MODULE, ["--config", str(tmp_path / "config.json"), "--out", tmp],
                                  cfg.nproc_per_node, cfg.time_limit, env=env_extra, rdzv=rdzv,
                                  on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None)
            rank_results = read_rank_files(tmp_path)
        local_world = cfg.nproc_per_node if (rdzv and rdzv.nnodes > 1) else cfg.world_size
        status_i, error_i = classify(proc.returncode, proc.timed_out, rank_results,
                                     cfg.world_size if not (rdzv and rdzv.nnodes > 1) else local_world, proc.output_tail)
        entry = repeat_entry(i, cfg, rank_results, status_i, error_i, proc.seconds)
        repeats.append(entry)
        if i == 0:
            ranks = [{k: r.get(k) for k in ("rank", "local_rank", "host", "device", "device_name", "pid")}
                     for r in rank_results]
            emit("ranks", ranks)
        emit("repeat", entry)
        if status_i != "ok":
            status, error = status_i, error_i
            if proc.output_tail and status_i == "failed":
                entry["output_tail"] = proc.output_tail[-4000:]
            break
        ranks_last = rank_results
    spec_info = {"params": next((r.get("params") for r in rank_results if r.get("params")), None),
                 "flops_per_sample": spec.flops_per_sample, "unit": spec.unit, "seq_len": spec.seq_len}
    dp_size = next((r.get("dp_size") for r in rank_results if r.get("dp_size")), None)
    ok_ranks = ranks_last if status == "ok" else rank_results
    rec = new_record(status=status, error=error, ranks=ranks, model=spec_info,
                     global_batch=cfg.batch_size * cfg.grad_accum * dp_size if dp_size else None,
                     tf32=next((r.get("tf32") for r in ok_ranks if "tf32" in r), None),
                     strategy_info=next((r.get("strategy_info") for r in ok_ranks if r.get("strategy_info")), None),
                     repeats=repeats,
                     summary=summarize_case(cfg, spec, repeats, ok_ranks, device_type) if any(
                         r["status"] == "ok" for r in repeats) else None,
                     **base)
    store.append(rec)
    return rec
