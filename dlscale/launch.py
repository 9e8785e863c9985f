"""A RunConfig -> repeats of torchrun subprocesses -> one record in the store.

Each repeat is one ``torchrun`` process group bounded by ``cfg.time_limit`` seconds; its ranks
write ``rank<R>.json`` files that are merged here. The case's status is the first non-ok
repeat's (``timeout`` beats ``oom`` beats ``failed``) and stops further repeats; the record is
appended whatever the status, so an OOM batch size is on file like a result.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable

from dlscale import envinfo, fp8, metrics
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
    if proc_rc != 0 and len(ranks) >= world:
        # every rank measured and reported ok, then a process died at exit (seen rarely as
        # "terminate called without an active exception" in torch's teardown): the measurement
        # stands; the repeat carries a warning.
        return "ok", None
    if proc_rc != 0 or len(ranks) < world:
        missing = sorted(set(range(world)) - {r["rank"] for r in ranks})
        last = [line for line in tail.splitlines() if line.strip()][-1:] or ["no output"]
        return "failed", f"torchrun exited {proc_rc}; ranks without a result: {missing}; last output: {last[0][:300]}"
    return "ok", None


# (phase, mark it ends at); each phase starts at the previous mark, the first at the spawn
PHASES = (("launch", "started"), ("import", "imported"), ("init", "process_group"), ("build", "built"),
          ("warmup", "warmed_up"), ("window", "window_done"), ("after", "finished"))


def process_phases(marks: dict[str, float] | None, spawned: float | None, ended: float) -> dict[str, float] | None:
    """Where a repeat's process time went, in seconds, from rank 0's wall-clock marks.

    launch: torchrun and the interpreter up to the worker's first line; import: torch and dlscale;
    init: the process group; build: model, strategy, batches; warmup; window (the timed steps and
    the two synchronisations); after: extras after the window (breakdown, profile, checks, record);
    exit: teardown until torchrun returned. A phase whose mark is missing (the rank failed
    before it) is left out, and the time goes to the next phase present. None without marks.
    """
    if not marks or "started" not in marks or spawned is None:
        return None
    out: dict[str, float] = {}
    prev = spawned
    for name, mark in PHASES:
        if mark in marks:
            out[name] = round(max(marks[mark] - prev, 0.0), 3)
            prev = marks[mark]
    out["exit"] = round(max(ended - prev, 0.0), 3)
    return out


def repeat_entry(i: int, cfg: RunConfig, ranks: list[dict], status: str, error: str | None,
                 seconds: float, started: float | None = None) -> dict[str, Any]:
    """One repeat of a case from its ranks' results; ``started``: when its process was spawned
    (epoch s), for the process phases."""
    entry: dict[str, Any] = {"repeat": i, "status": status, "error": error, "process_s": round(seconds, 3)}
    r0 = next((r for r in ranks if r.get("rank") == 0), None)
    r0 = r0 or next((r for r in ranks if r.get("status") == "ok"), None)  # multi-node: node without rank 0
    entry["phases_s"] = process_phases((r0 or {}).get("marks"), started, (started or 0.0) + seconds)
    mems = [r.get("peak_mem_allocated_bytes") for r in ranks if r.get("peak_mem_allocated_bytes") is not None]
    res = [r.get("peak_mem_reserved_bytes") for r in ranks if r.get("peak_mem_reserved_bytes") is not None]
    rss = [r.get("peak_rss_bytes") for r in ranks if r.get("peak_rss_bytes") is not None]
    entry["peak_mem_allocated_bytes"] = max(mems) if mems else None
    entry["peak_mem_reserved_bytes"] = max(res) if res else None
    entry["per_rank_peak_mem_allocated_bytes"] = [r.get("peak_mem_allocated_bytes") for r in ranks]
    entry["peak_rss_bytes"] = max(rss) if rss else None
    states = [r.get("model_state_mem_bytes") for r in ranks if r.get("model_state_mem_bytes") is not None]
    entry["model_state_mem_bytes"] = max(states) if states else None
    entry["per_rank_model_state_mem_bytes"] = [r.get("model_state_mem_bytes") for r in ranks] if states else None
    # per node, the local rank 0 samples the hardware; rank 0 measures the breakdown
    nodes = [r.get("utilisation") for r in ranks if r.get("utilisation") is not None]
    entry["utilisation"] = nodes[0] if nodes else None
    if len(nodes) > 1:
        entry["utilisation_per_node"] = nodes
    entry["breakdown"] = r0.get("breakdown") if r0 else None
    if r0 is not None and r0.get("profile"):  # rank 0's top ops (the trace file itself is staged)
        entry["profile_top_ops"] = r0["profile"].get("top_ops")
    if status == "ok" and r0 is not None:
        global_batch = cfg.batch_size * cfg.grad_accum * r0["dp_size"]
        entry.update({
            "samples_per_s": metrics.throughput(cfg.steps, global_batch, r0["window_s"]),
            "window_s": r0["window_s"],
            "warmup_s": r0.get("warmup_s"),
            "step_times_ms": r0["step_times_ms"],
            "window_wall": r0.get("window_wall"),
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
        "model_state_mem_bytes": max((r["model_state_mem_bytes"] for r in repeats if r.get("model_state_mem_bytes")),
                                     default=None),
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
    base = dict(kind="run", id=uuid.uuid4().hex, case_key=cfg.case_key(), label=cfg.label,
                command=command or "dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                config=cfg.to_dict(), device_type=device_type, world_size=cfg.world_size, env=env)
    reason = fp8.check(cfg, {"device_type": device_type}) or (
        strat.check(cfg, {"device_type": device_type}) if strat.check else None)
    if reason:
        rec = new_record(status="unsupported", error=reason, ranks=[], repeats=[], summary=None, **base)
        store.append(rec)
        return rec

    repeats: list[dict] = []
    ranks: list[dict] = []
    status, error = "ok", None
    emit = on_event or (lambda kind, payload: None)
    env_extra = _thread_env(device_type, strat, cfg, env_extra)
    base["omp_num_threads"] = env_extra.get("OMP_NUM_THREADS") if device_type == "cpu" else None
    # nn.DataParallel drives all the node's devices from one process
    nproc = 1 if strat.single_process else cfg.nproc_per_node
    # the ranks this launcher's torchrun starts (its node's share of the world)
    local_world = nproc if (strat.single_process or (rdzv and rdzv.nnodes > 1)) else cfg.world_size
    staging = Path(tempfile.mkdtemp(prefix="dlscale-traces-"))
    try:
        for i in range(cfg.repeats):
            with tempfile.TemporaryDirectory(prefix="dlscale-case-") as tmp:
                tmp_path = Path(tmp)
                (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
                proc = spawn_torchrun(WORKER_MODULE, ["--config", str(tmp_path / "config.json"), "--out", tmp],
                                      nproc, cfg.time_limit, env=env_extra, rdzv=rdzv,
                                      on_line=(lambda line: print(line, file=sys.stderr)) if verbose else None)
                rank_results = read_rank_files(tmp_path)
                series = _keep_artifacts(tmp_path, store, base["id"], i, staging)
            status_i, error_i = classify(proc.returncode, proc.timed_out, rank_results, local_world,
                                         proc.output_tail)
            entry = repeat_entry(i, cfg, rank_results, status_i, error_i, proc.seconds, proc.started)
            if status_i == "ok" and proc.returncode != 0:
                entry["warning"] = f"torchrun exited {proc.returncode} after every rank reported ok"
            entry["series"] = series
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
        # rank_results: the last repeat's ranks (every repeat's when all were ok)
        spec_info = {"params": next((r.get("params") for r in rank_results if r.get("params")), None),
                     "flops_per_sample": spec.flops_per_sample, "unit": spec.unit, "seq_len": spec.seq_len}
        dp_size = next((r.get("dp_size") for r in rank_results if r.get("dp_size")), None)
        rec = new_record(status=status, error=error, ranks=ranks, model=spec_info,
                         global_batch=cfg.batch_size * cfg.grad_accum * dp_size if dp_size else None,
                         tf32=next((r.get("tf32") for r in rank_results if "tf32" in r), None),
                         strategy_info=next((r.get("strategy_info") for r in rank_results
                                             if r.get("strategy_info")), None),
                         repeats=repeats,
                         summary=summarize_case(cfg, spec, repeats, rank_results, device_type) if any(
                             r["status"] == "ok" for r in repeats) else None,
                         **base, **_median_repeat_extras(repeats, store, base["id"], staging))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    store.append(rec)
    return rec


def _thread_env(device_type: str, strat, cfg: RunConfig, env_extra: dict[str, str] | None) -> dict[str, str]:
    """On the CPU, give each rank an equal share of the cores (torchrun sets 1 thread per rank
    only when it starts several), so 1-process baselines and N-process runs use the machine alike."""
    env = dict(env_extra or {})
    if device_type == "cpu" and "OMP_NUM_THREADS" not in env and "OMP_NUM_THREADS" not in os.environ:
        local = 1 if strat.single_process else cfg.nproc_per_node
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // local))
    return env


def _keep_artifacts(tmp: Path, store: ResultStore, rec_id: str, repeat: int, staging: Path) -> list[str]:
    """Move a repeat's utilisation series into the store (beside the records) and stage its trace."""
    kept = []
    for f in sorted(tmp.glob("series-rank*.jsonl")):
        dest = store.root / "series" / f"{rec_id}-r{repeat}-{f.stem.split('-', 1)[1]}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(f), dest)
        kept.append(str(dest.relative_to(store.root)))
    if (tmp / "trace.json").exists():
        shutil.move(str(tmp / "trace.json"), staging / f"trace-r{repeat}.json")
    return kept


def median_repeat(repeats: list[dict]) -> dict | None:
    """The ok repeat whose throughput is the median (the lower middle one for an even count)."""
    ok = sorted((r for r in repeats if r["status"] == "ok"), key=lambda r: r["samples_per_s"])
    return ok[(len(ok) - 1) // 2] if ok else None


def _median_repeat_extras(repeats: list[dict], store: ResultStore, rec_id: str, staging: Path) -> dict:
    """Utilisation, breakdown and profiler trace of the median repeat, for the record's top level."""
    med = median_repeat(repeats)
    if med is None:
        return {"utilisation": None, "breakdown": None, "trace": None, "profile_top_ops": None}
    trace = None
    staged = staging / f"trace-r{med['repeat']}.json"
    if staged.exists():
        dest = store.root / "traces" / f"{rec_id}.json"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), dest)
        trace = str(dest.relative_to(store.root))
    return {"utilisation": med.get("utilisation"), "breakdown": med.get("breakdown"),
            "median_repeat": med["repeat"], "trace": trace, "profile_top_ops": med.get("profile_top_ops")}
