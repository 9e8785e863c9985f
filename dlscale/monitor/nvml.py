"""NVML reader: one GPU's utilisation, memory, power, clocks, clock-event reasons, processes and
PCIe / NVLink rates from NVML's cumulative counters. Runs in the sampler process (or in-process for
the live table); pynvml is imported only by ``open_gpus``."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

# nvmlDeviceGetPcieThroughput blocks ~20 ms per call (per GPU and direction).  When the
# driver lacks the cumulative PCIe byte counters it is polled at most this often, so that
# the blocking calls take <= ~10 % of the sampler's wall time.
PCIE_FALLBACK_BUDGET = 0.10
PCIE_FALLBACK_CALL_S = 0.02

def _nvml_value(pynvml, fv):
    """Decode an nvmlFieldValue_t's union by its valueType; (value, bits)."""
    vt = fv.valueType
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_DOUBLE", 0):
        return float(fv.value.dVal), None
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_INT", 1):
        return int(fv.value.uiVal), 32
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_LONG", 2):
        return int(fv.value.ulVal), 64
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", 3):
        return int(fv.value.ullVal), 64
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_SIGNED_LONG_LONG", 4):
        return int(fv.value.sllVal), None
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_SIGNED_INT", 5):
        return int(fv.value.siVal), None
    return int(fv.value.ullVal), 64


def _counter_delta(prev, cur, bits):
    """Difference of a cumulative counter; handles one wrap of an unsigned counter."""
    d = cur - prev
    if d < 0:
        if bits is None:
            return None  # counter reset
        d += 1 << bits
    return d


