"""An external case -> repeats of its command (fresh processes) -> one record of kind ``external``.

The record has the shape of a native run record (docs/records.md) so that report, compare,
predict and cost read it alike: ``config`` (the ExternalCase, command as argv), ``repeats`` (one
per run of the command, each with the parser's window figure, its per-step figures and what was
skipped), ``summary`` (median, spread, per device, tokens/s, MFU where dlscale knows the model's
FLOPs), ``utilisation`` of the median repeat, ``env`` (with the versions of the tool's packages
where they are importable here). The command's full output of each repeat is kept in
``STORE/logs/``; the hardware series in ``STORE/series/`` (as for native runs).
"""
from __future__ import annotations

import importlib.metadata
import shlex
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dlscale.results import envinfo, metrics
from dlscale.case.config import resolve_device
from dlscale.external.case import ExternalCase
from dlscale.external.spawner import ExternalSpawner
from dlscale.results.store import ResultStore, new_record


def package_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    """Installed versions of the tool's packages in dlscale's Python (the command may use another)."""
    out: dict[str, str | None] = {}
    for n in names:
        try:
            out[n] = importlib.metadata.version(n)
        except importlib.metadata.PackageNotFoundError:
            out[n] = None
    return out


def repeat_entry(i: int, proc, r0: dict[str, Any]) -> dict[str, Any]:
    """A repeat of the record from the spawner's process result and rank-0-like dict."""
    entry: dict[str, Any] = {"repeat": i, "status": r0["status"], "error": r0.get("error"),
                             "process_s": round(proc.seconds, 3), "returncode": proc.returncode}
    for k in ("samples_per_s", "tokens_per_s", "window_s", "step_times_ms", "per_step_samples_per_s", "parse",
              "utilisation", "warning"):
        if r0.get(k) is not None:
            entry[k] = r0[k]
    if r0["status"] != "ok":
        entry.pop("samples_per_s", None)
        if proc.output_tail:
            entry["output_tail"] = proc.output_tail[-4000:]
    return entry


def summarize(case: ExternalCase, repeats: list[dict], device_type: str, device_name: str | None,
              unit: str) -> dict[str, Any]:
    ok = [r for r in repeats if r["status"] == "ok"]
    tput = metrics.summarize(r["samples_per_s"] for r in ok)
    median = tput["median"]
    steps = [t for r in ok for t in r.get("step_times_ms") or []]
    per_device = median / case.world_size if median else None
    toks = [r["tokens_per_s"] for r in ok if r.get("tokens_per_s") is not None]
    spec = case.registered_spec()
    gpu = device_name if device_type == "cuda" else None
    dtype = metrics.precision_dtype(case.precision, device_type, gpu)
    peak, source = metrics.peak_flops(gpu, dtype)
    # MFU only where dlscale counts the model's FLOPs (a registered model, samples in its unit)
    flops = spec.flops_per_sample if spec is not None and unit == spec.unit else None
    return {
        "samples_per_s": tput,
        "samples_per_s_per_device": per_device,
        "tokens_per_s": metrics.summarize(toks)["median"] if toks else None,
        "step_ms_p50": metrics.percentile(steps, 50) if steps else None,
        "step_ms_p90": metrics.percentile(steps, 90) if steps else None,
        "mfu": metrics.mfu(flops, per_device, peak) if (flops and per_device) else None,
        "peak_flops": peak,
        "peak_flops_source": source,
        "dtype": dtype,
        "peak": metrics.peak_used(gpu, dtype),
        "device_name": device_name,
    }


