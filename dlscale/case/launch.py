"""One case -> one Record: ``measure(cfg, spawner)``, the repeat loop every launcher shares.

Each repeat is one fresh set of processes started by a spawner (torchrun here, or this node's
share of a rendezvous; a Slurm task; others plug in the same way) and bounded by
``cfg.time_limit`` seconds; its ranks write ``rank<R>.json`` files that are merged here. The
case's status is the first non-ok repeat's (``timeout`` beats ``oom`` beats ``failed``) and stops
further repeats. ``measure`` never stores: the caller decides (``run``/``sweep`` store the record
whatever its status, so an OOM batch size is on file like a result; a batch-size probe drops it).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from dlscale import frameworks, inputs
from dlscale.case import stacks
from dlscale.case.rankfiles import read_results, read_started
from dlscale.results import envinfo, metrics, validity
from dlscale.train import energy, fp8
from dlscale.case.config import RunConfig
from dlscale.case import procs
from dlscale.case.procs import ProcResult, Rendezvous, spawn_torchrun
from dlscale.results.record import Record
from dlscale.case.resolve import ResolvedCase, resolve
from dlscale.quality import target as quality_target
from dlscale.results.store import StoreError
from dlscale.strategies import get_strategy



# torchrun's failure summary, one entry per failed local rank ("Root Cause" is the first observed)
_TORCHRUN_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
# torchrun's rendezvous gave up on nodes that never joined (c10d: RendezvousTimeoutError; static:
# "Timed out after N seconds waiting for clients. 1/2 clients joined.")
_JOIN_TIMEOUT = re.compile(r"RendezvousTimeoutError|waiting for clients\. (\d+)/(\d+) clients joined")
# a rank gave up waiting in a collective for a peer (gloo's read/connect time-outs, NCCL's watchdog)
_COLLECTIVE_TIMEOUT = re.compile(r"timed out|timeout|DEADLINE_EXCEEDED", re.IGNORECASE)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def killed_ranks(tail: str) -> list[tuple[int, str]]:
    """(rank, signal name) of ranks that torchrun reports killed by a signal, the root cause first."""
    root = tail.rfind("Root Cause")
    found = _TORCHRUN_FAILURE.findall(tail[root:]) if root >= 0 else []
    found += _TORCHRUN_FAILURE.findall(tail[:root] if root >= 0 else tail)
    out: list[tuple[int, str]] = []
    for rank, code in found:
        if int(code) < 0 and int(rank) not in {r for r, _ in out}:
            out.append((int(rank), _signal_name(-int(code))))
    return out


def classify(proc: ProcResult, ranks: list[dict], world: int, started: dict[int, int] | None = None,
             rank_stacks: dict[int, list] | None = None) -> tuple[str, str | None]:
    """(status, error) of one repeat from the process result and the ranks' own reports.

    ``started``: rank -> pid of the ranks that started (``read_started``); ``proc.stopped_pids``:
    processes found stopped when the time limit struck. A rank that stalls is named as the cause
    (``timeout``), not the healthy peer that gave up waiting for it in a collective; a rank
    killed by a signal is named with the signal. ``rank_stacks``: rank -> main-thread frames dumped at
    the time limit (dlscale/case/stacks.py): the unfinished ranks are named with where they were.
    """
    everyone = sorted(set(range(world)) | set(started or {}))
    if proc.timed_out:
        return _timed_out(ranks, everyone, started, proc.stopped_pids, rank_stacks)
    join = _JOIN_TIMEOUT.search(proc.output_tail) if not ranks else None
    if join:
        joined = f" ({join.group(1)} of {join.group(2)} nodes joined)" if join.group(1) else ""
        return "timeout", (f"a peer node never joined the rendezvous{joined} within the join timeout "
                           "(--collective-timeout); no rank started")
    bad = [r for r in ranks if r.get("status") != "ok"]
    oom = [r for r in bad if r.get("status") == "oom"]
    if oom:
        return "oom", f"rank {oom[0]['rank']}: {oom[0].get('error')}"
    return _ended(proc, ranks, bad, everyone, world)


def _timed_out(ranks: list[dict], everyone: list[int], started: dict[int, int] | None,
               stopped_pids: list[int] | None, rank_stacks: dict[int, list] | None) -> tuple[str, str]:
    """classify's time-limit case: who was stopped, who never started, where the rest were."""
    hung = sorted(set(everyone) - {r["rank"] for r in ranks if r.get("status") == "ok"})
    stopped = sorted(r for r, pid in (started or {}).items() if pid in set(stopped_pids or ()))
    if stopped:
        names = ", ".join(f"rank {r}" for r in stopped)
        return "timeout", (f"time limit reached; {names} was stopped (SIGSTOP) and did not reach the next "
                           f"collective; ranks not finished: {hung}")
    held = (f"; {len(stopped_pids)} process(es) of the case were found stopped (SIGSTOP)"
            if stopped_pids else "")
    if started is not None and set(started) and set(everyone) - set(started):
        never = ", ".join(f"rank {r}" for r in sorted(set(everyone) - set(started)))
        return "timeout", f"time limit reached; {never} never started{held}; ranks not finished: {hung}"
    seen = stacks.summary(rank_stacks or {}, hung)
    return "timeout", f"time limit reached{held}; ranks not finished: {hung}" + (f". {seen}" if seen else "")


