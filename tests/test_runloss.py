"""What a run loses besides the step: slow ranks, the training share of the wall time, energy, checkpoints."""
from __future__ import annotations

import pytest

import helpers_cli
from dlscale.results import validity
from dlscale.train import ranktimes
from dlscale.case.config import RunConfig, parse_injection
from dlscale.results.store import ResultStore
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
    from dlscale.case.config import validate_case

    validate_case(cfg)  # 500 is a sleep, not a step that must be reached
    with pytest.raises(ConfigError):
        parse_injection("slower@5")


# two gloo ranks, one slowed, named the straggler: the ddp run of
# test_checkpoint_phase_times_saves_and_restores_the_losses


# ---------------------------------------------------------------------------------------------- goodput

def test_training_shares_of_the_wall_time():
    from dlscale.results import goodput

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
    assert set(got) == set(lostcols.CSV_COLUMNS) and got["checkpoint_blocking_s"] is None
    rec["repeats"][0]["checkpoint"] = {"saves": [{"blocking_s": 0.5, "durable_s": 2.0, "write_bytes_per_s": 3e9}],
                                       "step_effect": 0.25}
    cells = {h: f(SimpleNamespace(record=rec)) for h, f in lostcols.COLUMNS}
    assert cells["checkpoint block / durable (s)"] == (0.5, 2.0)
    assert cells["checkpoint write (GB/s)"] == (3.0,) and cells["steps after checkpoint (%)"] == (25.0,)
    rec["repeats"][0]["checkpoint"].update(mode="async", every=3, restore_matches=True)
    rec["repeats"][0]["checkpoint"]["saves"][0]["bytes"] = 6e9
    from dlscale.train import checkpoint_timing

    assert "async" in checkpoint_timing.console_line(rec) and checkpoint_timing.console_line({"repeats": []}) is None


# ---------------------------------------------------------------------------------------------- energy

class _FakeNvml:
    """NVML's energy call on fake handles: a handle's next counter value (mJ), or NotSupported."""

    def __init__(self, counters):
        self.counters = {h: None if v is None else iter(v) for h, v in counters.items()}

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        vals = self.counters[h]
        if vals is None:
            raise RuntimeError("NVMLError_NotSupported")
        return next(vals)


def _rapl(root, name, uj, rng=None):
    d = root / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "energy_uj").write_text(f"{uj}\n")
    if rng is not None:
        (d / "max_energy_range_uj").write_text(f"{rng}\n")
    return d


def test_counter_delta_undoes_one_wrap_and_refuses_a_reset():
    from dlscale.train.energy import counter_delta

    assert counter_delta(100, 350) == 250
    assert counter_delta(900, 100, wrap=1000) == 200  # 900 -> 1000 (wrap) -> 100
    assert counter_delta(900, 100) is None  # went back without a known range: no figure
    assert counter_delta(None, 5) is None and counter_delta(5, None) is None


def test_meter_sums_the_gpus_that_have_a_counter(tmp_path):
    from dlscale.train import energy

    nvml = _FakeNvml({"a": [1_000_000, 1_250_000], "b": [500, 2500], "c": None})
    m = energy.Meter(nvml, ["a", "b", "c"], energy.rapl_domains(str(tmp_path)))
    m.start()
    got = m.stop()
    assert got["gpu_j"] == pytest.approx(250.0 + 2.0)  # mJ -> J
    assert (got["gpus_read"], got["gpus_unsupported"], got["cpu_j"]) == (2, 1, None)
    assert got["read_s"] >= 0
    # nothing read at both ends: no energy at all
    assert energy.Meter(_FakeNvml({"c": None}), ["c"]).stop() is None
    m = energy.Meter(_FakeNvml({"c": None}), ["c"])
    m.start()
    assert m.stop() is None


def test_rapl_packages_only_with_their_wrap(tmp_path):
    from dlscale.train import energy

    pkg = _rapl(tmp_path, "intel-rapl:0", 9_000_000, rng=10_000_000)
    _rapl(tmp_path, "intel-rapl:0:0", 1)  # a sub-domain (core) is part of the package: not summed again
    assert energy.rapl_domains(str(tmp_path)) == [str(pkg)]
    m = energy.Meter(None, [], energy.rapl_domains(str(tmp_path)))
    m.start()
    (pkg / "energy_uj").write_text("1000000\n")  # wrapped: 9 J -> 10 J -> 1 J
    got = m.stop()
    assert got["cpu_j"] == pytest.approx(2.0) and got["gpu_j"] is None and got["cpu_packages_read"] == 1
    assert energy.rapl_domains(str(tmp_path / "none")) == []


