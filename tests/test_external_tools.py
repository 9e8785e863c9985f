"""Real training tools under `dlscale run --command`, on the CPU: the Hugging Face Trainer (a tiny
randomly initialised GPT-2 built in code, no downloads) and DeepSpeed (no compiled ops).

They need the optional extra (`pip install -e '.[external]'`) and skip, with the reason, without it.
"""
import os
import shlex
import sys
from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.schema import validate_record
from dlscale.store import ResultStore

TOOLS = Path(__file__).parent / "tools"
PY = shlex.quote(sys.executable)


def run(*argv):
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code


@pytest.mark.slow
def test_hf_trainer_tiny_gpt2_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[external]')")
    pytest.importorskip("accelerate", reason="accelerate not installed (pip install -e '.[external]')")
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
    assert "arrival times of the Trainer's log lines, 4 samples per step" in p["method"]
    assert rep["samples_per_s"] > 0 and len(rep["step_times_ms"]) == 6
    # the Trainer's own whole-run figure is kept beside the window's, for comparison
    assert p["extra"]["trainer_samples_per_s"] > 0
    assert rec["model"] == {"unit": "seq", "seq_len": 32, "params": None, "flops_per_sample": None,
                            "registered": False}
    assert rec["summary"]["tokens_per_s"] == pytest.approx(rep["samples_per_s"] * 32)
    assert rec["external"]["packages"]["transformers"]
    assert validate_record(rec) is None
    log = (store / rep["log"]).read_text()
    assert "'train_samples_per_second'" in log


@pytest.mark.slow
def test_deepspeed_on_cpu(tmp_path, monkeypatch):
    pytest.importorskip("deepspeed", reason="deepspeed not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    if not os.environ.get("DLSCALE_TEST_DEEPSPEED"):
        pytest.skip("DeepSpeed's CPU backend JIT-compiles its shared-memory op with g++ on first use (minutes on a "
                    "2-core machine); set DLSCALE_TEST_DEEPSPEED=1 to run it")
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
