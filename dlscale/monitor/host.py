"""Host collector: one sample of the machine (CPU per core and steal, memory, disk and network
rates), of the watched process tree (RSS, CPU time, the load that competes with it) and of the GPUs
(their NVML readers, dlscale/monitor/nvml.py). Used by the sampler process and by the live table."""

from __future__ import annotations

import os
import time

import psutil

from dlscale.monitor import nvml

# The process tree whose RSS is summed is re-listed this often (listing children scans /proc).
CHILDREN_REFRESH_S = 2.0

MPS_SERVER = "nvidia-cuda-mps-server"  # the process NVML lists on a GPU shared through MPS


class Collector:
    """Takes samples.  Used by the sampler process and by the live table (in-process)."""

    def __init__(self, interval_s: float, gpu_indices=None, pid=None, use_nvml: bool = True):
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
        self.gpus: list[nvml.GpuReader] = []
        if use_nvml:
            found = nvml.open_gpus(gpu_indices, self.errors)
            self.gpus = found.gpus
            self.meta.update(nvml=found.ok, nvml_error=found.error, gpus=found.info())
        else:
            self.meta["nvml_error"] = "NVML disabled by the caller"
        fallback = nvml.pcie_fallback_period(interval_s, self.gpus)
        self.pcie_period_s = fallback or interval_s
        self.meta["pcie_fallback_period_s"] = fallback
        # The watched process tree: its RSS, its CPU time and its GPU processes (the rest of the
        # machine's load is what competes with the case: dlscale/results/validity.py).
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
        if now - self._tree_at < CHILDREN_REFRESH_S:
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