def _ended(proc: ProcResult, ranks: list[dict], bad: list[dict], everyone: list[int],
           world: int) -> tuple[str, str | None]:
    """classify's case of processes that ended by themselves: stalls, kills, failures, or ok."""
    proc_rc, tail = proc.returncode, proc.output_tail
    reported = {r["rank"] for r in ranks}
    killed = [(r, name) for r, name in killed_ranks(tail) if r not in reported]
    missing = sorted(set(everyone) - reported)
    # before the killed ranks: a stalled (e.g. SIGSTOPped) rank cannot act on torchrun's SIGTERM after its
    # peers' collective timeout and is SIGKILLed 30 s later; a rank killed first never lets a peer time out
    if bad and missing and all(_COLLECTIVE_TIMEOUT.search(str(r.get("error") or "")) for r in bad):
        who = ", ".join(f"rank {r}" for r in missing)
        after = "".join(f"; then rank {r} was killed by {name} (torchrun ending the case)" for r, name in killed)
        return "timeout", (f"{who} did not reach the collective (stalled) within the collective timeout; "
                           f"rank {bad[0]['rank']} gave up waiting: {bad[0].get('error')}{after}")
    # SIGTERM is how torchrun ends the other ranks after a first failure: not a cause
    cause = [(r, name) for r, name in killed if name != "SIGTERM"] or (killed if not bad else [])
    if cause:
        r, name = cause[0]
        extra = " (the kernel's out-of-memory killer also sends it)" if name == "SIGKILL" else ""
        peers = f"; then rank {bad[0]['rank']}: {bad[0].get('error')}" if bad else ""
        return "failed", f"rank {r} was killed by {name}{extra}{peers}"
    if bad:
        return "failed", f"rank {bad[0]['rank']}: {bad[0].get('error')}"
    if proc_rc != 0 and len(ranks) >= world:
        # every rank measured and reported ok, then a process died at exit (seen rarely as
        # "terminate called without an active exception" in torch's teardown): the measurement
        # stands; the repeat carries a warning.
        return "ok", None
    if proc_rc is not None and proc_rc < 0:
        return "failed", (f"the launcher (torchrun) was killed by {_signal_name(-proc_rc)}; its ranks were ended "
                          f"with it; ranks without a result: {missing}")
    if proc_rc != 0 or len(ranks) < world:
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
    entry["data"] = inputs.merge_ranks(ranks)  # real data: waits, loader CPU and reads (None: synthetic)
    if r0 is not None and r0.get("profile"):  # rank 0's top ops (the trace file itself is staged)
        entry["profile_top_ops"] = r0["profile"].get("top_ops")
    if status == "ok" and r0 is not None:
        global_batch = cfg.batch_size * cfg.grad_accum * r0["dp_size"]
        steps = r0.get("window_steps") or cfg.steps  # --min-window: as many as the warm-up called for
        entry.update({
            "samples_per_s": metrics.throughput(steps, global_batch, r0["window_s"]),
            "window_steps": steps,
            "window_s": r0["window_s"],
            "warmup_s": r0.get("warmup_s"),
            "step_times_ms": r0["step_times_ms"],
            "window_wall": r0.get("window_wall"),
            "loss_first": (r0.get("warmup_losses") or [None])[0],
            "loss_last": r0.get("loss_last"),
            "loss_after": r0.get("loss_after"),
            "loss_after_steps": r0.get("loss_after_steps"),  # training steps before loss_after (parity)
            "warmup_losses": r0.get("warmup_losses"),
            "loss_scope": r0.get("loss_scope"),  # "global": the losses are the global batch's (parity.py)
            "nonfinite_losses": r0.get("nonfinite_losses"),  # losses read that were NaN or inf (stored as null)
        })
        # --until: the counters span all the steps trained, which the reading says
        counted = (r0.get("energy") or {}).get("steps") or steps
        used = energy.merge_nodes(ranks, counted * global_batch, cfg.nnodes)
        if used is not None:  # only where a counter was read at both ends of the window
            entry["energy"] = used
        if r0.get("checkpoint"):  # --checkpoint-every: the saves timed after the window (checkpoint_timing)
            entry["checkpoint"] = r0["checkpoint"]
        if r0.get("rank_steps"):  # every rank's window and solo steps, gathered after the window (ranktimes)
            entry["rank_steps"] = r0["rank_steps"]
        if r0.get("quality") is not None:  # --until: target, curve, samples and seconds to it
            entry["quality"] = r0["quality"]
        if r0.get("loss_scale") is not None:  # amp-fp16: the scaler's scale around the window, rank 0's
            entry.update({"loss_scale": r0["loss_scale"], "skipped_steps": r0.get("skipped_steps"),
                          "loss_scale_tracker": r0.get("loss_scale_tracker")})
    return entry


