"""`dlscale compare` and its statistics (bootstrap CI of the ratio of medians, exact Mann-Whitney)."""
from __future__ import annotations

import importlib.util
import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dlscale.cli import main
from dlscale.report.stats import _midranks, bootstrap_median_ci, bootstrap_ratio_ci, mann_whitney, min_two_sided_p

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)

A_BERT = [100, 102, 98, 101, 99]
B_BERT = [80, 81.6, 78.4, 80.8, 79.2]  # exactly 20 % slower, same relative noise
A_RN = [500, 510, 490, 505, 495]
B_RN = [505, 495, 500, 510, 490]  # the same values, another order


def side(prefix: str, bert: list[float], rn: list[float], label: str | None = None) -> list[dict]:
    return [
        F.run_record(f"{prefix}1", "bert-base", "amp-bf16", 128, "ddp", 1, 2, bert, label=label),
        F.run_record(f"{prefix}2", "resnet50", "fp32", 64, "ddp", 1, 2, rn, unit="img", label=label),
    ]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def stores(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    F.write_store(a, side("a", A_BERT, A_RN))
    F.write_store(b, side("b", B_BERT, B_RN))
    return a, b


def verdicts(doc: dict) -> dict[str, dict]:
    return {c["model"]: c for c in doc["cases"]}


def test_known_regression_and_known_no_change(stores, capsys):
    a, b = stores
    rc, out, err = cli(capsys, "compare", str(a), str(b), "--format", "json")
    assert rc == 0, err
    v = verdicts(json.loads(out))
    bert, rn = v["bert-base"], v["resnet50"]
    assert bert["verdict"] == "slower"
    assert bert["median_a"] == 100 and bert["median_b"] == 80 and bert["ratio"] == pytest.approx(0.8)
    assert bert["ci_high"] < 1 and bert["ci_low"] < 0.8 < bert["ci_high"]
    assert bert["p_value"] == pytest.approx(2 / 252)  # complete separation, 5 vs 5, exact
    assert rn["verdict"] == "no change (within noise)" and rn["ratio"] == pytest.approx(1.0)
    assert rn["ci_low"] < 1 < rn["ci_high"] and rn["p_value"] == pytest.approx(1.0)
    rc, out, _ = cli(capsys, "compare", str(a), str(b))
    assert "| slower |" in out and "| no change (within noise) |" in out and "0.800" in out
    assert "-20.0" in out and "1 no change (within noise), 1 slower" in out


def test_faster_is_the_mirror(stores, capsys):
    a, b = stores
    rc, out, _ = cli(capsys, "compare", str(b), str(a), "--format", "json")
    assert verdicts(json.loads(out))["bert-base"]["verdict"] == "faster"


def test_fail_on_regression(stores, capsys):
    a, b = stores
    rc, _, err = cli(capsys, "compare", str(a), str(b), "--fail-on-regression", "10")
    assert rc == 1 and "regression" in err and "bert-base" in err
    assert cli(capsys, "compare", str(a), str(b), "--fail-on-regression", "25")[0] == 0
    assert cli(capsys, "compare", str(b), str(a), "--fail-on-regression", "0")[0] == 0  # faster is fine


def test_min_change_turns_small_significant_changes_into_no_change(tmp_path, capsys):
    F.write_store(tmp_path / "a", side("a", A_BERT, A_RN))
    F.write_store(tmp_path / "b", side("b", [x * 0.97 for x in A_BERT], A_RN))
    doc = json.loads(cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")[1])
    assert verdicts(doc)["bert-base"]["verdict"] == "slower"
    doc = json.loads(cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json",
                         "--min-change", "5")[1])
    assert verdicts(doc)["bert-base"]["verdict"] == "no change (within noise)"


def test_one_store_two_labels(tmp_path, capsys):
    F.write_store(tmp_path / "s", side("a", A_BERT, A_RN, label="before") + side("b", B_BERT, B_RN, label="after"))
    rc, out, _ = cli(capsys, "compare", str(tmp_path / "s"), "--label-a", "before", "--label-b", "after",
                     "--format", "json")
    assert rc == 0
    v = verdicts(json.loads(out))
    assert v["bert-base"]["verdict"] == "slower" and v["resnet50"]["verdict"] == "no change (within noise)"
    rc, _, err = cli(capsys, "compare", str(tmp_path / "s"))
    assert rc == 2 and "--label-a" in err and err.count("\n") == 1
    rc, _, err = cli(capsys, "compare", str(tmp_path / "s"), "--label-a", "before", "--label-b", "nope")
    assert rc == 2 and "side B" in err
    # the one line names what side B asked for
    rc, _, err = cli(capsys, "compare", str(tmp_path / "s"), "--label-a", "before", "--label-b", "after",
                     "--filter-b", "model=gpt2,t5")
    assert rc == 2 and err.count("\n") == 1
    assert all(w in err for w in ("side B", str(tmp_path / "s"), "'after'", "--filter-b model=gpt2,t5"))


def test_too_few_repeats_unmatched_and_non_ok(tmp_path, capsys):
    F.write_store(tmp_path / "a", [
        F.run_record("a1", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [100, 101, 99]),
        F.run_record("a2", "gpt2", "amp-bf16", 8, "ddp", 1, 4, [200, 201, 199, 200, 202]),
        F.run_record("a3", "gpt2", "amp-bf16", 8, "ddp", 1, 8, [400, 401, 399, 400, 402]),
    ])
    F.write_store(tmp_path / "b", [
        F.run_record("b1", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [70, 71, 69]),
        F.run_record("b2", "gpt2", "amp-bf16", 8, "ddp", 1, 4, None, status="oom", error="CUDA out of memory"),
        F.run_record("b4", "gpt2", "amp-bf16", 8, "ddp", 2, 8, [800, 801, 799]),
    ])
    rc, out, err = cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json",
                       "--fail-on-regression", "5")
    assert rc == 0  # an inconclusive slowdown is not a significant one
    by = {c["devices"]: c for c in json.loads(out)["cases"]}
    assert by[2]["verdict"] == "inconclusive (too few repeats)" and by[2]["ratio"] == pytest.approx(0.7)
    assert by[4]["verdict"] == "n/a (ok → oom)"
    assert by[8]["verdict"] == "only in A" and by[16]["verdict"] == "only in B"


