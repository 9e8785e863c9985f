"""What a new user meets in the first hour: each defect's reproducer, pure or in-process."""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from dlscale.cli import build_parser, main

FIXTURES = Path(__file__).resolve().parent / "fixtures"
READ_VERBS = ("report", "parity", "compare", "predict", "cost")


@pytest.fixture
def store(tmp_path: Path) -> Path:
    d = tmp_path / "results"
    shutil.copytree(FIXTURES / "report_store", d)
    return d


# ---------------------------------------------------------------- the store of the read verbs

@pytest.mark.parametrize("verb", ("report", "parity"))
def test_read_verbs_take_the_store_both_ways(store, capsys, verb):
    rc_opt = main([verb, "--store", str(store), "--format", "json"])
    out_opt = capsys.readouterr().out
    rc_pos = main([verb, str(store), "--format", "json"])
    out_pos = capsys.readouterr().out
    opt, pos = json.loads(out_opt), json.loads(out_pos)
    for d in (opt, pos):
        d.pop("generated", None)  # the report's own timestamp
    assert rc_opt == rc_pos and opt == pos and opt


def test_compare_takes_one_or_two_stores_as_options(store, capsys):
    assert main(["compare", "--store", str(store), "--store", str(store), "--format", "json"]) == 0
    two = capsys.readouterr().out
    assert main(["compare", str(store), str(store), "--format", "json"]) == 0
    assert capsys.readouterr().out == two


@pytest.mark.parametrize("argv", (["report", "x", "--store", "y"], ["compare", "--store", "a", "--store", "b",
                                                                    "--store", "c"], ["cost", "--model", "gpt2", "--shape", "8", "--tokens", "1e9"]))
def test_store_given_twice_or_missing_is_one_line_exit_2(tmp_path, capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--store" in err


def test_every_read_verb_documents_store_option_only():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for verb in READ_VERBS:
        parser = sub.choices[verb]
        assert "--store DIR" in parser.format_help(), verb
        shown = [a.dest for a in parser._actions if not a.option_strings and a.help != argparse.SUPPRESS]
        assert not shown, (verb, shown)


def test_a_positional_store_on_a_writing_verb_names_the_option(capsys, store):
    for words, named in (([str(store)], True), (["results.jsonl"], True), (["tiny"], False)):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["sweep", "quick", *words])
        err = capsys.readouterr().err
        assert e.value.code == 2 and len(err.strip().splitlines()) == 1
        assert (f"--store {words[0]}" in err) is named  # a stray word that is no store gets no such hint


# ---------------------------------------------------------------- keys and titles of unrelated tables

def _fixtures():
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _names_and_titles(directory: Path, records: list) -> dict:
    from dlscale.report.data import build_report, load_records

    F = _fixtures()
    F.write_store(directory, records)
    return {g.name: g.title for g in build_report(load_records(directory)).groups}


def test_a_strategy_option_elsewhere_changes_no_other_key_or_title(tmp_path):
    F = _fixtures()
    base = F.main_store_records()
    before = _names_and_titles(tmp_path / "a", base)
    hooked = F.run_record("r99-hook", "bert-base", "amp-bf16", 128, "ddp", 1, 2, [150, 151, 149],
                          extra={})
    hooked["config"]["strategy_options"] = {"comm_hook": "fp16"}
    hooked["case_key"] = F._case_key(hooked["config"])
    after = _names_and_titles(tmp_path / "b", base + [hooked])
    assert {k: v for k, v in after.items() if k in before} == before
    new = set(after) - set(before)
    assert len(new) == 1 and "fp16" in new.pop()


# ---------------------------------------------------------------- parity against a reference of the same model

