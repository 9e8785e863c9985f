"""Bad values are refused before anything starts: one `dlscale: error:` line, exit 2, nothing written.

Every test runs in-process; launching is replaced by a sentinel, so a value that is wrongly
accepted fails the test instead of starting a training run.
"""
from pathlib import Path

import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.case.config import MAX_BATCH, MAX_SECONDS, MAX_SEED, check_cpu_processes

BASE = ["--device", "cpu", "--model", "gpt2", "--flavor", "tiny", "--precision", "fp32", "--repeats", "1"]
CASE = "{model: gpt2, flavor: tiny, batch_size: 4, precision: fp32}"


class Started(Exception):
    """Raised where a case would start measuring: validation let it through."""


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    from dlscale.case import batchsearch, launch
    from dlscale.results import envinfo

    def started(*a, **k):
        raise Started()

    monkeypatch.setattr(launch, "measure", started)
    monkeypatch.setattr(batchsearch, "measure_max_batch", started)
    monkeypatch.setattr(envinfo, "affinity_count", lambda: 2)  # the CPU limit must not depend on the host


def run(*argv):
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code


def refused(capsys, code, *fragments):
    """Exit 2 with exactly one stderr line, `dlscale: error: ...`, holding every fragment."""
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("dlscale: error:"), err
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def write(tmp_path, body, name="s.yaml"):
    p = tmp_path / name
    p.write_text(body)
    return p


# ----------------------------------------------------------------------------- dlscale run

@pytest.mark.parametrize("argv, fragments", [
    (["--time-limit", "inf"], ["time-limit", "finite"]),
    (["--time-limit", "nan"], ["time-limit", "finite"]),
    (["--time-limit", "1e300"], ["time-limit", "<= 604800", "a week"]),
    (["--collective-timeout", "inf"], ["collective-timeout", "finite"]),
    (["--collective-timeout", "1e300"], ["collective-timeout", "<= 604800"]),
    (["--sample-interval", "nan"], ["sample-interval", "finite"]),
    (["--clip-grad-norm", "inf"], ["clip-grad-norm", "finite"]),
    (["--seed", str(MAX_SEED + 1)], ["seed", "<= 4294967295", "got 4294967296"]),
    (["--seed", "-1"], ["seed", ">= 0"]),
    (["--batch-size", str(MAX_BATCH + 1)], ["batch-size", "<= 1048576", "per device"]),
    (["--batch-size", "10000000000000"], ["batch-size", "<= 1048576"]),
    (["--warmup", "10000001"], ["warmup", "<= 10000000"]),
    (["--nproc-per-node", "9"], ["nproc-per-node 9", "2 core(s): at most 8"]),
    (["--nproc-per-node", "4096"], ["nproc-per-node 4096", "at most 8"]),
    (["--inject-failure", "crash@5:1"], ["inject-failure rank 1", "world size 1"]),
    (["--inject-failure", "crash@120"], ["inject-failure step 120", "never reached"]),
    (["--max-batch-cap", "64"], ["max-batch-cap needs --batch-size max"]),
    (["--max-batch-start", "8"], ["max-batch-start needs --batch-size max"]),
])
def test_run_refuses_absurd_values(tmp_path, capsys, argv, fragments):
    store = tmp_path / "st"
    refused(capsys, run("run", *BASE, "--store", str(store), *argv), *fragments)
    assert not store.exists()