def test_repeat_and_summary_energy_per_sample_and_token():
    from dlscale.train import energy

    ranks = [{"rank": 0, "device": "cuda:0", "energy": {"gpu_j": 300.0, "gpus_read": 2, "gpus_unsupported": 0,
                                                        "cpu_j": None, "cpu_packages_read": 0, "read_s": 2.0}},
             {"rank": 1, "device": "cuda:1"},
             {"rank": 2, "device": "cuda:0", "energy": {"gpu_j": 100.0, "gpus_read": 2, "gpus_unsupported": 0,
                                                        "cpu_j": 5.0, "cpu_packages_read": 1, "read_s": 2.5}}]
    e = energy.merge_nodes(ranks, samples=200)
    assert (e["gpu_j"], e["nodes"], e["source"], e["read_s"]) == (400.0, 2, "nvml", 2.5)
    assert e["j_per_sample"] == pytest.approx(2.0)  # the GPUs', not the CPU package's
    assert energy.merge_nodes(ranks, samples=200, nnodes=3)["j_per_sample"] is None  # a node's reading missing
    assert energy.merge_nodes([{"rank": 0, "device": "cpu"}], 10) is None
    reps = [{"status": "ok", "energy": {"j_per_sample": x}} for x in (1.0, 3.0, 2.0)] + [{"status": "ok"}]
    assert energy.summary_fields(reps, seq_len=100) == pytest.approx({"joules_per_sample": 2.0,
                                                                      "joules_per_token": 0.02})
    assert energy.summary_fields([{"status": "ok"}], 100) == {}


def test_cost_takes_the_measured_energy_where_the_record_has_it():
    from dlscale.train import energy
    from dlscale.perfmodel.core import Shape
    from dlscale.perfmodel.cost import CostOption

    rec = {"id": "r1", "median_repeat": 0,
           "repeats": [{"repeat": 0, "status": "ok", "energy": {"gpu_j": 1200.0, "gpus_read": 1, "read_s": 2.0}}]}
    sampled = CostOption(Shape(1, 1), "single", 100.0, "run", "r1", 500.0, "mean GPU power, node 0")
    other = CostOption(Shape(1, 2), "ddp", 190.0, "run", "r2", 900.0, "mean GPU power, node 0")
    got = energy.prefer_measured([sampled, other], [rec, {"id": "r2", "repeats": []}])
    assert got[0].power_w == pytest.approx(600.0) and "measured" in got[0].power_source
    assert got[1] == other  # no counter in its record: the sampled power stays


# ---------------------------------------------------------------------------------------------- checkpoints

def _ckpt_cfg(**kw):
    base = dict(model="gpt2", flavor="tiny", device="cpu", nproc_per_node=2, strategy="ddp", warmup=1, steps=2)
    return RunConfig(**{**base, **kw})


def test_checkpoint_options_are_checked_before_anything_runs(tmp_path):
    from dlscale.train import checkpoint_timing as ct
    from dlscale.case.config import validate_case

    with pytest.raises(ConfigError, match="checkpoint-every"):
        _ckpt_cfg(checkpoint_every=0)
    for bad in (dict(checkpoint_mode="async"), dict(checkpoint_dir=str(tmp_path)),
                dict(checkpoint_every=2, strategy="pipeline"), dict(checkpoint_every=2, nnodes=2)):
        with pytest.raises(ConfigError):
            ct.check_case(_ckpt_cfg(**bad))
    with pytest.raises(ConfigError, match="checkpoint-mode"):
        _ckpt_cfg(checkpoint_every=2, checkpoint_mode="lazy")
    validate_case(_ckpt_cfg(checkpoint_every=2, checkpoint_mode="async"))


def test_restore_check_allows_gpu_drift_after_the_first_step_only():
    from dlscale.train.checkpoint_timing import DRIFT_RTOL_GPU, RESTORE_RTOL, restore_check

    trained = [2.0, 1.0]
    drift = [2.0, 1.0 + DRIFT_RTOL_GPU / 2]  # the second loss moved by half the GPU's drift tolerance
    assert restore_check(trained, drift, "cuda") == (True, pytest.approx(DRIFT_RTOL_GPU / 2))
    assert restore_check(trained, drift, "cpu")[0] is False
    first_off = [2.0 * (1 + 10 * RESTORE_RTOL), 1.0]  # the first step reads only the restored weights
    assert restore_check(trained, first_off, "cuda")[0] is False
    assert restore_check(trained, [2.0, 1.0 + 2 * DRIFT_RTOL_GPU], "cuda")[0] is False
    assert restore_check(trained, trained, "cpu") == (True, 0.0)


