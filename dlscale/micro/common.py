"""Shared pieces of the micro-benchmarks: input parsing, timing, errors, statuses, output."""
from __future__ import annotations

import argparse
import contextvars
import gc
import math
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from dlscale import ConfigError
from dlscale.cli import EXIT_FAILED, EXIT_OK, EXIT_OOM, EXIT_TIMEOUT, deprecated_alias
from dlscale.fmt import fmt_cell
from dlscale.results import envinfo, validity
from dlscale.results.envinfo import cpu_model
from dlscale.results.store import ResultStore, new_record

DEVICES = ("auto", "cuda", "cpu")
ROW_STATUSES = ("ok", "unsupported", "oom", "failed")

# ---------------------------------------------------------------------------------------------
# input parsing (every failure is a ConfigError: one line, exit code 2)

_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "kib": 2**10, "m": 2**20, "mb": 2**20,
          "mib": 2**20, "g": 2**30, "gb": 2**30, "gib": 2**30, "t": 2**40, "tb": 2**40,
          "tib": 2**40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str | int, name: str = "size") -> int:
    """"8" -> 8, "64K" -> 65536, "1M" -> 1048576, "1G"/"1GiB"/"1GB" -> 2**30 (binary multiples,
    as nccl-tests' -b/-e). Raises ConfigError on anything else or on a size < 1 byte."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ConfigError(f"bad {name} {text!r}; use a byte count with an optional binary suffix "
                              f"K, M, G or T (e.g. 8, 64K, 1M, 1G)")
        value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise ConfigError(f"{name} must be at least 1 byte, got {text!r}")
    return value


def split_list(values: str | Sequence[str] | None) -> list[str]:
    """Comma-separated and/or repeated option values -> flat list of non-empty items."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in str(v).split(",") if p.strip())
    return out


def parse_choices(values: str | Sequence[str] | None, choices: Sequence[str], name: str) -> list[str]:
    """Validated list of names from ``choices`` (order kept, duplicates dropped)."""
    out: list[str] = []
    for v in split_list(values):
        key = v.lower()
        if key not in choices:
            raise ConfigError(f"unknown {name} {v!r}; choose from: {', '.join(choices)}")
        if key not in out:
            out.append(key)
    return out


def parse_positive_ints(values: str | Sequence[str] | None, name: str) -> list[int]:
    out = []
    for v in split_list(values):
        try:
            n = int(v)
        except ValueError:
            raise ConfigError(f"bad {name} {v!r}; expected a positive integer") from None
        if n < 1:
            raise ConfigError(f"{name} must be >= 1, got {n}")
        out.append(n)
    return out


def int_or_auto(text: str) -> str | int:
    """argparse type for --warmup/--iters: "auto" or a non-negative integer (checked later)."""
    if str(text).lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"expected an integer or 'auto', got {text!r}") from None


def resolve_count(value: str | int | None, name: str, gpu_default: int, cpu_default: int,
                  device: str, minimum: int) -> int:
    if value in (None, "auto"):
        return gpu_default if device == "cuda" else cpu_default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer or 'auto', got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_nproc(nproc: int, what: str) -> None:
    """matmul, bandwidth and layer run in this process, on one device."""
    if nproc < 1:
        raise ConfigError(f"nproc-per-node must be >= 1, got {nproc}")
    if nproc != 1:
        raise ConfigError(f"nproc-per-node {nproc} is not supported by micro {what}: it measures one "
                          f"device in this process (only micro comm starts several); use 1")