@pytest.mark.parametrize("value", ["", "  "])
def test_run_refuses_an_empty_store(tmp_path, capsys, monkeypatch, value):
    """An empty --store would be the current directory: nothing may land there."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, run("run", *BASE, "--store", value), "--store", "result store directory")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [
    ["--seed", str(MAX_SEED)],
    ["--batch-size", str(MAX_BATCH)],
    ["--time-limit", str(MAX_SECONDS)],
    ["--nproc-per-node", "8"],  # 4 per core on the 2 cores the fixture gives
    ["--inject-failure", "crash@119"],  # warm-up 20 + steps 100: the last step
])
def test_run_accepts_the_boundary_values(tmp_path, argv):
    with pytest.raises(Started):
        run("run", *BASE, "--store", str(tmp_path / "st"), *argv)


def test_cpu_process_limit_follows_the_cores():
    check_cpu_processes(64, cores=16)
    with pytest.raises(ConfigError) as e:  # the option, the value and the bound
        check_cpu_processes(65, cores=16)
    assert all(w in str(e.value) for w in ("nproc-per-node", "65", "64")), e.value


# ----------------------------------------------------------------------------- suites and sweep

@pytest.mark.parametrize("body, fragments", [
    (f"device: cpu\nseed: 1\nseed: 2\ncases: [{CASE}]\n", ["duplicate key 'seed'", "line 3", "first at line 2"]),
    ("device: cpu\nmatrix:\n  models: [gpt2]\n  batch_sizes: [4]\n  batch_sizes: [8]\n",
     ["duplicate key 'batch_sizes'", "line 5", "first at line 4"]),
    ("device: cpu\ncases:\n  - {model: gpt2, batch_size: 4, batch_size: 8}\n", ["duplicate key 'batch_size'"]),
    (f"device: cpu\nseed: {MAX_SEED + 1}\ncases: [{CASE}]\n", ["key 'seed'", "<= 4294967295", "got 4294967296"]),
    (f"device: cpu\nseed: -1\ncases: [{CASE}]\n", ["key 'seed'", "got -1"]),
    (f"device: cpu\ntime_limit: .inf\ncases: [{CASE}]\n", ["key 'time_limit'", "<= 604800", "got inf"]),
    (f"device: cpu\ncollective_timeout: .nan\ncases: [{CASE}]\n", ["key 'collective_timeout'", "got nan"]),
    (f"device: cpu\nmatrix: {{models: [gpt2], batch_sizes: [{MAX_BATCH + 1}]}}\n",
     ["key 'matrix.batch_sizes'", "<= 1048576"]),
    ("device: cpu\ncases: [{model: gpt2, flavor: tiny, batch_size: 4, inject_failure: 'crash@1:2'}]\n",
     ["key 'cases[0]'", "inject-failure rank 2"]),
    ("device: cpu\nwarmup: 1\nsteps: 2\ncases: [{model: gpt2, flavor: tiny, batch_size: 4, "
     "inject_failure: 'crash@3'}]\n", ["key 'cases[0]'", "inject-failure step 3 is never reached"]),
])
def test_sweep_refuses_bad_suites(tmp_path, capsys, body, fragments):
    suite = write(tmp_path, body)
    store = tmp_path / "st"
    refused(capsys, run("sweep", str(suite), "--store", str(store)), "s.yaml", *fragments)
    assert not store.exists()


def test_merge_keys_still_override(tmp_path):
    """`<<: *base` then a key is YAML's override, not a duplicate."""
    from dlscale.case.suite import load_suite

    suite = write(tmp_path, "device: cpu\ncases:\n  - &b {model: gpt2, flavor: tiny, batch_size: 4, precision: fp32}\n"
                            "  - {<<: *b, batch_size: 8}\n")
    assert [c.batch_size for c in load_suite(suite).cases] == [4, 8]


def _matrix(n_batches: int, n_accum: int) -> str:
    return (f"device: cpu\nmatrix:\n  models: [gpt2]\n  flavors: [tiny]\n  precisions: [fp32]\n"
            f"  batch_sizes: {list(range(1, n_batches + 1))}\n  grad_accum: {list(range(1, n_accum + 1))}\n")


def test_case_limit_is_checked_before_expanding(tmp_path, capsys, monkeypatch):
    """10^6 planned cases are refused from the axes' lengths, without expanding one of them."""
    from dlscale.case import suite as suite_mod

    monkeypatch.setattr(suite_mod, "_expand_block", lambda *a: pytest.fail("expanded before the limit check"))
    path = write(tmp_path, _matrix(1000, 1000))
    store = tmp_path / "st"
    refused(capsys, run("sweep", str(path), "--store", str(store), "--dry-run"),
            "1,000,000 cases", "limit of 10,000", "--max-cases")
    assert not store.exists()


def test_max_cases_override(tmp_path, capsys):
    path = write(tmp_path, _matrix(3, 2))
    refused(capsys, run("sweep", str(path), "--store", str(tmp_path / "st"), "--dry-run", "--max-cases", "5"),
            "6 cases", "limit of 5")
    assert run("sweep", str(path), "--store", str(tmp_path / "st"), "--dry-run", "--max-cases", "6") == 0
    refused(capsys, run("sweep", str(path), "--store", str(tmp_path / "st"), "--max-cases", "0"), "--max-cases")