@dataclass
class _Repeats:
    """What the repeats of a case left: their entries, how the case ended, what rank 0 reported."""
    entries: list[dict[str, Any]] = field(default_factory=list)
    status: str = "ok"
    error: str | None = None
    device_name: str | None = None
    parsed_unit: str = "sample"
    stopped_by: KeyboardInterrupt | None = None

    def median(self) -> dict[str, Any] | None:
        ok = sorted((r for r in self.entries if r["status"] == "ok"), key=lambda r: r["samples_per_s"])
        return ok[(len(ok) - 1) // 2] if ok else None


def _run_repeats(case: ExternalCase, spawner: ExternalSpawner, rec_id: str,
                 emit: Callable[[str, Any], None]) -> _Repeats:
    """Run the repeats until one is not ok; a signal after an ok repeat keeps those that finished."""
    from dlscale.case import launch  # Interrupted; not at import: launch brings torch

    out = _Repeats()
    try:
        for i in range(case.repeats):
            proc, ranks = spawner(i)
            r0 = ranks[0]
            entry = repeat_entry(i, proc, r0)
            entry["log"] = str(Path("logs") / f"{rec_id}-r{i}.log")
            if case.monitor:
                entry["series"] = [str(Path("series") / f"{rec_id}-r{i}-rank0.jsonl")]
            out.device_name = out.device_name or r0.get("device_name")
            if r0.get("parse"):
                out.parsed_unit = r0["parse"]["unit"]
            out.entries.append(entry)
            emit("repeat", entry)
            if entry["status"] != "ok":
                out.status, out.error = entry["status"], entry["error"]
                break
    except KeyboardInterrupt as e:  # a signal to dlscale: the repeats that finished are kept
        if not any(r["status"] == "ok" for r in out.entries):
            raise
        out.stopped_by = e
        out.status, out.error = "interrupted", launch.interrupted_error(e, len(out.entries), case.repeats)
    return out


def _external_record(case: ExternalCase, rec_id: str, device_type: str, env: dict[str, Any],
                     done: _Repeats) -> dict[str, Any]:
    device_name = done.device_name
    if device_type == "cuda" and device_name is None:
        device_name = next((g.get("name") for g in env.get("gpus") or []), None)
    unit = case.workload_unit(done.parsed_unit)
    spec = case.registered_spec()
    med_rep = done.median()
    repeats = done.entries
    logged = next(((r.get("parse") or {}).get("seq_len") for r in repeats if (r.get("parse") or {}).get("seq_len")),
                  None)
    seq_len, seq_source = case.seq_len_for(logged)
    return new_record(
        kind="external", id=rec_id, case_key=case.case_key(), label=case.label,
        command=shlex.join(case.command), config=case.to_dict(), device_type=device_type,
        world_size=case.world_size, global_batch=case.global_batch, env=env, ranks=[],
        status=done.status, error=done.error, repeats=repeats,
        model={"unit": unit, "seq_len": seq_len, "seq_len_source": seq_source, "params": None,
               "flops_per_sample": spec.flops_per_sample if spec is not None and spec.unit == unit else None,
               "registered": spec is not None},
        summary=summarize(case, repeats, device_type, device_name, unit) if med_rep else None,
        utilisation=med_rep.get("utilisation") if med_rep else None,
        median_repeat=med_rep["repeat"] if med_rep else None,
        external={"parser": case.parser, "framework": case.framework,
                  "packages": env["external_packages"]},
    )


def measure_external(case: ExternalCase, store: ResultStore, *, verbose: bool = False,
                     on_event: Callable[[str, Any], None] | None = None) -> dict[str, Any]:
    """Run ``case.repeats`` repeats of the command; returns the record (the caller stores it).

    ``store``: where the repeats' logs and utilisation series go (``logs/``, ``series/``). Bad
    input raises ConfigError before anything runs. A repeat that is not ok stops the case; the
    record is made whatever the status.
    """
    from dlscale.case import launch  # Interrupted; not at import: launch brings torch

    device_type = resolve_device(case.device)
    case.check_launchable()
    store.check_writable()
    parser = ExternalSpawner(case, device_type).parser
    env = envinfo.capture()
    env["external_packages"] = package_versions(parser.packages)
    rec_id = uuid.uuid4().hex
    logs = store.root / "logs"
    series = store.root / "series"
    logs.mkdir(parents=True, exist_ok=True)
    if case.monitor:
        series.mkdir(parents=True, exist_ok=True)
    spawner = ExternalSpawner(case, device_type, verbose=verbose,
                              log_path=lambda i: logs / f"{rec_id}-r{i}.log",
                              series_path=lambda i: series / f"{rec_id}-r{i}-rank0.jsonl" if case.monitor else None)
    done = _run_repeats(case, spawner, rec_id, on_event or (lambda kind, payload: None))
    rec = _external_record(case, rec_id, device_type, env, done)
    if done.stopped_by is not None:
        raise launch.Interrupted(rec, *done.stopped_by.args) from None
    return rec
