"""Suites and `dlscale sweep`: parsing and validation, resume after a kill, --force, failures,
and the largest-batch search (with the worker's simulated "oom-above@N" threshold).

The process tests run tiny GPT-2 cases on the CPU (one process each, warm-up 1, steps 2,
repeats 1); each torchrun start costs several seconds here, so they are few: the sweep that is
killed mid-case (a ``python -m dlscale sweep``) starts torchrun for its cases. The sweeps that test
resumes in this process, and the failing-case sweep with its largest-batch search, train their
`single` cases here (conftest.py ``single_in_process``): the resume, --force, failure and search
bookkeeping is what they check, not torchrun.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

import helpers_cli
from dlscale import ConfigError, cli
from dlscale.case.batchsearch import search_max_batch
from dlscale.case.caseargs import batch_size_arg
from dlscale.commands import sweep as sweep_cmd
from dlscale.case.config import RunConfig, parse_injection
from dlscale.results.store import ResultStore
from dlscale.case.suite import filter_suite, load_suite, matches, parse_filters, shipped_suites


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def records(store: Path) -> list[dict]:
    return ResultStore(store).load().records if store.exists() else []


TINY = """\
    device: cpu
    warmup: 1
    steps: 2
    repeats: 1
    time_limit: 120
    collective_timeout: 60