def summarize_case(cfg: RunConfig, spec, repeats: list[dict], ranks: list[dict], device_type: str) -> dict[str, Any]:
    ok = [r for r in repeats if r["status"] == "ok"]
    tput = metrics.summarize(r["samples_per_s"] for r in ok)
    steps = [t for r in ok for t in r["step_times_ms"]]
    median = tput["median"]
    per_device = median / cfg.world_size if median else None
    device_name = next((r.get("device_name") for r in ranks if r.get("device_name")), None)
    tf32 = next((r.get("tf32") for r in ranks if r.get("tf32") is not None), None)
    dtype = metrics.precision_dtype(cfg.precision, device_type, device_name, tf32)
    gpu = device_name if device_type == "cuda" else None
    peak, source = metrics.peak_flops(gpu, dtype)
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
        "peak": metrics.peak_used(gpu, dtype),
        "device_name": device_name,
        **energy.summary_fields(repeats, spec.seq_len),  # measured energy counters only
    }


class Spawner(Protocol):
    """Starts one repeat's ranks for a case and waits for them (bounded by the case's time limit).

    The ranks write ``rank<R>.json`` into ``workdir`` (which also holds ``config.json``);
    ``local_world`` is how many of them this spawner starts (its node's share of the world).
    """

    def local_world(self, cfg: RunConfig) -> int: ...

    def start(self, cfg: RunConfig, workdir: Path, env: dict[str, str]) -> ProcResult: ...


