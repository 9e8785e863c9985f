"""Tests of dlscale.monitor against known loads on the test machine.

Each test starts a real sampler process.  The machine may be shared (other test
suites, compilers): the CPU test therefore compares the sampler with psutil's own
measurement of the same window instead of assuming an otherwise idle host.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from dlscale import ConfigError
from dlscale.monitor import GPU_METRICS, HardwareSampler, validate_interval

GPU_SUMMARY_KEYS = [stem + suffix for _k, stem in GPU_METRICS for suffix in ("_mean", "_max")]


def _nvml_usable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _started(**kw) -> HardwareSampler:
    s = HardwareSampler(**kw)
    s.start()
    assert s.wait_ready(15.0), s.summary(0, time.time())["sampling_error"]
    return s


def _sleep_until(t: float) -> None:
    while (d := t - time.time()) > 0:
        time.sleep(min(d, 0.05))


def _wait_for(s: HardwareSampler, done, timeout: float = 15.0) -> list[dict]:
    """The sampler's series once ``done(series)`` holds: as long as the samples take to land, never a
    fixed guess (slow under load, wasted when idle)."""
    deadline = time.monotonic() + timeout
    while True:
        series = s.series()
        if done(series):
            return series
        assert time.monotonic() < deadline, f"{len(series)} samples, the condition never held"
        time.sleep(0.01)


def _samples_after(s: HardwareSampler, n: int, t: float = 0.0) -> list[dict]:
    """Wait for ``n`` samples taken after ``t`` (time.time())."""
    return _wait_for(s, lambda series: sum(1 for x in series if x["t"] > t) >= n)


def _total(samples, key, t0, t1):
    """Bytes over a window, from the per-sample rates and their intervals."""
    return sum((s[key] or 0) * s["dt"] for s in samples if t0 <= s["t"] <= t1)


# ---------------------------------------------------------------------------- config


def test_validate_interval_bounds():
    assert validate_interval(0.01) == 0.01
    assert validate_interval(10) == 10.0
    assert validate_interval("0.5") == 0.5
    for bad in (0.005, 11, 0, -1, float("nan"), "x", None):
        with pytest.raises(ConfigError) as ei:
            validate_interval(bad)
        assert "\n" not in str(ei.value)
    with pytest.raises(ConfigError):
        HardwareSampler(interval_s=0.001)


def test_not_started_and_idempotent_stop():
    s = HardwareSampler()
    s.stop()  # no-op before start
    out = s.summary(0, time.time())
    assert out["n_samples"] == 0 and out["sampling_error"] == "sampler was never started"
    assert s.series() == []


# ---------------------------------------------------------------------------- loads


@pytest.mark.slow
def test_cpu_busy_loop_one_core():
    ncpu = psutil.cpu_count()
    s = _started(interval_s=0.1)
    try:
        busy = subprocess.Popen(
            [sys.executable, "-c",
             "import time\nt0=time.time(); print(t0, flush=True)\nwhile time.time() < t0 + 2.2: pass\n"],
            stdout=subprocess.PIPE, text=True)
        t_busy = float(busy.stdout.readline())
        t0, t1 = t_busy + 0.4, t_busy + 2.0
        _sleep_until(t0)
        psutil.cpu_percent()  # reference: psutil in this process over the same window
        _sleep_until(t1)
        reference = psutil.cpu_percent()
        busy.wait(10)
        _samples_after(s, 1, t1)
        out = s.summary(t0, t1)
    finally:
        s.stop()
    mean = out["cpu_util_pct_mean"]
    print(f"cpu: sampler {mean:.1f} %, reference {reference:.1f} %, {ncpu} cores, n={out['n_samples']}")
    assert out["sampling_error"] is None
    assert 12 <= out["n_samples"] <= 18
    assert len(out["cpu_util_per_core_mean"]) == ncpu
    assert abs(sum(out["cpu_util_per_core_mean"]) / ncpu - mean) < 1e-6
    # A spinning process keeps >= one core busy (foreign load only adds to it).
    assert mean >= 100.0 / ncpu * 0.7
    assert out["cpu_util_pct_max"] >= mean
    # Same window, independent measurement: the two agree whatever else runs.
    assert abs(mean - reference) < 12
    if ncpu == 2 and reference < 70:  # quiet 2-core host: one core of two
        assert 35 <= mean <= 75


@pytest.mark.slow
def test_disk_write_shows(tmp_path):
    size = 64 << 20
    before = psutil.disk_io_counters()
    if before is None:
        pytest.skip("psutil.disk_io_counters() returns None here (no /proc/diskstats)")
    s = _started(interval_s=0.1)
    try:
        t0 = time.time()
        c0 = psutil.disk_io_counters().write_bytes
        with open(tmp_path / "blob", "wb") as f:
            chunk = b"\x5a" * (1 << 20)
            for _ in range(size >> 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        written = psutil.disk_io_counters().write_bytes - c0
        _samples_after(s, 2, time.time())  # the second one's interval starts after the fsync
        t1 = time.time()
        out = s.summary(t0, t1)
        samples = s.series()
    finally:
        s.stop()
    if written < size // 2:
        pytest.skip(f"this filesystem's writes do not show in the disk counters "
                    f"(64 MiB fsynced, counters moved {written} bytes)")
    total = _total(samples, "disk_write_bps", t0, t1)
    print(f"disk: wrote {size} B, counters {written} B, sampler {total:.0f} B, max {out['disk_write_bps_max']:.0f} B/s")
    assert out["disk_write_bps_max"] > 0 and out["disk_write_bps_mean"] > 0
    assert total >= 0.5 * size


@pytest.mark.slow
def test_loopback_traffic_shows():
    nbytes = 50_000_000
    lo0 = psutil.net_io_counters(pernic=True).get("lo")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    received = [0]

    def sink():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(1 << 20):
                received[0] += len(data)

    s = _started(interval_s=0.1)
    try:
        th = threading.Thread(target=sink)
        th.start()
        t0 = time.time()
        with socket.create_connection(srv.getsockname()) as c:
            buf = b"\0" * (1 << 20)
            sent = 0
            while sent < nbytes:
                c.sendall(buf)
                sent += len(buf)
        th.join(10)
        _samples_after(s, 2, time.time())
        t1 = time.time()
        out = s.summary(t0, t1)
        samples = s.series()
    finally:
        s.stop()
        srv.close()
    lo1 = psutil.net_io_counters(pernic=True).get("lo")
    if lo0 is None or lo1 is None or lo1.bytes_sent - lo0.bytes_sent < nbytes // 2:
        pytest.skip("loopback traffic does not show in psutil.net_io_counters() here")
    assert received[0] >= nbytes
    sent_total = _total(samples, "net_sent_bps", t0, t1)
    recv_total = _total(samples, "net_recv_bps", t0, t1)
    print(f"net: sent {nbytes} B over lo, sampler sent {sent_total:.0f} B recv {recv_total:.0f} B")
    assert sent_total >= 0.5 * nbytes and recv_total >= 0.5 * nbytes
    assert out["net_sent_bps_max"] > 0 and out["net_recv_bps_mean"] > 0


@pytest.mark.slow
def test_host_memory_and_process_tree_rss():
    # A child of this process holding ~80 MiB shows in proc_rss (tree of this pid); started before the
    # sampler, its first listing of the tree has it (no waiting for the 2 s re-listing)
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys,time\nb=bytearray(80<<20)\nprint('x',flush=True)\ntime.sleep(30)\n"],
                             stdout=subprocess.PIPE, text=True)
    try:
        child.stdout.readline()
        s = _started(interval_s=0.05)
        try:
            _samples_after(s, 3)
            out = s.summary(0, time.time())
        finally:
            s.stop()
    finally:
        child.kill()
        child.wait()
    own = psutil.Process().memory_info().rss
    assert out["proc_rss_bytes_max"] >= own + (60 << 20)
    assert 0 < out["host_mem_used_bytes_mean"] <= psutil.virtual_memory().total
    assert 0.0 <= out["cpu_steal_pct_mean"] <= 100.0  # Linux: psutil reports steal (0 on bare metal)


# ---------------------------------------------------------------------------- NVML


@pytest.mark.slow
def test_without_nvml_gpu_fields_are_null():
    variants = [dict(nvml=False)]
    if not _nvml_usable():
        variants.append({})  # the genuine path on a machine without the NVML library
    for kw in variants:
        s = _started(interval_s=0.05, gpu_indices=[0, 1], **kw)
        _samples_after(s, 3)
        out = s.summary(0, time.time())
        s.stop()
        assert out["nvml"] is False and out["n_gpus"] == 0
        assert out["nvml_error"]
        assert out["sampling_error"] is None
        for k in GPU_SUMMARY_KEYS:
            assert out[k] is None, k
        assert out["per_gpu"] == []
        assert out["cpu_util_pct_mean"] is not None
        assert all(smp["gpus"] == [] for smp in s.series())


@pytest.mark.skipif(not _nvml_usable(), reason="NVML is not usable on this machine")
def test_with_nvml_reports_gpus():
    s = _started(interval_s=0.1)
    _samples_after(s, 3)
    out = s.summary(0, time.time())
    s.stop()
    assert out["nvml"] is True and out["n_gpus"] >= 1 and out["sampling_error"] is None
    assert out["gpu_mem_used_bytes_mean"] is not None
    assert len(out["per_gpu"]) == out["n_gpus"]


FAKE_PYNVML = r"""
import time
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_FEATURE_ENABLED = 1
NVML_CLOCK_SM = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_LINK_COUNT = 91
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198