def _parity_rec(rid, strategy, devices, options, warm):
    cfg = {"model": "wide-deep", "flavor": "tiny", "strategy": strategy, "nproc_per_node": devices, "nnodes": 1,
           "batch_size": 8 // devices, "precision": "fp32", "compile": False, "clip_grad_norm": None,
           "grad_accum": 1, "warmup": len(warm), "steps": 5, "repeats": 1, "device": "cpu", "seed": 0,
           "strategy_options": options, "label": None}
    rep = {"repeat": 0, "status": "ok", "samples_per_s": 100.0, "window_s": 1.0, "step_times_ms": [10.0] * 5,
           "warmup_losses": warm, "loss_after": warm[-1], "loss_scope": "global", "loss_after_steps": 8}
    return {"schema": "dlscale.record/1", "kind": "run", "id": rid, "created": "2026-01-01T00:00:00+00:00",
            "case_key": f"k-{rid}", "label": None, "config": cfg, "device_type": "cpu", "world_size": devices,
            "status": "ok", "error": None, "global_batch": 8, "repeats": [rep], "strategy_info": {},
            "model": {"unit": "sample"}, "summary": {"samples_per_s": {"n": 1, "median": 100.0}}}


def test_parity_never_compares_a_resized_model_with_the_default_single(tmp_path, capsys):
    warm = [0.70, 0.69, 0.68]
    bigger = [0.75, 0.74, 0.72]  # a 4x vocabulary trains another model: other losses
    d = tmp_path / "s"
    d.mkdir()
    recs = [_parity_rec("s", "single", 1, {}, warm), _parity_rec("e", "embedding-shard", 2, {"shard": "row"}, warm),
            _parity_rec("v", "embedding-shard", 2, {"shard": "row", "vocab_scale": 4}, bigger)]
    (d / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert main(["parity", "--store", str(d), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    verdicts = {c["record_id"]: (c["verdict"], g["reference"]) for g in doc["groups"] for c in g["cases"]}
    assert verdicts["e"][0] == "pass" and verdicts["e"][1]["record_id"] == "s"
    assert verdicts["v"][0] == "not comparable" and verdicts["v"][1] is None


# ---------------------------------------------------------------- every record dlscale writes validates

class _FakeRanks:
    """A spawner whose ranks report what a worker's rank file holds, without starting a process:
    the record is assembled by launch.measure as for a real case."""

    def __init__(self, status: str):
        self.status, self.calls = status, 0

    def local_world(self, cfg):
        return cfg.world_size

    def start(self, cfg, workdir, env):
        import time

        from dlscale.case.procs import ProcResult

        self.calls += 1
        if self.status == "interrupted" and self.calls > 1:
            raise KeyboardInterrupt
        rank_status = {"interrupted": "ok", "timeout": "ok"}.get(self.status, self.status)
        for r in range(cfg.world_size if self.status != "timeout" else 0):
            res = {"rank": r, "local_rank": r, "world_size": cfg.world_size, "host": "h", "device": "cpu",
                   "pid": 1, "status": rank_status, "error": None if rank_status == "ok" else "out of memory",
                   "backend": "gloo", "threads": 1, "marks": {"started": time.time()}, "params": 1000, "dp_size": 1}
            if rank_status == "ok":
                res.update(window_s=0.5, step_times_ms=[50.0] * cfg.steps, warmup_losses=[1.0] * cfg.warmup,
                           loss_last=0.9, loss_after=0.9, loss_after_steps=cfg.warmup + cfg.steps,
                           loss_scope="global", peak_mem_allocated_bytes=1, peak_mem_reserved_bytes=1)
            (workdir / f"rank{r}.json").write_text(json.dumps(res))
        rc = {"ok": 0, "interrupted": 0, "oom": 3, "timeout": None}.get(self.status, 1)
        return ProcResult(rc, self.status == "timeout", 1.0, "", ["fake"], time.time())


def _measured(cfg, status: str = "ok") -> dict:
    from dlscale.case import launch

    try:
        rec = launch.measure(cfg, _FakeRanks(status), command="dlscale run")
    except launch.Interrupted as e:
        rec = e.record
    return rec.to_dict() if hasattr(rec, "to_dict") else rec


def _cfg(**kw):
    from dlscale.case.config import RunConfig

    base = dict(model="gpt2", flavor="tiny", device="cpu", batch_size=4, warmup=1, steps=2, repeats=2,
                monitor=False)
    return RunConfig(**{**base, **kw})


def _launchable(strategy: str):
    """A CPU case of ``strategy`` that passes validation (its model and device count), or None."""
    from dlscale import ConfigError
    from dlscale.case.config import validate_case

    own = {"embedding-shard": "wide-deep", "partial-fc": "face"}.get(strategy)  # the workloads they shard
    for model in ([own] if own else []) + ["gpt2", "wide-deep", "face", "resnet50", "llama"]:
        for n in (1, 2, 4, 8):
            cfg = _cfg(model=model, strategy=strategy, nproc_per_node=n)
            try:
                validate_case(cfg)
                return cfg
            except (ConfigError, ValueError, KeyError):
                continue
    return None


def _check(rec: dict) -> list[str]:
    from dlscale.schema import record_errors

    errors = list(record_errors(rec))
    try:
        import jsonschema
    except ImportError:
        return errors
    from dlscale.schema import record_schema

    return errors + [e.message for e in jsonschema.Draft202012Validator(record_schema()).iter_errors(rec)]


def _other_kinds(tmp_path: Path, capsys) -> dict:
    from dlscale.importers import ImportOptions, import_path

    table = FIXTURES / "tables" / "mxnet-bert-base-v100.yaml"
    out = {"kind imported": import_path(table, "table", ImportOptions())[0]}
    assert main(["micro", "matmul", "--sizes", "16", "--dtype", "fp32", "--store", str(tmp_path / "m")]) == 0
    capsys.readouterr()
    out["kind micro"] = json.loads((tmp_path / "m" / "results.jsonl").read_text().splitlines()[0])
    assert {"load", "validity"} <= set(out["kind micro"])  # micro records carry run's validity checks
    out["kind external"] = _external_record(tmp_path)
    return out


def _external_record(tmp_path: Path) -> dict:
    """An external record made by measure_external, the command's output fed in at the spawn seam
    (its parsing, conversion and record are the real ones)."""
    import sys
    import time

    from dlscale.external import measure, spawner
    from dlscale.case.procs import ProcResult
    from dlscale.results.store import ResultStore

    def fake_spawn(command, time_limit, env=None, on_line=None, cwd=None):
        for line in _megatron_lines(64):
            on_line(line)
        return ProcResult(0, False, 0.5, "", list(command), time.time())

    case = _external(command=[sys.executable, "train.py"], repeats=1, device="cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spawner, "spawn", fake_spawn)
        rec = measure.measure_external(case, ResultStore(tmp_path / "ext"))
    assert rec["status"] == "ok" and rec["model"]["seq_len_source"] == "log"
    return rec


def test_a_record_of_every_precision_status_strategy_framework_and_kind_validates(tmp_path, capsys, monkeypatch):
    import functools

    from dlscale.case import launch

    # the environment is captured for real, once per framework (it takes a second on a loaded host)
    monkeypatch.setattr(launch.envinfo, "capture", functools.lru_cache(maxsize=None)(launch.envinfo.capture))
    from dlscale.frameworks import FRAMEWORKS
    from dlscale.train.precision import PRECISIONS
    from dlscale.results.store import STATUSES
    from dlscale.strategies import strategy_names

    recs = {f"precision {p}": _measured(_cfg(precision=p)) for p in PRECISIONS}
    recs.update({f"status {s}": _measured(_cfg(), s) for s in STATUSES if s != "unsupported"})
    recs["status unsupported"] = _measured(_cfg(precision="fp8"))  # no fp8 on the CPU
    recs.update({f"framework {f}": _measured(_cfg(framework=f)) for f in FRAMEWORKS})
    unbuildable = [s for s in strategy_names() if _launchable(s) is None]
    assert not unbuildable
    recs.update({f"strategy {s}": _measured(_launchable(s)) for s in strategy_names()})
    recs.update(_other_kinds(tmp_path, capsys))
    assert {r["status"] for r in recs.values()} >= set(STATUSES)
    assert {r["kind"] for r in recs.values()} >= {"run", "imported", "micro", "external"}
    bad = {what: errs for what, rec in recs.items() if (errs := _check(rec))}
    assert not bad


# ---------------------------------------------------------------- one record per multi-node case

@pytest.mark.parametrize("endpoint", ("10.0.0.2:29500", "127.0.0.1:29500"))
def test_exactly_one_node_leads_whoever_hosts_the_c10d_endpoint(endpoint):
    """Two nodes, torchrun's node ranks by sorted host name: rank 0 on one, the endpoint on either
    (or a loopback endpoint every node owns). Exactly one leads: the one that ran global rank 0."""
    from dlscale.case.multinode import is_lead
    from dlscale.case.procs import Rendezvous

    rdzv = Rendezvous(nnodes=2, rdzv_endpoint=endpoint)
    for endpoint_node in (0, 1):
        leads = [is_lead(node == 0, [2 * node, 2 * node + 1], rdzv,
                         hosts_endpoint=lambda host, n=node: n == endpoint_node or host.startswith("127."))
                 for node in (0, 1)]
        assert leads == [True, False]
        # world.json not written (rank 0 crashed before it): rank 0's node still leads alone
        assert [is_lead(False, [2 * n, 2 * n + 1], rdzv, hosts_endpoint=lambda h: True) for n in (0, 1)] == \
            [True, False]


def test_without_any_rank_the_rendezvous_host_records():
    from dlscale.case.multinode import is_lead
    from dlscale.case.procs import Rendezvous

    c10d = Rendezvous(nnodes=2, rdzv_endpoint="10.0.0.2:29500")
    assert [is_lead(False, [], c10d, hosts_endpoint=lambda h, n=n: n == 1) for n in (0, 1)] == [False, True]
    static = [Rendezvous(nnodes=2, node_rank=n, master_addr="10.0.0.1") for n in (0, 1)]
    assert [is_lead(False, [None], r) for r in static] == [True, False]


# ---------------------------------------------------------------- fp32 MFU where there is no TF32; the peak used

@pytest.mark.parametrize("name, tf32, want", [("Tesla V100-SXM2-16GB", None, "fp32"), ("Tesla T4", None, "fp32"),
                                              ("NVIDIA A100-SXM4-80GB", None, "tf32"),
                                              ("NVIDIA A100-SXM4-80GB", False, "fp32"), (None, None, "tf32")])
def test_fp32_is_tf32_only_where_the_device_has_it(name, tf32, want):
    from dlscale.results import metrics

    assert metrics.precision_dtype("fp32", "cuda", name, tf32) == want
    assert metrics.precision_dtype("amp-bf16", "cuda", name, tf32) == "bf16"  # only fp32 depends on the device


def test_an_imported_v100_fp32_table_has_an_mfu_and_says_which_peak():
    from dlscale.results import metrics
    from dlscale.importers import ImportOptions, import_path
    from dlscale.models import get_model

    recs = import_path(FIXTURES / "tables" / "dlperf-tf2-bert-base-v100.yaml", "table", ImportOptions())
    fp32 = [r for r in recs if r["config"]["precision"] == "fp32" and r["status"] == "ok"]
    assert fp32
    for r in fp32:
        s = r["summary"]
        peak = metrics.peak_entry(s["device_name"])
        assert s["dtype"] == "fp32" and s["peak_flops"] == peak.flops["fp32"]
        assert s["peak"] == {"device": peak.name, "dtype": "fp32", "dense": True, "flops": peak.flops["fp32"],
                             "source": peak.source}
        flops = get_model(r["config"]["model"], r["config"].get("flavor") or "full").flops_per_sample
        assert s["mfu"] == pytest.approx(flops * s["samples_per_s_per_device"] / peak.flops["fp32"])


def test_a_measured_case_records_its_peak():
    from types import SimpleNamespace

    from dlscale.case import launch
    from dlscale.results import metrics

    cfg = SimpleNamespace(precision="fp32", world_size=1)
    spec = SimpleNamespace(flops_per_sample=1e12, seq_len=None)
    reps = [{"status": "ok", "samples_per_s": 2.0, "step_times_ms": [500.0]}]
    v100 = [{"device_name": "Tesla V100-SXM2-16GB", "tf32": False}]
    s = launch.summarize_case(cfg, spec, reps, v100, "cuda")
    assert s["dtype"] == "fp32" and s["peak"]["device"] == "V100 SXM2" and s["peak"]["dense"] is True
    assert s["mfu"] == pytest.approx(2.0 * 1e12 / metrics.peak_entry("Tesla V100-SXM2-16GB").flops["fp32"])
    assert launch.summarize_case(cfg, spec, reps, [{"device_name": "cpu"}], "cpu")["peak"] is None


# ---------------------------------------------------------------- external runs: the sequence length they train

def _external(**kw):
    from dlscale.external.case import ExternalCase

    base = dict(command=["python", "train.py"], parser="megatron", model="gpt2", batch_size=4, precision="fp32",
                warmup=10, steps=30, monitor=False)
    return ExternalCase(**{**base, **kw})


def _megatron_lines(seq_len=None):
    lines = [f"  seq_length ...................................... {seq_len}"] if seq_len else []
    for i in range(1, 6):
        lines.append(f" [2025-04-13 23:41:{i:02d}] iteration {i * 10:8d}/{1000:8d} | consumed samples: {i * 40:12d} "
                     f"| elapsed time per iteration (ms): 100.0 | learning rate: 4.000000E-05 | global batch size: "
                     f"    4 | lm loss: 1.07E+01 |")
    return lines


@pytest.mark.parametrize("given, logged, tokens_per_seq", [(None, 64, 64), (32, 64, 32), (None, None, None)])
def test_tokens_per_second_come_from_a_stated_sequence_length(given, logged, tokens_per_seq):
    from dlscale.external.parsers import get_parser
    from dlscale.external.spawner import convert, seq_len_warning

    case = _external(seq_len=given)
    res = get_parser("megatron").parse(_megatron_lines(logged), case.parse_options())
    assert res.seq_len == logged
    sps, tps = convert(res, case)
    assert sps == pytest.approx(40.0)  # 4 samples per 100 ms
    assert tps == (pytest.approx(sps * tokens_per_seq) if tokens_per_seq else None)
    # gpt2's registered 1024 is never used for tokens/s: it is only assumed, and said so
    assert (seq_len_warning(res, case) is None) is (tokens_per_seq is not None)
    assert case.seq_len_for(res.seq_len)[1] == {None: "assumed", 64: "log", 32: "option"}[given or logged]


def test_torchtitan_states_its_sequence_length_at_start():
    from dlscale.external.parsers import LogLine, get_parser, log_seq_len

    line = ("[rank0]:[titan] - root - INFO - Training starts at step 1, with local batch size 8, global batch size "
            "64, gradient accumulation steps 1, sequence length 2048, total steps 100 (warmup 2)")
    assert log_seq_len(get_parser("torchtitan").seq_len_line, [LogLine("step: 1 loss: 8"), LogLine(line)]) == 2048
    assert get_parser("hf-trainer").seq_len_line is None  # the Trainer never prints it: --seq-len is needed


# ---------------------------------------------------------------- micro-benchmarks get run's validity checks

def _micro_rec(cvs, other_pct=None, threads=2, cores=2, device="cpu", nproc=1):
    load = None if other_pct is None else {"cores": cores, "threads": threads, "other_cpu_pct_mean": other_pct,
                                           "other_cpu_cores_mean": other_pct / 100 * cores, "wall_s": 5.0}
    rows = [{"shape": f"{n}x{n}x{n}", "dtype": "fp32", "status": "ok", "time_cv": cv} for n, cv in zip((64, 128), cvs)]
    return {"kind": "micro", "micro": "matmul", "device": device, "config": {"nproc_per_node": nproc},
            "results": rows, "load": load}


@pytest.mark.parametrize("rec, flags", [
    (_micro_rec([0.01, 0.02], other_pct=2.0), set()),
    (_micro_rec([0.01, 0.30], other_pct=2.0), {"spread"}),
    (_micro_rec([0.01, 0.02], other_pct=85.0), {"competing_cpu"}),
    (_micro_rec([0.01, 0.02], other_pct=2.0, threads=4, cores=2), {"oversubscribed"}),
    (_micro_rec([0.01, 0.02], other_pct=85.0, device="cuda"), set()),  # the CPU checks are for CPU runs
])
def test_micro_records_are_flagged_as_runs_are(rec, flags):
    from dlscale.results import validity

    v = validity.assess_micro(rec)
    assert {f.check for f in v.flags} == flags and v.sound is (not flags)


def test_collectives_on_one_rank_are_flagged_as_no_link_measured():
    from dlscale.results import validity

    def comm(n):
        return {**_micro_rec([0.01, 0.02], device="cuda"), "micro": "comm", "nranks": n}

    assert {f.check for f in validity.assess_micro(comm(1)).flags} == {"one_rank"}
    assert not validity.assess_micro(comm(2)).flags


def test_a_micro_record_without_a_load_says_what_it_could_not_check():
    from dlscale.results import validity

    v = validity.assess_micro(_micro_rec([0.01, 0.02]))
    assert not v.flags and {"competing_cpu", "oversubscribed"} <= set(v.unchecked)


def test_busy_time_leaves_out_idle_and_guest():
    from collections import namedtuple

    from dlscale.micro.common import cpu_busy_s

    T = namedtuple("T", "user nice system idle iowait irq softirq steal guest guest_nice")
    assert cpu_busy_s(T(3.0, 0.5, 1.0, 10.0, 2.0, 0.25, 0.25, 0.0, 1.0, 0.0)) == pytest.approx(5.0)


# ---------------------------------------------------------------- the quick suite's windows, sized by time

@pytest.mark.parametrize("warm, target, want", [
    ([5.0, 0.012, 0.01, 0.011], 1.5, 150),  # the first (compilation, allocation) left out; the fastest
    ([5.0, 0.01, 0.012, 0.011], None, 80),  # no target: exactly --steps
    ([5.0, 0.1, 0.1], 1.5, 80),  # --steps is the fewest
    ([5.0], 1.5, 80),  # nothing timed after the first step
    ([5.0, 1e-9, 0.0], 1.5, 100_000),  # a timer's glitch cannot ask for more than the cap
])
def test_window_steps_from_the_warm_up(warm, target, want):
    from dlscale.train.worker import calibrated_steps

    assert calibrated_steps(80, warm, target) == want


def test_the_quick_suite_sizes_its_windows_by_time():
    from dlscale.case.suite import load_suite
    from dlscale.results.validity import THRESHOLDS

    suite = load_suite("quick")
    assert suite.cases and all(c.min_window_s is not None and c.min_window_s > THRESHOLDS.min_window_s
                               and c.warmup >= 2 for c in suite.cases)
    # a procedure setting: the case keys stay those of the fixed-step suite
    assert all(c.case_key() == dataclasses.replace(c, min_window_s=None).case_key() for c in suite.cases)


def test_throughput_counts_the_steps_the_window_ran():
    from dlscale.case import launch
    from dlscale.case.config import RunConfig

    cfg = RunConfig(model="gpt2", flavor="tiny", device="cpu", batch_size=4, steps=80, min_window_s=1.5)
    r0 = {"rank": 0, "status": "ok", "dp_size": 1, "window_s": 1.6, "window_steps": 160,
          "step_times_ms": [10.0] * 160}
    entry = launch.repeat_entry(0, cfg, [r0], "ok", None, 3.0)
    assert entry["samples_per_s"] == pytest.approx(160 * 4 / 1.6) and entry["window_steps"] == 160


@pytest.mark.parametrize("argv", (["--min-window", "1", "--warmup", "1"], ["--min-window", "0"],
                                  ["--min-window", "1", "--framework", "jax"]))
def test_bad_min_window_is_one_line_exit_2(tmp_path, capsys, argv):
    rc = main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--store", str(tmp_path / "s"),
               *argv])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_a_window_sized_by_time_lasts_as_asked(tmp_path, capsys, single_in_process):
    with single_in_process():
        # one thread: two threads on two busy cores make a step's time swing tenfold, and the window
        # (sized from the fastest warm-up step) last ten times as long as asked
        rc = main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--batch-size", "2",
                   "--warmup", "3", "--steps", "1", "--min-window", "0.5", "--repeats", "1", "--no-monitor",
                   "--threads", "1", "--store", str(tmp_path)])
    capsys.readouterr()
    assert rc == 0
    (rec,) = [json.loads(ln) for ln in (tmp_path / "results.jsonl").read_text().splitlines()]
    rep = rec["repeats"][0]
    # one step asked for, as many run as fill half a second (half of it: window steps run faster than warm-up's)
    assert rep["window_steps"] == len(rep["step_times_ms"]) > 1 and rep["window_s"] >= 0.5 * 0.5
    assert rep["loss_after_steps"] == 3 + rep["window_steps"]