@dataclass
class TorchrunSpawner:
    """torchrun on this machine: the whole world, or this node's share of a rendezvous."""

    rdzv: Rendezvous | None = None
    env: dict[str, str] | None = None
    on_line: Callable[[str], None] | None = None
    module: str | None = None  # the worker; default: the case's framework's (dlscale/frameworks)

    def _nproc(self, cfg: RunConfig) -> int:
        # nn.DataParallel drives all the node's devices from one process
        return 1 if get_strategy(cfg.strategy).single_process else cfg.nproc_per_node

    def local_world(self, cfg: RunConfig) -> int:
        multi = self.rdzv is not None and self.rdzv.nnodes > 1
        return self._nproc(cfg) if (get_strategy(cfg.strategy).single_process or multi) else cfg.world_size

    def start(self, cfg: RunConfig, workdir: Path, env: dict[str, str]) -> ProcResult:
        module = self.module or frameworks.worker_module(cfg.framework)
        try:
            return spawn_torchrun(module, ["--config", str(workdir / "config.json"), "--out", str(workdir)],
                                  self._nproc(cfg), cfg.time_limit, env={**(self.env or {}), **env}, rdzv=self.rdzv,
                                  on_line=self.on_line,
                                  on_deadline=lambda stopped: stacks.request(workdir, read_started(workdir),
                                                                             skip=set(stopped)))
        finally:
            if hasattr(self.on_line, "close"):
                self.on_line.close()  # a phase the workers never ended (a crash) stops ticking


def measure(case: ResolvedCase | RunConfig, spawner: Spawner, *, files_root: Path | None = None,
            command: str | None = None, on_event: Callable[[str, Any], None] | None = None) -> Record:
    """Measure one case: ``cfg.repeats`` fresh runs through ``spawner``, merged into a Record.

    ``case``: resolved (dlscale/case/resolve.py; a bare RunConfig is resolved here). Nothing is stored:
    the caller decides. ``files_root``: where utilisation series and the median repeat's trace go
    (``series/``, ``traces/`` below it; the store's directory), None to drop them.
    ``on_event(kind, payload)``: ("ranks", rank list) after the first repeat and ("repeat", entry)
    after each. Bad input raises ConfigError before anything runs.
    """
    case = case if isinstance(case, ResolvedCase) else resolve(case)
    cfg, device_type, spec, strat = case.cfg, case.device_type, case.spec, case.strategy
    rec = Record(status="ok", error=None, config=cfg.to_dict(), case_key=cfg.case_key(), label=cfg.label,
                 command=command or "dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                 device_type=device_type, world_size=cfg.world_size,
                 env=envinfo.capture(framework=cfg.framework, device_type=device_type),
                 backend="nccl" if device_type == "cuda" else "gloo", data_set=inputs.describe(cfg))
    reason = fp8.check(cfg, {"device_type": device_type}) or frameworks.unsupported_reason(
        cfg, {"device_type": device_type}, strat.unsupported)
    if reason:
        rec.status, rec.error = "unsupported", reason
        return rec
    emit = on_event or (lambda kind, payload: None)
    local_world = spawner.local_world(cfg)
    env = thread_env(device_type, cfg, local_world)
    rec.omp_num_threads = env.get("OMP_NUM_THREADS") if device_type == "cpu" else None
    env.update({k: str(v) for k, v in cfg.env.items()})  # the case's own tuning variables
    rank_results: list[dict] = []  # the last finished repeat's rank files (every repeat's when all were ok)
    procs.clean_stale_tempdirs()  # what a SIGKILLed dlscale left behind
    with tempfile.TemporaryDirectory(prefix=procs.temp_prefix("traces")) as staging_dir:
        staging = Path(staging_dir)
        try:
            _repeat_loop(_Repeats(cfg, spawner, env, local_world, files_root, staging, emit), rec, rank_results)
        except KeyboardInterrupt as e:  # a signal to dlscale: the repeats that finished are kept
            if not any(r["status"] == "ok" for r in rec.repeats):
                raise
            rec.status, rec.error = "interrupted", interrupted_error(e, len(rec.repeats), cfg.repeats)
            with procs.uninterrupted():
                _finish(cfg, spec, rec, rank_results, device_type, files_root, staging)
            raise Interrupted(rec, *e.args) from None
        _finish(cfg, spec, rec, rank_results, device_type, files_root, staging)
    return rec


