"""What a new user meets in the first hour: each defect's reproducer, pure or in-process."""
from __future__ import annotations

import argparse
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


def test_a_positional_store_on_a_writing_verb_names_the_option(capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["sweep", "quick", "myresults"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--store myresults" in err and len(err.strip().splitlines()) == 1


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