class NVMLError(Exception):
    pass

class NVMLError_NotSupported(NVMLError):
    pass

class _O:
    def __init__(self, **kw):
        self.__dict__.update(kw)

def nvmlInit():
    pass

def nvmlDeviceGetCount():
    return 2

def nvmlDeviceGetHandleByIndex(i):
    return i

def nvmlDeviceGetName(h):
    return b"FakeGPU"

def nvmlDeviceGetUtilizationRates(h):
    return _O(gpu=50 if h == 0 else 100, memory=20)

def nvmlDeviceGetMemoryInfo(h):
    return _O(total=80 << 30, used=(1 << 30) * (h + 1), free=0)

def nvmlDeviceGetPowerUsage(h):
    if h == 1:
        raise NVMLError_NotSupported("Not Supported")
    return 100000

def nvmlDeviceGetClockInfo(h, which):
    return 1400

def nvmlDeviceGetPcieThroughput(h, counter):
    if h == 0:
        raise NVMLError_NotSupported("Not Supported")
    return 500  # KB/s

def nvmlDeviceGetNvLinkState(h, link):
    raise NVMLError("Invalid Argument")

def _fv(fid, scope, value, ret=NVML_SUCCESS, ts=None):
    return _O(fieldId=fid, scopeId=scope, nvmlReturn=ret, valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
              value=_O(ullVal=value), timestamp=ts)

