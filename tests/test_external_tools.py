"""Real training tools under `dlscale run --command`, on the CPU: the Hugging Face Trainer (a tiny
randomly initialised GPT-2 built in code, no downloads) and DeepSpeed (no compiled ops); and the
hf-trainer parser on long runs' output as the installed transformers' own code prints it.

transformers and accelerate are in the `test` extra (and `external`); DeepSpeed is not (README: its
first use compiles an op for minutes), and its test skips, with the reason, without it.
"""
import contextlib
import io
import os
import shlex
import sys
import time
from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.external.parsers import LogLine, ParseOptions, get_parser
from dlscale.schema import validate_record
from dlscale.results.store import ResultStore

TOOLS = Path(__file__).parent / "tools"
PY = shlex.quote(sys.executable)


def run(*argv):
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code


@pytest.mark.slow
def test_hf_trainer_tiny_gpt2_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[test]')")
    pytest.importorskip("accelerate", reason="accelerate not installed (pip install -e '.[test]')")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    store = tmp_path / "st"
    cmd = f"{PY} {shlex.quote(str(TOOLS / 'hf_tiny_train.py'))} --steps 24 --batch-size 4 --logging-steps 2 --out hf"
    code = run("run", "--command", cmd, "--parser", "hf-trainer", "--cwd", str(tmp_path), "--model", "gpt2-tiny-hf",
               "--batch-size", "4", "--precision", "fp32", "--device", "cpu", "--warmup", "8", "--steps", "12",
               "--repeats", "1", "--seq-len", "32", "--stack", "hf-trainer", "--store", str(store))
    (rec,) = ResultStore(store).load().records
    assert code == 0, rec.get("error")
    rep = rec["repeats"][0]
    p = rep["parse"]
    # 24 steps logged every 2: the warm-up rule skips steps 1-8, the window is steps 9-20
    assert (p["skipped_steps"], p["window_steps"], p["steps_seen"]) == (8, 12, 24)
    assert p["method"].startswith("total samples / total time over steps 9-20")
    # timed by the log lines (not the final metrics), at the samples per step the Trainer's figures give
    method = p["method"]
    assert "log lines" in method and "final metrics" not in method and "4 samples" in method, method
    assert "train_samples_per_second" in method and "train_steps_per_second" in method, method
    assert rep["samples_per_s"] > 0 and len(rep["step_times_ms"]) == 6
    # the Trainer's own whole-run figure is kept beside the window's, for comparison
    assert p["extra"]["trainer_samples_per_s"] > 0
    assert rec["model"] == {"unit": "seq", "seq_len": 32, "seq_len_source": "option", "params": None,
                            "flops_per_sample": None, "registered": False}
    assert rec["summary"]["tokens_per_s"] == pytest.approx(rep["samples_per_s"] * 32)
    assert rec["external"]["packages"]["transformers"]
    assert validate_record(rec) is None
    log = (store / rep["log"]).read_text()
    assert "'train_samples_per_second'" in log


def trainer_output(steps, logging_steps, step_s, batch, first_step=False, t0=1000.0):
    """What the installed Trainer prints for a run (its PrinterCallback, the same format as the
    progress bar's, and speed_metrics), each line with the time it would arrive."""
    from transformers.trainer_callback import PrinterCallback, TrainerControl, TrainerState
    from transformers.trainer_utils import speed_metrics

    cb, state, control, out, times = PrinterCallback(), TrainerState(), TrainerControl(), io.StringIO(), []
    with contextlib.redirect_stdout(out):
        for s in range(1, steps + 1):
            if s % logging_steps == 0 or (first_step and s == 1):
                cb.on_log(None, state, control, logs={"loss": 10.5 - s / steps, "grad_norm": 3.21,
                                                      "learning_rate": 5e-05 * (1 - s / steps), "epoch": s / steps})
                times.append(t0 + s * step_s)
        fin = speed_metrics("train", time.time() - steps * step_s, num_samples=steps * batch, num_steps=steps)
        cb.on_log(None, state, control, logs={**fin, "total_flos": 1e15, "train_loss": 10.2, "epoch": 1.0})
        times.append(times[-1] + 0.1)
    lines = out.getvalue().splitlines()
    assert len(lines) == len(times)
    return [LogLine(text, t) for text, t in zip(lines, times)]


# (steps, logging_steps, seconds per step, global batch, logging_first_step): runs whose final metrics,
# rounded by speed_metrics and printed to 4 significant digits (transformers 5), put runtime x steps/s
# a step or more off the step count, or the rates' ratio off the batch
LONG_RUNS = [
    (20000, 10, 0.6172, 8, False),  # 1.234e+04 s x 1.62 steps/s = 19991: once read as logging_first_step
    (5000, 50, 0.37008, 16, False),  # 1850 s x 2.702 steps/s = 4999: the same
    (10000, 1, 0.6172, 4, False),  # 6172 s x 1.62 steps/s = 9999: once "do not fit"
    (5000, 50, 0.37, 16, True),
    (200, 10, 9.1, 2048, False),  # 225.1 samples/s / 0.11 steps/s = 2046: once the samples per step
]


@pytest.mark.slow  # importing transformers takes seconds
@pytest.mark.parametrize("steps,every,step_s,batch,first", LONG_RUNS)
def test_hf_trainer_parser_reads_long_runs_as_transformers_prints_them(steps, every, step_s, batch, first):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[test]')")
    lines = trainer_output(steps, every, step_s, batch, first)
    r = get_parser("hf-trainer").parse(lines, ParseOptions(warmup=100, steps=steps // 2, global_batch=batch))
    assert (r.steps_seen, r.skipped_steps, r.window_steps) == (steps, 100, steps // 2)
    assert r.samples_per_s == pytest.approx(batch / step_s, rel=1e-9)
    assert r.step_times_ms == pytest.approx([step_s * 1000.0] * len(r.step_times_ms), rel=1e-9)
    assert not r.warnings


@pytest.mark.slow
def test_deepspeed_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    if not os.environ.get("DLSCALE_TEST_DEEPSPEED"):
        pytest.skip("DeepSpeed's CPU backend JIT-compiles its shared-memory op with g++ on first use (1-3 minutes "
                    "on a 2-core machine; ~25 s once built); set DLSCALE_TEST_DEEPSPEED=1 to run it")
    store = tmp_path / "st"
    cmd = f"{PY} {shlex.quote(str(TOOLS / 'ds_tiny_train.py'))} --steps 20 --batch-size 8"
    code = run("run", "--command", cmd, "--parser", "deepspeed", "--model", "mlp", "--unit", "img", "--batch-size",
               "8", "--precision", "fp32", "--device", "cpu", "--warmup", "4", "--steps", "12", "--repeats", "1",
               "--no-monitor", "--time-limit", "900", "--store", str(store))
    (rec,) = ResultStore(store).load().records
    assert code == 0, rec.get("error")
    p = rec["repeats"][0]["parse"]
    assert p["method"].startswith("from RunningAvgSamplesPerSec at steps 4 and 16")
    assert (p["skipped_steps"], p["window_steps"]) == (4, 12) and rec["repeats"][0]["samples_per_s"] > 0