def test_compare_csv(stores, capsys):
    a, b = stores
    rc, out, _ = cli(capsys, "compare", str(a), str(b), "--format", "csv")
    lines = out.strip().splitlines()
    assert rc == 0 and len(lines) == 3 and lines[0].startswith("case,") and "verdict" in lines[0]


def test_bootstrap_is_deterministic_and_brackets_the_ratio():
    a, b = A_BERT, B_BERT
    assert bootstrap_ratio_ci(a, b, seed=0) == bootstrap_ratio_ci(a, b, seed=0)
    lo, hi = bootstrap_ratio_ci(a, b, resamples=2000, confidence=0.95, seed=0)
    assert 0.75 < lo < 0.8 < hi < 0.85


def test_bootstrap_of_a_median_brackets_it_and_collapses_on_equal_values():
    ratios = [0.95, 0.97, 0.99, 1.0, 1.01, 0.96, 0.98, 0.97, 1.02, 0.94]  # median 0.975
    assert bootstrap_median_ci(ratios, seed=0) == bootstrap_median_ci(ratios, seed=0)
    lo, hi = bootstrap_median_ci(ratios, resamples=2000, confidence=0.95, seed=0)
    assert 0.94 <= lo < 0.975 < hi <= 1.02
    assert bootstrap_median_ci([0.98] * 5) == (0.98, 0.98)
    with pytest.raises(ValueError):
        bootstrap_median_ci([])


def test_mann_whitney_exact_matches_brute_force_with_ties():
    rng = np.random.default_rng(7)
    for _ in range(40):
        na, nb = (int(x) for x in rng.integers(1, 7, 2))
        x = rng.integers(0, 4, na).astype(float)
        y = rng.integers(0, 4, nb).astype(float)
        _, p, method = mann_whitney(x, y)
        assert method == "exact"
        z = np.concatenate([x, y])
        r = _midranks(z)
        centre = na * (len(z) + 1) / 2
        obs = abs(r[:na].sum() - centre)
        combos = list(itertools.combinations(range(len(z)), na))
        brute = sum(abs(r[list(c)].sum() - centre) >= obs - 1e-9 for c in combos) / len(combos)
        assert p == pytest.approx(brute, abs=1e-12)