def resolve_device(requested: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; "cuda" without a GPU -> ConfigError."""
    import torch  # torch: keeps start-up light

    if requested not in DEVICES:
        raise ConfigError(f"unknown device {requested!r}; choose one of: {', '.join(DEVICES)}")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda requested but no CUDA GPU is visible; use --device cpu")
    return requested


def torch_device(device: str):
    import torch  # torch: keeps start-up light

    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def device_name(device) -> str:
    """GPU name (what the peak tables match on) or the CPU model."""
    import torch  # torch: keeps start-up light

    dev = torch.device(device) if isinstance(device, str) else device
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)

    return cpu_model()


def memory_bytes(device: str) -> int | None:
    """What one device can hold: the GPU's total memory, or the host's RAM for the CPU (None: unknown)."""
    try:
        if device == "cuda":
            import torch  # torch: keeps start-up light

            return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, RuntimeError, AttributeError):
        return None


def check_fits(need: int, device: str, what: str) -> None:
    """ConfigError before anything is allocated when the buffers ``what`` asks for exceed what the device
    holds (a typo such as --sizes 10000000 would otherwise run, and record oom)."""
    have = memory_bytes(device)
    if have is not None and need > have:
        raise ConfigError(f"{what} needs {need / 2**30:,.1f} GiB of buffers, more than the {have / 2**30:,.1f} GiB "
                          f"this {device} device holds")


def cache_bytes(device) -> int:
    """Last-level cache size: L2 of a GPU, the largest CPU cache from sysfs (32 MiB if unknown)."""
    import torch  # torch: keeps start-up light

    dev = torch.device(device) if isinstance(device, str) else device
    if dev.type == "cuda":
        size = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)
        return int(size) if size else 50 * 2**20
    best = 0
    for idx in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (idx / "size").read_text().strip()
            best = max(best, parse_bytes(text))
        except (OSError, ConfigError):
            continue
    return best or 32 * 2**20


# ---------------------------------------------------------------------------------------------
# timing

def synchronize(device) -> None:
    import torch  # torch: keeps start-up light

    dev = torch.device(device) if isinstance(device, str) else device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def measure(fn: Callable[[], Any], device, warmup: int, iters: int,
            min_sample_s: float = 0.0) -> dict[str, float | int]:
    """Time ``fn``: ``warmup`` untimed calls, then ``iters`` samples; seconds per call.

    CUDA: a pair of CUDA events around each sample, one synchronisation at the end (the GPU
    stays busy between samples). CPU: ``time.perf_counter`` around each sample. A sample is
    ``inner`` back-to-back calls divided by ``inner``; with ``min_sample_s`` > 0 ``inner`` is
    raised (after warm-up, from one extra timed call) so that a sample lasts about that long,
    which hides the launch latency of tiny kernels. With ``min_sample_s`` = 0 exactly
    ``warmup + iters`` calls are made (what collectives need: every rank the same count).
    Returns median/min/max seconds per call, the sample count and ``inner``.
    """
    import torch  # torch: keeps start-up light

    dev = torch.device(device) if isinstance(device, str) else device
    for _ in range(warmup):
        fn()
    synchronize(dev)
    inner = 1
    if min_sample_s > 0:
        t0 = time.perf_counter()
        fn()
        synchronize(dev)
        one = time.perf_counter() - t0
        if one < min_sample_s:
            inner = int(min(1000, math.ceil(min_sample_s / max(one, 1e-7))))
    times: list[float] = []
    if dev.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for i in range(iters):
            starts[i].record()
            for _ in range(inner):
                fn()
            ends[i].record()
        ends[-1].synchronize()
        times = [s.elapsed_time(e) / 1e3 / inner for s, e in zip(starts, ends)]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            times.append((time.perf_counter() - t0) / inner)
    mean = statistics.fmean(times)
    cv = statistics.stdev(times) / mean if len(times) > 1 and mean > 0 else None
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "samples": len(times), "inner": inner, "cv": cv}


@dataclass(frozen=True)
class Timing:
    """How every case of a micro-benchmark is timed: ``warmup`` untimed calls, ``iters`` samples, each
    sample at least ``min_sample_s`` long (``measure``); None = 1 ms on a GPU (hides the launch latency of
    small kernels), 0 on the CPU."""

    warmup: int = 5
    iters: int = 20
    min_sample_s: float | None = None

    def measure(self, fn: Callable[[], Any], device) -> dict[str, float | int]:
        import torch  # torch: keeps start-up light

        dev = torch.device(device) if isinstance(device, str) else device
        least = self.min_sample_s if self.min_sample_s is not None else (1e-3 if dev.type == "cuda" else 0.0)
        return measure(fn, dev, self.warmup, self.iters, least)


def timing_fields(t: dict[str, float | int]) -> dict[str, Any]:
    """Row fields of a ``measure`` result, in microseconds."""
    return {"time_us": t["median_s"] * 1e6, "time_us_min": t["min_s"] * 1e6,
            "time_us_max": t["max_s"] * 1e6, "samples": t["samples"], "inner": t["inner"], "time_cv": t.get("cv")}


# ---------------------------------------------------------------------------------------------
# load: what else used this process's cores while it measured (the validity checks of `run`)

_WATCH: contextvars.ContextVar["LoadWatch | None"] = contextvars.ContextVar("micro_load", default=None)


def cpu_busy_s(times) -> float:
    """Busy seconds of one psutil cpu_times entry (guest time is inside user already)."""
    idle = getattr(times, "idle", 0.0) + getattr(times, "iowait", 0.0)
    total = sum(getattr(times, f) for f in times._fields if f not in ("guest", "guest_nice"))
    return total - idle


class LoadWatch:
    """This process's cores' busy time over a micro-benchmark, split into its own (and its reaped
    children's) and everyone else's."""

    def __init__(self) -> None:
        import psutil  # psutil: keeps the CLI start-up light

        self.cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            list(range(psutil.cpu_count() or 1))
        self.t0, self.busy0, self.own0 = time.monotonic(), self._busy(), self._own()

    def _busy(self) -> float:
        import psutil  # psutil: keeps the CLI start-up light

        per = psutil.cpu_times(percpu=True)
        return sum(cpu_busy_s(per[i]) for i in self.cpus if i < len(per))

    @staticmethod
    def _own() -> float:
        import psutil  # psutil: keeps the CLI start-up light

        t = psutil.Process().cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def result(self) -> dict[str, Any]:
        import torch  # torch: keeps start-up light

        wall = max(time.monotonic() - self.t0, 1e-9)
        other = max(0.0, (self._busy() - self.busy0) - (self._own() - self.own0))
        return {"wall_s": round(wall, 3), "cores": len(self.cpus), "threads": torch.get_num_threads(),
                "other_cpu_cores_mean": round(other / wall, 3),
                "other_cpu_pct_mean": round(100.0 * other / (wall * len(self.cpus)), 2)}


def watched(func: Callable[[Any], int]) -> Callable[[Any], int]:
    """``func`` with a LoadWatch running, for make_record to read."""
    def run(args: Any) -> int:
        token = _WATCH.set(LoadWatch())
        try:
            return func(args)
        finally:
            _WATCH.reset(token)
    return run


# ---------------------------------------------------------------------------------------------
# errors and statuses

_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "failed to allocate")
_UNSUPPORTED_TEXT = ("not implemented", "not supported", "unsupported", "no kernel", "does not support")


def classify_error(exc: BaseException) -> str:
    """"oom" for an allocation failure, "unsupported" for a missing kernel, else "failed"."""
    import torch  # torch: keeps start-up light

    oom_type = getattr(torch.cuda, "OutOfMemoryError", None) or getattr(torch, "OutOfMemoryError", None)
    if isinstance(exc, MemoryError) or (oom_type is not None and isinstance(exc, oom_type)):
        return "oom"
    text = str(exc).lower()
    if any(t in text for t in _OOM_TEXT):
        return "oom"
    if isinstance(exc, (RuntimeError, NotImplementedError, TypeError)) and any(
            t in text for t in _UNSUPPORTED_TEXT):
        return "unsupported"
    return "failed"


def error_reason(exc: BaseException, limit: int = 300) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def free_memory(device) -> None:
    import torch  # torch: keeps start-up light

    gc.collect()
    dev = torch.device(device) if isinstance(device, str) else device
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def record_status(rows: Iterable[dict[str, Any]]) -> str:
    """Record status from row statuses: failed > oom > ok > unsupported (all rows unsupported)."""
    statuses = [r.get("status", "ok") for r in rows]
    if not statuses:
        return "failed"
    for s in ("failed", "oom"):
        if s in statuses:
            return s
    if "ok" in statuses:
        return "ok"
    return "unsupported"


def exit_code(status: str) -> int:
    """0 for ok and all-unsupported (the device lacks it: not an error of the run)."""
    return {"ok": EXIT_OK, "unsupported": EXIT_OK, "oom": EXIT_OOM, "timeout": EXIT_TIMEOUT}.get(
        status, EXIT_FAILED)


def pct(value: float | None, peak: float | None) -> float | None:
    return None if not peak or value is None else 100.0 * value / peak


# ---------------------------------------------------------------------------------------------
# records and console output

def args_config(args: Any) -> dict[str, Any]:
    """Every CLI option as given (the parser's own bookkeeping fields dropped)."""
    return {k: v for k, v in vars(args).items() if k not in ("func", "command", "micro_command")}


@dataclass
class Outcome:
    """What one micro-benchmark run measured, as its record keeps it: the rows, the options and what they
    resolved to (``config``), how to plot the rows, the device; ``error``: the failed rows' reasons."""

    micro: str
    status: str
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    plot: dict[str, Any]
    device: str
    device_name: str | None
    error: str | None = None


def make_record(out: Outcome, env: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    watch = _WATCH.get()
    rec = new_record("micro", micro=out.micro, status=out.status, error=out.error, config=out.config,
                     env=env if env is not None else envinfo.capture(), results=out.rows, plot=out.plot,
                     device=out.device, device_name=out.device_name, load=watch.result() if watch else None,
                     **extra)
    rec["validity"] = validity.assess_micro(rec).to_dict()
    return rec


def failed_reasons(rows: Iterable[dict[str, Any]], label: Callable[[dict[str, Any]], str]) -> str | None:
    """The record's error: each failed row's ``label(row)`` and reason, joined (None: no row failed)."""
    return "; ".join(f"{label(r)}: {r['reason']}" for r in rows if r["status"] == "failed") or None


def append_record(store_dir: str, record: dict[str, Any]) -> str:
    store = ResultStore(store_dir)
    store.append_or_recover(record)  # StoreError (exit 7) names the file that keeps the record
    return str(store.file)


def check_store(store_dir: str) -> None:
    ResultStore(store_dir).check_writable()


def _cell(value: Any) -> str:
    return fmt_cell(value, missing="-")


def print_table(title: str, columns: Sequence[tuple[str, str]], rows: Sequence[dict[str, Any]],
                formatters: dict[str, Callable[[Any], str]] | None = None) -> None:
    """A rich table: ``columns`` = [(row field, header with unit)]; a row's reason goes last."""
    from rich.console import Console  # rich: keeps start-up light
    from rich.table import Table  # rich: keeps start-up light

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    formatters = formatters or {}
    table = Table(title=title, title_justify="left")
    for _, header in columns:
        table.add_column(header, justify="right")
    table.add_column("status", justify="left")
    for row in rows:
        cells = [formatters.get(key, _cell)(row.get(key)) for key, _ in columns]
        status = row.get("status", "ok")
        if row.get("reason"):
            status += f" ({row['reason']})"
        table.add_row(*cells, status)
    console.print(table)


def print_done(record: dict[str, Any], path: str) -> None:
    for f in (record.get("validity") or {}).get("flags") or []:
        print(f"{'⚠' if f.get('severity') == 'warn' else '?'} {f.get('check')}: {f.get('reason')}")
    print(f"record {record['id']} appended to {path} (status {record['status']})")


def add_common_options(p: argparse.ArgumentParser, warmup_defaults: tuple[int, int],
                       iters_defaults: tuple[int, int], nproc_help: str | None = None) -> None:
    """--nproc-per-node, --device, --warmup, --steps, --store (defaults: (GPU, CPU) pairs); --iters
    is the old spelling of --steps."""
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help=nproc_help or "processes (devices) to use; this micro-benchmark measures one "
                                      "device in this process, so only 1 is accepted")
    p.add_argument("--device", default="auto", choices=DEVICES,
                   help="where to run: auto = cuda when a GPU is visible, else cpu")
    p.add_argument("--warmup", type=int_or_auto, default="auto", metavar="N",
                   help=f"untimed calls before timing each case; auto = {warmup_defaults[0]} on GPU, "
                        f"{warmup_defaults[1]} on CPU")
    p.add_argument("--steps", dest="iters", type=int_or_auto, default="auto", metavar="N",
                   help=f"timed samples per case (the median is reported); auto = {iters_defaults[0]} "
                        f"on GPU, {iters_defaults[1]} on CPU")
    deprecated_alias(p, "--iters", "--steps", dest="iters", type=int_or_auto)
    p.add_argument("--store", default="results", metavar="DIR",
                   help="result store directory; one record of kind 'micro' is appended to "
                        "DIR/results.jsonl")
