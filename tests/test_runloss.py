"""What a run loses besides the step: slow ranks, the training share of the wall time, energy, checkpoints."""
from __future__ import annotations

import pytest

import helpers_cli
from dlscale import ranktimes, validity
from dlscale.config import RunConfig, parse_injection
from dlscale.store import ResultStore
from dlscale import ConfigError


def _rank(rank, solo, window=10.0, host="h", device="cpu"):
    return {"rank": rank, "host": host, "device": device, "window_median_ms": window, "window_p90_ms": window,
            "solo_ms": solo}


def _record(rank_steps, world=2):
    rep = {"repeat": 0, "status": "ok", "samples_per_s": 10.0, "window_s": 2.0, "step_times_ms": [10.0] * 12,
           "rank_steps": rank_steps}
    return {"status": "ok", "world_size": world, "config": {"steps": 12}, "repeats": [rep], "median_repeat": 0}


# ---------------------------------------------------------------------------------------------- slow ranks

def test_slowest_rank_against_the_median_of_the_others():
    ranks = [_rank(0, [10, 11, 10]), _rank(1, [15, 16, 15], host="b", device="cuda:1"), _rank(2, [10, 10, 12])]
    s = ranktimes.slowest(ranks)
    assert (s["rank"], s["host"], s["device"], s["basis"]) == (1, "b", "cuda:1", "solo")
    assert s["median_ms"] == 15 and s["others_median_ms"] == 10  # medians of ranks 0 and 2: 10, 10
    assert s["gap"] == pytest.approx(0.5) and s["separated"] is True


def test_overlapping_steps_do_not_separate_and_one_rank_has_no_slowest():
    s = ranktimes.slowest([_rank(0, [10, 14, 10, 14]), _rank(1, [11, 15, 11, 15])])
    assert s["rank"] == 1 and s["separated"] is False  # rank 1's p25 (11) is below rank 0's p75 (14)
    assert ranktimes.slowest([_rank(0, [10])]) is None
    # without solo steps on every rank: the window's medians
    assert ranktimes.slowest([_rank(0, None, 10.0), _rank(1, [9.0], 12.0)])["basis"] == "window"


def test_straggler_flag_names_the_rank_past_the_threshold_only():
    gap = validity.THRESHOLDS.straggler_gap
    slow = [_rank(0, [10.0] * 4), _rank(1, [10.0 * (1 + 2 * gap)] * 4, host="node7")]
    flags = [f for f in validity.assess(_record(slow)).flags if f.check == "straggler"]
    assert len(flags) == 1 and "rank 1" in flags[0].reason and "node7" in flags[0].reason
    assert flags[0].value == pytest.approx(2 * gap)
    near = [_rank(0, [10.0] * 4), _rank(1, [10.0 * (1 + gap / 2)] * 4)]
    assert not [f for f in validity.assess(_record(near)).flags if f.check == "straggler"]
    v = validity.assess(_record(None))
    assert "straggler" in v.unchecked
    assert "straggler" not in validity.assess(_record(None, world=1)).unchecked


def test_slow_injection_parses_as_milliseconds_on_any_step():
    assert parse_injection("slow@50:1") == ("slow", 50, 1)
    cfg = RunConfig(model="gpt2", flavor="tiny", nproc_per_node=2, warmup=1, steps=2, inject_failure="slow@500:1")
    from dlscale.config import validate_case

    validate_case(cfg)  # 500 is a sleep, not a step that must be reached
    with pytest.raises(ConfigError):
        parse_injection("slower@5")


@pytest.mark.slow  # two gloo ranks, one slowed: the straggler flag names it
def test_two_ranks_one_slowed_is_named_straggler(tmp_path):
    p = helpers_cli.dlscale("run", "--model", "gpt2", "--flavor", "tiny", "--precision", "fp32", "--device", "cpu",
                            "--strategy", "ddp", "--nproc-per-node", "2", "--batch-size", "2", "--warmup", "2",
                            "--steps", "4", "--repeats", "1", "--no-monitor", "--inject-failure", "slow@80:1",
                            "--store", str(tmp_path))
    assert p.returncode == 0, p.stderr[-3000:]
    rec = ResultStore(tmp_path).load().records[0]
    steps = rec["repeats"][0]["rank_steps"]
    assert [r["rank"] for r in steps] == [0, 1] and all(len(r["solo_ms"]) == ranktimes.SOLO_STEPS for r in steps)
    flags = [f for f in rec["validity"]["flags"] if f["check"] == "straggler"]
    assert len(flags) == 1 and "rank 1 " in flags[0]["reason"], rec["validity"]
    assert ranktimes.record_slowest(rec)["rank"] == 1


# ---------------------------------------------------------------------------------------------- goodput

def test_training_shares_of_the_wall_time():
    from dlscale import goodput

    phases = {"launch": 1.0, "import": 2.0, "init": 0.5, "build": 0.5, "warmup": 2.0, "window": 3.0, "after": 0.5,
              "exit": 0.5}  # 10 s in all
    assert goodput.shares(phases) == pytest.approx({"window": 0.3, "with_warmup": 0.5})
    assert goodput.shares({"launch": 1.0}) is None and goodput.shares(None) is None
    assert goodput.shares({"window": 1.0, "exit": float("nan"), "after": True}) == {"window": 1.0, "with_warmup": 1.0}
    rec = {"median_repeat": 1, "repeats": [{"repeat": 0, "status": "ok", "phases_s": {"window": 1.0, "exit": 1.0}},
                                           {"repeat": 1, "status": "ok", "phases_s": phases}]}
    assert goodput.pct_pair(rec) == pytest.approx((30.0, 50.0))  # the median repeat's


def test_report_columns_show_the_slowest_rank_and_the_window_share():
    from types import SimpleNamespace

    from dlscale.report import lostcols, render

    rec = _record([_rank(0, [10.0] * 3), _rank(1, [13.0] * 3, host="b")])
    rec["repeats"][0]["phases_s"] = {"build": 3.0, "window": 1.0}
    got = lostcols.fields(SimpleNamespace(record=rec))
    assert (got["slowest_rank"], got["slowest_rank_host"]) == (1, "b")
    assert got["slowest_rank_gap"] == pytest.approx(0.3) and got["wall_share_window"] == pytest.approx(0.25)
    headers = [h for h, _ in render.EXTRA_COLUMNS]
    assert all(h in headers for h, _ in lostcols.COLUMNS)
