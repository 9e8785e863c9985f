"""The loss checks of validity.assess on hand-made records: a non-finite loss (warn) and a loss that
rose far after the window (note); records without losses pass; the other checks are unaffected."""
from __future__ import annotations

import json
import math

import pytest
from test_validity import record

from dlscale.results import validity
from dlscale.results.store import ResultStore


def losses(rec: dict, after, first: float | None = None, last=None, warm=None) -> dict:
    """Set every ok repeat's loss_after (one value, or one per repeat), first warm-up loss, loss_last;
    ``record()`` is test_validity's sound record: 5 repeats, warm-up losses 6.2, 6.1, loss_after 5.9."""
    afters = after if isinstance(after, (list, tuple)) else [after] * len(rec["repeats"])
    for r, a in zip(rec["repeats"], afters):
        r["loss_after"] = a
        if first is not None:
            r["warmup_losses"] = [first, first]
        if warm is not None:
            r["warmup_losses"] = list(warm)
        if last is not None:
            r["loss_last"] = last
    return rec


def checks(rec: dict, t: validity.Thresholds = validity.THRESHOLDS) -> dict[str, validity.Flag]:
    return {f.check: f for f in validity.assess(rec, t).flags}


def test_diverged_loss_is_a_note_with_the_medians():
    # first warm-up loss 6.2; loss_after 70 (11.3 x) in every repeat, training loss as high
    f = checks(losses(record(), 70.0, last=68.0))
    assert set(f) == {"loss_diverged"}
    d = f["loss_diverged"]
    assert d.severity == validity.NOTE and d.value == pytest.approx(70 / 6.2) and d.limit == 10
    # the reason names the losses it compared: the first warm-up step's, after the window, the last step's
    assert all(v in d.reason for v in ("6.2", "70", "68")) and "\n" not in d.reason, d.reason
    assert validity.assess(losses(record(), 70.0)).sound  # a note: the throughput stands


def test_median_of_repeats_and_the_factor():
    # one repeat at 990 does not move the median (45.9): 45.9 / 6.2 = 7.4 x, within 10 x
    assert "loss_diverged" not in checks(losses(record(), [990.8, 45.9, 102.2, 40.0, 30.0]))
    # medians: loss_after 102.2 over first 7.16 (the s21 synthetic ResNet-50): 14.3 x
    assert "loss_diverged" in checks(losses(record(samples=(100.0, 101.0, 99.0)), [990.8, 102.2, 45.9], 7.16))
    assert "loss_diverged" not in checks(losses(record(), 60.0))  # 9.7 x
    assert "loss_diverged" in checks(losses(record(), 60.0), validity.Thresholds(loss_diverged_factor=5))
    assert validity.assess(record()).thresholds["loss_diverged_factor"] == 10


def test_an_eval_mode_rise_with_a_low_training_loss_is_not_flagged():
    # the s21 synthetic ResNet-50 runs: training loss 5.1 (0.084 at two GPUs) on their one batch, loss_after
    # (eval mode) 102 (65.8): only the eval-mode reading rose
    assert "loss_diverged" not in checks(losses(record(), 65.8, first=5.0, last=0.0835))
    assert "loss_diverged" not in checks(losses(record(), 102.2, first=7.16, last=5.1))
    assert "loss_diverged" in checks(losses(record(), 102.2, first=7.16, last=80.0))


def test_diverged_needs_finite_positive_losses():
    assert "loss_diverged" not in checks(losses(record(), 70.0, first=0.0))
    assert "loss_diverged" not in checks(losses(record(), 70.0, first=-1.0))
    assert "loss_diverged" not in checks(losses(record(), 0.0))


def test_nan_loss_after_is_a_warning_naming_the_repeat():
    rec = losses(record(), [5.9, math.nan, 5.9, 5.9, 5.9])
    v = validity.assess(rec)
    assert not v.sound and set(checks(rec)) == {"loss_nonfinite"}
    f = checks(rec)["loss_nonfinite"]
    assert f.severity == validity.WARN
    assert f.reason.startswith("repeat 2: loss after the window is nan: the model diverged")
    assert "loss scaler" not in f.reason  # fp32: no scaler
    # the flag survives the record's JSON round trip
    assert validity.Validity.from_dict(json.loads(json.dumps(v.to_dict()))).flags == v.flags


def test_infinite_warmup_loss_with_amp_fp16_mentions_skipped_steps():
    rec = losses(record(), 5.9, warm=[6.2, math.inf, math.nan])
    rec["config"]["precision"] = "amp-fp16"
    f = checks(rec)["loss_nonfinite"]
    # the repeat, the step and its value named, and the others counted; amp-fp16's scaler named
    assert all(v in f.reason for v in ("repeat 1", "step 2", "inf", "9")) and "scal" in f.reason, f.reason


def test_a_stored_nan_reads_as_null_and_is_still_flagged(tmp_path):
    # the workers and the store record a non-finite loss as null: null beside numbers is one
    rec = losses(record(), [5.9, math.nan, 5.9, 5.9, 5.9], warm=[6.2, 6.1])
    rec["repeats"][2]["warmup_losses"] = [6.2, math.inf]
    ResultStore(tmp_path).append(rec)
    (stored,) = ResultStore(tmp_path).load().records
    assert stored["repeats"][1]["loss_after"] is None
    f = checks(stored)["loss_nonfinite"]
    assert f.reason.startswith("repeat 2: loss after the window is not finite (recorded as null")
    assert "(and 1 more)" in f.reason


