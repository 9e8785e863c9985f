"""benchmarks/ddp_tail.py: the GPU gap before the optimizer step, read from a hand-made trace."""
from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_ddp_tail", ROOT / "benchmarks" / "ddp_tail.py")
TAIL = importlib.util.module_from_spec(_spec)
sys.modules["bench_ddp_tail"] = TAIL  # dataclasses look their module up
_spec.loader.exec_module(TAIL)


def _x(cat: str, name: str, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 0}


def _step(t0: float) -> list[dict]:
    """One step from t0 (µs): backward compute to +10,000; the last bucket's all-reduce
    +10,000..+10,500; the host begins the optimizer at +10,800; its kernel runs +11,500..+12,000."""
    return [_x("kernel", "sm90_gemm", t0, 6000), _x("kernel", "elementwise", t0 + 6000, 4000),
            _x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 10000, 500),
            _x("user_annotation", "Optimizer.step#AdamW.step", t0 + 10800, 1200),
            _x("gpu_user_annotation", "Optimizer.step#AdamW.step", t0 + 11500, 500),
            _x("kernel", "multi_tensor_apply_kernel", t0 + 11500, 500)]


def test_tail_of_two_steps(tmp_path, capsys):
    trace = {"traceEvents": _step(0.0) + _step(12000.0)}
    rows = TAIL.tails(trace)
    assert [r.step for r in rows] == [1, 2]
    for r in rows:
        assert r.step_ms == pytest.approx(12.0) and r.compute_busy_ms == pytest.approx(10.5)
        assert r.idle_before_optimizer_ms == pytest.approx(1.5)  # 10,000 -> 11,500
        assert r.collective_in_gap_ms == pytest.approx(0.5) and r.host_late_ms == pytest.approx(0.8)
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    assert TAIL.main([str(path)]) == 0
    assert "| 2 | 12.00 | 10.50 | 1.50 | 0.50 | 0.80 |" in capsys.readouterr().out
    (tmp_path / "none.json").write_text(json.dumps({"traceEvents": []}))
    assert TAIL.main([str(tmp_path / "none.json")]) == 1


def _base_step(t0: float) -> list[dict]:
    """A 1-GPU step from t0 (µs): compute to +10,000 with a 10 µs launch gap, the optimizer at once."""
    return [_x("kernel", "sm90_gemm", t0, 6000), _x("kernel", "elementwise", t0 + 6010, 3990),
            _x("gpu_user_annotation", "Optimizer.step#AdamW.step", t0 + 10000, 500),
            _x("kernel", "multi_tensor_apply_kernel", t0 + 10000, 500)]


def test_against_a_one_gpu_trace(tmp_path, capsys):
    """The 2-GPU step of _step against _base_step: 1.5 ms longer (1 ms of it the idle tail, of which
    0.5 ms a collective), the elementwise kernel 0.01 ms longer, one gap of 10 µs gone."""
    two = {"traceEvents": _step(0.0) + _step(12000.0) + _step(24000.0)}
    one = {"traceEvents": _base_step(0.0) + _base_step(10500.0) + _base_step(21000.0)}
    parts, classes = TAIL.compare(TAIL.tails(two), TAIL.tails(one), top=2)
    got = {label: (b, a) for label, b, a in parts}
    assert got["GPU step"] == (pytest.approx(10.5), pytest.approx(12.0))
    assert got["compute kernels, busy"] == (pytest.approx(10.49), pytest.approx(10.5))
    assert got["GPU idle before the optimizer"] == (pytest.approx(0.0), pytest.approx(1.5))
    assert got["short gaps between compute kernels"] == (pytest.approx(0.01), pytest.approx(0.0))
    assert got["collective kernels, all"] == (pytest.approx(0.0), pytest.approx(0.5))
    assert classes[0][0] == pytest.approx(0.01) and classes[0][-1] == "elementwise"
    for name, trace in (("two.json", two), ("one.json", one)):
        (tmp_path / name).write_text(json.dumps(trace))
    assert TAIL.main([str(tmp_path / "two.json"), "--against", str(tmp_path / "one.json")]) == 0
    assert "| GPU step | 10.50 | 12.00 | +1.50 |" in capsys.readouterr().out


_hspec = importlib.util.spec_from_file_location("bench_host_trace", ROOT / "benchmarks" / "host_trace.py")
HOST = importlib.util.module_from_spec(_hspec)
sys.modules["bench_host_trace"] = HOST
_hspec.loader.exec_module(HOST)


def test_host_trace_sets_host_time_beside_gpu_time(tmp_path, capsys):
    """benchmarks/host_trace.py: a 20 ms host step with 8 ms of compute and 3 ms of collectives;
    two FSDP pre-forward ranges (one with a nested range of the same hook, counted once)."""
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 20000),
          _x("user_annotation", "FSDP::pre_forward (blocks.0)", 1000, 2000),
          _x("user_annotation", "FSDP::pre_forward", 1500, 500),  # nested: not added again
          _x("user_annotation", "FSDP::pre_forward (blocks.1)", 5000, 1000),
          _x("cpu_op", "aten::mm", 6000, 100),  # not a counted prefix
          _x("kernel", "sm90_gemm", 2000, 5000), _x("gpu_memset", "Memset", 7000, 3000),
          _x("kernel", "ncclDevKernel_AllGather_RING_LL", 3000, 3000),
          _x("kernel", "late_kernel", 21000, 4000)]  # after the step's range: not counted
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    (step,) = HOST.host_steps(HOST.load(str(path)))
    assert step.host_ms == pytest.approx(20.0) and step.compute_ms == pytest.approx(8.0)
    assert step.collective_ms == pytest.approx(3.0)
    assert step.ranges == {"FSDP::pre_forward": (2, pytest.approx(3.0))}
    assert HOST.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "| ProfilerStep#1 | 20.00 | 8.00 | 3.00 | 2.50 |" in out and "| FSDP::pre_forward | 2 / 3.00 |" in out
    (tmp_path / "empty.json").write_text(json.dumps({"traceEvents": []}))
    assert HOST.main([str(tmp_path / "empty.json")]) == 2