def test_checkpoint_options_leave_the_case_key_as_it_was(tmp_path):
    plain = _ckpt_cfg()
    timed = _ckpt_cfg(checkpoint_every=3, checkpoint_mode="async", checkpoint_dir=str(tmp_path))
    assert timed.case_key() == plain.case_key()
    assert _ckpt_cfg(inject_failure="slow@20:1").case_key() == plain.case_key()


def test_checkpoint_dir_must_exist_be_writable_and_have_room(tmp_path, monkeypatch):
    import shutil

    from dlscale.train import checkpoint_timing as ct

    ct.check_dir(str(tmp_path), need_bytes=1000)
    afile = tmp_path / "f"
    afile.write_text("")
    for bad in (tmp_path / "missing", afile):
        with pytest.raises(ConfigError, match="checkpoint-dir"):
            ct.check_dir(str(bad), 1000)
    free = shutil.disk_usage(tmp_path).free
    with pytest.raises(ConfigError, match="GB free"):
        ct.check_dir(str(tmp_path), need_bytes=free)  # SAVES saves of it do not fit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]  # the write test left nothing behind
    assert ct.state_bytes(10) == ct.STATE_BYTES_PER_PARAM * 10


def test_bad_checkpoint_option_is_one_line_exit_2_and_nothing_written(tmp_path):
    store = tmp_path / "store"
    p = helpers_cli.dlscale("run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--steps", "2",
                            "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path / "nope"),
                            "--store", str(store))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "checkpoint-dir" in p.stderr
    assert not store.exists() or not any(store.iterdir())


def test_checkpoint_summary_per_save_and_the_steps_around():
    from dlscale.train import checkpoint_timing as ct

    got = ct.summarise([[10.0, 12.0, 11.0], [15.0, 13.0, 14.0], [12.0, 12.0, 13.0]], worst=[0.5, 2.0, 0.4, 1.0],
                       written=[4e9, 4e9])
    assert [s["write_bytes_per_s"] for s in got["saves"]] == [2e9, 4e9]  # bytes / durable seconds
    assert (got["saves"][1]["blocking_s"], got["saves"][1]["durable_s"]) == (0.4, 1.0)
    assert got["step_ms_before"] == 11.0 and got["step_ms_after"] == 13.0  # median of 15,13,14,12,12,13
    assert got["step_effect"] == pytest.approx(13 / 11 - 1)
    rec = {"median_repeat": 0, "repeats": [{"repeat": 0, "status": "ok", "checkpoint": got}]}
    v = ct.report_values(rec)
    assert v["blocking_s"] == pytest.approx(0.45) and v["write_bytes_per_s"] == pytest.approx(3e9)


@pytest.mark.slow
def test_checkpoint_phase_times_saves_and_restores_the_losses(tmp_path):
    """Tiny GPT-2 at two gloo processes: ddp saved sync, fsdp (its shards) async, both restored; in
    the ddp run rank 1 is slowed and named the straggler."""
    common = ["run", "--model", "gpt2", "--flavor", "tiny", "--precision", "fp32", "--device", "cpu",
              "--nproc-per-node", "2", "--batch-size", "2", "--warmup", "2", "--steps", "4", "--repeats", "1",
              "--no-monitor", "--checkpoint-every", "2", "--collective-timeout", "60"]
    ckdir = tmp_path / "ck"
    ckdir.mkdir()
    runs = {"ddp": ["--strategy", "ddp", "--checkpoint-mode", "sync", "--checkpoint-dir", str(ckdir),
                    "--inject-failure", "slow@80:1"],
            "fsdp": ["--strategy", "fsdp", "--checkpoint-mode", "async"]}
    got = helpers_cli.dlscale_many([common + extra + ["--store", str(tmp_path / name)]
                                    for name, extra in runs.items()])
    for (name, extra), p in zip(runs.items(), got):
        assert not isinstance(p, BaseException) and p.returncode == 0, (name, p)
        rec = ResultStore(tmp_path / name).load().records[0]
        c = rec["repeats"][0]["checkpoint"]
        assert c["mode"] == extra[3] and len(c["saves"]) == 2
        for s in c["saves"]:
            assert 0 < s["blocking_s"] <= s["durable_s"] and s["bytes"] > 0
            assert s["write_bytes_per_s"] == pytest.approx(s["bytes"] / s["durable_s"])
        assert c["restore_matches"] is True and c["losses_restored"] == pytest.approx(c["losses_trained"])
        assert len(c["steps_ms"]) == 3 and c["step_effect"] is not None
    assert list(ckdir.iterdir()) == []  # the saves are removed after the phase

    rec = ResultStore(tmp_path / "ddp").load().records[0]
    steps = rec["repeats"][0]["rank_steps"]
    assert [r["rank"] for r in steps] == [0, 1] and all(len(r["solo_ms"]) == ranktimes.SOLO_STEPS for r in steps)
    flags = [f for f in rec["validity"]["flags"] if f["check"] == "straggler"]
    assert len(flags) == 1 and "rank 1 " in flags[0]["reason"], rec["validity"]
    assert ranktimes.record_slowest(rec)["rank"] == 1
    from dlscale.train import energy

    assert ("energy" in rec["repeats"][0]) == bool(energy.rapl_domains())  # only where a counter was read


