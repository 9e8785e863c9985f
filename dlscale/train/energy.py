"""Energy of the timed window from hardware counters, read at both ends of it (never inside it).

GPUs: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the
driver loaded; Volta and newer) on each GPU the node's ranks use. CPUs: Linux RAPL
(``/sys/class/powercap/intel-rapl:N/energy_uj``, the package domains only: their sub-domains are
parts of them), microjoules that wrap at ``max_energy_range_uj``; the whole package, so other
processes' use counts too. A counter that cannot be read at either end gives nothing: the record
carries energy only where a counter was read, never a figure made from power or a guess.

The readers take their NVML module and their sysfs root as arguments so tests drive them with fakes.
"""
from __future__ import annotations

import dataclasses
import glob
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from dlscale.results.record import median_repeat_with

RAPL_ROOT = "/sys/class/powercap"


@dataclass
class Reading:
    """Counters at one instant: per GPU joules (None: unsupported), per RAPL package microjoules."""

    gpu_j: list[float | None] = field(default_factory=list)
    rapl_uj: dict[str, int] = field(default_factory=dict)
    rapl_range_uj: dict[str, int] = field(default_factory=dict)


def nvml_joules(nvml, handles) -> list[float | None]:
    """Each handle's total-energy counter in joules; None where the GPU or driver does not support it."""
    out: list[float | None] = []
    for h in handles:
        try:
            out.append(float(nvml.nvmlDeviceGetTotalEnergyConsumption(h)) / 1e3)
        except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: no counter on this GPU
            out.append(None)
    return out


def rapl_domains(root: str = RAPL_ROOT) -> list[str]:
    """The readable package-level RAPL domains (``intel-rapl:N``) under ``root``."""
    out = []
    for d in sorted(glob.glob(os.path.join(root, "intel-rapl:*"))):
        if os.path.basename(d).count(":") == 1 and os.access(os.path.join(d, "energy_uj"), os.R_OK):
            out.append(d)
    return out


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def rapl_read(domains: list[str]) -> tuple[dict[str, int], dict[str, int]]:
    """(microjoules, wrap range) of each domain that could be read now."""
    uj, rng = {}, {}
    for d in domains:
        v = _read_int(os.path.join(d, "energy_uj"))
        if v is not None:
            uj[d] = v
            r = _read_int(os.path.join(d, "max_energy_range_uj"))
            if r:
                rng[d] = r
    return uj, rng


def counter_delta(before: float | None, after: float | None, wrap: float | None = None) -> float | None:
    """``after - before`` of a counter that counts up; one wrap past ``wrap`` (its range) is undone; None
    where either end is missing, or it went back without a known range (a driver reload: no figure)."""
    if before is None or after is None:
        return None
    if after >= before:
        return after - before
    return after + wrap - before if wrap else None


def window_energy(before: Reading, after: Reading, seconds: float | None = None) -> dict[str, Any] | None:
    """The window's energy: summed GPU joules over the GPUs read at both ends, summed RAPL package joules;
    None where no counter was read at both ends."""
    gpus = [counter_delta(b, a) for b, a in zip(before.gpu_j, after.gpu_j)]
    read = [g for g in gpus if g is not None]
    cpu = [counter_delta(before.rapl_uj.get(d), after.rapl_uj.get(d), after.rapl_range_uj.get(d))
           for d in before.rapl_uj]
    cpu_read = [c / 1e6 for c in cpu if c is not None]
    if not read and not cpu_read:
        return None
    out: dict[str, Any] = {"gpu_j": sum(read) if read else None, "gpus_read": len(read),
                           "gpus_unsupported": len(gpus) - len(read),
                           "cpu_j": sum(cpu_read) if cpu_read else None, "cpu_packages_read": len(cpu_read)}
    if seconds:
        out["read_s"] = seconds
    return out


class Meter:
    """The node's counters (local rank 0): ``start()`` before the window, ``stop()`` after it."""

    def __init__(self, nvml=None, handles=(), rapl: list[str] | None = None):
        self.nvml, self.handles, self.rapl = nvml, list(handles), list(rapl or [])
        self.before: Reading | None = None
        self.t0 = 0.0

    def read(self) -> Reading:
        uj, rng = rapl_read(self.rapl)
        return Reading(nvml_joules(self.nvml, self.handles) if self.nvml else [], uj, rng)

    def start(self) -> None:
        self.before = self.read()
        self.t0 = time.perf_counter()

    def stop(self) -> dict[str, Any] | None:
        """The energy since ``start``, with the seconds between the two readings (``read_s``)."""
        if self.before is None:
            return None
        t = time.perf_counter()
        return window_energy(self.before, self.read(), t - self.t0)