# ---------------------------------------------------------------- also seen

def test_the_console_loss_is_the_training_loss_not_the_eval_one():
    from dlscale import console

    rec = {"repeats": [{"status": "ok", "samples_per_s": 10.0, "loss_last": 6.9078, "loss_after": 5.6e10}]}
    assert console._loss(rec) == "6.9078"


def test_profiler_steps_are_not_top_ops():
    from types import SimpleNamespace

    from dlscale.train.breakdown import top_ops

    ev = [SimpleNamespace(key=k, count=c, self_cpu_time_total=t) for k, c, t in
          (("ProfilerStep*", 2, 9000.0), ("aten::mm", 8, 4000.0), ("aten::add", 8, 1000.0))]
    got = top_ops(ev, steps=2, on_device=False, top=5)
    assert [r["name"] for r in got] == ["aten::mm", "aten::add"] and got[0]["self_ms_per_step"] == 2.0


def test_env_names_numpy_jax_and_transformers(capsys):
    from importlib import metadata

    assert main(["env", "--json"]) == 0
    env = json.loads(capsys.readouterr().out)
    for name in ("numpy", "jax", "transformers"):
        try:
            want = metadata.version(name)
        except metadata.PackageNotFoundError:
            want = None
        assert env["packages"][name] == want


def test_importing_the_same_file_twice_stores_its_cases_once(tmp_path, capsys):
    table = str(FIXTURES / "tables" / "mxnet-bert-base-v100.yaml")
    store = tmp_path / "s"
    assert main(["import", table, "--format", "table", "--store", str(store)]) == 0
    first = (store / "results.jsonl").read_text().splitlines()
    capsys.readouterr()
    assert main(["import", table, "--format", "table", "--store", str(store)]) == 0
    assert (store / "results.jsonl").read_text().splitlines() == first and "skipped" in capsys.readouterr().out
    assert all(json.loads(ln)["provenance"]["checksum"] for ln in first)
    changed = tmp_path / "t.yaml"  # the same source edited: a new checksum, imported again
    changed.write_text(Path(table).read_text() + "\n# corrected\n")
    assert main(["import", str(changed), "--format", "table", "--store", str(store)]) == 0
    assert len((store / "results.jsonl").read_text().splitlines()) == 2 * len(first)


