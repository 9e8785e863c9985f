"""`dlscale parity`: every strategy's losses beside single's, with tolerance and verdict (records built
by hand; the real multi-process check is test_strategies.py::test_parity_view_passes_for_every_strategy)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlscale.results import parity
from dlscale.cli import main

WARM = [6.2224, 6.1257, 6.0511]
AFTER = 5.7319


def rec(rid: str, strategy: str, devices: int, batch: int, warm=WARM, after=AFTER, *, model: str = "gpt2",
        precision: str = "fp32", scope: str | None = "global", info: dict | None = None, repeats: int = 1,
        created: str = "2026-01-01T00:00:00+00:00") -> dict:
    cfg = {"model": model, "flavor": "tiny", "strategy": strategy, "nproc_per_node": devices, "nnodes": 1,
           "batch_size": batch, "precision": precision, "compile": False, "clip_grad_norm": None, "grad_accum": 1,
           "warmup": len(warm), "steps": 5, "repeats": repeats, "device": "cpu", "seed": 0, "time_limit": 60.0,
           "collective_timeout": 60.0, "strategy_options": {}, "label": None}
    dp = 1 if strategy in ("pipeline", "tensor", "model", "single") else devices
    reps = [{"repeat": i, "status": "ok", "samples_per_s": 100.0 + i, "window_s": 1.0, "step_times_ms": [10.0] * 5,
             "warmup_losses": list(warm), "loss_after": after, "loss_scope": scope} for i in range(repeats)]
    return {"schema": "dlscale.record/1", "kind": "run", "id": rid, "created": created, "case_key": f"k-{rid}",
            "label": None, "config": cfg, "device_type": "cpu", "world_size": devices, "status": "ok",
            "error": None, "global_batch": batch * dp, "repeats": reps, "strategy_info": info or {},
            "model": {"unit": "seq"}, "summary": {"samples_per_s": {"n": repeats, "median": 100.0}}}


def write(tmp_path: Path, records: list[dict]) -> Path:
    d = tmp_path / "results"
    d.mkdir(exist_ok=True)
    (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


def run_json(capsys, store: Path, *extra: str) -> tuple[int, dict]:
    rc = main(["parity", str(store), "--format", "json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_pass_fail_and_the_numbers(tmp_path, capsys):
    off = [w * (1 + 3e-4) for w in WARM]  # 3e-4 relative: outside cpu/fp32's 1e-4
    store = write(tmp_path, [
        rec("s", "single", 1, 8),
        rec("d", "ddp", 2, 4, warm=[w * (1 + 2e-7) for w in WARM]),
        rec("p", "pipeline", 2, 8, after=AFTER * (1 - 5e-6)),
        rec("z", "zero1", 2, 4, warm=off),
    ])
    rc, doc = run_json(capsys, store)
    assert rc == 1  # zero1 is outside the tolerance
    (g,) = doc["groups"]
    assert g["tolerance"] == parity.TOLERANCES[("cpu", "fp32")] == 1e-4 and g["global_batch"] == 8
    assert g["reference"]["record_id"] == "s" and g["reference"]["warmup_losses"] == WARM
    by = {c["strategy"]: c for c in g["cases"]}
    assert by["ddp"]["verdict"] == "pass" and by["ddp"]["max_rel_diff"] == pytest.approx(2e-7, rel=1e-3)
    assert by["pipeline"]["verdict"] == "pass" and by["pipeline"]["max_rel_diff"] == pytest.approx(5e-6, rel=1e-3)
    assert by["zero1"]["verdict"] == "FAIL" and by["zero1"]["max_rel_diff"] == pytest.approx(3e-4, rel=1e-3)
    assert doc["summary"] == {"pass": 2, "FAIL": 1} and doc["passed"] is False
    # a looser tolerance passes everything; the Markdown table says the same
    rc, doc = run_json(capsys, store, "--tolerance", "1e-3")
    assert rc == 0 and doc["summary"] == {"pass": 3}
    assert main(["parity", str(store)]) == 1
    out, err = capsys.readouterr()
    assert "| single (reference) | 1 | 6.222400 | 6.125700 | 6.051100 | 5.731900 |" in out
    assert "| zero1 | 2 |" in out and "| 3.0e-04 | 1e-04 |" in out and "FAIL" in out
    assert err.strip().count("\n") == 0 and "zero1" in err and "3.0e-04" in err, err  # the case and its difference


def test_batchnorm_older_records_and_missing_reference(tmp_path, capsys):
    store = write(tmp_path, [
        rec("rs", "single", 1, 8, model="resnet50"),
        rec("rd", "ddp", 2, 4, model="resnet50", warm=[2.0, 1.5, 1.2]),  # BatchNorm per rank: differs
        rec("rm", "model", 2, 8, model="resnet50", warm=[w * (1 + 1e-6) for w in WARM]),  # whole batch: same
        rec("s", "single", 1, 8),
        rec("old", "ddp", 2, 4, warm=[9.9, 9.9, 9.9], scope=None),  # rank 0's share, before loss_scope
        rec("d16", "ddp", 2, 8),  # global batch 16: single ran 8
    ])
    rc, doc = run_json(capsys, store)
    assert rc == 0
    cases = {(g["model"], g["global_batch"], c["strategy"]): c for g in doc["groups"] for c in g["cases"]}
    bn = cases[("resnet50", 8, "ddp")]
    assert bn["verdict"] == "expected to differ" and "BatchNorm" in bn["note"]
    assert cases[("resnet50", 8, "model")]["verdict"] == "pass"
    old = cases[("gpt2", 8, "ddp")]
    assert old["verdict"] == "not comparable" and old["max_rel_diff"] == 0.0  # loss_after only: equal
    assert cases[("gpt2", 16, "ddp")]["verdict"] == "not comparable"
    assert main(["parity", str(store)]) == 0
    out = capsys.readouterr().out
    # the 16-sample case is not compared with the 8-sample single: a line of the output names both batches
    assert any("16" in ln and "8" in ln and "single" in ln for ln in out.splitlines()), out



def test_repeat_spread_and_bad_input(tmp_path, capsys):
    a, b = rec("s", "single", 1, 8, repeats=2), rec("d", "ddp", 2, 4)
    a["repeats"][1]["loss_after"] = AFTER * (1 + 4e-5)
    rc, doc = run_json(capsys, write(tmp_path, [a, b]))
    assert doc["groups"][0]["reference"]["repeat_spread"] == pytest.approx(4e-5, rel=1e-3)
    assert main(["parity", str(tmp_path / "results"), "--tolerance", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tolerance" in err, err

    assert main(["parity", str(tmp_path / "nope")]) == 2


def test_frameworks_are_never_each_others_reference(tmp_path, capsys):
    """JAX initialises its own weights: its single is JAX's reference, torch's is torch's (no cross FAIL)."""
    off = [w * 1.08 for w in WARM]  # another framework's trajectory: 8 % away
    jx, jd = rec("js", "single", 1, 8, warm=off), rec("jd", "ddp", 2, 4, warm=off)
    jx["config"]["framework"] = jd["config"]["framework"] = "jax"
    old = rec("ts", "single", 1, 8)  # an older torch record: no framework field at all
    td = rec("td", "ddp", 2, 4)
    td["config"]["framework"] = "torch"
    rc, doc = run_json(capsys, write(tmp_path, [jx, jd, old, td]))
    assert rc == 0 and len(doc["groups"]) == 2
    refs = {g["reference"]["record_id"]: [c["record_id"] for c in g["cases"]] for g in doc["groups"]}
    assert refs == {"js": ["jd"], "ts": ["td"]}
    assert all(c["verdict"] == "pass" for g in doc["groups"] for c in g["cases"])