@pytest.mark.parametrize("argv, fragments", [
    (["--store", ""], ["--store", "result store directory"]),
    (["--max-batch-cap", "16"], ["--max-batch-cap", "largest-batch cases", "has none"]),
    (["--max-batch-cap", str(MAX_BATCH + 1)], ["max-batch-cap", "<= 1048576"]),
    (["--warmup", "-1"], ["warmup must be >= 0"]),
    (["--repeats", "1001"], ["repeats must be <= 1000"]),
])
def test_sweep_refuses_bad_options(tmp_path, capsys, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    suite = write(tmp_path, f"device: cpu\ncases: [{CASE}]\n")
    argv = argv if "--store" in argv else ["--store", "st", *argv]
    refused(capsys, run("sweep", str(suite), *argv), *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]


# ----------------------------------------------------------------------------- dlscale slurm

@pytest.mark.parametrize("argv, fragments", [
    (["--seed", str(MAX_SEED + 1)], ["seed", "<= 4294967295"]),
    (["--time-limit", "inf"], ["time-limit", "finite"]),
    (["--batch-size", str(MAX_BATCH + 1)], ["batch-size", "<= 1048576"]),
    (["--inject-failure", "crash@0:1"], ["inject-failure rank 1"]),
    (["--store", ""], ["--store", "result store directory"]),
])
def test_slurm_refuses_absurd_values(tmp_path, capsys, monkeypatch, argv, fragments):
    monkeypatch.chdir(tmp_path)
    argv = argv if "--store" in argv else ["--store", "st", *argv]
    refused(capsys, run("slurm", "--dry-run", "--model", "gpt2", *argv), *fragments)
    assert list(tmp_path.iterdir()) == []


def test_slurm_refuses_a_huge_suite(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, _matrix(101, 100), "big.yaml")
    refused(capsys, run("slurm", "big.yaml", "--dry-run", "--store", "st"), "10,100 cases", "limit of 10,000",
            "--max-cases")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.yaml"]
    write(tmp_path, _matrix(3, 2), "small.yaml")  # the override the message names exists on slurm too
    refused(capsys, run("slurm", "small.yaml", "--dry-run", "--store", "st", "--max-cases", "5"), "limit of 5")


# ----------------------------------------------------------------------------- dlscale compare

@pytest.mark.parametrize("argv, fragments", [
    (["--fail-on-regression", "nan"], ["--fail-on-regression", "[0, 100)", "got nan"]),
    (["--fail-on-regression", "inf"], ["--fail-on-regression", "got inf"]),
    (["--fail-on-regression", "100"], ["--fail-on-regression", "at most 100 %"]),
    (["--fail-on-regression", "-1"], ["--fail-on-regression", "got -1"]),
    (["--min-change", "nan"], ["--min-change", "finite", "got nan"]),
    (["--min-change", "inf"], ["--min-change", "got inf"]),
    (["--min-change", "-1"], ["--min-change", ">= 0"]),
    (["--min-change", "100", "--fail-on-regression", "5"], ["--min-change 100", "could never fire"]),
    (["--resamples", "1000000000000"], ["--resamples", "100 to 1000000"]),
    (["--resamples", "99"], ["--resamples"]),
    (["--seed", "-1"], ["--seed", "0 to 4294967295"]),
    (["--seed", str(MAX_SEED + 1)], ["--seed"]),
    (["--confidence", "nan"], ["--confidence", "[50, 100)"]),
])
def test_compare_refuses_gate_values(tmp_path, capsys, argv, fragments):
    """Checked before the stores are read (they need not exist) and before -o is written."""
    out = tmp_path / "cmp.md"
    refused(capsys, run("compare", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(out), *argv), *fragments)
    assert not out.exists()


def test_compare_accepts_the_boundary_values():
    from dlscale.report.compare import MAX_RESAMPLES, check_options

    check_options(MAX_RESAMPLES, 99.9, MAX_SEED, 99.9, 99.9)
    check_options(100, 50.0, 0, 0.0, 0.0)
    check_options(2000, 95.0, 0, 250.0, None)  # without the gate, only speed-ups can reach 250 %


def test_compare_refuses_an_empty_store(capsys):
    refused(capsys, run("compare", "", "x"), "A must name a result store directory")