def _nvml_handles(uuids: list[str] | None, count: int):
    """pynvml and the handles of the node's ranks' GPUs (by UUID; else the first ``count``); (None, [])
    where NVML does not load."""
    try:
        import pynvml  # optional: pynvml

        pynvml.nvmlInit()
        if uuids:
            return pynvml, [pynvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
        return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except Exception:  # noqa: BLE001 - no NVML library or driver: no GPU energy, never a failure
        return None, []


def start(denv, uuids: list[str] | None = None, rapl_root: str = RAPL_ROOT) -> Meter | None:
    """Worker hook before the window: a started Meter on local rank 0 (one per node), else None."""
    if denv.local_rank != 0:
        return None
    nvml, handles = _nvml_handles(uuids, denv.local_world_size) if denv.device.type == "cuda" else (None, [])
    meter = Meter(nvml, handles, rapl_domains(rapl_root))
    if not meter.handles and not meter.rapl:
        return None
    meter.start()
    return meter


def stop(meter: Meter | None, result: dict[str, Any]) -> None:
    """Worker hook after the window: the node's energy in the rank's result, where a counter was read."""
    if meter is not None:
        got = meter.stop()
        if got is not None:
            result["energy"] = got


# ----------------------------------------------------------------------------- records

def merge_nodes(ranks: list[dict[str, Any]], samples: float | None, nnodes: int = 1) -> dict[str, Any] | None:
    """A repeat's energy from its nodes' readings: the sums, and joules per sample of the device that
    trained (GPUs on CUDA, CPU packages on the CPU), only where all ``nnodes`` nodes read theirs (part of
    the job's energy over all its samples would be too low). None where no node read a counter."""
    nodes = [r["energy"] for r in ranks if isinstance(r.get("energy"), dict)]
    if not nodes:
        return None

    def total(key):
        xs = [n.get(key) for n in nodes if isinstance(n.get(key), (int, float))]
        return sum(xs) if xs else None

    cuda = any(str(r.get("device", "")).startswith("cuda") for r in ranks)
    reads = [n["read_s"] for n in nodes if isinstance(n.get("read_s"), (int, float))]
    out = {"gpu_j": total("gpu_j"), "cpu_j": total("cpu_j"), "gpus_read": total("gpus_read"),
           "gpus_unsupported": total("gpus_unsupported"), "cpu_packages_read": total("cpu_packages_read"),
           "nodes": len(nodes), "read_s": max(reads) if reads else None, "source": "nvml" if cuda else "rapl"}
    joules = out["gpu_j"] if cuda else out["cpu_j"]
    whole = len(nodes) >= nnodes
    out["j_per_sample"] = joules / samples if joules is not None and samples and whole else None
    return out


def _median_of(repeats: list[dict[str, Any]], key: str) -> float | None:
    xs = [r["energy"][key] for r in repeats if isinstance(r.get("energy"), dict)
          and isinstance(r["energy"].get(key), (int, float))]
    return statistics.median(xs) if xs else None


def summary_fields(repeats: list[dict[str, Any]], seq_len: int | None) -> dict[str, Any]:
    """The summary's joules per sample (median over the ok repeats that read a counter) and per token
    (÷ the sequence length); nothing where no repeat read one."""
    ok = [r for r in repeats if r.get("status") == "ok"]
    if not any(isinstance(r.get("energy"), dict) for r in ok):
        return {}
    per = _median_of(ok, "j_per_sample")
    return {"joules_per_sample": per, "joules_per_token": per / seq_len if per is not None and seq_len else None}


def measured_power(rec: dict[str, Any]) -> tuple[float | None, str]:
    """The mean GPU power of a record's median repeat from its energy counter (joules ÷ window), for
    ``cost``; (None, why) where the record has no measured GPU energy."""
    rep = median_repeat_with(rec, "energy") or {}
    e = rep.get("energy")
    w = e.get("read_s") if e else None
    if not e or not isinstance(e.get("gpu_j"), (int, float)) or not isinstance(w, (int, float)) or w <= 0:
        return None, "no measured energy"
    if e.get("gpus_unsupported"):
        return None, f"energy counter unsupported on {e['gpus_unsupported']} GPU(s)"
    return e["gpu_j"] / w, f"measured energy (NVML counter, {e.get('gpus_read')} GPU(s))"


def prefer_measured(options: list, records: list[dict[str, Any]]) -> list:
    """``cost``'s options with the power from the measured energy where their record has it; the sampled
    mean power otherwise (each option's ``power_source`` says which)."""
    by_id = {str(r.get("id")): r for r in records if isinstance(r, dict)}
    out = []
    for o in options:
        rec = by_id.get(o.record) if o.kind == "run" else None
        p, src = measured_power(rec) if rec else (None, "")
        out.append(dataclasses.replace(o, power_w=p, power_source=src) if p is not None else o)
    return out