class Interrupted(KeyboardInterrupt):
    """A signal stopped a case after some of its repeats finished: ``record`` holds them (status
    ``interrupted``; a Record, or an external run's record dict) for the caller to store; otherwise
    a KeyboardInterrupt like any other."""

    def __init__(self, record: Record | dict[str, Any], *args):
        super().__init__(*args)
        self.record = record


def interrupted_error(e: KeyboardInterrupt, finished: int, repeats: int) -> str:
    """The ``error`` of an interrupted record."""
    by = f" by {e.args[0]}" if e.args else ""
    return (f"interrupted{by} during repeat {finished + 1}/{repeats}: the {finished} repeat(s) that finished "
            f"are kept; the case runs again in full")


def keep_interrupted(e: KeyboardInterrupt, store, sweep: dict[str, str] | None = None) -> str:
    """Store the repeats that finished before the signal (an ``Interrupted``'s record, given its
    ``sweep`` origin); one clause saying what became of them."""
    rec = getattr(e, "record", None)
    if rec is None:
        return f"no repeat of it had finished, no record was written to {store.file}"
    data = rec.to_dict() if isinstance(rec, Record) else dict(rec)
    if sweep:
        data["sweep"] = sweep
    n = len(data["repeats"])
    try:
        store.append_uninterrupted(data)
    except StoreError as err:  # kept in the recovery file it names
        return f"its {n} finished repeat(s) could not be stored: {err}"
    return (f"its {n} finished repeat(s) are in {store.file} as record {data['id'][:12]} (status "
            f"interrupted; a sweep measures the case again in full)")


@dataclass
class _Repeats:
    """How a case's repeats are run: the same for each of them."""

    cfg: RunConfig
    spawner: Spawner
    env: dict[str, str]  # the ranks' environment (threads, the case's tuning variables)
    local_world: int  # the ranks this spawner starts
    files_root: Path | None  # the store's directory (series), None to drop them
    staging: Path  # traces kept until the median repeat is known
    emit: Callable[[str, Any], None]


def _repeat_loop(run: _Repeats, rec: Record, rank_results: list[dict]) -> None:
    """Run the repeats into ``rec.repeats``, stopping at the first that is not ok; ``rank_results``
    is set in place to each finished repeat's rank files (a signal leaves the last finished one's)."""
    cfg, spawner, env, local_world, emit = run.cfg, run.spawner, run.env, run.local_world, run.emit
    for i in range(cfg.repeats):
        with tempfile.TemporaryDirectory(prefix=procs.temp_prefix("case")) as tmp:
            workdir = Path(tmp)
            run_cfg = quality_target.repeat_config(cfg, i)  # --until: repeats over seeds
            (workdir / "config.json").write_text(json.dumps(run_cfg.to_dict()))
            proc = spawner.start(run_cfg, workdir, env)
            rank_results[:] = read_results(workdir)
            started = read_started(workdir)
            rank_stacks = stacks.read(workdir) if proc.timed_out else {}
            series = _keep_artifacts(workdir, run.files_root, rec.id, i, run.staging)
        status_i, error_i = classify(proc, rank_results, local_world, started=started or None,
                                     rank_stacks=rank_stacks)
        entry = repeat_entry(i, cfg, rank_results, status_i, error_i, proc.seconds, proc.started)
        if status_i == "ok" and proc.returncode != 0:
            entry["warning"] = f"torchrun exited {proc.returncode} after every rank reported ok"
        entry["series"] = series
        if rank_stacks:  # timed out: where each rank was (innermost frame, and dlscale's)
            entry["rank_stacks"] = {str(r): stacks.where(f) for r, f in sorted(rank_stacks.items())}
        rec.repeats.append(entry)
        if i == 0:
            rec.ranks = [{k: r.get(k) for k in RANK_KEYS} for r in rank_results]
            emit("ranks", rec.ranks)
        emit("repeat", entry)
        if status_i != "ok":
            rec.status, rec.error = status_i, error_i
            if proc.output_tail and status_i == "failed":
                entry["output_tail"] = proc.output_tail[-4000:]
            break