class GpuReader:
    """One NVML device and the state its rate fields need."""

    def __init__(self, pynvml, index: int, errors: list):
        self.nvml = pynvml
        self.index = index
        self.errors = errors
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.name = self._try(lambda: to_str(pynvml.nvmlDeviceGetName(self.h)), "name")
        mem = self._try(lambda: pynvml.nvmlDeviceGetMemoryInfo(self.h), "memory")
        self.mem_total_bytes = int(mem.total) if mem is not None else None
        self.unsupported: set[str] = set()
        fid = {
            "pcie_tx": getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197),
            "pcie_rx": getattr(pynvml, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198),
            "nvlink_tx": getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", 138),
            "nvlink_rx": getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", 139),
        }
        # Cumulative counters read through nvmlDeviceGetFieldValues, as (direction, field id,
        # scopeId).  Each is probed alone first (an unknown field id can fail the whole
        # call on old drivers).  PCIe: one GPU-wide byte counter per direction.  NVLink: one
        # KiB counter per link (scopeId = link), summed over links, as nvitop does.
        self.nvlink_links = self._nvlink_link_count()
        wanted = [("pcie_tx", fid["pcie_tx"], 0), ("pcie_rx", fid["pcie_rx"], 0)]
        for link in range(self.nvlink_links or 0):
            wanted += [("nvlink_tx", fid["nvlink_tx"], link), ("nvlink_rx", fid["nvlink_rx"], link)]
        self._fields = [w for w in wanted if self._field_ok(w[1], w[2])]
        have = {w[0] for w in self._fields}
        if not {"pcie_tx", "pcie_rx"} <= have:
            self._fields = [w for w in self._fields if not w[0].startswith("pcie")]
        self.nvlink = "nvlink_tx" in have or "nvlink_rx" in have
        self.pcie_source = None
        if "pcie_tx" in have and "pcie_rx" in have:
            self.pcie_source = "field_counters"
        else:
            try:
                pynvml.nvmlDeviceGetPcieThroughput(self.h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
                self.pcie_source = "pcie_throughput"
            except Exception:
                self.pcie_source = None
        self._prev_counters: dict[tuple, tuple[int, int, int | None]] = {}  # (dir, link) -> (ts_us, value, bits)
        self._last_pcie_poll = -1e18

    def _field_ok(self, field_id, scope):
        p = self.nvml
        try:
            fv = p.nvmlDeviceGetFieldValues(self.h, [(field_id, scope)])[0]
            return fv.nvmlReturn == p.NVML_SUCCESS
        except Exception:
            return False

    def _nvlink_link_count(self):
        """Number of NVLinks (NVML_FI_DEV_NVLINK_LINK_COUNT, else active links by state)."""
        p = self.nvml
        try:
            fv = p.nvmlDeviceGetFieldValues(self.h, [getattr(p, "NVML_FI_DEV_NVLINK_LINK_COUNT", 91)])[0]
            if fv.nvmlReturn == p.NVML_SUCCESS:
                return int(_nvml_value(p, fv)[0])
        except Exception:
            pass
        n = 0
        for link in range(getattr(p, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if p.nvmlDeviceGetNvLinkState(self.h, link) == p.NVML_FEATURE_ENABLED:
                    n += 1
            except Exception:
                break  # past the last link (InvalidArgument), or no NVLink at all
        return n

    def _try(self, fn, what):
        try:
            return fn()
        except Exception as e:  # NVMLError and friends: that field is null
            self._note(what, e)
            return None

    def _note(self, what, e):
        p = self.nvml
        not_supported = getattr(p, "NVMLError_NotSupported", None)
        if not_supported is not None and isinstance(e, not_supported):
            self.unsupported.add(what)
            return
        msg = f"gpu {self.index} {what}: {type(e).__name__}: {e}"
        if msg not in self.errors and len(self.errors) < 50:
            self.errors.append(msg)
            print(msg, file=sys.stderr, flush=True)

    def _call(self, what, fn):
        if what in self.unsupported:
            return None
        return self._try(fn, what)

    def _counters_to_rates(self, out, fvs):
        p = self.nvml
        raw: dict[str, list] = {}
        for (direction, _fid, scope), fv in zip(self._fields, fvs):
            if fv.nvmlReturn != p.NVML_SUCCESS:
                continue
            value, bits = _nvml_value(p, fv)
            raw.setdefault(direction, []).append((scope, int(fv.timestamp), value, bits))
        for direction, rows in raw.items():
            total, ok = 0.0, False
            for scope, ts, value, bits in rows:
                key = (direction, scope)
                prev = self._prev_counters.get(key)
                self._prev_counters[key] = (ts, value, bits)
                if prev is None or ts <= prev[0]:
                    continue
                d = _counter_delta(prev[1], value, bits)
                if d is None:
                    continue
                scale = 1024 if direction.startswith("nvlink") else 1  # NVLink counters are KiB
                total += d * scale / ((ts - prev[0]) / 1e6)
                ok = True
            if ok:
                out[direction + "_bps"] = total

    def sample(self, pcie_period_s: float) -> dict:
        p, h = self.nvml, self.h
        out = {"index": self.index}
        util = self._call("utilization", lambda: p.nvmlDeviceGetUtilizationRates(h))
        out["util_pct"] = float(util.gpu) if util is not None else None
        out["mem_util_pct"] = float(util.memory) if util is not None else None
        mem = self._call("memory", lambda: p.nvmlDeviceGetMemoryInfo(h))
        out["mem_used_bytes"] = int(mem.used) if mem is not None else None
        pw = self._call("power", lambda: p.nvmlDeviceGetPowerUsage(h))
        out["power_w"] = pw / 1000.0 if pw is not None else None
        clk = self._call("sm_clock", lambda: p.nvmlDeviceGetClockInfo(h, p.NVML_CLOCK_SM))
        out["sm_clock_mhz"] = float(clk) if clk is not None else None
        reasons = self._call("clock_reasons", lambda: _clock_reasons(p, h))
        out["clock_reasons"] = int(reasons) if reasons is not None else None
        out["pids"] = self._call("processes", lambda: _gpu_pids(p, h))
        for k in ("pcie_tx_bps", "pcie_rx_bps", "nvlink_tx_bps", "nvlink_rx_bps"):
            out[k] = None
        if self._fields:
            ids = [(f[1], f[2]) for f in self._fields]
            fvs = self._call("field_values", lambda: p.nvmlDeviceGetFieldValues(h, ids))
            if fvs is not None:
                self._counters_to_rates(out, fvs)
        if self.pcie_source == "pcie_throughput":
            now = time.monotonic()
            if now - self._last_pcie_poll >= pcie_period_s:
                self._last_pcie_poll = now
                # KB/s as NVML documents it, over a 20 ms window; taken as KiB/s (as nvidia-smi
                # and nvitop do) -> bytes/s.
                tx = self._call("pcie_throughput", lambda: p.nvmlDeviceGetPcieThroughput(h, p.NVML_PCIE_UTIL_TX_BYTES))
                rx = self._call("pcie_throughput", lambda: p.nvmlDeviceGetPcieThroughput(h, p.NVML_PCIE_UTIL_RX_BYTES))
                out["pcie_tx_bps"] = tx * 1024.0 if tx is not None else None
                out["pcie_rx_bps"] = rx * 1024.0 if rx is not None else None
        return out


def to_str(x):
    return x.decode() if isinstance(x, bytes) else str(x)


# Clock-event ("throttle") reason bits of nvmlDeviceGetCurrentClocksEventReasons, as nvml.h
# defines them. SLOWDOWN: the clocks are held down by heat or a hardware signal (the validity
# check "throttled"); the power cap is the normal state of a GPU at its power limit, recorded apart.
CLOCK_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock"}
SLOWDOWN_MASK = 0x8 | 0x20 | 0x40 | 0x80
POWER_CAP_MASK = 0x4


def clock_reason_names(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_REASONS.items() if mask & bit]


def _clock_reasons(pynvml, h) -> int:
    fn = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons  # the older name
    return fn(h)


def _gpu_pids(pynvml, h) -> list[int]:
    """Pids of the compute and graphics processes NVML lists on a GPU."""
    pids: set[int] = set()
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(pynvml, name, None)
        if fn is not None:
            pids |= {int(pr.pid) for pr in fn(h)}
    return sorted(pids)



def pcie_fallback_period(interval_s: float, gpus: list[GpuReader]) -> float | None:
    """How often the GPUs without PCIe byte counters poll the blocking throughput call (None: none needs to)."""
    n_fallback = sum(1 for g in gpus if g.pcie_source == "pcie_throughput")
    return max(interval_s, 2 * PCIE_FALLBACK_CALL_S * n_fallback / PCIE_FALLBACK_BUDGET) if n_fallback else None


def nvml_indices(pynvml, wanted, count: int, errors: list[str]) -> list[int]:
    """NVML indices of ``wanted`` (ints pass through; UUIDs are looked up: CUDA's device order and
    CUDA_VISIBLE_DEVICES do not apply to NVML, a GPU's UUID is the same in both)."""
    by_uuid: dict[str, int] = {}
    if any(isinstance(w, str) for w in wanted):
        for i in range(count):
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                by_uuid[to_str(pynvml.nvmlDeviceGetUUID(h)).lower()] = i
            except Exception as e:
                errors.append(f"gpu {i}: uuid: {type(e).__name__}: {e}")
    out = []
    for w in wanted:
        if isinstance(w, str):
            if w.lower() in by_uuid:
                out.append(by_uuid[w.lower()])
            else:
                errors.append(f"gpu {w} not present (NVML sees {count} GPUs)")
        else:
            out.append(w)
    return out


@dataclass
class NvmlGpus:
    """What ``open_gpus`` found: whether NVML answered, why not, and a reader per GPU."""

    ok: bool = False
    error: str | None = None
    gpus: list[GpuReader] = field(default_factory=list)

    def info(self) -> list[dict]:
        """The sampler's metadata of each GPU."""
        return [{"index": g.index, "name": g.name, "mem_total_bytes": g.mem_total_bytes, "pcie_source": g.pcie_source,
                 "nvlink": g.nvlink, "nvlink_links": g.nvlink_links} for g in self.gpus]


def open_gpus(gpu_indices, errors: list[str]) -> NvmlGpus:
    """Initialise NVML and a reader for each wanted GPU (None: every GPU); problems go to ``errors`` and,
    joined, to the result's ``error``."""
    try:
        import pynvml  # optional: pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return NvmlGpus(error=f"{type(e).__name__}: {e}")
    try:
        count = pynvml.nvmlDeviceGetCount()
    except Exception as e:
        return NvmlGpus(error=f"nvmlDeviceGetCount: {type(e).__name__}: {e}")
    out = NvmlGpus(ok=True)
    indices = list(range(count)) if gpu_indices is None else nvml_indices(pynvml, gpu_indices, count, errors)
    for i in indices:
        if not 0 <= i < count:
            errors.append(f"gpu index {i} not present (NVML sees {count} GPUs)")
            continue
        try:
            out.gpus.append(GpuReader(pynvml, i, errors))
        except Exception as e:
            errors.append(f"gpu {i}: {type(e).__name__}: {e}")
    if errors:
        out.error = "; ".join(errors)
    return out
