"""``dlscale cost``: time, money, cost per million samples, energy, price files, the deadline choice."""
from __future__ import annotations

import json
import math

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.commands.perf_args import DeprecatedAlias
from dlscale.perfmodel.law import DEFAULT_LAW
from dlscale.perfmodel.cost import (Amount, BUILTIN_PRICES, cheapest_meeting_deadline, load_prices, record_power_w,
                                    training_cost)
from dlscale.report.data import Row
from dlscale.results.store import ResultStore
from test_perfmodel import GPU_ENV, comm_record, run_record


def util(powers):
    return {"n_gpus": len(powers), "gpu_power_w_mean": sum(powers) / len(powers),
            "per_gpu": [{"index": i, "power_w_mean": p} for i, p in enumerate(powers)]}


@pytest.fixture()
def store(tmp_path):
    s = ResultStore(tmp_path / "c")
    one = run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00")
    one["utilisation"] = util([350.0, 60.0])                  # the node has 2 GPUs; the run used one
    s.append(one)
    two = run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00")
    two["utilisation"] = util([300.0, 310.0])
    s.append(two)
    four = run_record(2, 1150.0, "ddp", "2025-01-01T02:00:00+00:00", nnodes=2)  # 2 nodes x 2
    four["repeats"] = [{"repeat": 0, "status": "ok", "samples_per_s": 1150.0,
                        "utilisation_per_node": [util([300.0, 300.0]), util([320.0, 320.0])]}]
    four["median_repeat"] = 0
    s.append(four)
    s.append(comm_record())
    return str(tmp_path / "c")