def nvmlDeviceGetFieldValues(h, ids):
    t = time.time()
    ts = int(t * 1e6)
    out = []
    for x in ids:
        fid, scope = x if isinstance(x, tuple) else (x, 0)
        if fid == NVML_FI_DEV_NVLINK_LINK_COUNT:
            out.append(_fv(fid, scope, 2 if h == 0 else 0, ts=ts))
        elif h == 0 and fid in (NVML_FI_DEV_PCIE_COUNT_TX_BYTES, NVML_FI_DEV_PCIE_COUNT_RX_BYTES):
            out.append(_fv(fid, scope, int(t * 1e9) % (1 << 64), ts=ts))  # 1 GB/s
        elif h == 0 and fid in (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            out.append(_fv(fid, scope, int(t * 1000), ts=ts))  # 1000 KiB/s per link
        else:
            out.append(_fv(fid, scope, 0, ret=NVML_ERROR_NOT_SUPPORTED, ts=ts))
    return out
"""


@pytest.mark.slow
def test_nvml_path_with_a_fake_driver(tmp_path, monkeypatch):
    """Exercises the NVML code (rates from counters, NotSupported -> null, the blocking PCIe
    fallback, averaging over GPUs) on any machine, through a stand-in pynvml module."""
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = _started(interval_s=0.05)
    # until the blocking PCIe fallback (polled every 0.4 s here) has been read again after start-up
    _wait_for(s, lambda series: len(series) >= 3 and any(
        g["pcie_rx_bps"] is not None for x in series for g in x["gpus"] if g["index"] == 1))
    out = s.summary(0, time.time())
    s.stop()
    assert out["sampling_error"] is None and out["nvml"] is True and out["n_gpus"] == 2
    g0, g1 = out["per_gpu"]
    assert g0["name"] == "FakeGPU" and g0["mem_total_bytes"] == 80 << 30
    assert out["gpu_util_pct_mean"] == 75 and out["gpu_util_pct_max"] == 100
    assert out["gpu_mem_used_bytes_mean"] == 1.5 * (1 << 30) and out["gpu_mem_used_bytes_max"] == 2 << 30
    assert g0["power_w_mean"] == 100 and g1["power_w_mean"] is None and out["gpu_power_w_mean"] == 100
    assert out["gpu_sm_clock_mhz_mean"] == 1400
    assert g0["pcie_tx_bps_mean"] == pytest.approx(1e9, rel=0.05)  # cumulative byte counters
    assert g1["pcie_rx_bps_mean"] == 500 * 1024  # blocking fallback, KB/s -> B/s
    assert g0["nvlink_tx_bps_mean"] == pytest.approx(2 * 1000 * 1024, rel=0.05)  # 2 links summed
    assert g1["nvlink_tx_bps_mean"] is None
    assert out["gpu_nvlink_rx_bps_mean"] == pytest.approx(2 * 1000 * 1024, rel=0.05)
    for smp in s.series():
        assert [g["index"] for g in smp["gpus"]] == [0, 1]


# ---------------------------------------------------------------------------- failures


@pytest.mark.slow
def test_killed_sampler_reports_error_and_stop_is_quick():
    s = _started(interval_s=0.05)
    _samples_after(s, 2)
    os.kill(s.sampler_pid, signal.SIGKILL)
    child = psutil.Process(s.sampler_pid)
    deadline = time.monotonic() + 5
    while child.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:  # dead, not yet reaped
        time.sleep(0.01)
    t = time.time()
    out = s.summary(0, t)
    assert out["n_samples"] > 0  # what was collected survives
    assert out["sampling_error"] and "SIGKILL" in out["sampling_error"]
    t_stop = time.monotonic()
    s.stop()
    assert time.monotonic() - t_stop < 1.0
    assert "SIGKILL" in s.summary(0, t)["sampling_error"]


@pytest.mark.slow
def test_hung_sampler_is_killed_within_bounded_time():
    s = _started(interval_s=0.05)
    os.kill(s.sampler_pid, signal.SIGSTOP)
    t_stop = time.monotonic()
    s.stop()
    took = time.monotonic() - t_stop
    assert took < 3.5
    assert not psutil.pid_exists(s.sampler_pid) or psutil.Process(s.sampler_pid).status() == psutil.STATUS_ZOMBIE
    assert s.summary(0, time.time())["sampling_error"]


def test_unwritable_series_path_does_not_raise(tmp_path):
    s = HardwareSampler(series_path=str(tmp_path / "no" / "such" / "dir" / "s.jsonl"))
    s.start()
    assert s.sampler_pid is None  # no process started
    s.stop()
    out = s.summary(0, time.time())
    assert out["sampling_error"] and out["n_samples"] == 0


@pytest.mark.slow
def test_exception_inside_sampler_is_reported(tmp_path, monkeypatch):
    (tmp_path / "psutil.py").write_text("raise RuntimeError('psutil is broken here')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    s = HardwareSampler(interval_s=0.05)
    s.start()
    assert not s.wait_ready(10.0)
    t = time.monotonic()
    s.stop()
    assert time.monotonic() - t < 1.0
    err = s.summary(0, time.time())["sampling_error"]
    assert s._proc.returncode == 1 and "psutil is broken here" in err  # the child's own reason comes back


@pytest.mark.slow
def test_sampler_exits_when_its_parent_dies():
    code = ("import os,sys,time\nfrom dlscale.monitor import HardwareSampler\n"
            "s=HardwareSampler(0.05); s.start(); s.wait_ready(15)\n"
            "print(s.sampler_pid, flush=True); os._exit(0)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and psutil.pid_exists(pid):
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    if alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, "orphaned sampler kept running"


# ---------------------------------------------------------------------------- series + overhead


@pytest.mark.slow
def test_series_file_written_as_it_goes(tmp_path):
    path = tmp_path / "series.jsonl"
    s = _started(interval_s=0.05, series_path=str(path))
    _samples_after(s, 3)
    on_disk_while_running = path.read_text().count("\n")
    s.stop()
    lines = path.read_text().splitlines()
    assert on_disk_while_running >= 3
    samples = [json.loads(x) for x in lines]
    assert len(samples) == len(s.series()) >= on_disk_while_running
    ts = [x["t"] for x in samples]
    assert ts == sorted(ts) and abs(ts[-1] - time.time()) < 5
    assert {"t", "dt", "cpu_util_pct", "cpu_steal_pct", "cpu_util_per_core", "disk_write_bps", "net_recv_bps",
            "gpus"} <= set(samples[0])


@pytest.mark.slow
def test_overhead_is_small():
    s = _started(interval_s=0.1)
    proc = psutil.Process(s.sampler_pid)
    c0 = sum(proc.cpu_times()[:2])
    t0 = time.time()
    time.sleep(1.5)  # 15 samples; 5 % of it is 75 ms, well above the 10 ms CPU-time tick

    t1 = time.time()
    c1 = sum(proc.cpu_times()[:2])
    out = s.summary(t0, t1)
    s.stop()
    external = 100.0 * (c1 - c0) / (t1 - t0)
    print(f"sampler CPU at 0.1 s: {external:.2f} % of one core (psutil), "
          f"{out['sampler_cpu_pct']:.2f} % (self-reported)")
    assert external < 5.0
    assert out["sampler_cpu_pct"] is not None and out["sampler_cpu_pct"] < 5.0


@pytest.mark.slow
def test_cli_live_table():
    r = subprocess.run([sys.executable, "-m", "dlscale.monitor", "--interval", "0.1", "--duration", "0.6"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # a header, then a row per sample, each of the header's width (the columns line up)
    assert len(lines) >= 5 and {len(x) for x in lines[2:]} == {len(lines[1])}
    r = subprocess.run([sys.executable, "-m", "dlscale.monitor", "--interval", "0.005", "--duration", "1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_gpus_by_uuid_map_to_nvml_indices():
    """The worker names its GPUs by UUID (CUDA order and CUDA_VISIBLE_DEVICES do not apply to NVML)."""
    from dlscale import monitor
    from dlscale.monitor.nvml import nvml_indices

    assert monitor.parse_gpus("all") is None
    assert monitor.parse_gpus("1,GPU-abc") == [1, "GPU-abc"]
    with pytest.raises(ConfigError, match="--gpus"):
        monitor.parse_gpus("first")

    class FakeNvml:
        uuids = ["GPU-aaa", "GPU-BBB", "GPU-ccc"]

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetUUID(self, h):
            return self.uuids[h].encode()

    errors: list[str] = []
    assert nvml_indices(FakeNvml(), ["GPU-ccc", "gpu-bbb", 0], 3, errors) == [2, 1, 0] and errors == []
    assert nvml_indices(FakeNvml(), ["GPU-zzz"], 3, errors) == [] and len(errors) == 1


def test_the_mps_server_is_not_a_competing_gpu_process():
    """Under MPS, NVML lists the server beside the case's own processes: not a competitor; any
    other process on the GPU still is."""
    from dlscale import monitor

    class Proc:
        def __init__(self, pid):
            self.pid = pid

    class FakePsutil:
        names = {70: monitor.MPS_SERVER, 80: "python"}

        def Process(self, pid):
            if pid not in self.names:
                raise psutil.NoSuchProcess(pid)
            return type("P", (), {"name": lambda _self, n=self.names[pid]: n})()

    col = monitor.Collector.__new__(monitor.Collector)
    col.psutil, col._tree, col.own_pid, col.cores, col._names = FakePsutil(), [Proc(10), Proc(11)], 12, None, {}
    col._case_cpu_s = lambda: 0.5
    s = {"gpus": [{"pids": [10, 11, 70]}, {"pids": [10, 70, 80, 90]}]}
    col._case_load(s, [50.0, 50.0], 1.0)
    assert s["gpus"][0]["foreign_pids"] == [] and s["gpus"][0]["own_pids_seen"] is True
    assert s["gpus"][1]["foreign_pids"] == [80, 90]
