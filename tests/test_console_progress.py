"""Console lines (validity, breakdown, profiler, numbers), shared formatting, and long-phase progress."""
from __future__ import annotations

import io
import json
import time

import pytest

from dlscale import console, fmt
from dlscale.case import progress


def test_numbers_keep_significant_digits_and_one_repeat_has_no_stdev():
    assert fmt.fmt_num(0.0123, 1) == "0.012" and fmt.fmt_num(0.0, 1) == "0.0" and fmt.fmt_num(464.43, 2) == "464.43"
    assert fmt.fmt_num(1234.5, 1, group=True) == "1,234.5" and fmt.fmt_num(None) == fmt.MISSING
    assert fmt.fmt_num(float("nan")) == fmt.MISSING and fmt.fmt_num(True) == fmt.MISSING
    assert fmt.fmt_stdev(0.0, 1) == fmt.MISSING and fmt.fmt_stdev(1.5, 2) == "1.50" and fmt.fmt_stdev(1.0, None) == "—"
    assert fmt.fmt_bytes(3 * 2 ** 20) == "3 MiB" and fmt.fmt_bytes(1.5 * 2 ** 30) == "1.50 GiB"
    assert fmt.fmt_bytes(512) == "512 B" and fmt.fmt_si(1.5e6, "B/s") == "1.5MB/s" and fmt.fmt_si(512) == "512B"
    assert fmt.fmt_cell(True) == "yes" and fmt.fmt_cell(1e-9) == "1e-09" and fmt.fmt_cell(2.5e7) == "2.5e+07"
    assert fmt.md_table(["a", "b"], [[1, "x|y"]], numeric_from=1) == "| a | b |\n|---|---:|\n| 1 | x\\|y |"


def _rec(**extra):
    rec = {"status": "ok", "config": {"model": "gpt2", "strategy": "single", "precision": "fp32", "compile": False,
                                      "batch_size": 4, "profile": True, "steps": 20},
           "world_size": 1, "device_type": "cpu",
           "repeats": [{"repeat": 0, "status": "ok", "samples_per_s": 0.0123, "window_s": 2.0, "loss_after": 5.73191, "loss_last": 5.73191,
                        "step_times_ms": [100.0] * 20}],
           "summary": {"samples_per_s": {"n": 1, "median": 0.0123, "stdev": None}, "tokens_per_s": None,
                       "step_ms_p50": 100.0, "step_ms_p90": 100.0, "mfu": None, "peak_rss_bytes": 2 ** 30}}
    rec.update(extra)
    return rec


def test_slow_run_prints_digits_dash_stdev_and_loss(capsys):
    console.print_result(_rec())
    row = capsys.readouterr().out.splitlines()[2].split()
    # samples/s 0.012 (not 0.0), stdev '-' (one repeat), n 1, loss 5.7319
    assert row[5:8] == ["0.012", "-", "1"] and row[-2:] == ["5.7319", "ok"]


def test_breakdown_and_profile_lines(capsys, tmp_path):
    b = {"supported": True, "steps": 10, "data_ms": 1.0, "forward_ms": 5.0, "backward_ms": 12.0, "optimizer_ms": 2.0,
         "step_ms": 20.0, "exposed_comm_ms": 2.0, "comm_ms": 8.0, "overlap_ratio": 0.75}
    rec = _rec(breakdown=b, trace="traces/abc.json",
               profile_top_ops=[{"name": "aten::mm", "self_ms_per_step": 3.25, "calls_per_step": 12}])
    console.print_result(rec, tmp_path)
    out = capsys.readouterr().out
    assert ("# breakdown (ms per step, median of 10 steps after the window): data 1.00, forward 5.00, backward 12.00 "
            "(exposed comm 2.00 of all-reduce 8.00, 75 % overlapped), optimizer 2.00 = step 20.00") in out
    assert f"# profiler trace: {tmp_path / 'traces/abc.json'} (open in chrome://tracing or ui.perfetto.dev)" in out
    assert "# top ops by self time (ms per step): aten::mm 3.25" in out
    console.print_result(_rec(breakdown={"supported": False, "reason": "strategy has its own step"}, trace=None))
    assert "# breakdown: not measured (strategy has its own step)" in capsys.readouterr().out


def _line(phase, event, t, **info):
    return "[rank0]: " + progress.MARK + json.dumps({"phase": phase, "event": event, "t": t, **info})


def test_phase_lines_become_progress_only_for_long_phases():
    out, passed = io.StringIO(), []
    p = progress.PhasePrinter(out=out, passthrough=passed.append, quiet_s=0.2, every_s=60.0)
    t0 = time.time()
    p(_line("build", "start", t0))
    p(_line("build", "end", t0 + 0.01))  # quick: nothing printed
    p("some other worker output")
    p(_line("compile", "start", t0))
    time.sleep(0.3)
    p._tick()  # the timer's check, run here so that a loaded machine's late timer thread cannot miss it
    p(_line("compile", "end", t0 + 12.5))
    p(_line("warmup", "start", t0))
    p(_line("warmup", "progress", t0 + 5, step=3, of=20))
    p.close()
    lines = out.getvalue().splitlines()
    assert passed == ["some other worker output"]
    assert lines[0].startswith("#   torch.compile (first step): running (")
    assert lines[1] == "#   torch.compile (first step): done in 12.5 s"
    assert lines[2].startswith("#   warm-up: running (") and lines[2].endswith(", step 3/20)")
    assert len(lines) == 3 and not any("build" in x for x in lines)
    assert progress.parse("no mark") is None and progress.parse(progress.MARK + "{broken") is None


def test_worker_side_phase_line_round_trips(capsys):
    progress.phase("rendezvous", "start", rank=0)
    progress.phase("rendezvous", "start", rank=1)  # other ranks stay quiet
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1
    ev = progress.parse(lines[0])
    assert ev.phase == "rendezvous" and ev.event == "start" and ev.t == pytest.approx(time.time(), abs=60)