def cost_json(argv, capsys):
    assert main(["cost"] + argv + ["--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_training_cost_hand_computed():
    c = training_cost(500.0, 8, 2.0, Amount(tokens=1e9, seq_len=1024), power_w=4000.0)
    hours = 1e9 / 1024 / 500 / 3600
    assert c["hours"] == pytest.approx(hours)
    assert c["gpu_hours"] == pytest.approx(hours * 8) and c["cost"] == pytest.approx(hours * 8 * 2)
    assert c["cost_per_million_samples"] == pytest.approx(1e6 * 8 * 2 / (500 * 3600))   # $8.89
    assert c["energy_j_per_sample"] == pytest.approx(8.0)                               # 4000 W / 500 /s
    assert c["energy_kwh"] == pytest.approx(4000 * hours / 1000)
    e = training_cost(100.0, 2, 3.0, Amount(epochs=90, dataset_size=1_281_167))
    assert e["hours"] == pytest.approx(90 * 1_281_167 / 100 / 3600)
    assert e["cost"] == pytest.approx(e["hours"] * 2 * 3) and e["energy_j_per_sample"] is None
    for bad in ({"samples": -1}, {"samples": 1, "tokens": 1}, {}, {"tokens": 1e9}, {"epochs": 1}):
        with pytest.raises(ConfigError):
            training_cost(500.0, 8, 2.0, Amount(**bad))
    with pytest.raises(ConfigError):
        training_cost(500.0, 8, 0.0, Amount(samples=1))


def test_cheapest_meeting_deadline():
    opts = [{"config": "a", "devices": 1, "hours": 8.68, "cost": 8.68},
            {"config": "b", "devices": 2, "hours": 4.63, "cost": 9.26},
            {"config": "c", "devices": 4, "hours": 2.42, "cost": 9.66}]
    meet, best = cheapest_meeting_deadline(opts, 5.0)
    assert [o["config"] for o in meet] == ["b", "c"] and best["config"] == "b"
    assert cheapest_meeting_deadline(opts, 1.0) == ([], None)
    with pytest.raises(ConfigError):
        cheapest_meeting_deadline(opts, 0.0)


def test_energy_per_sample_from_sampled_power(store):
    from dlscale.report.data import load_records

    recs = {r["config"]["nnodes"] * 10 + r["config"]["nproc_per_node"]: r
            for r in load_records(store).records if r.get("kind") == "run"}
    # one rank on a 2-GPU node: the busiest GPU only (the idle one is not the job's)
    assert record_power_w(Row(recs[11]))[0] == pytest.approx(350.0)
    assert record_power_w(Row(recs[12]))[0] == pytest.approx(610.0)
    p, how = record_power_w(Row(recs[22]))                # both nodes from the median repeat
    assert p == pytest.approx(1240.0) and how.endswith("per node")


def test_cost_measured_with_energy(store, capsys):
    c = cost_json([store, "--model", "m", "--shape", "2", "--tokens", "1e9", "--price-per-gpu-hour", "2"], capsys)
    hours = 1e9 / 1024 / 600 / 3600
    assert c["hours"] == pytest.approx(hours) and c["cost"] == pytest.approx(hours * 2 * 2)
    assert c["cost_per_million_samples"] == pytest.approx(1e6 * 2 * 2 / (600 * 3600))
    assert c["energy_j_per_sample"] == pytest.approx(610 / 600)
    assert c["energy_kwh"] == pytest.approx(610 * hours / 1000)
    # a shape picks that shape: 2 nodes x 2
    c = cost_json([store, "--model", "m", "--shape", "2x2", "--samples", "1e6", "--price-per-gpu-hour", "1"], capsys)
    assert c["samples_per_s"] == 1150.0
    c = cost_json([store, "--model", "m", "--nnodes", "2", "--nproc-per-node", "2", "--samples", "1e6",
                   "--price-per-gpu-hour", "1"], capsys)
    assert c["samples_per_s"] == 1150.0 and c["energy_j_per_sample"] == pytest.approx(1240 / 1150)
    assert main(["cost", store, "--model", "m", "--shape", "2", "--samples", "1e6", "--price-per-gpu-hour",
                 "2"]) == 0
    text = capsys.readouterr().out
    assert "| energy per seq |" in text and "| cost per million seq |" in text


def test_cost_measured_beats_predicted(store, capsys):
    """A measured shape uses its record; the prediction only stands beside it. A shape nothing was measured
    at takes the prediction, with its band."""
    c = cost_json([store, "--model", "m", "--shape", "1x2", "--samples", "1e6", "--predicted", "--overlap", "none",
                   "--price-per-gpu-hour", "1"], capsys)
    assert c["samples_per_s"] == 600.0 and c["kind"] == "run"
    # beside it: what the model says at 1x2 without that record (the default law; 20 buckets of latency)
    alpha = (20e-6 - 8 / 250e9) / 2
    t2 = 0.1 + 500e6 / 250e9 + 40 * alpha + DEFAULT_LAW.node["ln_gpus"] * math.log(2) * 0.1
    assert c["predicted_samples_per_s"] == pytest.approx(64 / t2)
    assert c["energy_j_per_sample"] == pytest.approx(610 / 600)
    c = cost_json([store, "--model", "m", "--shape", "4x2", "--samples", "1e6", "--predicted", "--overlap", "none",
                   "--inter-busbw", "12.5", "--price-per-gpu-hour", "1"], capsys)
    assert c["kind"] == "predicted" and c["samples_per_s_low"] < c["samples_per_s"] <= c["samples_per_s_high"]
    assert c["hours_range"][0] < c["hours"] < c["hours_range"][1]
    assert c["energy_j_per_sample"] == pytest.approx(350 * 8 / c["samples_per_s"])  # estimate: 1-device x 8
    assert "estimate" in c["power_source"]


def test_deadline_planner_ranks_the_measured_record_not_the_prediction(tmp_path, capsys):
    """The 4x8-style bug: a measured 2x2 record that misses the deadline must not be replaced by a faster
    prediction of the same shape that meets it."""
    s = ResultStore(tmp_path / "d")
    s.append(run_record(1, 320.0, "single", "2025-01-01T00:00:00+00:00"))
    s.append(run_record(2, 600.0, "ddp", "2025-01-01T01:00:00+00:00"))
    s.append(run_record(2, 700.0, "ddp", "2025-01-01T02:00:00+00:00", nnodes=2))    # slow: 2 nodes, 700/s
    s.append(comm_record())
    argv = [str(tmp_path / "d"), "--model", "m", "--deadline-hours", "3", "--samples", "1e7", "--price-per-gpu-hour",
            "1", "--predicted", "--shapes", "1x2,2x2", "--inter-busbw", "100", "--overlap", "none"]
    out = cost_json(argv, capsys)
    opts = {o["config"]: o for o in out["options"]}
    assert set(opts) == {"single 1x1", "ddp 1x2", "ddp 2x2"}                         # no predicted 2x2 option
    two = opts["ddp 2x2"]
    assert two["samples_per_s"] == 700.0 and two["kind"] == "run"
    assert two["predicted_samples_per_s"] > 1000.0                                  # the model beside it
    assert two["hours"] == pytest.approx(1e7 / 700 / 3600) and not two["meets_deadline"]   # 3.97 h > 3 h
    assert two["predicted_hours"] < 3.0                      # the prediction alone would have met the deadline
    assert out["cheapest"] is None and out["fastest"] == "ddp 2x2"
    assert main(["cost"] + argv) == 0
    text = capsys.readouterr().out
    assert "predicted hours" in text and "| ddp 2x2 | 4 | 700.0 |" in text


def test_cost_says_cpu_and_flavour(tmp_path, capsys):
    s = ResultStore(tmp_path / "cpu")
    rec = run_record(1, 50.0, "single", "2025-01-01T00:00:00+00:00", flavor="tiny", device="cpu")
    rec["device_type"] = "cpu"
    s.append(rec)
    assert main(["cost", str(tmp_path / "cpu"), "--model", "m", "--flavor", "tiny", "--shape", "1",
                 "--samples", "1e6", "--price-per-gpu-hour", "1"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    c = cost_json([str(tmp_path / "cpu"), "--model", "m", "--flavor", "tiny", "--shape", "1", "--samples", "1e6",
                   "--price-per-gpu-hour", "1"], capsys)
    assert "CPU" in c["qualifier"] and "tiny" in c["qualifier"] and c["qualifier"] in title


def test_cost_devices_is_a_deprecated_alias(store, capsys):
    DeprecatedAlias.warned.clear()
    c = cost_json([store, "--model", "m", "--devices", "2", "--samples", "1e6", "--price-per-gpu-hour", "1"], capsys)
    assert c["samples_per_s"] == 600.0


def test_price_files(store, tmp_path, capsys):
    entries = load_prices("builtin")
    assert BUILTIN_PRICES.exists() and all(e["usd_per_gpu_hour"] > 0 and e["source"] for e in entries)
    c = cost_json([store, "--model", "m", "--shape", "2", "--samples", "1e6", "--price-file", "builtin"], capsys)
    h100 = next(e for e in entries if e["name"] == "aws-capacity-block-h100")
    assert c["price_per_gpu_hour"] == h100["usd_per_gpu_hour"] and "capacityblocks" in c["price_source"]
    c = cost_json([store, "--model", "m", "--shape", "2", "--samples", "1e6", "--price-file", "builtin",
                   "--price", "aws-on-demand-h100-2023"], capsys)
    assert c["price_per_gpu_hour"] == 12.29
    own = tmp_path / "p.yaml"
    own.write_text("prices:\n  - {name: mine, gpu: 'H100', usd_per_gpu_hour: 0, source: me}\n")
    assert main(["cost", store, "--model", "m", "--shape", "2", "--samples", "1e6", "--price-file", str(own)]) == 2
    err = capsys.readouterr().err
    assert "positive" in err and err.count("\n") == 1
    own.write_text("prices:\n  - {name: mine, gpu: 'A100', usd_per_gpu_hour: 1.5, source: me}\n")
    assert main(["cost", store, "--model", "m", "--shape", "2", "--samples", "1e6", "--price-file", str(own)]) == 2
    err = capsys.readouterr().err  # one line: the file, the records' GPU no entry matches, the ways out
    gpu = GPU_ENV["gpus"][0]["name"]
    assert err.count("\n") == 1 and str(own) in err and gpu in err and "--price-per-gpu-hour" in err, err


def test_cost_deadline_picks_cheapest(store, capsys):
    """1e7 samples at $1/GPU-h: 1 GPU 8.68 h $8.68; 1x2 4.63 h $9.26; 2x2 2.42 h $9.66.
    Deadline 5 h -> 1x2 and 2x2 meet it, 1x2 is the cheaper."""
    out = cost_json([store, "--model", "m", "--deadline-hours", "5", "--samples", "1e7",
                     "--price-per-gpu-hour", "1"], capsys)
    opts = {o["config"]: o for o in out["options"]}
    assert set(opts) == {"single 1x1", "ddp 1x2", "ddp 2x2"}
    assert opts["single 1x1"]["hours"] == pytest.approx(1e7 / 320 / 3600) and not opts["single 1x1"]["meets_deadline"]
    assert opts["ddp 1x2"]["cost"] == pytest.approx(1e7 / 600 / 3600 * 2)
    assert out["cheapest"] == "ddp 1x2" and out["fastest"] == "ddp 2x2"
    out = cost_json([store, "--model", "m", "--deadline-hours", "1", "--samples", "1e7",
                     "--price-per-gpu-hour", "1"], capsys)
    assert out["cheapest"] is None
    # with predicted shapes too: 64 GPUs finish within the hour
    out = cost_json([store, "--model", "m", "--deadline-hours", "1", "--samples", "1e7", "--price-per-gpu-hour", "1",
                     "--predicted", "--shapes", "1x2,16x2,32x2", "--inter-busbw", "12.5"], capsys)
    assert out["cheapest"] == "ddp 16x2 (predicted)"
    assert main(["cost", store, "--model", "m", "--deadline-hours", "1", "--samples", "1e7",
                 "--price-per-gpu-hour", "1"]) == 0
    text = capsys.readouterr().out  # none meets the deadline: the fastest is named
    assert "1 h" in text and "ddp 2x2" in text


@pytest.mark.parametrize("argv", [
    ["cost", "{s}", "--model", "m", "--shape", "8", "--samples", "1000", "--price-per-gpu-hour", "2"],
    ["cost", "{s}", "--model", "nope", "--shape", "2", "--samples", "1000", "--price-per-gpu-hour", "2"],
    ["cost", "{s}", "--model", "m", "--shape", "2", "--samples", "1000"],                 # no price
    ["cost", "{s}", "--model", "m", "--shape", "2", "--samples", "1000", "--price", "x"],
    ["cost", "{s}", "--model", "m", "--nnodes", "2", "--samples", "1000", "--price-per-gpu-hour", "2"],
])
def test_cost_one_line_errors(store, capsys, argv):
    assert main([a.format(s=store) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dlscale: error: ") and err.count("\n") == 1


@pytest.mark.parametrize("extra", [
    ["--shape", "2", "--price-per-gpu-hour", "-2"],
    ["--shape", "0", "--price-per-gpu-hour", "2"],
    ["--price-per-gpu-hour", "2"],                                   # neither --shape nor --deadline-hours
    ["--deadline-hours", "0", "--price-per-gpu-hour", "2"],
    ["--shape", "2", "--price-per-gpu-hour", "2", "--price-file", "builtin"],
    ["--shape", "2", "--nnodes", "2", "--price-per-gpu-hour", "2"],
])
def test_cost_bad_arguments_exit_2(store, capsys, extra):
    with pytest.raises(SystemExit) as e:
        main(["cost", store, "--model", "m", "--samples", "1000"] + extra)
    assert e.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