def test_mann_whitney_normal_approximation_for_large_samples():
    rng = np.random.default_rng(0)
    a = rng.normal(100, 1, 40)
    _, p_same, method = mann_whitney(a, rng.normal(100, 1, 40))
    _, p_shift, _ = mann_whitney(a, rng.normal(97, 1, 40))
    assert method == "normal" and p_same > 0.01 and p_shift < 1e-6
    assert min_two_sided_p(5, 5) == pytest.approx(2 / 252) and min_two_sided_p(3, 3) == pytest.approx(0.1)


def _interrupted(rid: str, nproc: int, samples: list[float], asked: int = 3, created: str = "2024-05-03T10:00:00+00:00"):
    rec = F.run_record(rid, "gpt2", "amp-bf16", 8, "ddp", 1, nproc, samples, created=created)
    rec["status"], rec["config"]["repeats"] = "interrupted", asked
    rec["error"] = f"interrupted by SIGTERM during repeat {len(samples) + 1}/{asked}"
    return rec


def test_an_interrupted_case_is_compared_on_its_finished_repeats_and_flagged(tmp_path, capsys):
    """An interrupted record's finished repeats are a measurement: compare pairs them (no "n/a") and
    lists the interruption; where the case has an ok record, the ok one is used, even if older."""
    F.write_store(tmp_path / "a", [
        F.run_record("a1", "gpt2", "amp-bf16", 8, "ddp", 1, 2, [100, 101, 99]),
        F.run_record("a2", "gpt2", "amp-bf16", 8, "ddp", 1, 4, [200, 201, 199]),
    ])
    F.write_store(tmp_path / "b", [
        _interrupted("b1", 2, [80, 81]),
        F.run_record("b2", "gpt2", "amp-bf16", 8, "ddp", 1, 4, [150, 151, 149]),
        _interrupted("b3", 4, [300]),  # newer than b2, but b2 is ok
    ])
    rc, out, err = cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--format", "json")
    assert rc == 0, err
    by = {c["devices"]: c for c in json.loads(out)["cases"]}
    assert by[2]["status_b"] == "interrupted" and by[2]["ratio"] == pytest.approx(80.5 / 100)
    assert by[2]["verdict"] == "inconclusive (too few repeats)"
    assert by[2]["flags"].startswith("interrupted: B: ")  # the flag by its check, on side B
    assert by[4]["status_b"] == "ok" and by[4]["ratio"] == pytest.approx(1.5 / 2) and not by[4]["flags"]
    rc, out, err = cli(capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"))
    (note,) = [ln for ln in out.splitlines() if "? interrupted: B: " in ln]  # the flag's note, side B
    assert {"2", "3"} <= set(re.findall(r"\d+", note.split("B: ", 1)[1])), note  # 2 of the 3 repeats finished


def test_the_report_shows_an_interrupted_cases_numbers_with_its_flag(tmp_path, capsys):
    """A table row of an interrupted case carries its finished repeats' median and the note flag; a
    failed newer record does not hide it, and one with no finished repeat is still INTERRUPTED."""
    failed = F.run_record("f", "gpt2", "amp-bf16", 8, "ddp", 1, 2, None, status="failed", error="boom",
                          created="2024-05-04T10:00:00+00:00")
    nothing = _interrupted("n", 8, [90])
    nothing["repeats"], nothing["summary"] = [], None
    struck = _interrupted("i", 2, [80.0, 82.0])
    F.write_store(tmp_path / "s", [struck, failed, nothing])
    rc, out, err = cli(capsys, "report", str(tmp_path / "s"))
    assert rc == 0, err
    row2 = next(ln for ln in out.splitlines() if ln.startswith("| 1 | 2 |"))
    assert "81.00" in row2 and "? few_repeats, interrupted" in row2, row2
    (note,) = [ln for ln in out.splitlines() if "1n2g ? interrupted: " in ln]  # the flag's note for its row
    assert {"2", "3"} <= set(re.findall(r"\d+", note.split("interrupted: ", 1)[1])), note
    assert f"1n2g interrupted: {struck['error']}" in out  # the record's own error beside its case
    assert "| 1 | 8 | INTERRUPTED |" in out
