"""Performance model and cost: pure functions against hand-computed values, and the CLI verbs."""
from __future__ import annotations

import json

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.perfmodel import allreduce_time_s, gradient_bytes, predict_scaling, training_cost
from dlscale.store import ResultStore, new_record

PARAMS = 125_000_000          # G = 500e6 bytes of fp32 gradients
BUSBW = 250.0                 # GB/s, the largest all_reduce row of the micro record
STEP_MS = 100.0               # 1-device step time
BATCH = 32


def run_record(nproc: int, median: float, strategy: str, created: str, breakdown=None, model="m", **cfg_extra):
    cfg = {"model": model, "flavor": "full", "precision": "amp-bf16", "compile": False, "batch_size": BATCH,
           "grad_accum": 1, "strategy": strategy, "nnodes": 1, "nproc_per_node": nproc, "device": "auto",
           "warmup": 2, "steps": 10, "seed": 0, "strategy_options": {}}
    cfg.update(cfg_extra)
    rec = new_record("run", config=cfg, status="ok", world_size=nproc, global_batch=BATCH * nproc,
                     device_type="cuda", case_key=f"{model}-{strategy}-{nproc}-{cfg['precision']}",
                     model={"params": PARAMS, "flops_per_sample": 1e12, "unit": "seq", "seq_len": 1024},
                     summary={"samples_per_s": {"median": median, "n": 3}, "step_ms_p50": STEP_MS if nproc == 1
                              else 1000.0 * BATCH * nproc / median},
                     breakdown=breakdown)
    rec["created"] = created
    return rec


@pytest.fixture()
def store(tmp_path):
    s = ResultStore(tmp_path / "res")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    s.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00",
                        breakdown={"supported": True, "overlap_ratio": 0.5, "comm_ms": 2.0, "exposed_comm_ms": 1.0,
                                   "step_ms": 101.0}))
    s.append(new_record("micro", micro="comm", status="ok", device="cuda", device_name="Test GPU", nranks=2,
                        config={}, results=[
                            {"op": "all_reduce", "bytes": 1 << 20, "busbw_gbps": 50.0, "nranks": 2, "status": "ok"},
                            {"op": "all_gather", "bytes": 1 << 31, "busbw_gbps": 999.0, "nranks": 2, "status": "ok"},
                            {"op": "all_reduce", "bytes": 1 << 30, "busbw_gbps": BUSBW, "nranks": 2, "status": "ok"}]))
    return str(tmp_path / "res")


# ----------------------------------------------------------------------------- pure functions

def test_allreduce_time_hand_computed():
    assert allreduce_time_s(500e6, 2, 250e9) == pytest.approx(2e-3)          # 500e6 * 1 / 250e9
    assert allreduce_time_s(500e6, 4, 250e9) == pytest.approx(3e-3)          # 500e6 * 1.5 / 250e9
    assert allreduce_time_s(500e6, 8, 250e9) == pytest.approx(3.5e-3)        # 500e6 * 1.75 / 250e9
    assert allreduce_time_s(500e6, 1, 250e9) == 0.0
    assert gradient_bytes(PARAMS) == 500e6
    with pytest.raises(ConfigError):
        allreduce_time_s(500e6, 2, 0)


def test_predict_scaling_hand_computed():
    rows = predict_scaling(100.0, PARAMS, 32, [1, 2, 4], 250e9, overlap=0.5, measured={1: 320.0, 2: 600.0})
    r1, r2, r4 = rows
    assert r1["step_ms"] == pytest.approx(100.0) and r1["samples_per_s"] == pytest.approx(320.0)
    assert r2["allreduce_ms"] == pytest.approx(2.0) and r2["exposed_ms"] == pytest.approx(1.0)
    assert r2["step_ms"] == pytest.approx(101.0)
    assert r2["samples_per_s"] == pytest.approx(64 / 0.101)
    assert r2["efficiency"] == pytest.approx(100 / 101)
    assert r2["error_pct"] == pytest.approx((64 / 0.101 - 600) / 600 * 100)
    assert r2["measured_efficiency"] == pytest.approx(600 / 640)
    assert r4["exposed_ms"] == pytest.approx(1.5) and r4["samples_per_s"] == pytest.approx(128 / 0.1015)
    assert r4["measured_samples_per_s"] is None and r4["error_pct"] is None
    # grad_accum: one all-reduce per optimizer step of batch x accum samples
    acc = predict_scaling(100.0, PARAMS, 32, [2], 250e9, overlap=0.0, grad_accum=4)[0]
    assert acc["samples_per_s"] == pytest.approx(2 * 32 * 4 / 0.102)
    with pytest.raises(ConfigError):
        predict_scaling(100.0, PARAMS, 32, [2], 250e9, overlap=1.5)


