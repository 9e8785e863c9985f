"""The parent side: ``HardwareSampler`` starts the sampler process (``python -m dlscale.monitor --worker``),
reads the series file it writes, and summarises a window of it. It starts no thread."""

from __future__ import annotations

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
from dlscale.monitor.nvml import POWER_CAP_MASK, SLOWDOWN_MASK, clock_reason_names

MIN_INTERVAL_S = 0.01
MAX_INTERVAL_S = 10.0
STOP_TIMEOUT_S = 2.0
# the checkout (or installation) that holds the dlscale package, put first on the sampler's PYTHONPATH
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
            env["PYTHONPATH"] = _PKG_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
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
