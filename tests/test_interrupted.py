"""A signal to dlscale after some repeats of a case finished: those repeats are stored (status
``interrupted``), `dlscale report` shows their numbers flagged ``interrupted``, and a resumed sweep measures
it again.

The repeats train in this process (conftest.one_process_here); the signal is a KeyboardInterrupt
raised where torchrun would start the second repeat, as procs.interrupts turns SIGTERM into one."""
from __future__ import annotations

import contextlib
import json

import pytest

from conftest import one_process_here

from dlscale import cli
from dlscale.case import launch
from dlscale.schema import validate_record

# one timed step a repeat: what is kept of an interrupted case does not depend on the window's length
WORKLOAD = ["--model", "gpt2", "--flavor", "tiny", "--precision", "fp32", "--strategy", "single", "--warmup", "1",
            "--steps", "1", "--device", "cpu"]
ARGS = [*WORKLOAD, "--batch-size", "2"]
SUITE = """
name: s
warmup: 1
steps: 1
repeats: 2
device: cpu
cases:
  - {model: gpt2, flavor: tiny, precision: fp32, strategy: single, batch_size: 2}
"""


@contextlib.contextmanager
def signal_at_repeat(n: int, counts=lambda cfg: True):
    """Inside, the n-th start of a case's processes that ``counts`` (1-based, over the block) is
    interrupted."""
    with one_process_here():
        here = launch.TorchrunSpawner
        starts = []

        class Interrupting(here):
            def start(self, cfg, workdir, env):
                if counts(cfg):
                    starts.append(cfg)
                    if len(starts) == n:
                        raise KeyboardInterrupt("SIGTERM")
                return super().start(cfg, workdir, env)

        launch.TorchrunSpawner = Interrupting
        try:
            yield starts
        finally:
            launch.TorchrunSpawner = here


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow  # trains repeats of tiny gpt2 in this process: seconds
def test_run_interrupted_after_a_repeat_keeps_it(tmp_path, capsys):
    store = tmp_path / "st"
    with signal_at_repeat(2):
        rc = cli.main(["run", *ARGS, "--repeats", "3", "--store", str(store)])
    assert rc == 130
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("dlscale:")]
    # one line naming the signal, the repeat it struck and what was kept
    assert len(err) == 1 and "SIGTERM" in err[0] and "2/3" in err[0] and "interrupted" in err[0], err
    assert str(store) in err[0] or "1 finished" in err[0], err
    (rec,) = _records(store / "results.jsonl")
    assert rec["status"] == "interrupted" and "2/3" in rec["error"] and "SIGTERM" in rec["error"]
    assert [r["status"] for r in rec["repeats"]] == ["ok"]
    assert rec["summary"]["samples_per_s"]["n"] == 1  # the finished repeat's numbers, summarised
    assert rec["summary"]["samples_per_s"]["median"] == rec["repeats"][0]["samples_per_s"] > 0
    assert rec["ranks"] and rec["model"]["params"] > 0 and rec["validity"] is not None
    assert validate_record(rec) is None  # the store's schema knows the status

    # the stored validity and the report carry the finished repeat's numbers, flagged
    assert [f["check"] for f in rec["validity"]["flags"] if f["check"] == "interrupted"] == ["interrupted"]
    assert cli.main(["report", str(store)]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| 1 | 1 |"))
    assert "INTERRUPTED" not in row and "interrupted" in row, row
    notes = [ln for ln in out.splitlines() if ln.startswith("- 1n1g") and "interrupted" in ln]
    assert notes and "1 of the 3" in notes[0], notes  # the flag's note says how many repeats finished



def test_run_interrupted_in_its_first_repeat_stores_nothing(tmp_path, capsys):
    store = tmp_path / "st"
    with signal_at_repeat(1):
        assert cli.main(["run", *ARGS, "--repeats", "2", "--store", str(store)]) == 130
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "SIGTERM" in err, err
    assert not (store / "results.jsonl").exists() or not _records(store / "results.jsonl")


@pytest.mark.slow  # trains repeats of tiny gpt2 in this process: seconds
def test_sweep_keeps_the_interrupted_case_and_measures_it_again(tmp_path, capsys):
    suite, store = tmp_path / "s.yaml", tmp_path / "st"
    suite.write_text(SUITE)
    with signal_at_repeat(2):
        assert cli.main(["sweep", str(suite), "--store", str(store)]) == 130
    err = capsys.readouterr().err
    assert "1/1" in err and str(store) in err, err  # the case struck and where its repeats are, named

    (rec,) = _records(store / "results.jsonl")
    assert rec["status"] == "interrupted" and len(rec["repeats"]) == 1 and rec["sweep"]["suite"] == "s"

    with one_process_here():
        assert cli.main(["sweep", str(suite), "--store", str(store)]) == 0
    assert "1 to run, 0 already ok" in capsys.readouterr().out
    recs = _records(store / "results.jsonl")
    assert [r["status"] for r in recs] == ["interrupted", "ok"] and len(recs[1]["repeats"]) == 2
    assert recs[0]["case_key"] == recs[1]["case_key"]


MAX = [*WORKLOAD, "--batch-size", "max", "--max-batch-start", "1", "--max-batch-cap", "2", "--repeats", "2"]
NOT_A_PROBE = lambda cfg: cfg.repeats > 1  # noqa: E731 - probes run one repeat (batchsearch.probe_config)


def test_an_interrupted_batch_probe_stores_nothing(tmp_path, capsys):
    store = tmp_path / "st"
    with signal_at_repeat(1):
        assert cli.main(["run", *MAX, "--store", str(store)]) == 130
    assert capsys.readouterr().err.strip().count("\n") == 0
    assert not (store / "results.jsonl").exists() or not _records(store / "results.jsonl")


@pytest.mark.slow  # trains repeats of tiny gpt2 in this process: seconds
def test_the_interrupted_case_of_a_batch_search_keeps_its_search(tmp_path, capsys):
    store = tmp_path / "st"
    with signal_at_repeat(2, NOT_A_PROBE):
        assert cli.main(["run", *MAX, "--store", str(store)]) == 130
    assert "SIGTERM" in capsys.readouterr().err

    (rec,) = _records(store / "results.jsonl")
    assert rec["status"] == "interrupted" and rec["batch_search"]["max"] == rec["config"]["batch_size"] == 2