def test_a_batch_search_says_when_the_cap_stopped_it():
    from dlscale.console import batch_search_line

    probes = [{"batch_size": b, "status": "ok"} for b in (8, 16, 32, 64)]
    capped = batch_search_line({"start": 8, "cap": 64, "probes": probes, "max": 64, "capped": True})
    assert "cap" in capped and "64" in capped and "--max-batch-cap" in capped
    oom = batch_search_line({"start": 8, "cap": 4096, "probes": probes + [{"batch_size": 128, "status": "oom"}],
                             "max": 96, "capped": False})
    assert "96" in oom and "128" in oom and "--max-batch-cap" not in oom
    assert batch_search_line(None) is None


def test_micro_io_takes_zero_workers_as_run_does():
    from dlscale import ConfigError
    from dlscale.micro.io import parse_workers

    assert parse_workers(["0,2", "4"]) == [0, 2, 4]
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ConfigError):
            parse_workers([bad])


@pytest.mark.parametrize("cli, device, cap, want", [("fp32", "cuda", (8, 0), "tf32"), ("fp32", "cuda", (7, 0), "fp32"),
                                                    ("fp32", "cpu", None, "fp32"), ("fp32-strict", "cuda", (9, 0), "fp32"),
                                                    ("bf16", "cuda", (9, 0), "bf16")])