def test_report_has_a_parity_section_and_a_loss_column(tmp_path, capsys):
    store = write(tmp_path, [rec("s", "single", 1, 8), rec("d", "ddp", 2, 4)])
    assert main(["report", str(store)]) == 0
    out = capsys.readouterr().out
    assert "## Loss parity" in out and "| ddp | 2 |" in out
    assert "loss after" in out and "5.7319" in out
    assert main(["report", str(store), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["parity"]["summary"] == {"pass": 1}


def test_markdown_headings_escape_the_label(tmp_path, capsys):
    """A label is user text: in a heading it cannot start a line, a heading or an HTML tag."""
    hostile = "x\n# injected <b>*y*</b>"
    a, b = rec("s", "single", 1, 8), rec("d", "ddp", 2, 4)
    a["label"] = b["label"] = a["config"]["label"] = b["config"]["label"] = hostile
    assert main(["parity", str(write(tmp_path, [a, b]))]) == 0
    out = capsys.readouterr().out
    assert "\n# injected" not in out and "<b>" not in out
    assert r"label x \# injected \<b\>\*y\*\</b\>" in out


def test_loss_after_compared_only_after_as_many_training_steps(tmp_path, capsys):
    """loss_after is the trained model's loss: compared only where the case had taken as many
    training steps as the reference (recorded as loss_after_steps; an older record is trusted only
    without --breakdown/--profile, which trained further steps before it). The warm-up losses are
    compared either way."""
    longer = rec("l", "ddp", 2, 4, after=AFTER * 0.9)
    longer["repeats"][0]["loss_after_steps"] = 3 + 5 + 4
    old_bd = rec("b", "zero1", 2, 4, after=AFTER * 0.9)
    old_bd["config"]["breakdown"] = True
    same = rec("f", "fsdp", 2, 4, after=AFTER * 0.9)
    same["repeats"][0]["loss_after_steps"] = 3 + 5  # as the reference (warm-up 3, steps 5): compared
    store = write(tmp_path, [rec("s", "single", 1, 8), longer, old_bd, same])
    rc, doc = run_json(capsys, store)
    by = {c["strategy"]: c for c in doc["groups"][0]["cases"]}
    assert by["ddp"]["verdict"] == "pass" and by["ddp"]["loss_after"] is None
    assert by["ddp"]["note"] == "loss after not compared: 12 training steps against the reference's 8"
    assert by["zero1"]["verdict"] == "pass" and by["zero1"]["note"].startswith(
        "loss after not compared: an older record whose --breakdown or --profile")
    assert by["fsdp"]["verdict"] == "FAIL" and by["fsdp"]["max_rel_diff"] == pytest.approx(0.1, rel=1e-3)
    assert rc == 1 and "loss after not compared" in by["ddp"]["note"]


def test_reduced_precision_compares_its_first_steps_only(tmp_path, capsys):
    """bf16/fp16: the first REDUCED_PRECISION_STEPS warm-up losses are compared, and loss_after only
    where the model had trained no more steps than that (rounding differences grow with every step;
    a model that memorised its synthetic batch ends near 0, where relative differences mean nothing).
    fp32 compares every step."""
    n = parity.REDUCED_PRECISION_STEPS
    warm = [1.0 - 0.01 * i for i in range(n)] + [1e-30] * 10
    apart = warm[:n] + [1e-3] * 10  # past the first n: near 0 and far apart, relatively
    long_bf16 = rec("l", "ddp", 2, 4, warm=apart, after=1e-20, precision="amp-bf16")
    long_bf16["repeats"][0]["loss_after_steps"] = len(warm) + 5
    ref = rec("s", "single", 1, 8, warm=warm, after=4e-44, precision="amp-bf16")
    ref["repeats"][0]["loss_after_steps"] = len(warm) + 5
    early = rec("e", "fsdp", 2, 4, warm=[w * (1 + 0.05) if i == 3 else w for i, w in enumerate(warm[:n])] + warm[n:],
                after=4e-44, precision="amp-bf16")
    early["repeats"][0]["loss_after_steps"] = len(warm) + 5
    rc, doc = run_json(capsys, write(tmp_path, [ref, long_bf16, early]))
    by = {c["strategy"]: c for c in doc["groups"][0]["cases"]}
    assert by["ddp"]["verdict"] == "pass" and by["ddp"]["max_rel_diff"] == 0.0
    assert by["ddp"]["note"] == (f"warm-up losses compared over the first {n} steps (amp-bf16); loss after not "
                                 f"compared: {len(warm) + 5} training steps in amp-bf16, past the {n} compared")
    assert by["fsdp"]["verdict"] == "FAIL" and by["fsdp"]["max_rel_diff"] == pytest.approx(0.05)  # step 4 counts
    assert rc == 1
    # the same trajectories in fp32: every step is compared
    fp32 = [dict(r, config=dict(r["config"], precision="fp32")) for r in (ref, long_bf16)]
    (tmp_path / "fp32").mkdir()
    rc, doc = run_json(capsys, write(tmp_path / "fp32", fp32))
    (case,) = doc["groups"][0]["cases"]
    assert case["verdict"] == "FAIL" and case["max_rel_diff"] > 1e20 and rc == 1
