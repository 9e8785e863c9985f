"""The one-line-error contract of every subcommand: bad input is one line on stderr, exit 2, naming
the option or value that is wrong, before anything is written or started (DEVELOPERS.md). What the
line says besides is free to change; each subcommand's own tests check the values it allows."""
from __future__ import annotations

import os

import pytest

from helpers_cli import dlscale

# (argv, what the line must name); paths are relative to an empty folder the call runs in
BAD = [
    (["run", "--model", "gpt2", "--warmup", "-1", "--store", "st"], "warmup"),
    (["run", "--model", "gpt2", "--batch-size", "abc", "--store", "st"], "abc"),
    (["run", "--model", "resnet51", "--store", "st"], "resnet51"),
    (["run", "--nnodes", "0", "--store", "st"], "nnodes"),
    (["sweep", "dlperf-bert", "--filter", "color=red", "--store", "st"], "color"),
    (["sweep", "dlperf-bert", "--steps", "0", "--store", "st"], "steps"),
    (["sweep", "nosuch.yaml", "--store", "st"], "nosuch.yaml"),
    (["report", "st", "--format", "pdf"], "pdf"),
    (["compare", "side-a", "side-b"], "side-a"),
    (["parity", "st"], "st"),
    (["micro", "matmul", "--size", "0", "--store", "st"], "size"),
    (["slurm", "--model", "gpt2", "--nnodes", "0"], "nnodes"),
    (["data", "make", "tokens", "--out", "tok", "--size", "big"], "big"),
    (["import", "--format", "nosuch", "x.csv", "--store", "st"], "nosuch"),
    (["cost", "--nnodes", "0"], "--nnodes"),
    (["env", "--bogus"], "--bogus"),
]


@pytest.mark.parametrize("argv, named", BAD, ids=lambda v: " ".join(v[:3]) if isinstance(v, list) else None)
def test_bad_input_is_one_line_exit_2_naming_it_and_nothing_written(tmp_path, monkeypatch, argv, named):
    monkeypatch.chdir(tmp_path)
    p = dlscale(*argv)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1 and lines[0].startswith("dlscale: error:"), p.stderr
    assert named in lines[0], lines[0]
    assert p.stdout == ""
    assert os.listdir(tmp_path) == []  # no store, no output folder, no job file