def test_micro_layer_reads_fp32_as_run_does(cli, device, cap, want):
    from dlscale.micro.layer import row_precision

    assert row_precision(cli, device, cap) == want


# ---------------------------------------------------------------- one option convention across verbs

# Spellings that name a concept the convention names otherwise (--nproc-per-node, --nnodes,
# --batch-size, --seq-len, --model, --steps, --shapes): hidden deprecated aliases only.
OLD_SPELLINGS = {"--gpus", "--nodes", "--gpus-per-node", "--batch", "--seq", "--kind", "--iters", "--devices",
                 "--num-gpus", "--seq-length"}
# import's --gpus-per-node is the source's stated server size (provenance), not the run's shape
STATED = {("import", "--gpus-per-node")}


def _subcommands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, path + (name,))
    if path:
        yield " ".join(path), parser


def test_every_subcommand_uses_one_option_convention():
    from dlscale.cli import DeprecatedAlias
    from dlscale.commands.perf_args import DeprecatedAlias as PerfAlias

    walked = list(_subcommands(build_parser()))
    assert {"run", "plan", "micro layer", "report", "import"} <= {p for p, _ in walked}
    for path, parser in walked:
        for action in parser._actions:
            for opt in action.option_strings:
                if opt not in OLD_SPELLINGS or (path, opt) in STATED:
                    continue
                assert action.help == argparse.SUPPRESS, f"{path} shows {opt}"
                assert isinstance(action, (DeprecatedAlias, PerfAlias)), f"{path} {opt} is not a deprecated alias"
            if action.dest.startswith("store") and action.option_strings:
                assert "--store" in action.option_strings, f"{path} names its store {action.option_strings}"