def test_long_run_counts_the_start_up_once_and_each_checkpoint():
    from dlscale.results import goodput

    rec = {"median_repeat": 0, "repeats": [{"repeat": 0, "status": "ok",
                                            "phases_s": {"launch": 100.0, "import": 200.0, "init": 100.0,
                                                         "build": 200.0, "warmup": 120.0, "window": 50.0},
                                            "checkpoint": {"saves": [{"blocking_s": 3.0}, {"blocking_s": 5.0}]}}]}
    o = goodput.long_run(10.0, rec, interval_min=30.0)  # 20 checkpoints x 4 s (median) + 720 s start-up
    assert (o["startup_s"], o["checkpoints"], o["checkpoint_blocking_s"]) == (720.0, 20, 4.0)
    assert o["hours_with_overheads"] == pytest.approx(10.0 + 800.0 / 3600.0)
    assert o["goodput"] == pytest.approx(10.0 / (10.0 + 800.0 / 3600.0))
    assert goodput.long_run(10.0, rec, None)["hours_with_overheads"] == pytest.approx(10.2)
    del rec["repeats"][0]["checkpoint"]
    missing = goodput.long_run(10.0, rec, 30.0)
    assert "reason" in missing and "hours_with_overheads" not in missing
    assert goodput.long_run(1.0, {"repeats": []}, 30.0) is None


def test_write_test_times_a_durable_write_and_leaves_nothing(tmp_path):
    from dlscale.micro import diskwrite

    row = diskwrite.measure_write(str(tmp_path), 3 << 20, chunk=1 << 20)
    assert row["status"] == "ok" and row["bytes"] == 3 << 20
    assert row["write_mb_s"] == pytest.approx(row["bytes"] / row["seconds"] / 1e6)
    assert list(tmp_path.iterdir()) == []
    for bad in ((str(tmp_path / "nope"), 10.0), (str(tmp_path), 0.0)):
        with pytest.raises(ConfigError):
            diskwrite.check(*bad)


def test_plan_estimates_a_save_from_the_state_and_the_bandwidth():
    from dlscale.train import checkpoint_timing as ct

    e = ct.plan_estimate(params=1_000_000_000, nodes=4, write_bytes_per_s=1.5e9)
    assert e["state_bytes"] == ct.STATE_BYTES_PER_PARAM * 1e9
    assert e["bytes_per_node"] == e["state_bytes"] / 4
    assert e["sync_save_s"] == pytest.approx(e["bytes_per_node"] / 1.5e9)
    assert ct.plan_estimate(10, 1, None)["sync_save_s"] is None


def test_the_phase_stager_stays_open_when_a_save_closes_it():
    # some torch releases' async_save closes the stager it is given after each save
    import torch

    from dlscale.train.checkpoint_timing import _stager

    stager = _stager("pageable")
    state = {"w": torch.arange(4.0), "step": 3, "kind": torch.float32.__class__}
    stager.close()
    staged = stager.stage(state)
    assert torch.equal(staged["w"], state["w"]) and staged["w"].data_ptr() != state["w"].data_ptr()
    stager.release()
    with pytest.raises(Exception):  # released: its copy tables are gone
        stager.stage(state)


def test_the_phase_stager_refills_its_host_copies_at_the_next_save():
    import torch

    from dlscale.train.checkpoint_timing import _stager

    stager = _stager("pageable")
    w = torch.zeros(4)
    first = stager.stage({"w": w})["w"].clone()
    w.add_(2.0)
    again = stager.stage({"w": w})
    assert torch.equal(first, torch.zeros(4)) and torch.equal(again["w"], w)
    assert again["w"].data_ptr() == stager.stage({"w": w})["w"].data_ptr()  # one host buffer, reused
    stager.release()
