"""`dlscale plan --check STORE`: the plan of hand-made stored cases beside their measured peaks
(in-process, no training)."""
from __future__ import annotations

import contextlib
import io
import json

from dlscale.planner import plancheck
from dlscale.cli import main as cli_main
from dlscale.case.config import RunConfig
from dlscale.planner.memplan import Workload, family, layout_for_run, plan_memory
from dlscale.models import get_model


def _rec(rid, strategy="single", flavor="tiny", batch=2, precision="amp-bf16", ckpt="none", measured=None,
         device_type="cuda", model="llama", label="t"):
    cfg = {"model": model, "flavor": flavor, "strategy": strategy, "nproc_per_node": 1, "nnodes": 1,
           "batch_size": batch, "precision": precision, "compile": True, "activation_checkpointing": ckpt,
           "grad_accum": 1, "strategy_options": {}, "label": label, "device": device_type}
    return {"schema": "dlscale.record/1", "kind": "run", "id": rid, "status": "ok", "label": label,
            "case_key": RunConfig.from_dict(cfg).case_key(), "config": cfg, "device_type": device_type,
            "world_size": 1, "summary": {"peak_mem_allocated_bytes": measured, "device_name": "NVIDIA H200"}}


def _predicted(strategy, flavor="tiny", batch=2, ckpt="none"):
    spec = get_model("llama", flavor)
    work = Workload(spec, "amp-bf16", ckpt, compiled=True, device_type="cuda")
    return plan_memory(work, layout_for_run(spec, strategy, 1, 1, {}), batch).peak


def _store(tmp_path, records):
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(tmp_path)


def _cli(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(args)
    return rc, out.getvalue(), err.getvalue()


def test_check_compares_each_newest_case_with_its_plan():
    single, fsdp = _predicted("single"), _predicted("fsdp")
    assert fsdp != single  # fsdp keeps bf16 weight copies: a different plan for the same model
    records = [_rec("old", measured=1.0),  # replaced by the newer record of the same case and label
               _rec("a", measured=single / 1.05),  # plan 5 % above the measurement
               _rec("b", strategy="fsdp", measured=fsdp / 0.8),  # plan 20 % below
               _rec("c", ckpt="selective", device_type="cpu"),  # nothing measured on the CPU
               _rec("d", model="resnet50", flavor="full")]  # no transformer architecture: no plan
    rep = plancheck.check(records, "S", tolerance=0.10)
    rows = {r.record_id: r for r in rep.rows}
    assert set(rows) == {"a", "b", "c"}
    assert rows["a"].predicted_bytes == single and abs(rows["a"].error - 0.05) < 1e-9 and rows["a"].within
    assert abs(rows["b"].error + 0.20) < 1e-9 and rows["b"].within is False
    assert rows["c"].error is None and rows["c"].within is None and rows["c"].measured_bytes is None
    assert "allocator" in rows["c"].note and "cpu" in rows["c"].note  # what is missing, and on what device
    assert [r.record_id for r in rep.outside] == ["b"]
    assert [s["record_id"] for s in rep.skipped] == ["d"]
    md = plancheck.to_markdown(rep)
    assert "| 1.050 | +5.0 | yes |" in md and "| 0.800 | -20.0 | **no** |" in md


def test_plan_check_command_exit_and_bad_input(tmp_path):
    store = _store(tmp_path, [_rec("a", measured=_predicted("single") / 1.05),
                              _rec("b", strategy="fsdp", measured=_predicted("fsdp") / 0.8)])
    rc, out, err = _cli(["plan", "--check", store])
    # one line naming the one case outside and its error
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "fsdp" in err and "(-20.0 %)" in err
    rc, out, _ = _cli(["plan", "--check", store, "--tolerance", "0.25", "--format", "json"])
    data = json.loads(out)
    assert rc == 0 and data["within"] == 2 and data["outside"] == 0
    assert _cli(["plan", "--check", store, "--model", "llama"])[0] == 2
    assert _cli(["plan", "--model", "llama", "--nproc-per-node", "1", "--gpu-memory", "80GiB", "--tolerance", "0.2"])[0] == 2
    rc, _, err = _cli(["plan", "--nproc-per-node", "1"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--model" in err and "--gpu-memory" in err
    (tmp_path / "results.jsonl").write_text(json.dumps(_rec("d", model="resnet50", flavor="full")) + "\n")
    rc, _, err = _cli(["plan", "--check", store])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and store in err, err  # the store, in one line


def test_fp8_note_only_where_the_plan_borrows_bf16s_count():
    rep = plancheck.check([_rec("l", precision="fp8", measured=1e9),
                           _rec("g", precision="fp8", model="gpt2", measured=1e9)], "S")
    notes = {r.record_id: r.note for r in rep.rows}
    assert notes["l"] == ""  # llama's float8 blocks have a count of their own
    g = notes["g"]  # the regime borrowed for gpt2's float8 activations, and that it bounds from above
    assert "amp-compiled" in g and family(get_model("gpt2", "tiny").arch) in g and "upper bound" in g, g