def test_old_spellings_still_work_with_a_warning(capsys):
    old = main(["plan", "--model", "llama", "--flavor", "8b", "--gpus", "16", "--nodes", "2", "--gpu-memory",
                "80GiB", "--inter-busbw", "400", "--format", "json"])
    out_old, err_old = capsys.readouterr()
    new = main(["plan", "--model", "llama", "--flavor", "8b", "--nproc-per-node", "8", "--nnodes", "2",
                "--gpu-memory", "80GiB", "--inter-busbw", "400", "--format", "json"])
    out_new, err_new = capsys.readouterr()
    assert old == new == 0 and json.loads(out_old) == json.loads(out_new)
    assert "--gpus" in err_old and "--nodes" in err_old and not err_new
    args = build_parser().parse_args(["micro", "layer", "--kind", "gpt2", "--batch", "2", "--seq", "16"])
    assert (args.kind, args.batch, args.seq) == ("gpt2", "2", "16")
    capsys.readouterr()


@pytest.mark.parametrize("na, nb, conf, want", [(3, 3, 0.95, 4), (2, 2, 0.95, 4), (3, 3, 0.99, 5), (5, 5, 0.95, 5)])
def test_repeats_that_can_decide(na, nb, conf, want):
    """Exact two-sided Mann-Whitney: the smallest p of n vs n is 2 / C(2n, n): 3 vs 3 0.1, 4 vs 4 0.029,
    5 vs 5 0.0079."""
    from dlscale.report.stats import repeats_for

    assert repeats_for(1 - conf, na, nb) == want