def _finish(cfg: RunConfig, spec, rec: Record, rank_results: list[dict], device_type: str,
            files_root: Path | None, staging: Path) -> None:
    """The record's case-level fields from the repeats measured and the last one's rank files, and
    its validity."""
    first = lambda key: next((r.get(key) for r in rank_results if r.get(key) is not None), None)  # noqa: E731
    dp_size = first("dp_size")
    rec.model = {"params": first("params"), "flops_per_sample": spec.flops_per_sample, "unit": spec.unit,
                 "seq_len": spec.seq_len}
    rec.global_batch = cfg.batch_size * cfg.grad_accum * dp_size if dp_size else None
    rec.tf32 = first("tf32")
    rec.strategy_info = first("strategy_info")
    threads = [r.get("threads") for r in rank_results if r.get("threads") is not None]
    rec.threads = threads or None
    if any(r["status"] == "ok" for r in rec.repeats):
        rec.summary = summarize_case(cfg, spec, rec.repeats, rank_results, device_type)
    _median_repeat_extras(rec, files_root, staging)
    rec.quality = quality_target.summarize(rec.repeats)  # --until only (None otherwise)
    rec.validity = validity.assess(rec.to_dict()).to_dict()


RANK_KEYS = ("rank", "local_rank", "host", "device", "device_name", "pid", "threads")


def thread_env(device_type: str, cfg: RunConfig, local_ranks: int) -> dict[str, str]:
    """On the CPU, each rank's threads: ``cfg.threads``, else the environment's OMP_NUM_THREADS,
    else an equal share of the cores (torchrun sets 1 per rank only when it starts several), so
    1-process baselines and N-process runs use the machine alike."""
    if device_type != "cpu":
        return {"OMP_NUM_THREADS": str(cfg.threads)} if cfg.threads else {}
    if cfg.threads:
        return {"OMP_NUM_THREADS": str(cfg.threads)}
    if "OMP_NUM_THREADS" in os.environ:
        return {"OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]}
    return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // max(1, local_ranks)))}


def _keep_artifacts(workdir: Path, root: Path | None, rec_id: str, repeat: int, staging: Path) -> list[str]:
    """Move a repeat's utilisation series under ``root`` (the store's directory) and stage its trace."""
    kept = []
    if root is None:
        return kept
    for f in sorted(workdir.glob("series-rank*.jsonl")):
        dest = Path(root) / "series" / f"{rec_id}-r{repeat}-{f.stem.split('-', 1)[1]}.jsonl"
        if _move(f, dest, "utilisation series"):
            kept.append(str(dest.relative_to(root)))
    if (workdir / "trace.json").exists():
        shutil.move(str(workdir / "trace.json"), staging / f"trace-r{repeat}.json")
    return kept


def _move(src: Path, dest: Path, what: str) -> bool:
    """Move a file into the store; a full or vanished store loses the file, never the record."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src), dest)
        return True
    except OSError as e:
        print(f"dlscale: warning: {what} {src.name} not kept in the store: {e.strerror or e}", file=sys.stderr,
              flush=True)
        return False


def median_repeat(repeats: list[dict]) -> dict | None:
    """The ok repeat whose throughput is the median (the lower middle one for an even count)."""
    ok = sorted((r for r in repeats if r["status"] == "ok"), key=lambda r: r["samples_per_s"])
    return ok[(len(ok) - 1) // 2] if ok else None


def _median_repeat_extras(rec: Record, root: Path | None, staging: Path) -> None:
    """Utilisation, breakdown and profiler trace of the median repeat, at the record's top level."""
    med = median_repeat(rec.repeats)
    if med is None:
        return
    staged = staging / f"trace-r{med['repeat']}.json"
    if staged.exists() and root is not None:
        dest = Path(root) / "traces" / f"{rec.id}.json"
        if _move(staged, dest, "profiler trace"):
            rec.trace = str(dest.relative_to(root))
    rec.utilisation, rec.breakdown = med.get("utilisation"), med.get("breakdown")
    rec.median_repeat, rec.profile_top_ops = med["repeat"], med.get("profile_top_ops")
    rec.data = med.get("data")
