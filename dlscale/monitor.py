"""Low-overhead hardware sampler: GPU (NVML) and host (psutil) utilisation over time.

The sampling loop runs in a separate *process* (``python -m dlscale.monitor --worker``,
started with :mod:`subprocess`, so nothing is forked from a parent that holds CUDA
state or threads, and the parent's ``__main__`` is never re-imported).  The parent
side (:class:`HardwareSampler`) starts no thread: the sampler appends one JSON line
per sample to the series file and flushes it, and the parent reads that file when
asked for :meth:`~HardwareSampler.summary` or :meth:`~HardwareSampler.series`.
A crash therefore leaves every sample taken so far on disk.

Protocol between the two processes:

* child stdin (pipe): the parent writes ``stop`` and closes it; EOF also stops the
  child, and the child exits by itself when its parent process disappears;
* child stdout (pipe): exactly one JSON line, the sampler's metadata (NVML present
  or not and why, the GPUs, the PCIe source, the child's pid), written before the
  first sample;
* child stderr: a temporary file, read back only to explain a failure;
* the series file: JSON lines, one sample per line, each with ``"t"`` = ``time.time()``.

Field definitions, units and caveats: docs/utilisation.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

from dlscale import ConfigError
from dlscale.fmt import fmt_si

MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 10.0
STOP_TIMEOUT_S = 2.0

# nvmlDeviceGetPcieThroughput blocks ~20 ms per call (per GPU and direction).  When the
# driver lacks the cumulative PCIe byte counters it is polled at most this often, so that
# the blocking calls take <= ~10 % of the sampler's wall time.
_PCIE_FALLBACK_BUDGET = 0.10
_PCIE_FALLBACK_CALL_S = 0.02
# The process tree whose RSS is summed is re-listed this often (listing children scans /proc).
_CHILDREN_REFRESH_S = 2.0
# The sampler gives up (exit 1, reason on stderr) after this many failed samples in a row.
_MAX_CONSECUTIVE_FAILURES = 20

# GPU metrics: per-sample key -> summary key stem.
GPU_METRICS = (
    ("util_pct", "gpu_util_pct"),
    ("mem_util_pct", "gpu_mem_util_pct"),
    ("mem_used_bytes", "gpu_mem_used_bytes"),
    ("power_w", "gpu_power_w"),
    ("sm_clock_mhz", "gpu_sm_clock_mhz"),
    ("pcie_tx_bps", "gpu_pcie_tx_bps"),
    ("pcie_rx_bps", "gpu_pcie_rx_bps"),
    ("nvlink_tx_bps", "gpu_nvlink_tx_bps"),
    ("nvlink_rx_bps", "gpu_nvlink_rx_bps"),
)
# Host metrics: the per-sample key is also the summary key stem.
HOST_METRICS = (
    "cpu_util_pct",
    "cpu_steal_pct",
    "host_mem_used_bytes",
    "proc_rss_bytes",
    "disk_read_bps",
    "disk_write_bps",
    "net_sent_bps",
    "net_recv_bps",
)


def validate_interval(interval_s: float) -> float:
    """Return the sampling interval as a float, or raise ConfigError (one line)."""
    try:
        value = float(interval_s)
    except (TypeError, ValueError):
        raise ConfigError(f"sampling interval must be a number of seconds, got {interval_s!r}") from None
    if not math.isfinite(value) or value < MIN_INTERVAL_S or value > MAX_INTERVAL_S:
        raise ConfigError(
            f"sampling interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S:g} s, got {interval_s!r}"
        )
    return value


# --------------------------------------------------------------------------------------
# Sampling side (runs in the sampler process, or in-process for the live table)
# --------------------------------------------------------------------------------------


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


class _Gpu:
    """One NVML device and the state its rate fields need."""

    def __init__(self, pynvml, index: int, errors: list):
        self.nvml = pynvml
        self.index = index
        self.errors = errors
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.name = self._try(lambda: _to_str(pynvml.nvmlDeviceGetName(self.h)), "name")
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


def _to_str(x):
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


MPS_SERVER = "nvidia-cuda-mps-server"  # the process NVML lists on a GPU shared through MPS


class _Collector:
    """Takes samples.  Used by the sampler process and by the live table (in-process)."""

    def __init__(self, interval_s: float, gpu_indices=None, pid=None, use_nvml: bool = True):
        import psutil

        self.psutil = psutil
        self.interval_s = interval_s
        self.errors: list[str] = []
        self.own_pid = os.getpid()
        self.pid = pid
        self.meta = {
            "sampler_pid": self.own_pid,
            "interval_s": interval_s,
            "watched_pid": pid,
            "n_cpus": psutil.cpu_count() or 0,
            "nvml": False,
            "nvml_error": None,
            "gpus": [],
        }
        self.gpus: list[_Gpu] = []
        if use_nvml:
            self._init_nvml(gpu_indices)
        else:
            self.meta["nvml_error"] = "NVML disabled by the caller"
        n_fallback = sum(1 for g in self.gpus if g.pcie_source == "pcie_throughput")
        self.pcie_period_s = max(interval_s, 2 * _PCIE_FALLBACK_CALL_S * n_fallback / _PCIE_FALLBACK_BUDGET)
        self.meta["pcie_fallback_period_s"] = self.pcie_period_s if n_fallback else None
        # The watched process tree: its RSS, its CPU time and its GPU processes (the rest of the
        # machine's load is what competes with the case: dlscale/validity.py).
        self._root = None
        self._tree: list = []
        self._tree_at = -1e18
        self._listed_wall = None  # wall time of the latest tree listing
        self._prev_listed_wall = None  # and of the one before
        self._cpu_prev: dict[int, tuple[float, float]] = {}  # pid -> (create time, CPU seconds)
        self._names: dict[int, str | None] = {}  # pid -> process name, for the MPS server
        if pid is not None:
            try:
                self._root = psutil.Process(pid)
            except Exception as e:
                self.errors.append(f"watched pid {pid}: {type(e).__name__}: {e}")
        self.cores = self._case_cores()
        self.meta["case_cores"] = self.cores
        # Prime the since-last-call counters.
        psutil.cpu_percent(percpu=True)
        psutil.cpu_times_percent()
        self._prev_t = time.monotonic()
        self._prev_disk = self._disk()
        self._prev_net = self._net()
        self._prev_cpu_s = time.process_time()
        if self._root is not None:
            self._refresh_tree(time.monotonic())
            self._case_cpu_s()
        for g in self.gpus:
            g.sample(self.pcie_period_s)

    def _case_cores(self) -> list[int] | None:
        """The cores the watched process may run on (its affinity); None: every core."""
        if self._root is None:
            return None
        try:
            return sorted(self._root.cpu_affinity())
        except Exception:  # not on every platform
            return None

    def _nvml_indices(self, wanted, count: int) -> list[int]:
        """NVML indices of ``wanted`` (ints pass through; UUIDs are looked up: CUDA's device order and
        CUDA_VISIBLE_DEVICES do not apply to NVML, a GPU's UUID is the same in both)."""
        by_uuid: dict[str, int] = {}
        if any(isinstance(w, str) for w in wanted):
            for i in range(count):
                try:
                    h = self.pynvml.nvmlDeviceGetHandleByIndex(i)
                    by_uuid[_to_str(self.pynvml.nvmlDeviceGetUUID(h)).lower()] = i
                except Exception as e:
                    self.errors.append(f"gpu {i}: uuid: {type(e).__name__}: {e}")
        out = []
        for w in wanted:
            if isinstance(w, str):
                if w.lower() in by_uuid:
                    out.append(by_uuid[w.lower()])
                else:
                    self.errors.append(f"gpu {w} not present (NVML sees {count} GPUs)")
            else:
                out.append(w)
        return out

    def _init_nvml(self, gpu_indices):
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:
            self.meta["nvml_error"] = f"{type(e).__name__}: {e}"
            return
        self.pynvml = pynvml
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            self.meta["nvml_error"] = f"nvmlDeviceGetCount: {type(e).__name__}: {e}"
            return
        self.meta["nvml"] = True
        indices = list(range(count)) if gpu_indices is None else self._nvml_indices(gpu_indices, count)
        for i in indices:
            if not 0 <= i < count:
                self.errors.append(f"gpu index {i} not present (NVML sees {count} GPUs)")
                continue
            try:
                self.gpus.append(_Gpu(pynvml, i, self.errors))
            except Exception as e:
                self.errors.append(f"gpu {i}: {type(e).__name__}: {e}")
        self.meta["gpus"] = [
            {
                "index": g.index,
                "name": g.name,
                "mem_total_bytes": g.mem_total_bytes,
                "pcie_source": g.pcie_source,
                "nvlink": g.nvlink,
                "nvlink_links": g.nvlink_links,
            }
            for g in self.gpus
        ]
        if self.errors:
            self.meta["nvml_error"] = "; ".join(self.errors)

    def _disk(self):
        try:
            d = self.psutil.disk_io_counters(perdisk=False)
            return None if d is None else (d.read_bytes, d.write_bytes)
        except Exception:
            return None

    def _net(self):
        try:
            n = self.psutil.net_io_counters(pernic=False)
            return None if n is None else (n.bytes_sent, n.bytes_recv)
        except Exception:
            return None

    def _refresh_tree(self, now):
        if now - self._tree_at < _CHILDREN_REFRESH_S:
            return
        self._tree_at = now
        try:
            kids = self._root.children(recursive=True)
        except Exception:
            kids = []
        self._prev_listed_wall, self._listed_wall = self._listed_wall, time.time()
        self._tree = [self._root] + [k for k in kids if k.pid != self.own_pid]

    def _case_cpu_s(self):
        """CPU seconds the watched tree and this sampler used since the previous call.

        A process first seen in this listing counts in full when it was created after the previous
        listing (all its time is new); one that ended between two samples loses its last interval
        (counted as other load: a small bias towards flagging, never towards hiding).
        """
        ps = self.psutil
        total, seen = 0.0, {}
        for proc in self._tree:
            try:
                with proc.oneshot():
                    ct = proc.cpu_times()
                    created = proc.create_time()
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
            cpu = ct.user + ct.system
            prev = self._cpu_prev.get(proc.pid)
            if prev is not None and prev[0] == created:
                total += max(0.0, cpu - prev[1])
            elif self._prev_listed_wall is not None and created >= self._prev_listed_wall:
                total += cpu
            seen[proc.pid] = (created, cpu)
        self._cpu_prev = seen
        own = time.process_time()
        total += max(0.0, own - self._prev_cpu_s)
        self._prev_cpu_s = own
        return total

    def _rss(self, now):
        if self._root is None:
            return None
        ps = self.psutil
        self._refresh_tree(now)
        total, alive = 0, 0
        for proc in self._tree:
            try:
                total += proc.memory_info().rss
                alive += 1
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess):
                continue
        return total if alive else None

    def sample(self) -> dict:
        t = time.time()
        now = time.monotonic()
        dt = now - self._prev_t
        self._prev_t = now
        ps = self.psutil
        s: dict = {"t": t, "dt": round(dt, 6)}
        per_core = ps.cpu_percent(percpu=True)
        s["cpu_util_pct"] = round(sum(per_core) / len(per_core), 2) if per_core else None
        s["cpu_util_per_core"] = [round(x, 1) for x in per_core]
        # steal: time the hypervisor ran another guest on this VM's CPUs (Linux; else absent). A
        # neighbour's load shows here, not in any process of this machine.
        steal = getattr(ps.cpu_times_percent(), "steal", None)
        s["cpu_steal_pct"] = round(steal, 2) if steal is not None else None
        try:
            s["host_mem_used_bytes"] = int(ps.virtual_memory().used)
        except Exception:
            s["host_mem_used_bytes"] = None
        s["proc_rss_bytes"] = self._rss(now)
        disk, net = self._disk(), self._net()
        for (prev, cur, keys) in (
            (self._prev_disk, disk, ("disk_read_bps", "disk_write_bps")),
            (self._prev_net, net, ("net_sent_bps", "net_recv_bps")),
        ):
            for j, k in enumerate(keys):
                if prev is None or cur is None or dt <= 0 or cur[j] < prev[j]:
                    s[k] = None
                else:
                    s[k] = round((cur[j] - prev[j]) / dt, 1)
        self._prev_disk, self._prev_net = disk, net
        s["gpus"] = [g.sample(self.pcie_period_s) for g in self.gpus]
        if self._root is not None:
            self._case_load(s, per_core, dt)
        s["sampler_cpu_s"] = round(time.process_time(), 6)
        return s

    def _case_load(self, s: dict, per_core: list, dt: float) -> None:
        """The case's CPU (cores busy in the watched tree, sampler included), the busy cores of its
        affinity, the rest (other processes); per GPU, the listed processes outside the tree."""
        case_s = self._case_cpu_s()
        cores = self.cores if self.cores is not None else range(len(per_core))
        busy = sum(per_core[i] for i in cores if i < len(per_core)) / 100.0
        case = case_s / dt if dt > 0 else None
        s["case_cpu_cores"] = None if case is None else round(case, 3)
        s["cpu_busy_cores"] = round(busy, 3)
        s["other_cpu_cores"] = None if case is None else round(max(0.0, busy - case), 3)
        tree = {p.pid for p in self._tree} | {self.own_pid}
        for g in s["gpus"]:
            pids = g.get("pids")
            if pids is not None:
                # under MPS, NVML lists the MPS server beside its clients (the case's processes and
                # any other one, each under its own pid): the server is no competitor of its own
                g["foreign_pids"] = [p for p in pids if p not in tree and not self._mps_server(p)]
                g["own_pids_seen"] = any(p in tree for p in pids)

    def _mps_server(self, pid: int) -> bool:
        """Whether ``pid`` is NVIDIA's MPS server (its name, looked up once per pid)."""
        if pid not in self._names:
            try:
                self._names[pid] = self.psutil.Process(pid).name()
            except Exception:  # noqa: BLE001 - gone, or another namespace's pid: not known as the server
                self._names[pid] = None
        return self._names[pid] == MPS_SERVER


