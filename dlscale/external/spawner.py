"""One repeat of an external command: spawned, bounded, sampled, its output parsed.

``ExternalSpawner(case)(repeat)`` has the shape of the launcher's spawners: it runs one repeat
and returns the process result and a list of per-rank result dicts shaped like the worker's
``rank<R>.json`` (here a single rank-0-like dict, since dlscale sees only the command's output):
``rank, status, error, samples_per_s, window_s, step_times_ms, dp_size, utilisation,
device_name, parse``. ``samples_per_s`` is the parser's window figure in the workload's unit,
the authority for this repeat (the command's steps are its own, not dlscale's).
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

from dlscale.case.procs import ProcResult, spawn
from dlscale.case.rankfiles import write_result
from dlscale.external.case import ExternalCase
from dlscale.external.parsers import LogLine, ParseError, ParseResult, ParseTimeout, get_parser
from dlscale.monitor import HardwareSampler

# what an out-of-memory failure prints in the common stacks (PyTorch, JAX/XLA, DeepSpeed)
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|RESOURCE_EXHAUSTED: Out of memory|CUBLAS_STATUS_ALLOC_FAILED"
                 r"|out of memory", re.IGNORECASE)


def _gpu_indices(case: ExternalCase, device_type: str) -> list[int | str] | None:
    """The GPUs the command will use: CUDA_VISIBLE_DEVICES when set, else the first
    nproc-per-node (torchrun puts local rank i on cuda:i)."""
    if device_type != "cuda":
        return None
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        return [int(v) if v.strip().isdigit() else v.strip() for v in vis.split(",") if v.strip()]
    return list(range(case.nproc_per_node))


def classify(proc: ProcResult, res: ParseResult | None, parse_error: str | None,
             complete: bool) -> tuple[str, str | None, str | None]:
    """(status, error, warning) of one repeat from the process result and the parse."""
    tail = proc.output_tail or ""
    last = [ln for ln in tail.splitlines() if ln.strip()][-1:] or ["no output"]
    if proc.timed_out:
        return "timeout", "time limit reached; the command's process tree was killed", None
    if proc.returncode != 0:
        if res is not None and complete:
            # the window was logged in full, then the command died on its way out
            return "ok", None, f"the command exited {proc.returncode} after its window was logged"
        oom = OOM.search(tail)
        if oom:
            line = next((ln for ln in reversed(tail.splitlines()) if OOM.search(ln)), last[0])
            return "oom", f"out of memory: {line.strip()[:300]}", None
        if proc.returncode is not None and proc.returncode < 0:
            try:
                name = signal.Signals(-proc.returncode).name
            except ValueError:
                name = f"signal {-proc.returncode}"
            return "failed", f"the command was killed by {name}; last output: {last[0].strip()[:300]}", None
        return "failed", f"command exited {proc.returncode}; last output: {last[0].strip()[:300]}", None
    if res is None:
        return "failed", parse_error, None
    return "ok", None, None


class ExternalSpawner:
    """Runs one repeat of ``case``; the repeat's output log and utilisation series go to the
    paths ``log_path(repeat)`` and ``series_path(repeat)`` give (None: not kept)."""

    def __init__(self, case: ExternalCase, device_type: str, *,
                 log_path: Callable[[int], Path | None] = lambda i: None,
                 series_path: Callable[[int], Path | None] = lambda i: None,
                 verbose: bool = False):
        self.case, self.device_type = case, device_type
        self.parser = get_parser(case.parser)
        self.log_path, self.series_path, self.verbose = log_path, series_path, verbose

    # the launcher's Spawner protocol (launch.measure): one rank-0-like result file per repeat
    def local_world(self, case: ExternalCase | None = None) -> int:
        return 1  # one result per repeat, whatever the command starts

    def start(self, case: ExternalCase, workdir: Path, env: dict[str, str] | None = None) -> ProcResult:
        """Run the next repeat; write its rank-0-like dict to ``workdir/rank0.json``."""
        repeat = getattr(self, "_next", 0)
        self._next = repeat + 1
        proc, ranks = self(repeat, env=env)
        write_result(Path(workdir), 0, ranks[0])
        return proc

    def __call__(self, repeat: int, env: dict[str, str] | None = None) -> tuple[ProcResult, list[dict[str, Any]]]:
        case = self.case
        lines: list[LogLine] = []
        log_file = self.log_path(repeat)
        log = open(log_file, "w", encoding="utf-8", errors="replace") if log_file else None

        def on_line(text: str) -> None:
            lines.append(LogLine(text, time.time()))
            if log:
                log.write(text + "\n")
            if self.verbose:
                print(text, file=sys.stderr, flush=True)

        sampler = self._sampler(repeat)
        try:
            proc = spawn(case.command, case.time_limit, env=env, on_line=on_line, cwd=case.cwd)
        finally:
            if sampler is not None:
                sampler.stop()
            if log:
                log.close()
        res, err, late = None, None, False
        opts = case.parse_options()
        opts.deadline_s = case.time_limit - proc.seconds  # the case's time limit covers the parse too
        try:
            res = self.parser.parse(lines, opts)
        except ParseError as e:
            err, late = str(e), isinstance(e, ParseTimeout)
        complete = res is not None and not any("fewer than" in w for w in res.warnings)
        status, error, warning = classify(proc, res, err, complete)
        if late:
            status, error = "timeout", err
        r0: dict[str, Any] = {"rank": 0, "status": status, "error": error, "dp_size": case.world_size,
                              "pid": None, "host": None, "device_name": None}
        if warning:
            r0["warning"] = warning
        if res is not None:
            sps, tps = convert(res, case)
            note = seq_len_warning(res, case)
            if note:
                res.warnings.append(note)
            r0.update(samples_per_s=sps if status == "ok" else None, tokens_per_s=tps, window_s=res.window_s,
                      step_times_ms=list(res.step_times_ms), parse=res.to_dict(),
                      per_step_samples_per_s=[convert_rate(v, res.unit, case, res.seq_len)
                                              for v in res.per_step_samples_per_s])
        if sampler is not None:
            t0, t1 = (res.window_t if res is not None and res.window_t else
                      (proc.started or 0.0, (proc.started or 0.0) + proc.seconds))
            util = sampler.summary(t0, t1)
            util["scope"] = "window" if res is not None and res.window_t else "whole run"
            r0["utilisation"] = util
            gpus = [g.get("name") for g in util.get("per_gpu") or [] if g.get("name")]
            r0["device_name"] = gpus[0] if gpus else None
        return proc, [r0]

    def _sampler(self, repeat: int):
        if not self.case.monitor:
            return None

        path = self.series_path(repeat)
        # pid: dlscale itself, so the RSS sum covers the command's whole process tree
        s = HardwareSampler(self.case.sample_interval, gpu_indices=_gpu_indices(self.case, self.device_type),
                            series_path=str(path) if path else None, pid=os.getpid(),
                            nvml=self.device_type == "cuda")
        s.start()
        s.wait_ready(5.0)
        return s


def convert_rate(value: float, unit: str, case: ExternalCase, logged: int | None = None) -> float:
    """A parsed rate in the record's unit: tokens become sequences when the sequence length is known."""
    seq, _ = case.seq_len_for(logged)
    if unit == "tok" and case.workload_unit("tok") == "seq" and seq:
        return value / seq
    return value


def convert(res: ParseResult, case: ExternalCase) -> tuple[float, float | None]:
    """(samples/s in the record's unit, tokens/s where known) of a parse. Tokens/s is derived from
    samples/s only with a stated sequence length (--seq-len or the log), never an assumed one."""
    seq, source = case.seq_len_for(res.seq_len)
    sps = convert_rate(res.samples_per_s, res.unit, case, res.seq_len)
    if res.unit == "tok":
        return sps, res.samples_per_s
    stated = seq if source in ("option", "log") else None
    return sps, sps * stated if stated and case.workload_unit(res.unit) == "seq" else None


def seq_len_warning(res: ParseResult, case: ExternalCase) -> str | None:
    """What an assumed sequence length leaves out or assumes, in one line; None when it is stated."""
    seq, source = case.seq_len_for(res.seq_len)
    if source != "assumed" or case.workload_unit(res.unit) != "seq":
        return None
    if res.unit == "tok":
        return (f"sequences/s assume {case.model}'s sequence length {seq} (the log does not state one); "
                f"give --seq-len for the command's")
    return f"no tokens/s: the log does not state the sequence length; give --seq-len (not assuming {case.model}'s {seq})"
