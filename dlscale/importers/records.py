"""Imported records: one case (nodes x GPUs per node at one batch) made elsewhere, as a record.

Shaped like a measured run record (docs/records.md) so that report, compare, predict and cost
read it the same way, with ``kind: "imported"``, the figures as published or as reduced from
the logs, and ``provenance``. Repeats are the per-run figures where the source gives them; a
published median alone leaves ``repeats`` empty and ``summary.samples_per_s.n`` null (unknown).
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dlscale import ConfigError, metrics
from dlscale.config import MAX_BATCH, PRECISIONS
from dlscale.external.parsers import UNITS
from dlscale.store import STATUSES, new_record

FORMAT_ID = "dlscale-table/1"
# what is physically plausible for an imported figure (docs/external.md): a bigger one is a typo or
# hostile, and would overflow the reports' sums and formats
MAX_RATE = 1e12  # samples (or tokens) per second of one job: far above any cluster's
MAX_COUNT = 10**7  # nodes, GPUs, sequence length, keys of a table
MAX_PARAMS = 10**14  # model parameters


def check_precision(value: Any, where: str) -> str:
    if value not in PRECISIONS:
        raise ConfigError(f"{where}: precision {value!r} is not one of {', '.join(PRECISIONS)} (dlscale's names: "
                          f"fp32; amp-fp16 for FP16 mixed precision; amp-bf16)")
    return value


def _shown(value: Any) -> str:
    from dlscale.fmt import yaml_number_hint

    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else \
        f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    return (text if len(text) <= 80 else text[:77] + "...") + yaml_number_hint(value)


def check_int(value: Any, name: str, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ConfigError(f"{name} must be an integer in {minimum}..{maximum:,}, got {_shown(value)}")
    return value


def check_batch(value: Any, name: str) -> int:
    return check_int(value, name, maximum=MAX_BATCH)


def check_rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or \
            not 0 < value <= MAX_RATE:
        raise ConfigError(f"{name} must be a positive number of samples/s up to {MAX_RATE:.0e}, got {_shown(value)}")
    return float(value)


def registered_unit(model: str) -> tuple[str | None, int | None, float | None]:
    """(unit, seq_len, flops per sample) of a registered dlscale model, else Nones."""
    from dlscale.models import get_model, model_names

    if model not in model_names():
        return None, None, None
    spec = get_model(model, "full")
    return spec.unit, spec.seq_len, spec.flops_per_sample


def imported_record(*, model: str, precision: str, batch_size: int, nnodes: int, gpus_per_node: int,
                    unit: str, provenance: dict[str, Any], runs: list[float] | None = None,
                    median: float | None = None, mean: float | None = None, status: str = "ok",
                    error: str | None = None, strategy: str = "ddp", compile: bool = False,
                    framework: str | None = None, seq_len: int | None = None, params: int | None = None,
                    system: dict[str, Any] | None = None, label: str | None = None, note: str | None = None,
                    repeat_extra: list[dict[str, Any]] | None = None,
                    warnings: list[str] | None = None) -> dict[str, Any]:
    """One imported record. ``runs``: per-run figures (median, mean, spread recomputed); else
    ``median`` (and ``mean`` where the source gives it) as published."""
    if status not in STATUSES:
        raise ConfigError(f"status {status!r} is not one of {', '.join(STATUSES)}")
    if unit not in UNITS:
        raise ConfigError(f"unit {unit!r} is not one of {', '.join(UNITS)}")
    world = nnodes * gpus_per_node
    config = {"model": model, "flavor": "full", "strategy": strategy, "nproc_per_node": gpus_per_node,
              "nnodes": nnodes, "batch_size": batch_size, "precision": precision, "compile": bool(compile),
              "device": "cuda", "framework": framework}
    repeats: list[dict[str, Any]] = []
    summary = None
    if status == "ok":
        if runs:
            tput = metrics.summarize(runs)
            repeats = [{"repeat": i, "status": "ok", "samples_per_s": float(x), **(repeat_extra[i] if repeat_extra
                                                                                   else {})}
                       for i, x in enumerate(runs)]
        else:
            tput = {"n": None, "median": median, "mean": mean, "min": None, "max": None, "stdev": None}
        med = tput["median"]
        _, _, flops = registered_unit(model)
        summary = {"samples_per_s": tput, "samples_per_s_per_device": med / world if med else None,
                   "tokens_per_s": med * seq_len if (med and seq_len and unit == "seq") else None,
                   "device_name": (provenance.get("hardware") or {}).get("gpu"),
                   "step_ms_p50": None, "step_ms_p90": None}
        gpu = summary["device_name"]
        if flops and med and gpu:
            dtype = metrics.precision_dtype(precision, "cuda", gpu)  # a V100's fp32: its fp32 peak, no TF32
            peak, src = metrics.peak_flops(gpu, dtype)
            summary.update(mfu=metrics.mfu(flops, med / world, peak) if peak else None, peak_flops=peak,
                           peak_flops_source=src, dtype=dtype, peak=metrics.peak_used(gpu, dtype))
    key = {"kind": "imported", "config": config, "source": provenance.get("source"), "tool": provenance.get("tool"),
           "gpu": (provenance.get("hardware") or {}).get("gpu")}
    gpu_name = (provenance.get("hardware") or {}).get("gpu")
    rec = new_record(
        kind="imported", case_key=hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16],
        label=label, config=config, world_size=world, device_type="cuda", status=status, error=error,
        global_batch=batch_size * world, repeats=repeats, summary=summary,
        model={"unit": unit, "seq_len": seq_len, "params": params},
        # the node's GPUs as stated (hardware.gpus_per_node, else what this case used)
        env={"gpus": [{"index": i, "name": gpu_name, "memory_total_bytes": None}
                      for i in range((provenance.get("hardware") or {}).get("gpus_per_node") or gpus_per_node)]
             if gpu_name else [],
             "host": None, "stated_by": provenance.get("source")},
        provenance=provenance, system=system, note=note, warnings=list(warnings or []), ranks=[],
        command=None)
    return rec


def provenance(*, source: str | None, tool: str | None, date: str | None, fmt: str, file: str,
               gpu: str | None = None, gpus_per_node: int | None = None,
               interconnect: str | None = None, method: str | None = None) -> dict[str, Any]:
    """Where an imported figure comes from, as the user and the file state it."""
    return {"source": source or file, "tool": tool, "date": date, "format": fmt, "file": file,
            "hardware": {"gpu": gpu, "gpus_per_node": gpus_per_node, "interconnect": interconnect},
            "method": method}


def need(opts: Any, *names: str) -> None:
    """ConfigError naming the command-line options an importer needs and did not get."""
    missing = ["--" + n.replace("_", "-") for n in names if getattr(opts, n) is None]
    if missing:
        raise ConfigError(f"this file does not say it: give {', '.join(missing)}")


def workload_unit(opts: Any, default: str | None = None) -> tuple[str, int | None]:
    """(unit, seq_len) for an imported case: the options, else the registered model's, else ``default``."""
    unit, seq, _ = registered_unit(opts.model) if opts.model else (None, None, None)
    unit = opts.unit or unit or default
    if unit is None:
        raise ConfigError(f"model {opts.model!r} is not a registered dlscale model: give --unit img|seq|tok")
    return unit, opts.seq_len or seq
