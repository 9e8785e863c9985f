"""dlscale tune: candidates, pruning, ranking, the search's resume/budget/interrupt logic, bad input
(pure, in this process), and one real tune, interrupted and resumed (slow)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.case.config import RunConfig
from dlscale.tune import prune, rank, result, search, space
from dlscale.tune.cli import duration

TINY = dict(model="gpt2", flavor="tiny", device="cpu", nproc_per_node=2, precision="fp32")


def _cands(axes: space.Axes, **kw) -> list[space.Candidate]:
    base = RunConfig(**{**TINY, **kw})
    full = space.default_axes(axes, "cpu", base.world_size)
    label = space.LABEL_PREFIX + space.tune_id(base, axes)
    return space.generate(base, full, "cpu", prune.default_batches("cpu", True), label)


def _runnable(cands):
    return [c for c in cands if c.pruned is None]


# ---------------------------------------------------------------- axes and candidates

def test_axis_values_split_on_commas_and_repeats_in_order_without_duplicates():
    assert space.parse_axis("strategy", ["ddp,fsdp", "zero1", "ddp"]) == ("ddp", "fsdp", "zero1")
    assert space.parse_axis("compile", ["on,off"]) == (True, False)
    assert space.parse_axis("batch_size", ["8, 2"]) == (8, 2)
    assert space.parse_axis("precision", None) == ()


@pytest.mark.parametrize("name,value", [("strategy", "nosuch"), ("strategy", "auto"), ("batch_size", "two"),
                                        ("batch_size", "0"), ("compile", "maybe"),
                                        ("activation_checkpointing", "most")])
def test_a_bad_axis_value_is_one_config_error(name, value):
    with pytest.raises(ConfigError) as e:
        space.parse_axis(name, [value])
    assert "\n" not in str(e.value)


def test_global_batch_pairs_keep_it_and_respect_the_batch_axis_and_microbatches():
    from dlscale.planner.memplan import Layout, ParallelDims

    ddp = Layout("ddp", ParallelDims.of(dp_replicate=2))
    pairs, why = space.batch_choices(space.Axes(global_batch=16), ddp, 2, ())
    assert why == "" and pairs == [(8, 1), (4, 2), (2, 4), (1, 8)]
    pairs, _ = space.batch_choices(space.Axes(global_batch=16, batch_size=(4,)), ddp, 2, ())
    assert pairs == [(4, 2)]
    pipe = Layout("pipeline", ParallelDims.of(pp=2), microbatches=4)  # dp 1: the whole global batch per step
    pairs, _ = space.batch_choices(space.Axes(global_batch=16), pipe, 2, ())
    assert all(b % 4 == 0 and b * a == 16 for b, a in pairs) and (16, 1) in pairs and (2, 8) not in pairs
    pairs, why = space.batch_choices(space.Axes(global_batch=7), ddp, 2, ())
    assert pairs == [] and "7" in why


def test_every_runnable_candidate_keeps_the_global_batch_and_carries_the_tunes_label():
    cands = _cands(space.Axes(strategy=("ddp", "tensor", "pipeline"), activation_checkpointing=("none",),
                              global_batch=16))
    run = _runnable(cands)
    assert {c.cfg.strategy for c in run} == {"ddp", "tensor", "pipeline"}
    for c in run:
        dp = c.layout.dp
        assert c.cfg.batch_size * c.cfg.grad_accum * dp == 16
    assert len({c.cfg.label for c in cands}) == 1 and run[0].cfg.label.startswith(space.LABEL_PREFIX)
    assert len({c.key for c in run}) == len(run)


def test_the_tune_id_follows_its_inputs_not_the_order_of_calls():
    base = RunConfig(**TINY)
    a = space.tune_id(base, space.Axes(strategy=("ddp",)))
    assert a == space.tune_id(RunConfig(**TINY), space.Axes(strategy=("ddp",)))
    assert a != space.tune_id(base, space.Axes(strategy=("zero1",)))
    assert a != space.tune_id(dataclasses.replace(base, steps=base.steps + 1), space.Axes(strategy=("ddp",)))


def test_an_axis_value_the_model_cannot_take_is_bad_input():
    axes = space.Axes(strategy=("ddp",), activation_checkpointing=("selective",), batch_size=(8,))
    cands = _cands(axes, model="wide-deep")
    with pytest.raises(ConfigError, match="activation-checkpointing"):
        space.check_given(cands, axes)


def test_a_global_batch_no_configuration_divides_is_bad_input():
    axes = space.Axes(strategy=("ddp", "zero1"), activation_checkpointing=("none",), global_batch=7)
    with pytest.raises(ConfigError, match="global-batch 7"):
        space.check_given(_cands(axes), axes)


def test_strategies_that_cannot_run_here_are_pruned_with_a_reason_not_dropped():
    cands = _cands(space.Axes(strategy=("single", "ddp"), activation_checkpointing=("none",), batch_size=(4,)))
    single = [c for c in cands if c.cfg.strategy == "single"]
    assert single and all(c.pruned_by == "invalid" and c.pruned for c in single)
    assert [c.cfg.strategy for c in _runnable(cands)] == ["ddp"]


def test_a_mesh_strategy_at_another_strategys_degrees_is_not_run_twice():
    cands = _cands(space.Axes(strategy=("ddp", "hybrid", "fsdp", "hsdp"), activation_checkpointing=("none",),
                              batch_size=(8,)), model="resnet50")
    assert sorted(c.cfg.strategy for c in _runnable(cands)) == ["ddp", "fsdp"]
    whole = {c.cfg.strategy: c.pruned for c in cands if c.whole}
    assert set(whole) == {"hybrid", "hsdp"} and "ddp" in whole["hybrid"] and "fsdp" in whole["hsdp"]


def test_defaults_fill_only_the_axes_not_given_and_a_compile_mode_means_compiled():
    d = space.default_axes(space.Axes(strategy=("ddp",)), "cpu", 2)
    assert d.strategy == ("ddp",) and d.compile == (False,) and d.precision == ("fp32",)
    assert set(d.activation_checkpointing) == {"none", "selective", "full"}
    assert space.default_axes(space.Axes(), "cpu", 1).strategy == ("single",)
    assert space.default_axes(space.Axes(compile_mode=("max-autotune",)), "cpu", 2).compile == (True,)
    assert space.default_axes(space.Axes(), "cuda", 2).compile == (False, True)


def test_the_compile_option_alone_means_on(tmp_path):
    from dlscale.cli import build_parser
    from dlscale.tune.cli import axes_from_args

    ns = build_parser().parse_args(["tune", "--model", "gpt2", "--compile", "--store", str(tmp_path)])
    assert axes_from_args(ns).compile == (True,)
    ns = build_parser().parse_args(["tune", "--model", "gpt2", "--compile", "on,off"])
    assert axes_from_args(ns).compile == (True, False)


def test_every_candidate_carries_the_label_a_rerun_looks_for():
    from dlscale.cli import build_parser
    from dlscale.tune.cli import plan_candidates

    argv = ["tune", "--model", "gpt2", "--device", "cpu", "--nproc-per-node", "2", "--strategy", "ddp,zero1",
            "--batch-size", "2,8", "--activation-checkpointing", "none"]
    label, cands, ranked, _, _ = plan_candidates(build_parser().parse_args(argv))
    assert {c.cfg.label for c in cands} == {label} and ranked
    assert plan_candidates(build_parser().parse_args(argv + ["--budget", "1h", "--top", "1"]))[0] == label
    assert plan_candidates(build_parser().parse_args(argv + ["--steps", "7"]))[0] != label


# ---------------------------------------------------------------- memory

def test_the_plan_prunes_what_does_not_fit_and_keeps_what_does():
    cands = _cands(space.Axes(strategy=("ddp",), activation_checkpointing=("none",), batch_size=(1, 64)))
    peaks = {c.cfg.batch_size: prune.planned_peak(c) for c in cands}
    assert peaks[64] > peaks[1] > 0
    room = prune.Headroom(memory_bytes=(peaks[1] + peaks[64]) / 2 / 0.9, fraction=0.1)
    prune.prune_memory(cands, room)
    assert {c.cfg.batch_size: c.pruned_by for c in cands} == {1: None, 64: "memory"}


def test_an_oom_the_plan_missed_widens_the_headroom_so_that_case_no_longer_fits():
    room = prune.Headroom(memory_bytes=100.0, fraction=0.1)
    assert room.fits(80.0)
    assert room.after_oom(80.0, "case") is True
    assert not room.fits(80.0) and room.fits(60.0) and room.events
    assert room.after_oom(80.0, "case") is False  # already outside: nothing to widen


def test_a_measured_peak_over_the_plan_scales_later_plans():
    room = prune.Headroom(memory_bytes=100.0, fraction=0.0)
    assert room.after_measured(planned=40.0, measured=50.0, what="case") is True
    assert room.scale == pytest.approx(1.25)
    assert not room.fits(81.0) and room.fits(79.0)
    assert room.after_measured(planned=40.0, measured=45.0, what="case") is False


def test_without_a_requested_batch_only_the_largest_that_fit_are_kept():
    cands = _cands(space.Axes(strategy=("ddp",), activation_checkpointing=("none",)))
    prune.keep_largest_batches(cands, given_batch=False)
    kept = sorted(c.cfg.batch_size for c in _runnable(cands))
    every = sorted(c.cfg.batch_size for c in cands)
    assert kept == every[-prune.KEEP_BATCHES:]


# ---------------------------------------------------------------- ranking

def _machine():
    return rank.TuneMachine("cpu", 2, 1, 8 * 2**30)


def test_ranking_puts_recomputation_below_none_and_the_unmodelled_last():
    cands = _runnable(_cands(space.Axes(strategy=("ddp", "rpc-pipeline"), batch_size=(8,))))
    ranked = rank.rank(cands, _machine())
    assert [r.rank for r in ranked] == list(range(1, len(ranked) + 1))
    pred = {(r.candidate.cfg.strategy, r.candidate.cfg.activation_checkpointing): r.predicted_samples_per_s
            for r in ranked}
    assert pred[("ddp", "full")] < pred[("ddp", "selective")] < pred[("ddp", "none")]
    assert ranked[-1].predicted_samples_per_s is None and ranked[0].candidate.cfg.activation_checkpointing == "none"


def test_accumulation_amortises_the_gradient_exchange_in_the_prediction():
    cands = _runnable(_cands(space.Axes(strategy=("ddp",), activation_checkpointing=("none",), batch_size=(4,),
                                        grad_accum=(1, 4))))
    slow = rank.TuneMachine("cpu", 2, 1, 8 * 2**30, intra_busbw=1e5)  # the exchange dominates
    pred = {c.cfg.grad_accum: rank.predict(c, slow) for c in cands}
    assert pred[4] > pred[1]


# ---------------------------------------------------------------- the search

def _record(cfg: RunConfig, samples: list[float], status: str = "ok", created: str = "2000-01-01T00:00:00") -> dict:
    med = statistics.median(samples) if samples else None
    return {"schema": "dlscale.record/1", "kind": "run", "status": status, "label": cfg.label,
            "case_key": cfg.case_key(), "config": cfg.to_dict(), "device_type": "cpu", "world_size": cfg.world_size,
            "created": created, "id": f"id-{cfg.case_key()}-{len(samples)}", "model": {"unit": "sample"},
            "repeats": [{"repeat": i, "status": "ok", "samples_per_s": x} for i, x in enumerate(samples)],
            "summary": {"samples_per_s": {"n": len(samples), "median": med, "min": min(samples, default=None),
                                          "max": max(samples, default=None)}} if samples else None}


def _search(n: int = 4, top: int = 4, budget: float = 1e9):
    cands = _runnable(_cands(space.Axes(strategy=("ddp", "zero1"), activation_checkpointing=("none",),
                                        batch_size=(2, 8))))[:n]
    ranked = rank.rank(cands, _machine())
    return search.Search(cands[0].cfg.label, ranked, prune.Headroom(2**40), top, budget)


def test_a_rerun_reads_stored_results_back_instead_of_measuring_them():
    s = _search()
    first, rest = s.ranked[0].candidate.cfg, s.ranked[1:]
    stored = [_record(first, [10.0, 11.0]),
              _record(dataclasses.replace(first, label="other"), [99.0, 99.0]),  # another tune's: not read back
              _record(rest[0].candidate.cfg, [5.0], status="interrupted")]  # measured again in full
    measured: list[str] = []

    def measure(cfg):
        measured.append(cfg.case_key())
        return _record(cfg, [1.0, 2.0])

    search.run(s, search.resumable(stored, s.label), measure, lambda line: None)
    assert first.case_key() not in measured
    assert sorted(measured) == sorted(r.candidate.key for r in rest)
    assert [m.resumed for m in s.measured].count(True) == 1
    assert s.valid()[0].median == pytest.approx(10.5)  # the stored record is the best


def test_the_budget_stops_the_search_before_a_case_that_would_not_fit(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(search.time, "monotonic", lambda: clock[0])
    s = _search(budget=10.0)
    limits = []

    def measure(cfg):
        limits.append(cfg.time_limit)
        clock[0] += 6.0
        return _record(cfg, [1.0, 1.0])

    search.run(s, {}, measure, lambda line: None)
    assert len(s.measured) == 1 and s.stopped == "budget"
    assert limits == [search.MIN_CASE_LIMIT_S]  # a hung case gets at most its share of the budget
    big = _search(n=1, budget=1000.0)
    search.run(big, {}, measure, lambda line: None)
    assert limits[-1] == pytest.approx(1000.0 / big.ranked[0].candidate.cfg.repeats)
    assert all("budget" in why for why in s.skipped.values()) and len(s.skipped) == len(s.ranked) - 1


def test_an_interrupt_keeps_what_was_measured():
    s = _search()
    calls = []

    def measure(cfg):
        calls.append(cfg)
        if len(calls) == 2:
            raise KeyboardInterrupt("SIGINT")
        return _record(cfg, [3.0, 4.0])

    search.run(s, {}, measure, lambda line: None)
    assert s.stopped == "interrupted" and isinstance(s.interrupt, KeyboardInterrupt)
    assert len(s.measured) == 1 and s.valid()
    late = _record(calls[1], [9.0, 9.0])  # stored as the signal came: read back, not lost
    search.adopt_stored(s, [late])
    assert len(s.measured) == 2 and s.valid()[0].record is late and calls[1].case_key() not in s.skipped
    s.measured.pop()
    res = result.build(s, [r.candidate for r in s.ranked], [], None)
    assert res.best is not None and res.best["median"] == pytest.approx(3.5)


def test_after_the_top_only_candidates_that_could_still_win_are_measured():
    s = _search(n=2, top=1)
    best, other = s.ranked
    s.measured.append(search.Measurement(best, _record(best.candidate.cfg, [95.0, 100.0, 105.0])))
    best.predicted_samples_per_s = 100.0  # the model exact on the best: ratio 1, spread 10 %
    other.predicted_samples_per_s = 85.0
    assert not s.could_win(other)
    other.predicted_samples_per_s = 95.0
    assert s.could_win(other)
    other.predicted_samples_per_s = None  # the model cannot say: it could
    assert s.could_win(other)


def test_after_the_top_a_candidate_that_cannot_win_is_not_measured():
    s = _search(n=2, top=1)
    first, second = s.ranked
    first.predicted_samples_per_s, second.predicted_samples_per_s = 100.0, 10.0
    calls = []

    def measure(cfg):
        calls.append(cfg.case_key())
        return _record(cfg, [100.0, 100.0])

    search.run(s, {}, measure, lambda line: None)
    assert calls == [first.candidate.key] and "could not win" in s.skipped[second.candidate.key]


def test_an_oom_during_the_search_widens_the_plan_and_prunes_what_no_longer_fits():
    cands = _runnable(_cands(space.Axes(strategy=("ddp",), activation_checkpointing=("none",), batch_size=(2, 8))))
    room = prune.Headroom(2**40)
    prune.prune_memory(cands, room)
    ranked = rank.rank(cands, _machine())
    big, small = ranked  # the larger batch first
    s = search.Search(cands[0].cfg.label, ranked, room, 2, 1e9)
    calls = []

    def measure(cfg):
        calls.append(cfg.batch_size)
        return _record(cfg, [], status="oom") if cfg.batch_size == 8 else _record(cfg, [1.0, 1.0])

    search.run(s, {}, measure, lambda line: None)
    assert calls == [8, 2] and room.events and not room.fits(big.candidate.planned_peak)
    assert room.fits(small.candidate.planned_peak) and [m.ranked for m in s.valid()] == [small]
    # a candidate planned as high as the one that ran out of memory is no longer run
    fresh = space.Candidate(small.candidate.cfg, small.candidate.layout, planned_peak=big.candidate.planned_peak)
    prune.prune_memory([fresh], room)
    assert fresh.pruned_by == "memory"


def test_an_invalid_measurement_cannot_win():
    s = _search(n=2)
    a, b = s.ranked
    fast = _record(a.candidate.cfg, [100.0, 100.0])
    fast["global_batch"] = 999
    s.global_batch = 4 * 2
    s.measured += [search.Measurement(a, fast, global_batch=8),
                   search.Measurement(b, _record(b.candidate.cfg, [10.0, 10.0]), global_batch=None)]
    assert [m.ranked for m in s.valid()] == [b]


def test_rank_correlation_by_hand():
    assert result.spearman([(3, 30), (2, 20), (1, 10)]) == pytest.approx(1.0)
    assert result.spearman([(3, 10), (2, 20), (1, 30)]) == pytest.approx(-1.0)
    assert result.spearman([(3, 20), (2, 30), (1, 10)]) == pytest.approx(0.5)
    assert result.spearman([(1, 1), (2, 2)]) is None
    assert result.spearman([(5, 30), (5, 20), (5, 10)]) is None  # the model does not order them
    assert result.spearman([(2, 30), (2, 20), (1, 10)]) == pytest.approx(3 ** 0.5 / 2)


def test_no_correlation_says_why():
    from types import SimpleNamespace

    def why(predicted, measured):
        rows = [{"valid": True, "predicted": p, "median": m} for p, m in zip(predicted, measured)]
        res = SimpleNamespace(rows=rows)
        return result._correlation(res, {"rank_correlation": result.spearman(list(zip(predicted, measured)))})

    assert why([5, 5, 5], [1, 2, 3]) != why([1, 2], [1, 2]) != why([1, 2, 3], [4, 4, 4])
    assert why([1, 2, 3], [1, 2, 3]) == "1.00"


def test_a_ranking_on_the_assumed_mfu_is_flagged():
    s = _search(n=2)
    a, b = s.ranked
    s.measured += [search.Measurement(a, _record(a.candidate.cfg, [100.0, 101.0])),
                   search.Measurement(b, _record(b.candidate.cfg, [50.0, 51.0]))]
    res = result.build(s, [a.candidate, b.candidate], [], None)
    assert "assumed-mfu" in result.to_dict(res)["rank_basis"]
    assumed = result.to_markdown(res)
    s.ranked = [dataclasses.replace(r, basis="strategy model (measured)") for r in s.ranked]
    measured = result.to_markdown(result.build(s, [a.candidate, b.candidate], [], None))
    assert assumed.count("⚠") == measured.count("⚠") + 1 and "micro layer" in assumed and "micro layer" not in measured
    assert result.average_ranks([5, 7, 5, 1]) == [2.5, 1.0, 2.5, 4.0]


def test_a_runner_up_gets_compares_verdict_and_gap():
    s = _search(n=2)
    a, b = s.ranked
    s.measured += [search.Measurement(a, _record(a.candidate.cfg, [100.0, 101.0, 102.0, 103.0])),
                   search.Measurement(b, _record(b.candidate.cfg, [50.0, 51.0, 52.0, 53.0]))]
    res = result.build(s, [a.candidate, b.candidate], [], None)
    runner = res.rows[1]
    assert res.best["case_key"] == a.candidate.key
    assert runner["verdict"] == "slower" and runner["gap_pct"] == pytest.approx((51.5 / 101.5 - 1) * 100)
    assert "--label" not in res.best["command"] and "tune" not in res.best["command"].split()[1:]
    data = json.loads(result.to_json(res))
    assert data["best"]["case_key"] == a.candidate.key and len(data["measured"]) == 2
    assert result.to_markdown(res).count(res.best["command"]) == 1


def test_target_shapes_predict_data_parallel_finalists_with_a_band_and_say_why_for_others():
    from dlscale.perfmodel.core import parse_shapes

    s = _search(n=4)
    by = {r.candidate.cfg.strategy: r for r in s.ranked}
    targets = result.Targets(parse_shapes("8x8"), 100.0, 50.0, price_per_gpu_hour=2.0)
    zero1 = search.Measurement(by["zero1"], _record(by["zero1"].candidate.cfg, [5.0, 6.0]))
    assert result.predict_targets(zero1, [], targets)["note"].startswith("no prediction")
    rec = _record(by["ddp"].candidate.cfg, [5.0, 6.0])
    ddp = search.Measurement(by["ddp"], rec)
    assert result.predict_targets(ddp, [rec], targets)["note"]  # no parameter count: no gradient bytes
    rec["model"]["params"] = 100_000
    out = result.predict_targets(ddp, [rec], targets)
    row = next(x for x in out["rows"] if x["shape"] == "8x8")
    assert out["note"] is None and row["basis"]
    assert row["samples_per_s_low"] <= row["samples_per_s"] <= row["samples_per_s_high"]
    assert row["samples_per_s"] <= 64 * 5.5 / 2  # never above ideal scaling of the measured node
    assert row["cost_per_million_samples"] == pytest.approx(1e6 * 64 * 2.0 / (row["samples_per_s"] * 3600))
    s.measured = [ddp, zero1]
    res = result.build(s, [r.candidate for r in s.ranked], [rec], targets)
    assert [t["case"] for t in res.targets] == [ddp.ranked.candidate.describe(), zero1.ranked.candidate.describe()]
    text = result.to_markdown(res)
    assert "| 8x8 |" in text and text.count("no prediction") == 1


def test_the_html_report_has_a_table_per_tune_fastest_first():
    from dlscale.tune.report import html_section, tune_rows

    s = _search(n=2)
    a, b = (r.candidate.cfg for r in s.ranked)
    recs = [_record(b, [10.0, 11.0]), _record(a, [20.0, 21.0]), _record(dataclasses.replace(a, label=None), [5.0])]
    rows = tune_rows(recs[:2])
    assert [r["best"] for r in rows] == [True, False] and rows[0]["median"] == pytest.approx(20.5)
    assert rows[1]["gap_pct"] == pytest.approx((10.5 / 20.5 - 1) * 100)
    html = "".join(html_section(recs))
    assert html.count("<table ") == 1 and s.label in html  # the unlabelled record is no tune's
    assert html_section([recs[2]]) == []


# ---------------------------------------------------------------- the command line: bad input

def test_durations():
    assert duration("20m") == 1200 and duration("90s") == 90 and duration("1h30m") == 5400 and duration("45") == 45
    for bad in ("0", "0m", "abc", "", "5x"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


@pytest.mark.parametrize("model,extra", [
    ("gpt2", ["--budget", "0"]), ("gpt2", ["--strategy", "nosuch"]), ("gpt2", ["--global-batch", "7"]),
    ("gpt2", ["--repeats", "1"]), ("wide-deep", ["--activation-checkpointing", "full"]),
    ("gpt2", ["--compile", "sometimes"]), ("gpt2", ["--target-shapes", "0x8"]), ("gpt2", ["--inter-busbw", "50"]),
    ("gpt2", ["--strategy", "single"]), ("nosuch", [])])
def test_bad_input_is_one_line_and_exit_2_before_anything_is_written(model, extra, tmp_path, capsys):
    store = tmp_path / "store"
    argv = ["tune", "--model", model, "--device", "cpu", "--nproc-per-node", "2", "--strategy", "ddp,zero1",
            "--batch-size", "2,8", "--store", str(store)]
    if "--activation-checkpointing" not in extra:
        argv += ["--activation-checkpointing", "none"]
    try:
        code = main(argv + extra)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert not store.exists()


def test_dry_run_lists_candidates_and_measures_nothing(tmp_path, capsys):
    code = main(["tune", "--model", "gpt2", "--device", "cpu", "--nproc-per-node", "2", "--strategy", "ddp,pipeline",
                 "--activation-checkpointing", "none", "--batch-size", "2,8", "--store", str(tmp_path / "s"),
                 "--dry-run"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and not (tmp_path / "s").exists()
    ranked = [line.split()[1:3] for line in out if line.split()[0].isdigit()]
    # ddp at both batches; the pipeline's 4 micro-batches divide 8 only
    assert sorted(ranked) == [["ddp", "b2"], ["ddp", "b8"], ["pipeline", "microbatches=4,schedule=1f1b"]]


# ---------------------------------------------------------------- one real tune

def _tune_records(store: Path) -> list[dict]:
    from dlscale.results.store import ResultStore

    return [r for r in ResultStore(store).load().records if str(r.get("label", "")).startswith(space.LABEL_PREFIX)]


@pytest.mark.slow  # trains tiny GPT-2 candidates in this process: seconds
def test_a_tune_finds_the_faster_by_measurement_and_resumes_after_an_interrupt(tmp_path, single_in_process,
                                                                               monkeypatch):
    from dlscale.case import launch
    from tests.helpers_cli import dlscale

    store = tmp_path / "store"
    args = ["tune", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--nproc-per-node", "1",
            "--batch-size", "2,8", "--activation-checkpointing", "none",
            "--warmup", "1", "--steps", "3", "--no-monitor", "--top", "2", "--store", str(store), "--format", "json"]
    # two one-process candidates (single at two batches), trained in this process (conftest.py): the
    # search over strategies, its ranking and resuming from the store are pure tests above; this one
    # measures, is interrupted and resumes for real. The interrupt (a KeyboardInterrupt, as a signal to
    # dlscale becomes one: the real signal is tests/test_faults_procs.py's) arrives where the second
    # candidate would start, once the first is stored: the tune keeps it and prints the best so far
    with single_in_process():
        first_key: list = []
        real_start = launch.TorchrunSpawner.start

        def start(self, cfg, workdir, env):
            first_key[:] = first_key or [cfg.case_key()]
            if cfg.case_key() != first_key[0]:
                raise KeyboardInterrupt("SIGINT")
            return real_start(self, cfg, workdir, env)

        with monkeypatch.context() as mp:
            mp.setattr(launch.TorchrunSpawner, "start", start)
            stopped = dlscale(*args)
    out, err = stopped.stdout, stopped.stderr
    assert stopped.returncode == 130, err[-2000:]
    before = [r for r in _tune_records(store) if r["status"] == "ok"]
    assert before and json.loads(out)["best"]["record"] in {r["id"] for r in before}

    # the resumed tune, in this process, trains its candidates here too (conftest.py): the same records
    with single_in_process():
        done = dlscale(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads(done.stdout)
    ok = [r for r in _tune_records(store) if r["status"] == "ok"]
    keys = [r["case_key"] for r in ok]
    seen = [(r["case_key"], r["config"]["strategy"], r["config"]["batch_size"], r["created"], r["label"])
            for r in _tune_records(store)]
    assert len(set(keys)) == len(keys) == len(res["measured"]) == 2, (seen, err[-3000:], done.stderr[-3000:])
    assert {r["case_key"] for r in before} <= {m["case_key"] for m in res["measured"] if m["resumed"]}
    medians = {m["case_key"]: m["median"] for m in res["measured"]}
    # the best is the measured fastest (which batch wins is the machine's)
    assert res["best"]["median"] == max(medians.values())

    again = dlscale(*args)  # everything is in the store now: nothing is measured
    assert again.returncode == 0
    assert all(m["resumed"] for m in json.loads(again.stdout)["measured"])
    assert len([r for r in _tune_records(store) if r["status"] == "ok"]) == len(keys)


def test_newest_per_key_keeps_the_newest_record_of_each_key():
    from dlscale.results.record import newest_per_key

    recs = [{"id": "a", "created": "2", "k": ["x"]}, {"id": "b", "created": "1", "k": ["x", "y"]},
            {"id": "c", "created": "2", "k": ["x"]}, {"id": "d", "created": "9", "k": [None, ""]}]
    got = {k: r["id"] for k, r in newest_per_key(recs, lambda r: r["k"]).items()}
    assert got == {"x": "c", "y": "b"}  # of two as new the later; a record may count for two keys
