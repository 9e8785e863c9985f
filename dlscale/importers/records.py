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
from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError
from dlscale.case.config import MAX_BATCH, PRECISIONS
from dlscale.external.parsers import UNITS
from dlscale.fmt import yaml_number_hint
from dlscale.results import metrics
from dlscale.results.store import STATUSES, new_record

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
    from dlscale.models import get_model, model_names  # torch: keeps start-up light

    if model not in model_names():
        return None, None, None
    spec = get_model(model, "full")
    return spec.unit, spec.seq_len, spec.flops_per_sample


@dataclass(frozen=True)
class ImportedCase:
    """What was run elsewhere: the workload, its layout and how it was trained."""
    model: str
    precision: str
    batch_size: int
    nnodes: int
    gpus_per_node: int
    unit: str
    strategy: str = "ddp"
    compile: bool = False
    framework: str | None = None
    seq_len: int | None = None
    params: int | None = None

    def config(self) -> dict[str, Any]:
        return {"model": self.model, "flavor": "full", "strategy": self.strategy,
                "nproc_per_node": self.gpus_per_node, "nnodes": self.nnodes, "batch_size": self.batch_size,
                "precision": self.precision, "compile": bool(self.compile), "device": "cuda",
                "framework": self.framework}


@dataclass(frozen=True)
class Figures:
    """What the source reports of the case: per-run figures (``runs``, with ``repeat_extra`` per
    run where the logs give more), else the published ``median`` (and ``mean``)."""
    runs: list[float] | None = None
    median: float | None = None
    mean: float | None = None
    status: str = "ok"
    error: str | None = None
    repeat_extra: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class Provenance:
    """Where an imported figure comes from, as the user and the file state it."""
    source: str | None
    tool: str | None
    date: str | None
    fmt: str
    file: str
    gpu: str | None = None
    gpus_per_node: int | None = None
    interconnect: str | None = None
    method: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source or self.file, "tool": self.tool, "date": self.date, "format": self.fmt,
                "file": self.file,
                "hardware": {"gpu": self.gpu, "gpus_per_node": self.gpus_per_node,
                             "interconnect": self.interconnect},
                "method": self.method}


def _summary(case: ImportedCase, figures: Figures, gpu: str | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(repeats, summary) of an ok case: per-run figures summarised, else the published ones."""
    runs, world = figures.runs, case.nnodes * case.gpus_per_node
    repeats: list[dict[str, Any]] = []
    if runs:
        tput = metrics.summarize(runs)
        extra = figures.repeat_extra
        repeats = [{"repeat": i, "status": "ok", "samples_per_s": float(x), **(extra[i] if extra else {})}
                   for i, x in enumerate(runs)]
    else:
        tput = {"n": None, "median": figures.median, "mean": figures.mean, "min": None, "max": None, "stdev": None}
    med = tput["median"]
    _, _, flops = registered_unit(case.model)
    summary = {"samples_per_s": tput, "samples_per_s_per_device": med / world if med else None,
               "tokens_per_s": med * case.seq_len if (med and case.seq_len and case.unit == "seq") else None,
               "device_name": gpu, "step_ms_p50": None, "step_ms_p90": None}
    if flops and med and gpu:
        dtype = metrics.precision_dtype(case.precision, "cuda", gpu)  # a V100's fp32: its fp32 peak, no TF32
        peak, src = metrics.peak_flops(gpu, dtype)
        summary.update(mfu=metrics.mfu(flops, med / world, peak) if peak else None, peak_flops=peak,
                       peak_flops_source=src, dtype=dtype, peak=metrics.peak_used(gpu, dtype))
    return repeats, summary


def imported_record(case: ImportedCase, figures: Figures, provenance: Provenance, *,
                    system: dict[str, Any] | None = None, label: str | None = None, note: str | None = None,
                    warnings: list[str] | None = None) -> dict[str, Any]:
    """One imported record. ``figures.runs``: per-run figures (median, mean, spread recomputed);
    else ``figures.median`` (and ``mean`` where the source gives it) as published."""
    if figures.status not in STATUSES:
        raise ConfigError(f"status {figures.status!r} is not one of {', '.join(STATUSES)}")
    if case.unit not in UNITS:
        raise ConfigError(f"unit {case.unit!r} is not one of {', '.join(UNITS)}")
    prov = provenance.as_dict()
    world = case.nnodes * case.gpus_per_node
    config = case.config()
    gpu_name = provenance.gpu
    repeats, summary = _summary(case, figures, gpu_name) if figures.status == "ok" else ([], None)
    key = {"kind": "imported", "config": config, "source": prov["source"], "tool": provenance.tool, "gpu": gpu_name}
    return new_record(
        kind="imported", case_key=hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16],
        label=label, config=config, world_size=world, device_type="cuda", status=figures.status,
        error=figures.error, global_batch=case.batch_size * world, repeats=repeats, summary=summary,
        model={"unit": case.unit, "seq_len": case.seq_len, "params": case.params},
        # the node's GPUs as stated (hardware.gpus_per_node, else what this case used)
        env={"gpus": [{"index": i, "name": gpu_name, "memory_total_bytes": None}
                      for i in range(provenance.gpus_per_node or case.gpus_per_node)]
             if gpu_name else [],
             "host": None, "stated_by": prov["source"]},
        provenance=prov, system=system, note=note, warnings=list(warnings or []), ranks=[],
        command=None)


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