def test_an_inconclusive_comparison_says_what_it_would_take(tmp_path, capsys):
    F = _fixtures()
    recs = [F.run_record(f"r-{lab}", "bert-base", "amp-bf16", 128, "ddp", 1, 1, [100.0, 101.0, 99.0 + i], label=lab)
            for i, lab in enumerate(("a", "b"))]
    F.write_store(tmp_path / "s", recs)
    assert main(["compare", "--store", str(tmp_path / "s"), "--label-a", "a", "--label-b", "b", "--format", "json"]) == 0
    (pair,) = json.loads(capsys.readouterr().out)["cases"]
    assert pair["verdict"].startswith("inconclusive") and "--repeats 4" in pair["needs"]
    assert main(["compare", "--store", str(tmp_path / "s"), "--label-a", "a", "--label-b", "b"]) == 0
    assert "--repeats 4" in capsys.readouterr().out


def test_the_report_shows_a_micro_record_s_flags(tmp_path, capsys):
    F = _fixtures()
    micro = F.micro_record()
    micro["validity"] = {"sound": False, "flags": [{"check": "competing_cpu", "severity": "warn",
                                                   "reason": "other processes used 90 % of the cores"}]}
    F.write_store(tmp_path / "s", [micro])
    assert main(["report", "--store", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "competing_cpu" in out and "90 %" in out
    html = tmp_path / "r.html"
    assert main(["report", "--store", str(tmp_path / "s"), "--format", "html", "--no-plots", "--output", str(html)]) == 0
    assert "competing_cpu" in html.read_text() and "90 %" in html.read_text()