"""


# ----------------------------------------------------------------------------- parsing

def test_shipped_suites_load_and_expand():
    # every shipped suite loads to distinct cases (how many is the suite file's to say)
    names = set(shipped_suites())
    assert {"quick", "dlperf-resnet50", "dlperf-bert", "gpt2", "dlperf-model-parallel"} <= names
    for name in names:
        cases = load_suite(name).cases
        assert cases and len({c.case_key() for c in cases}) == len(cases), name
    quick = load_suite("quick")
    assert [(c.model, c.strategy, c.world_size) for c in quick.cases] == [
        ("gpt2", "single", 1), ("gpt2", "ddp", 2), ("bert-base", "single", 1), ("bert-base", "ddp", 2),
        ("resnet50", "single", 1), ("resnet50", "ddp", 2)]
    assert all(c.flavor == "tiny" and c.device == "cpu" and c.precision == "fp32" for c in quick.cases)
    # its suite-wide `threads: 1` reaches every case: the 1-process baseline and the 2-process case get the
    # same budget per rank (an axis a matrix block leaves out takes the suite's setting, not the default)
    assert {c.threads for c in quick.cases} == {1} and all(c.steps == 80 for c in quick.cases)
    bert = load_suite("dlperf-bert")
    assert sorted({(c.precision, c.batch_size) for c in bert.cases}) == [
        ("amp-fp16", 64), ("amp-fp16", 96), ("amp-fp16", 128), ("fp32", 32), ("fp32", 48), ("fp32", 64)]
    assert {c.nproc_per_node for c in bert.cases} == {1, 2, 4, 8} and {c.compile for c in bert.cases} == {False, True}
    rn = load_suite("dlperf-resnet50")
    assert {(c.precision, c.batch_size) for c in rn.cases} == {("fp32", 128), ("amp-fp16", 256)}
    g = load_suite("gpt2")
    assert sum(c.batch_search for c in g.cases) == 1 and g.cases[-1].batch_size == "max"
    assert g.cases[-1].max_batch_start == g.settings["max_batch_start"]
    # loading by path works too, and the name is the file's stem
    assert load_suite(str(quick.path)).name == "quick"


def test_matrix_order_exclude_cases_and_duplicates(tmp_path):
    p = write(tmp_path, TINY + """\
    matrix:
      models: [gpt2, resnet50]
      flavors: [tiny]
      strategies: [single, ddp]
      devices: [1, 2]
      batch_sizes: [4, max]
      precisions: [fp32]
    exclude:
      - {strategy: single, devices: 2}
      - {strategy: ddp, devices: 1}
      - {model: resnet50, batch_size: max}
    cases:
      - {model: bert-base, flavor: tiny, strategy: ddp, nodes: 2, nproc_per_node: 2, batch_size: 8, precision: fp32}
      - {model: gpt2, flavor: tiny, strategy: single, devices: 1, batch_size: 4, precision: fp32}
    """)
    s = load_suite(p)
    got = [(c.model, c.strategy, c.nnodes, c.nproc_per_node, c.batch_size) for c in s.cases]
    assert got == [("gpt2", "single", 1, 1, 4), ("gpt2", "ddp", 1, 2, 4), ("gpt2", "single", 1, 1, "max"),
                   ("gpt2", "ddp", 1, 2, "max"), ("resnet50", "single", 1, 1, 4), ("resnet50", "ddp", 1, 2, 4),
                   ("bert-base", "ddp", 2, 2, 8)]
    assert s.duplicates == 1  # the explicit gpt2 single case equals a matrix case
    assert s.name == "s" and s.settings["repeats"] == 1 and s.cases[0].warmup == 1
    # a "max" case has its own resume key, never that of a real batch size
    import dataclasses

    assert s.cases[2].case_key().startswith("max-")
    assert s.cases[2].case_key() != dataclasses.replace(s.cases[2], batch_size=8).case_key()


@pytest.mark.parametrize("body, words", [
    ("matrx: {models: [gpt2], batch_sizes: [8]}", ["key 'matrx'", "unknown key", "did you mean 'matrix'"]),
    ("matrix: {models: [gpt2], strategy: ddp, batch_sizes: [8]}",
     ["key 'matrix.strategy'", "did you mean 'strategies'"]),
    ("matrix: {models: [gpt2], batch_sizes: abc}",
     ["key 'matrix.batch_sizes': expected a list of positive integers or \"max\", got 'abc'"]),
    ("matrix: {models: [gpt2], batch_sizes: [8, 0]}", ["key 'matrix.batch_sizes'", "got 0"]),
    ("matrix: {models: [gpt3], batch_sizes: [8]}", ["key 'matrix.models'", "unknown model 'gpt3'", "gpt2"]),
    ("matrix: {models: [gpt2], strategies: [ddpp], batch_sizes: [8]}", ["unknown strategy 'ddpp'", "fsdp"]),
    ("matrix: {models: [gpt2], precisions: [fp4], batch_sizes: [8]}", ["unknown precision 'fp4'", "amp-bf16"]),
    ("matrix: {models: [gpt2], compile: [maybe], batch_sizes: [8]}", ["key 'matrix.compile'", "true/false"]),
    ("matrix: {models: [gpt2], strategies: [single], devices: [1, 2], batch_sizes: [8]}",
     ["key 'matrix'", "impossible case", "strategy=single", "devices=2", "runs one process", "exclude"]),
    ("matrix: [{models: [gpt2], batch_sizes: [8]}, {models: [gpt2], devices: [2], nodes: [1], batch_sizes: [8]}]",
     ["key 'matrix[1].devices'", "not both"]),
    ("matrix: {models: [gpt2], strategies: [model], devices: [1], batch_sizes: [8]}",
     ["impossible case", "needs at least 2 processes"]),
    ("matrix: {models: [gpt2], strategies: [ddp], batch_sizes: [8], strategy_options: [{bucket: 1}]}",
     ["impossible case", "unknown ddp option(s) bucket"]),
    ("matrix: {models: [gpt2], batch_sizes: [8], strategy_options: [{bucket: 1}]}",  # auto: single on 1 device
     ["impossible case", "strategy=auto", "unknown single option(s) bucket; allowed: none"]),
    ("matrix: {models: [gpt2], devices: [1]}", ["key 'matrix.batch_sizes'", "missing"]),
    ("repeats: 0\nmatrix: {models: [gpt2], batch_sizes: [8]}", ["key 'repeats'", "positive integer"]),
    ("device: tpu\nmatrix: {models: [gpt2], batch_sizes: [8]}", ["key 'device'", "auto, cuda, cpu"]),
    ("time_limit: soon\nmatrix: {models: [gpt2], batch_sizes: [8]}", ["key 'time_limit'", "seconds"]),
    ("exclude: [{modle: gpt2}]\nmatrix: {models: [gpt2], batch_sizes: [8]}",
     ["key 'exclude[0].modle'", "did you mean 'model'"]),
    ("cases: [{model: gpt2, batch_size: [8, 16]}]", ["key 'cases[0].batch_size'", "one value"]),
    ("cases: [{model: gpt2, batch_size: 8, inject_failure: boom}]", ["key 'cases[0].inject_failure'"]),
    ("cases: [{strategy: ddp, batch_size: 8}]", ["key 'cases[0].model'", "missing"]),
    ("matrix: {models: [gpt2], batch_sizes: [8]}\nexclude: [{model: gpt2}]", ["defines no cases"]),
    ("- just\n- a list", ["a suite is a mapping"]),
    ("matrix: {models: [gpt2]\n", ["not valid YAML", "line"]),
])
def test_bad_suites_name_file_and_key(tmp_path, body, words):
    p = write(tmp_path, body + "\n", "x.yaml")
    with pytest.raises(ConfigError) as e:
        load_suite(p)
    msg = str(e.value)
    assert "x.yaml" in msg and "\n" not in msg
    for w in words:
        assert w in msg, msg


def test_cli_bad_suite_exits_2_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("suites")
    Path("suites/x.yaml").write_text("matrix: {models: [gpt2], batch_sizes: abc}\n")
    assert cli.main(["sweep", "suites/x.yaml", "--store", "st"]) == 2
    err = capsys.readouterr().err.strip()
    # one line: the file, the key and the value refused (documented format FILE: key 'KEY': ...)
    assert err.count("\n") == 0 and err.startswith("dlscale: error: suites/x.yaml: key 'matrix.batch_sizes':"), err
    assert "'abc'" in err
    assert not Path("st").exists()
    assert cli.main(["sweep", "no-such-suite"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no-such-suite" in err and all(n in err for n in shipped_suites()), err
    assert cli.main(["sweep", "quick", "--filter", "colour=red"]) == 2
    assert cli.main(["sweep", "quick", "--filter", "model=gpt3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "colour" in err[0], err
    assert "gpt3" in err[1] and all(m in err[1] for m in ("bert-base", "gpt2", "resnet50")), err  # what it has


def test_filters():
    s = load_suite("dlperf-bert")

    def where(pred) -> list[int]:  # the cases a filter must select, by hand
        return [i for i, c in enumerate(s.cases) if pred(c)]

    assert filter_suite(s, parse_filters(["precision=fp32", "compile=false"])) == where(
        lambda c: c.precision == "fp32" and not c.compile)
    assert filter_suite(s, parse_filters(["devices=1,2", "batch_size=64"])) == where(
        lambda c: c.world_size in (1, 2) and c.batch_size == 64)
    assert filter_suite(s, parse_filters(["devices=1", "devices=8"])) == where(  # one key twice: either
        lambda c: c.world_size in (1, 8))
    g = load_suite("gpt2")
    assert [g.cases[i].batch_size for i in filter_suite(g, parse_filters(["batch_size=max"]))] == ["max"]
    with pytest.raises(ConfigError, match="allowed: model"):
        parse_filters(["colour=red"])
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_filters(["model"])


def test_filters_on_strategy_options():
    """strategy_options.NAME matches the option as a case sets it, as text (a number, a flag), and nothing where
    the case does not set it; a name that is not an identifier is refused."""
    s = load_suite(str(Path(__file__).resolve().parent.parent / "benchmarks/suites/two-gpu-strategies.yaml"))
    one_f = filter_suite(s, parse_filters(["strategy=pipeline", "strategy_options.schedule=1f1b"]))
    assert [(s.cases[i].model, s.cases[i].precision) for i in one_f] == [("gpt2", "amp-bf16"), ("gpt2", "amp-fp16")]
    assert len(filter_suite(s, parse_filters(["strategy_options.microbatches=8"]))) == 4
    assert len(filter_suite(s, parse_filters(["strategy_options.shard=zero3"]))) == 1
    with pytest.raises(ConfigError, match="two-gpu-strategies") as e:  # the suite and the filter named
        filter_suite(s, parse_filters(["strategy_options.microbatches=4"]))
    assert "microbatches=4" in str(e.value)
    with pytest.raises(ConfigError, match="strategy_options"):
        parse_filters(["strategy_options.=1"])
    fields = {"strategy_options": {"compiled_autograd": True}, "nnodes": 1, "nproc_per_node": 2}
    assert matches(fields, parse_filters(["strategy_options.compiled_autograd=True"]))
    assert not matches(fields, parse_filters(["strategy_options.compiled_autograd=false"]))


def test_plan_skips_what_cannot_run_and_what_is_done(tmp_path):
    p = write(tmp_path, TINY + """\
    matrix: {models: [gpt2], flavors: [tiny], devices: [1, 2, 4], batch_sizes: [4, max], precisions: [fp32]}
    cases: [{model: gpt2, flavor: tiny, nodes: 2, nproc_per_node: 1, batch_size: 4, precision: fp32}]
    """)
    s = load_suite(p)
    ok = {"kind": "run", "status": "ok", "id": "a" * 32, "created": "2026-01-01T00:00:00+00:00"}
    recs = [dict(ok, case_key=s.cases[0].case_key()),
            dict(ok, case_key=RunConfig(model="gpt2").case_key(), batch_search={"case_key": s.cases[3].case_key()}),
            dict(ok, case_key=s.cases[1].case_key(), status="oom")]
    plan = sweep_cmd.plan(s, list(range(len(s.cases))), recs, force=False, gpus=2)
    assert [(p.action, p.reason.split(" ")[0]) for p in plan] == [
        ("done", "ok"), ("run", ""), ("skip", "needs"), ("done", "ok"), ("run", ""), ("skip", "needs"),
        ("skip", "needs")]
    # the numbers each skip states: the GPUs the case needs and the machine has; the nodes it needs
    assert re.findall(r"\d+", plan[2].reason) == ["4", "2"] and "GPU" in plan[2].reason, plan[2].reason
    assert re.findall(r"\d+", plan[6].reason)[0] == "2" and "node" in plan[6].reason, plan[6].reason
    forced = sweep_cmd.plan(s, list(range(len(s.cases))), recs, force=True, gpus=None)
    assert [p.action for p in forced] == ["run"] * 6 + ["skip"]


def test_plan_skips_a_cpu_case_with_more_processes_than_run_takes(tmp_path):
    """On the CPU a case over config.CPU_OVERSUBSCRIBE processes per core is skipped with run's reason
    at planning (it used to start, fail at launch and make the sweep exit 5)."""
    from dlscale.case.config import CPU_OVERSUBSCRIBE
    from dlscale.results.envinfo import affinity_count

    cores = affinity_count() or os.cpu_count() or 1
    too_many = CPU_OVERSUBSCRIBE * cores + 1
    p = write(tmp_path, TINY + f"""\
    matrix: {{models: [gpt2], flavors: [tiny], devices: [1, {too_many}], batch_sizes: [4], precisions: [fp32]}}
    """)
    s = load_suite(p)
    plan = sweep_cmd.plan(s, list(range(len(s.cases))), [], force=False, gpus=None)
    assert [p.action for p in plan] == ["run", "skip"]
    assert f"nproc-per-node {too_many} is more than {CPU_OVERSUBSCRIBE} processes per CPU core" in plan[1].reason


def test_dry_run_lists_and_runs_nothing(tmp_path, capsys):
    assert cli.main(["sweep", "dlperf-resnet50", "--dry-run", "--store", str(tmp_path / "st")]) == 0
    out = capsys.readouterr().out
    assert "20 case(s): 16 to run" in out and "4 skipped" in out and "resnet50 ddp x8 batch 256 amp-fp16 compiled" in out
    assert not (tmp_path / "st").exists()


# ----------------------------------------------------------------------------- batch search

def fake_probe(limit: int, log: list):
    def probe(b):
        log.append(b)
        return ("ok" if b <= limit else "oom"), None, 0.0
    return probe


@pytest.mark.parametrize("limit, start, cap", [(20, 8, 4096), (8, 8, 4096), (7, 8, 4096), (1, 8, 4096),
                                               (1000, 8, 4096), (333, 16, 512), (5000, 8, 4096), (3, 3, 4)])
def test_search_finds_the_threshold(limit, start, cap):
    log: list = []
    res = search_max_batch(fake_probe(limit, log), start, cap)
    assert res.max == min(limit, cap)
    assert res.capped == (limit >= cap)
    assert [p["batch_size"] for p in res.probes] == log and len(set(log)) == len(log)  # no batch probed twice
    assert max(log) <= cap
    if limit < cap:
        assert any(b == limit + 1 for b in log)  # the first batch that does not fit was seen


def test_search_edge_cases():
    assert search_max_batch(fake_probe(0, []), 8, 64).max is None  # nothing fits, not even 1
    res = search_max_batch(lambda b: (("ok", None, 0.0) if b < 16 else ("failed", "boom", 0.0)), 4, 64)
    assert res.max is None and res.stopped_at == 16 and "failed: boom" in res.stopped
    res = search_max_batch(lambda b: (("ok", None, 0.0) if b <= 10 else ("timeout", "slow", 0.0)), 8, 64)
    assert res.max == 10  # a probe past the time limit counts as not fitting


def test_oom_above_injection_and_batch_size_arg():
    from dlscale.train.worker import _Injected

    assert parse_injection("oom-above@24") == ("oom-above", 24, None)
    assert _Injected("oom-above@24", 0, 24).kind is None
    inj = _Injected("oom-above@24", 0, 25)
    assert (inj.kind, inj.step) == ("oom", 0)
    assert _Injected("oom-above@24:1", 0, 99).kind is None  # another rank
    assert RunConfig(inject_failure="oom-above@3").case_key() == RunConfig().case_key()
    assert batch_size_arg("max") == "max" and batch_size_arg("12") == 12
    args = cli.build_parser().parse_args(["run", "--batch-size", "max", "--max-batch-cap", "32"])
    assert args.batch_size == "max" and args.max_batch_cap == 32
    assert cli.build_parser().parse_args(["run", "--batch-size", "7"]).batch_size == 7
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["run", "--batch-size", "lots"])
    assert e.value.code == 2


def test_run_batch_size_max_is_wired(tmp_path, monkeypatch, capsys):
    from dlscale.case import batchsearch

    seen = {}

    def fake(case, spawner, **kw):  # the case resolved once by `dlscale run`
        from dlscale.results.record import Record

        cfg = case.cfg
        seen.update(cfg=cfg, **kw)
        return Record(status="ok", error=None, config=cfg.to_dict(), case_key=cfg.case_key(), label=None,
                      command="x", device_type="cpu", world_size=1, env={}, batch_search={"max": 24})

    monkeypatch.setattr(batchsearch, "measure_max_batch", fake)
    rc = cli.main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--batch-size", "max",
                   "--max-batch-start", "4", "--max-batch-cap", "64", "--store", str(tmp_path / "st"), "--json"])
    cfg = seen["cfg"]
    assert rc == 0 and cfg.batch_size == "max" and cfg.max_batch_start == 4 and cfg.max_batch_cap == 64
    assert json.loads(capsys.readouterr().out)["batch_search"]["max"] == 24


# ----------------------------------------------------------------------------- real sweeps

FAILING_SUITE = TINY + """\
    max_batch_start: 3
    max_batch_cap: 4
    cases:
      - {model: gpt2, flavor: tiny, strategy: single, batch_size: 2, precision: fp32, inject_failure: "crash@0"}
      - {model: gpt2, flavor: tiny, strategy: single, batch_size: max, precision: fp32,
         inject_failure: "oom-above@3"}
    """


RESUME_SUITE = TINY + """\
    matrix:
      models: [gpt2]
      flavors: [tiny]
      precisions: [fp32]
      strategies: [single]
      batch_sizes: [2, 4]