def _worker_main(args) -> int:
    """The sampler process: sample every interval until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent; it stops us
    parent = os.getppid()
    out = open(args.series, "a", encoding="utf-8")
    col = _Collector(args.interval, args.gpus, args.pid, use_nvml=not args.no_nvml)
    meta = dict(col.meta)
    meta["started_t"] = time.time()
    sys.stdout.write(json.dumps(meta) + "\n")
    sys.stdout.flush()
    stdin_fd = sys.stdin.fileno()
    interval = args.interval
    next_t = time.monotonic() + interval
    failures = 0
    orphaned = False
    while True:
        timeout = next_t - time.monotonic()
        if timeout > 0:
            r, _, _ = select.select([stdin_fd], [], [], timeout)
            if r:
                data = os.read(stdin_fd, 4096)
                if b"stop" in data:
                    break
                if not data:  # EOF without "stop": the caller is gone
                    orphaned = True
                    break
            continue
        if os.getppid() != parent:  # parent gone: do not outlive it
            orphaned = True
            break
        try:
            sample = col.sample()
        except Exception as e:  # a transient failure costs one sample, a persistent one ends the run
            failures += 1
            if failures == 1 or failures >= _MAX_CONSECUTIVE_FAILURES:
                print(f"sample failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if failures >= _MAX_CONSECUTIVE_FAILURES:
                raise
        else:
            failures = 0
            out.write(json.dumps(sample, separators=(",", ":")) + "\n")
            out.flush()
        next_t += interval
        now = time.monotonic()
        if next_t <= now:  # fell behind (machine overloaded, slow NVML): skip, do not burst
            next_t = now + interval
    out.close()
    if orphaned:  # nobody will read or delete the caller's temporary files
        for path in args.orphan_cleanup:
            try:
                os.unlink(path)
            except OSError:
                pass
    return 0


# --------------------------------------------------------------------------------------
# Caller side
# --------------------------------------------------------------------------------------


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _max(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def _load_summary(win: list[dict], meta: dict) -> dict:
    """What competed with the case in the window, and how its GPUs' clocks were held (validity).

    other_cpu_pct_mean: cores busy outside the case's process tree, % of the case's cores;
    gpu_throttle_frac: share of (sample, GPU) pairs with a thermal or hardware slowdown reason;
    gpu_foreign_procs_max: most processes outside the tree seen at once on the sampled GPUs, judged
    only when NVML lists one of the tree's own pids (gpu_pids_comparable; in a container NVML may
    report the host's pids).
    """
    out: dict = {}
    cores = meta.get("case_cores")
    n = len(cores) if cores else meta.get("n_cpus")
    out["case_n_cores"] = n
    for k in ("case_cpu_cores", "cpu_busy_cores", "other_cpu_cores"):
        out[k + "_mean"] = _mean([s.get(k) for s in win])
    other = out["other_cpu_cores_mean"]
    out["other_cpu_pct_mean"] = other / n * 100.0 if other is not None and n else None
    gs = [g for s in win for g in s.get("gpus", [])]
    reasons = [g["clock_reasons"] for g in gs if isinstance(g.get("clock_reasons"), int)]
    out["gpu_throttle_frac"] = sum(1 for r in reasons if r & SLOWDOWN_MASK) / len(reasons) if reasons else None
    out["gpu_power_cap_frac"] = sum(1 for r in reasons if r & POWER_CAP_MASK) / len(reasons) if reasons else None
    seen = 0
    for r in reasons:
        seen |= r & SLOWDOWN_MASK
    out["gpu_throttle_reasons"] = clock_reason_names(seen) if reasons else None
    listed = [g for g in gs if g.get("foreign_pids") is not None]
    if listed:
        out["gpu_pids_comparable"] = any(g.get("own_pids_seen") for g in listed)
        per_sample = [set().union(*[set(g.get("foreign_pids") or []) for g in s.get("gpus", [])]) for s in win]
        out["gpu_foreign_procs_max"] = max(len(x) for x in per_sample)
        out["gpu_foreign_pids"] = sorted(set().union(*per_sample))[:20]
    else:
        out["gpu_pids_comparable"] = out["gpu_foreign_procs_max"] = out["gpu_foreign_pids"] = None
    return out


class HardwareSampler:
    """Background hardware sampler in its own process.

    ``pid``: root of the process tree whose RSS is summed into ``proc_rss_bytes``
    (default: the calling process; pass ``os.getppid()`` from a torchrun worker to
    cover every local rank and its data-loader workers).  ``nvml=False`` skips NVML.
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        gpu_indices: list[int] | None = None,
        series_path: str | None = None,
        *,
        pid: int | None = None,
        nvml: bool = True,
    ):
        self.interval_s = validate_interval(interval_s)
        # NVML indices or GPU UUIDs ("GPU-..."); None: every GPU of the machine
        self.gpu_indices = None if gpu_indices is None else [i if isinstance(i, str) else int(i) for i in gpu_indices]
        self.series_path = None if series_path is None else os.fspath(series_path)
        self.pid = os.getpid() if pid is None else int(pid)
        self.use_nvml = bool(nvml)
        self._proc: subprocess.Popen | None = None
        self._owner_pid = os.getpid()  # a forked copy of this object (data-loader worker) must not act
        self._path: str | None = None
        self._tmp_series = False
        self._stderr_path: str | None = None
        self._meta: dict | None = None
        self._samples: list[dict] = []
        self._offset = 0
        self._stop_requested = False
        self._stopped = False
        self._error: str | None = None
        self._started_at = None

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def sampler_pid(self) -> int | None:
        """Pid of the sampler process (None before start)."""
        return None if self._proc is None else self._proc.pid

    def start(self) -> None:
        """Start the sampler process; returns at once.  Never raises: a failure to start
        is reported by summary()['sampling_error']."""
        if self._proc is not None:
            return
        try:
            if self.series_path is None:
                fd, self._path = tempfile.mkstemp(prefix="dlscale-monitor-", suffix=".jsonl")
                os.close(fd)
                self._tmp_series = True
            else:
                self._path = os.path.abspath(self.series_path)
                open(self._path, "w").close()  # truncate; fail here, not in the child
            fd, self._stderr_path = tempfile.mkstemp(prefix="dlscale-monitor-", suffix=".err")
            cmd = [sys.executable, "-m", "dlscale.monitor", "--worker",
                   "--interval", repr(self.interval_s), "--series", self._path, "--pid", str(self.pid),
                   "--gpus", "all" if self.gpu_indices is None else ",".join(map(str, self.gpu_indices))]
            if not self.use_nvml:
                cmd.append("--no-nvml")
            for path in ([self._path] if self._tmp_series else []) + [self._stderr_path]:
                cmd += ["--orphan-cleanup", path]
            env = dict(os.environ)
            pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            env["PYTHONUNBUFFERED"] = "1"
            with os.fdopen(fd, "wb") as err:
                self._proc = subprocess.Popen(
                    cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                    close_fds=True, env=env,
                )
            self._started_at = time.time()
        except BaseException as e:  # an interrupt between the temp files and the child leaves neither behind
            if self._proc is None:
                for path in ([self._path] if self._tmp_series else []) + [self._stderr_path]:
                    _unlink(path)
                self._stderr_path = None
            if not isinstance(e, Exception):
                raise
            self._error = f"failed to start the sampler: {type(e).__name__}: {e}"
            self._proc = None

    def wait_ready(self, timeout_s: float = 10.0) -> bool:
        """Block until the first sample is on disk (True) or timeout / sampler death (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._read_new()
            if self._samples:
                return True
            if self._proc is None or self._proc.poll() is not None:
                return False
            time.sleep(min(0.02, self.interval_s))
        return False

    def stop(self) -> None:
        """Stop the sampler: ask, wait up to ~2 s, then kill.  Never raises but an interrupt, and then
        its temp files are gone too."""
        proc = self._proc
        if proc is None or self._stopped or os.getpid() != self._owner_pid:
            return
        try:
            self._stop(proc)
        finally:  # a signal inside must not leave the child or the temp files behind
            if not self._stopped:
                try:
                    proc.kill()
                except Exception:
                    pass
            if self._tmp_series and self._path:
                _unlink(self._path)
            if self._stderr_path:
                _unlink(self._stderr_path)
                self._stderr_path = None

    def _stop(self, proc: subprocess.Popen) -> None:
        died_before = proc.poll() is not None
        self._stop_requested = True
        if not died_before:
            try:
                proc.stdin.write(b"stop\n")
                proc.stdin.flush()
            except (BrokenPipeError, OSError, ValueError):
                pass
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._set_error(f"sampler did not stop within {STOP_TIMEOUT_S:g} s; killed")
                try:
                    proc.kill()
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except Exception:
                    pass
        if died_before:
            self._set_error(self._death_reason())
        elif proc.returncode not in (0, None) and self._error is None:
            self._set_error(self._death_reason(at_stop=True))
        self._read_meta(0.0)
        self._read_new()
        for f in (proc.stdin, proc.stdout):
            try:
                f.close()
            except Exception:
                pass
        self._stopped = True

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def __del__(self):
        try:
            proc = self._proc
            if proc is not None and not self._stopped and os.getpid() == self._owner_pid and proc.poll() is None:
                proc.kill()
        except Exception:
            pass

    # -- results -----------------------------------------------------------------------

    def series(self) -> list[dict]:
        """All samples taken so far (each has "t", a time.time() stamp)."""
        self._check_alive()
        self._read_new()
        return list(self._samples)

    def summary(self, t_start: float, t_end: float) -> dict:
        """Averages and maxima over the samples with t_start <= t <= t_end.  Never raises."""
        self._check_alive()
        self._read_meta(0.5 if self._proc is not None and not self._stopped else 0.0)
        self._read_new()
        win = [s for s in self._samples if t_start <= s.get("t", -1) <= t_end]
        meta = self._meta or {}
        out: dict = {
            "n_samples": len(win),
            "interval_s": self.interval_s,
            "window_s": t_end - t_start,
            "nvml": bool(meta.get("nvml", False)),
            "nvml_error": meta.get("nvml_error") if meta else None,
            "n_gpus": len(meta.get("gpus", [])) if meta.get("nvml") else 0,
        }
        for k in HOST_METRICS:
            vals = [s.get(k) for s in win]
            out[k + "_mean"] = _mean(vals)
            out[k + "_max"] = _max(vals)
        cores = [s.get("cpu_util_per_core") for s in win if s.get("cpu_util_per_core")]
        ncore = min((len(c) for c in cores), default=0)
        out["cpu_util_per_core_mean"] = [sum(c[i] for c in cores) / len(cores) for i in range(ncore)] if cores else None
        out.update(_load_summary(win, meta))
        # GPU: per GPU over samples, then averaged over GPUs (max: over everything).
        per_gpu = []
        info = {g["index"]: g for g in meta.get("gpus", [])}
        for idx in sorted({g["index"] for s in win for g in s.get("gpus", [])} | set(info)):
            rows = [g for s in win for g in s.get("gpus", []) if g.get("index") == idx]
            entry = {"index": idx, "name": info.get(idx, {}).get("name"),
                     "mem_total_bytes": info.get(idx, {}).get("mem_total_bytes")}
            for k, _stem in GPU_METRICS:
                entry[k + "_mean"] = _mean([r.get(k) for r in rows])
                entry[k + "_max"] = _max([r.get(k) for r in rows])
            per_gpu.append(entry)
        for k, stem in GPU_METRICS:
            out[stem + "_mean"] = _mean([g[k + "_mean"] for g in per_gpu])
            out[stem + "_max"] = _max([g[k + "_max"] for g in per_gpu])
        out["per_gpu"] = per_gpu
        # The sampler's own CPU time over the window, % of one core.
        out["sampler_cpu_pct"] = None
        if len(win) >= 2:
            c0, c1 = win[0].get("sampler_cpu_s"), win[-1].get("sampler_cpu_s")
            dt = win[-1]["t"] - win[0]["t"]
            if c0 is not None and c1 is not None and dt > 0:
                out["sampler_cpu_pct"] = 100.0 * (c1 - c0) / dt
        err = self._error
        if err is None and not win:
            if self._proc is None:
                err = "sampler was never started"
            elif not self._samples:
                err = "sampler produced no samples"
            else:
                err = (f"no samples between t_start and t_end (window {t_end - t_start:.3f} s, "
                       f"interval {self.interval_s:g} s)")
        out["sampling_error"] = err
        return out

    # -- internals ---------------------------------------------------------------------

    def _set_error(self, msg):
        if msg and self._error is None:
            self._error = msg

    def _check_alive(self):
        proc = self._proc
        if proc is not None and not self._stopped and not self._stop_requested and proc.poll() is not None:
            self._set_error(self._death_reason())

    def _death_reason(self, at_stop=False):
        rc = self._proc.returncode if self._proc is not None else None
        if rc is not None and rc < 0:
            try:
                how = f"killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                how = f"killed by signal {-rc}"
        else:
            how = f"exited with code {rc}"
        when = "at stop" if at_stop else "before stop()"
        tail = self._stderr_tail()
        return f"sampler failed: process {how} {when}" + (f": {tail}" if tail else "")

    def _stderr_tail(self):
        if not self._stderr_path:
            return ""
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - 2000))
                lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
            return lines[-1][:300] if lines else ""
        except OSError:
            return ""

    def _read_meta(self, timeout_s: float):
        if self._meta is not None or self._proc is None or self._proc.stdout is None:
            return
        try:
            fd = self._proc.stdout.fileno()
            r, _, _ = select.select([fd], [], [], timeout_s)
            if not r:
                return
            line = self._proc.stdout.readline()
            if line:
                self._meta = json.loads(line)
        except Exception:
            pass

    def _read_new(self):
        """Parse the lines appended to the series file since the last read."""
        if not self._path or (self._stopped and self._tmp_series):
            return
        try:
            with open(self._path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self._offset += end + 1
        for line in data[: end + 1].splitlines():
            try:
                s = json.loads(line)
            except ValueError:
                continue
            if isinstance(s, dict) and "t" in s:
                self._samples.append(s)


def _unlink(path):
    if not path:
        return
    try:
        os.unlink(path)
    except OSError:
        pass


# --------------------------------------------------------------------------------------
# Command line: live table, and the hidden worker entry point
# --------------------------------------------------------------------------------------


def _fmt_bytes(x, per_s=False):
    return fmt_si(x, "B/s" if per_s else "B", missing="-")


def _live(args) -> int:
    col = _Collector(args.interval, args.gpus, pid=None, use_nvml=not args.no_nvml)
    meta = col.meta
    print(f"# {meta['n_cpus']} CPUs; NVML: {'yes, %d GPU(s)' % len(meta['gpus']) if meta['nvml'] else 'no (%s)' % meta['nvml_error']}")
    head = f"{'time':>8} {'cpu%':>6} {'mem':>8} {'disk r':>10} {'disk w':>10} {'net tx':>10} {'net rx':>10}"
    for g in meta["gpus"]:
        head += f" | gpu{g['index']} {'util%':>5} {'mem':>8} {'W':>6} {'MHz':>5}"
    print(head)
    out = open(args.series, "w") if args.series else None
    t_end = time.monotonic() + args.duration if args.duration else None
    next_t = time.monotonic() + args.interval
    try:
        while t_end is None or time.monotonic() < t_end:
            time.sleep(max(0.0, next_t - time.monotonic()))
            next_t += args.interval
            s = col.sample()
            if out:
                out.write(json.dumps(s, separators=(",", ":")) + "\n")
                out.flush()
            row = (f"{time.strftime('%H:%M:%S', time.localtime(s['t'])):>8} {s['cpu_util_pct'] or 0:6.1f} "
                   f"{_fmt_bytes(s['host_mem_used_bytes']):>8} {_fmt_bytes(s['disk_read_bps'], 1):>10} "
                   f"{_fmt_bytes(s['disk_write_bps'], 1):>10} {_fmt_bytes(s['net_sent_bps'], 1):>10} "
                   f"{_fmt_bytes(s['net_recv_bps'], 1):>10}")
            for g in s["gpus"]:
                u = "-" if g["util_pct"] is None else f"{g['util_pct']:.0f}"
                w = "-" if g["power_w"] is None else f"{g['power_w']:.0f}"
                c = "-" if g["sm_clock_mhz"] is None else f"{g['sm_clock_mhz']:.0f}"
                row += f" | gpu{g['index']} {u:>5} {_fmt_bytes(g['mem_used_bytes']):>8} {w:>6} {c:>5}"
            print(row, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if out:
            out.close()
    return 0


def _parse_gpus(text):
    """'all' -> None; else a list of NVML indices (ints) and/or GPU UUIDs (strings starting 'GPU-')."""
    if text in (None, "", "all"):
        return None
    out: list[int | str] = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        if x.upper().startswith(("GPU-", "MIG-")):
            out.append(x)
            continue
        try:
            out.append(int(x))
        except ValueError:
            raise ConfigError(f"--gpus must be 'all' or comma-separated NVML indices or GPU UUIDs (GPU-...), "
                              f"got {text!r}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlscale.monitor",
                                 description="Print a live table of GPU and host utilisation.")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (0.01..10)")
    ap.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    ap.add_argument("--gpus", default="all", help="comma-separated NVML indices, or 'all'")
    ap.add_argument("--series", default=None, help="also write the samples to this JSON-lines file")
    ap.add_argument("--no-nvml", action="store_true", help="do not query GPUs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--orphan-cleanup", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.interval = validate_interval(args.interval)
        args.gpus = _parse_gpus(args.gpus)
    except ConfigError as e:
        print(f"dlscale.monitor: error: {e}", file=sys.stderr)
        return 2
    if args.worker:
        if not args.series:
            print("dlscale.monitor: error: --worker needs --series", file=sys.stderr)
            return 2
        return _worker_main(args)
    return _live(args)


if __name__ == "__main__":
    sys.exit(main())