@pytest.mark.parametrize("make", [
    lambda r: [x.pop(k) for x in r["repeats"] for k in ("warmup_losses", "loss_after")],  # older / imported
    lambda r: losses(r, None, warm=[]),  # external runs: no losses
    lambda r: losses(r, None, warm=[None, None]),  # a strategy that reports no loss
], ids=["no-fields", "external", "no-loss-reported"])
def test_records_without_losses_are_not_flagged(make):
    rec = record()
    make(rec)
    v = validity.assess(rec)
    assert v.flags == [] and "loss_nonfinite" not in v.unchecked and "loss_diverged" not in v.unchecked


@pytest.mark.parametrize("counted, flagged", [(3, True), (0, False), (None, False)])
def test_every_loss_null_is_flagged_where_the_worker_counted_non_finite_ones(counted, flagged):
    # a model that is NaN from its first step: every loss null, as a strategy without losses reads;
    # the worker's count (nonfinite_losses) tells them apart
    rec = losses(record(), None, warm=[None, None], last=None)
    for r in rec["repeats"]:
        if counted is not None:
            r["nonfinite_losses"] = counted
    found = checks(rec)
    assert ("loss_nonfinite" in found) == flagged
    if flagged:
        assert found["loss_nonfinite"].reason.startswith(
            "repeat 1: 3 of the losses the worker read were not finite (recorded as null) (and 4 more): the model")


def test_other_checks_are_unaffected():
    assert validity.assess(record()).flags == []
    stalled = losses(record(step_ms=[100.0] * 10 + [400.0] + [100.0] * 9), 70.0)
    assert set(checks(stalled)) == {"stall", "loss_diverged"}
    assert set(checks(losses(record(window_s=0.3), math.nan))) == {"short_window", "loss_nonfinite"}


def test_steps_the_loss_scaler_skipped_in_the_window_are_a_warning():
    rec = record()
    rec["config"]["steps"] = 30
    for r in rec["repeats"]:
        r["loss_scale"], r["skipped_steps"] = [65536.0, 65536.0], 0
    assert "skipped_steps" not in checks(rec)
    rec["repeats"][1].update(loss_scale=[65536.0, 16384.0], skipped_steps=2)
    f = checks(rec)["skipped_steps"]
    assert f.severity == validity.WARN and f.value == 2
    assert f.reason.startswith("the loss scaler skipped the optimizer update of 2 of 30 timed step(s) "
                               "(scale 65536 -> 16384; 1 repeat(s))")


def test_skipped_steps_not_countable_is_a_note():
    """A repeat with a loss scale but no count (the window crossed the growth interval and the readings
    disagree with no skip): a note, not the warning, which needs a count."""
    rec = record()
    for r in rec["repeats"]:
        r["loss_scale"], r["skipped_steps"] = [65536.0, 65536.0], 0
    rec["repeats"][0]["skipped_steps"] = None
    f = checks(rec)["skipped_steps"]
    assert f.severity == validity.NOTE and f.reason, f.reason

    for r in rec["repeats"]:
        r.pop("loss_scale")
        r["skipped_steps"] = None
    assert "skipped_steps" not in checks(rec)    # no scaler: nothing to count


def test_skipped_steps_are_the_halvings_of_the_scale():
    from dlscale.results.metrics import ScaleReading as R
    from dlscale.results.metrics import skipped_steps

    assert skipped_steps(R(65536.0), R(65536.0)) == 0
    assert skipped_steps(R(65536.0), R(8192.0)) == 3
    assert skipped_steps(None, R(1.0)) is None and skipped_steps(R(1.0), None) is None
    # trackers: 15 good steps before a 40-step window; 15 + 40 < 2,000, so no growth fits: halvings are skips
    assert skipped_steps(R(65536.0, 15), R(32768.0, 12), 40) == 1


def test_skipped_steps_when_the_scale_can_grow_inside_the_window():
    """Tracker 1,990 before a 40-step window: with no skip the scale doubles at the window's 10th step and the
    tracker ends at 30. A skip after the growth brings the scale back where it was (halvings 0) and the tracker
    elsewhere: the readings cannot count the skips (None), where the scale alone said 0."""
    from dlscale.results.metrics import ScaleReading as R
    from dlscale.results.metrics import skipped_steps

    assert skipped_steps(R(65536.0, 1990), R(131072.0, 30), 40) == 0          # grew once, nothing skipped
    assert skipped_steps(R(65536.0, 1990), R(65536.0, 5), 40) is None         # grew, then one skip 5 steps before the end
    assert skipped_steps(R(65536.0, 1990), R(65536.0, 5)) == 0                # without the window's length: the old rule
    assert skipped_steps(R(65536.0, 0, 20), R(262144.0, 0), 40) == 0          # interval 20: two growths, none skipped


@pytest.mark.slow
def test_a_model_nan_from_its_first_step_is_flagged_end_to_end(tmp_path, monkeypatch):
    """Every loss of the run is NaN (here: cross-entropy made NaN), so every loss in the record is
    null, as a strategy without losses reads; the worker's count makes the run a loss_nonfinite
    warning all the same."""
    import torch.nn.functional as F
    from conftest import one_process_here

    from dlscale import cli

    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: real(*a, **k) * float("nan"))
    store = tmp_path / "st"
    with one_process_here():
        assert cli.main(["run", "--model", "gpt2", "--flavor", "tiny", "--precision", "fp32", "--strategy", "single",
                         "--warmup", "2", "--steps", "3", "--device", "cpu", "--batch-size", "2", "--repeats", "1",
                         "--store", str(store)]) == 0
    (rec,) = ResultStore(store).load().records
    (rep,) = rec["repeats"]
    assert rep["warmup_losses"] == [None, None] and rep["loss_last"] is None and rep["loss_after"] is None
    assert rep["nonfinite_losses"] == 4  # two warm-up steps, the window's last step, the loss after it
    assert [f["check"] for f in rec["validity"]["flags"] if f["check"] == "loss_nonfinite"] == ["loss_nonfinite"]