"""


def _wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_sweep_killed_mid_case_resumes_without_loss_or_duplicates(tmp_path, capsys, single_in_process):
    suite = write(tmp_path, RESUME_SUITE)
    store = tmp_path / "st"
    log = open(tmp_path / "sweep.log", "w")
    # `python -m dlscale sweep`, its first case (batch 2) trained in that process (tests/tools/dlscale_here.py):
    # the second, the one the signal strikes, starts its torchrun and worker as always
    here = Path(__file__).resolve().parent / "tools" / "dlscale_here.py"
    proc = subprocess.Popen([sys.executable, str(here), "--here", "batch_size=2", "sweep", str(suite), "--store",
                             str(store)], stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        _wait(lambda: len(records(store)) >= 1, 150, "the first case's record")
        # the second case is running once the sweep has a torchrun child again
        me = psutil.Process(proc.pid)
        kids = _wait(lambda: me.children(recursive=True), 30, "the second case's processes")
        time.sleep(1.0)
        kids = me.children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "sweep.log").read_text()
    assert "interrupted" in text and "2/2" in text, text  # the case it struck, named
    gone, alive = psutil.wait_procs(kids, timeout=15)
    assert not alive, f"case processes left behind: {alive}"
    first = records(store)
    assert len(first) == 1 and first[0]["status"] == "ok" and first[0]["config"]["batch_size"] == 2
    assert first[0]["sweep"]["suite"] == "s"

    # run again: carries on with case 2, the one interrupted; case 1 is not measured again. The sweeps
    # in this process train their `single` cases here (conftest.py): the same record, no torchrun start
    with single_in_process():
        assert cli.main(["sweep", str(suite), "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert "1 to run, 1 already ok" in out and "[1/1] ok" in out
    recs = records(store)
    keys = [r["case_key"] for r in recs]
    assert len(recs) == 2 and len(set(keys)) == 2 and all(r["status"] == "ok" for r in recs)
    assert recs[0]["id"] == first[0]["id"]
    assert sorted(r["config"]["batch_size"] for r in recs) == [2, 4]
    assert "throughput median" in out  # the DLPerf table of the sweep's cases
    # workload fields always, in the configuration's field order (the framework too); procedure fields only
    # where they differ from their defaults
    cmd = recs[1]["command"]
    assert cmd.startswith("dlscale run --model gpt2 --framework torch --flavor tiny --precision fp32 "), cmd
    assert "--strategy single" in cmd and "--batch-size 4" in cmd and "--label" not in cmd, cmd

    # a third run has nothing to do; --force measures again (a new record, nothing rewritten)
    assert cli.main(["sweep", str(suite), "--store", str(store)]) == 0
    assert "0 to run, 2 already ok" in capsys.readouterr().out
    with single_in_process():
        assert cli.main(["sweep", str(suite), "--store", str(store), "--force", "--filter", "batch_size=4"]) == 0
    recs2 = records(store)
    assert len(recs2) == 3 and [r["id"] for r in recs2[:2]] == [r["id"] for r in recs]
    per_key = {k: sum(1 for r in recs2 if r["case_key"] == k) for k in keys}
    assert sorted(per_key.values()) == [1, 2] and recs2[2]["config"]["batch_size"] == 4


@pytest.mark.slow
def test_failing_case_is_recorded_and_the_sweep_goes_on_then_max_batch(tmp_path, capsys, single_in_process):
    suite, store = write(tmp_path, FAILING_SUITE), tmp_path / "st"
    # `dlscale sweep SUITE --store STORE` in this process, its `single` cases (the crash, the batch
    # probes) trained here too (conftest.py): the sweep's bookkeeping of a failure and of the search
    # is what this checks; the torchrun of a `single` sweep case: the kill-and-resume test above
    with single_in_process():
        p = helpers_cli.dlscale("sweep", str(suite), "--store", str(store))
    assert p.returncode == 5  # a case failed
    captured = [p.stdout, p.stderr]
    assert "[1/2] FAILED" in captured[0] and "injected crash" in captured[0], captured
    done = [ln for ln in captured[0].splitlines() if "[2/2] ok" in ln]
    assert len(done) == 1 and "max=3" in done[0], captured  # the largest batch found, named
    assert captured[1].strip().count("\n") == 0 and "failed" in captured[1], captured

    recs = records(store)
    assert [r["status"] for r in recs] == ["failed", "ok"]  # probes are not stored as records
    search = recs[1]["batch_search"]
    assert [(p["batch_size"], p["status"]) for p in search["probes"]] == [(3, "ok"), (4, "oom")]
    assert search["max"] == 3 and recs[1]["config"]["batch_size"] == 3 and not search["capped"]
    assert "--batch-size max" in recs[1]["command"]
    # resume: the max case is done (matched on its search key), the failed case would run again
    assert cli.main(["sweep", str(suite), "--store", str(store), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1 to run, 1 already ok" in out
    assert "   1  run   gpt2 (tiny) single x1 batch 2" in out and "   2  done  gpt2 (tiny) single x1 batch max" in out


def test_run_length_overrides(tmp_path, capsys):
    s = load_suite("dlperf-bert")
    short = s.with_overrides(warmup=5, steps=20, repeats=2)
    assert {(c.warmup, c.steps, c.repeats) for c in short.cases} == {(5, 20, 2)}
    assert short.settings["repeats"] == 2
    # repeats do not change a case's identity; steps do
    assert s.with_overrides(repeats=1).cases[0].case_key() == s.cases[0].case_key()
    assert short.cases[0].case_key() != s.cases[0].case_key()
    assert s.with_overrides() is s
    with pytest.raises(ConfigError, match="steps") as e:
        s.with_overrides(steps=0)
    assert "0" in str(e.value) and "\n" not in str(e.value)
    assert cli.main(["sweep", "quick", "--repeats", "0", "--dry-run", "--store", str(tmp_path / "st")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "repeats" in err and not (tmp_path / "st").exists(), err


def test_sweep_summary_finds_baselines_stored_by_another_sweep(tmp_path):
    """A suite run in parts (1-GPU cases, then 2-GPU cases): the 2-GPU summary still has its speedup."""
    import json
    import shutil

    fixtures = Path(__file__).resolve().parent / "fixtures" / "report_store"
    shutil.copytree(fixtures, tmp_path / "st")
    recs = [json.loads(line) for f in sorted((tmp_path / "st").glob("*.jsonl")) for line in f.read_text().splitlines()
            if line.startswith("{")]
    two = [r for r in recs if r.get("kind") == "run" and r.get("status") == "ok" and r.get("world_size") == 2
           and r["config"]["model"] == "bert-base" and r["config"]["strategy"] == "ddp"
           and r["config"]["batch_size"] == 128]
    assert two
    text = sweep_cmd.summary_tables(tmp_path / "st", {two[0]["case_key"]})
    rows = [line for line in text.splitlines() if line.startswith("| 1 | ")]
    assert [r.split("|")[2].strip() for r in rows] == ["1", "2"]  # the baseline row came along
    assert "100.0" in rows[0] and "—" not in rows[1].split("|")[4]


def test_huge_suite_is_refused_before_expansion(tmp_path, capsys, monkeypatch):
    """10^6 cases would take minutes and gigabytes to expand: the product of the axes is checked first."""
    from dlscale.case import suite as suite_mod

    sizes = ", ".join(str(b) for b in range(1, 1001))
    p = write(tmp_path, f"matrix: {{models: [gpt2], batch_sizes: [{sizes}], grad_accum: [{sizes}]}}\n", "big.yaml")
    monkeypatch.setattr(suite_mod, "_expand_block", lambda *a: pytest.fail("expanded before counting"))
    with pytest.raises(ConfigError) as e:
        load_suite(p)
    assert "1,000,000" in str(e.value) and "10,000" in str(e.value)  # the count and the limit named
    monkeypatch.undo()
    assert cli.main(["sweep", str(p), "--dry-run", "--max-cases", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--max-cases" in err, err