def test_training_cost_hand_computed():
    c = training_cost(500.0, 8, 2.0, tokens=1e9, seq_len=1024)
    hours = 1e9 / 1024 / 500 / 3600
    assert c["hours"] == pytest.approx(hours)
    assert c["gpu_hours"] == pytest.approx(hours * 8)
    assert c["cost"] == pytest.approx(hours * 8 * 2)
    e = training_cost(100.0, 2, 3.0, epochs=90, dataset_size=1_281_167)
    assert e["hours"] == pytest.approx(90 * 1_281_167 / 100 / 3600)
    assert e["cost"] == pytest.approx(e["hours"] * 2 * 3)
    for bad in ({"samples": -1}, {"samples": 1, "tokens": 1}, {}, {"tokens": 1e9},
                {"epochs": 1}):
        with pytest.raises(ConfigError):
            training_cost(500.0, 8, 2.0, **bad)
    with pytest.raises(ConfigError):
        training_cost(500.0, 8, 0.0, samples=1)


# ----------------------------------------------------------------------------- CLI on a fixture store

def test_predict_cli_json_from_store(store, capsys):
    assert main(["predict", store, "--model", "m", "--devices", "2,4", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    inp = out["inputs"]
    assert inp["busbw_gbps"] == pytest.approx(BUSBW)        # largest all_reduce row, not all_gather
    assert inp["overlap"] == pytest.approx(0.5)             # from the 2-device breakdown
    assert inp["compute_ms"] == pytest.approx(STEP_MS) and inp["gradient_bytes"] == 500e6
    rows = {r["devices"]: r for r in out["rows"]}
    assert sorted(rows) == [1, 2, 4]
    assert rows[2]["allreduce_ms"] == pytest.approx(2.0) and rows[2]["exposed_ms"] == pytest.approx(1.0)
    assert rows[2]["measured_samples_per_s"] == 600.0
    assert rows[2]["error_pct"] == pytest.approx((64 / 0.101 - 600) / 600 * 100)
    assert rows[4]["measured_samples_per_s"] is None


def test_predict_cli_markdown_and_overrides(store, capsys):
    assert main(["predict", store, "--model", "m", "--devices", "8", "--busbw", "100", "--overlap", "0"]) == 0
    out = capsys.readouterr().out
    assert "| N | compute (ms) | all-reduce (ms) | exposed comm (ms)" in out
    # 500e6 * 1.75 / 100e9 = 8.75 ms, all exposed
    assert "| 8 | 100.00 | 8.75 | 8.75 | 108.75 |" in out
    assert "fp32" in out


def test_cost_cli_measured(store, capsys):
    assert main(["cost", store, "--model", "m", "--devices", "2", "--tokens", "1e9",
                 "--price-per-gpu-hour", "2", "--format", "json"]) == 0
    c = json.loads(capsys.readouterr().out)
    hours = 1e9 / 1024 / 600 / 3600
    assert c["hours"] == pytest.approx(hours) and c["cost"] == pytest.approx(hours * 2 * 2)
    assert main(["cost", store, "--model", "m", "--devices", "4", "--samples", "1e6", "--predicted",
                 "--price-per-gpu-hour", "1", "--format", "json"]) == 0
    c = json.loads(capsys.readouterr().out)
    assert c["samples_per_s"] == pytest.approx(128 / 0.1015)


@pytest.mark.parametrize("argv", [
    ["cost", "{s}", "--model", "m", "--devices", "8", "--samples", "1000", "--price-per-gpu-hour", "2"],
    ["cost", "{s}", "--model", "nope", "--devices", "2", "--samples", "1000", "--price-per-gpu-hour", "2"],
    ["predict", "{s}", "--model", "m", "--precision", "fp32"],
])
def test_bad_input_one_line_exit_2(store, capsys, argv):
    assert main([a.format(s=store) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlscale: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("extra", [
    ["--price-per-gpu-hour", "-2"],            # non-positive
    [],                                        # missing price
    ["--price-per-gpu-hour", "2", "--devices", "0"],
])
def test_bad_arguments_exit_2(store, capsys, extra):
    argv = ["cost", store, "--model", "m", "--samples", "1000"] + (["--devices", "2"] if "--devices" not in extra
                                                                     else []) + extra
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_predict_needs_busbw(tmp_path, capsys):
    s = ResultStore(tmp_path / "r")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    assert main(["predict", str(tmp_path / "r"), "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "--busbw" in err and "micro comm" in err and err.count("\n") == 1
    # no breakdown anywhere: overlap falls back to 0 and says so
    assert main(["predict", str(tmp_path / "r"), "--model", "m", "--busbw", "250", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["inputs"]["overlap"] == 0.0 and "assumed" in out["inputs"]["overlap_source"]


def test_ambiguous_workload(store, capsys):
    ResultStore(store).append(run_record(1, 100.0, "single", "2025-01-02T00:00:00+00:00", precision="fp32"))
    assert main(["predict", store, "--model", "m"]) == 2
    assert "--precision" in capsys.readouterr().err
    assert main(["predict", store, "--model", "m", "--precision", "amp-bf16", "--format", "json"]) == 0
