"""Benchmark suites (bare, compare and commands sections), the driver benchmarks/run.py with its
yardsticks (bare_loop.py, bare_loop_jax.py, bare_mp.py), compare --ignore and --filter-a/-b and its
real-data columns, report --group-by label, benchmarks/kernels.py; each GPU suite in a tiny CPU
version through the driver."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

import yaml

from dlscale import ConfigError, benchsuite, frameworks
from dlscale.benchsuite import BareRun, Command, bare_args
from dlscale.cli import main as dlscale_main
from dlscale.config import RunConfig
from dlscale.suite import load_suite, parse_suite

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


F = _load("report_fixtures", FIXTURES / "report_fixtures.py")
RUN = _load("bench_run", ROOT / "benchmarks" / "run.py")
KERNELS = _load("bench_kernels", ROOT / "benchmarks" / "kernels.py")
SUITES = ROOT / "benchmarks" / "suites"
HAVE_JAX = not frameworks.missing_packages("jax")

TINY = {"device": "cpu", "warmup": 1, "steps": 2, "repeats": 1, "label": "t",
        "matrix": {"models": ["gpt2"], "flavors": ["tiny"], "precisions": ["fp32"], "batch_sizes": [2],
                   "strategies": ["single", "ddp"], "devices": [1, 2]},
        "exclude": [{"strategy": "single", "devices": 2}, {"strategy": "ddp", "devices": 1}]}


def parse(**sections) -> object:
    return parse_suite({**TINY, **sections}, Path("bench.yaml"))


# ----------------------------------------------------------------------------- suite sections

@pytest.mark.parametrize("path", sorted(SUITES.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_benchmark_suite_loads(path):
    if "framework: jax" in path.read_text() and not HAVE_JAX:
        pytest.skip("JAX is not installed (pip install -e '.[jax]')")
    suite = benchsuite.load(path)  # data sets its before commands make are checked when made
    assert suite.cases and suite.description
    for run in suite.bench.bare:  # each bare run is the case of the same key, where one exists
        twins = [c for c in suite.cases if c.case_key() == run.cfg.case_key()]
        assert run.variant or not twins or twins[0].label == run.cfg.label or run.cfg.label
    for cmd in suite.bench.commands:
        assert not cmd.script or (ROOT / "benchmarks" / cmd.argv[0]).is_file()


def test_before_commands_defer_the_data_checks_of_what_they_make(tmp_path):
    tok = tmp_path / "tok" / "tokens.bin"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "description": "x", "device": "cpu",
        "cases": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "data": f"tokens:{tok}"}],
        "commands": [{"name": "tokens", "when": "before", "creates": str(tok),
                      "dlscale": ["data", "make", "tokens", "--out", str(tok.parent), "--size", "2k"]}]}))
    with pytest.raises(ConfigError, match="no such file|does not exist|not found"):
        load_suite(path)
    suite = benchsuite.load(path)  # the file is the command's to make: only the model is checked now
    assert [c.name for c in suite.bench.when("before")] == ["tokens"] and suite.bench.commands[0].creates == str(tok)
    bad = tmp_path / "bad.yaml"  # a model that cannot read tokens is still refused
    bad.write_text(path.read_text().replace("model: gpt2", "model: resnet50"))
    with pytest.raises(ConfigError, match="trains on images"):
        benchsuite.load(bad)


def test_bare_each_takes_the_cases_keys_and_overrides_follow():
    suite = parse(bare=[{"each": {"devices": 2}, "repeats": 3}])
    (run,) = suite.bench.bare
    ddp = [c for c in suite.cases if c.world_size == 2][0]
    assert run.cfg.case_key() == ddp.case_key() and run.cfg.repeats == 3 and run.store == "bare"
    assert run.cfg.monitor is False and run.variant == {}
    moved = suite.with_overrides(steps=7, device="cpu")
    assert moved.bench.bare[0].cfg.steps == 7
    assert moved.bench.bare[0].cfg.case_key() == [c for c in moved.cases if c.world_size == 2][0].case_key()


def test_bare_variant_goes_to_its_own_store():
    suite = parse(bare=[{"model": "resnet50", "flavor": "tiny", "precision": "fp32", "batch_size": 2,
                         "sgd": "foreach", "label": "foreach"}])
    run = suite.bench.bare[0]
    assert run.variant == {"sgd": "foreach"} and run.store == "variants" and run.cfg.label == "foreach"


def test_bare_args_map_every_field_the_loop_takes():
    cfg = RunConfig(model="resnet50", flavor="tiny", precision="amp-bf16", compile=True,
                    compile_mode="reduce-overhead", inductor_options={"coordinate_descent_tuning": True},
                    batch_size=8, warmup=3, steps=9, seed=4, strategy="ddp", nproc_per_node=2)
    assert bare_args(BareRun(cfg, torchvision=True, sgd="fused"), "cuda") == [
        "--model", "resnet50", "--flavor", "tiny", "--batch-size", "8", "--precision", "amp-bf16",
        "--device", "cuda", "--seed", "4", "--warmup", "3", "--steps", "9", "--sgd", "fused", "--compile",
        "--compile-mode", "reduce-overhead", "--inductor-option", "coordinate_descent_tuning=true",
        "--torchvision"]


def test_compare_spec_argv():
    suite = parse(bare=[{"each": {}}], compare=[
        {"name": "env", "a": {"label": "t", "devices": 2}, "b": {"store": "bare", "strategy": ["ddp", "single"]},
         "ignore": ["env", "strategy_options"]}])
    spec = suite.bench.compare[0]
    assert spec.argv({"dlscale": "S", "bare": "B", "variants": "V"}) == [
        "S", "B", "--label-a", "t", "--filter-a", "devices=2", "--filter-b", "strategy=ddp,single",
        "--ignore", "env,strategy_options"]


@pytest.mark.skipif(not HAVE_JAX, reason="JAX is not installed (pip install -e '.[jax]')")
def test_a_jax_case_gets_the_jax_loop():
    suite = parse(matrix={"models": ["gpt2"], "flavors": ["tiny"], "precisions": ["fp32"], "batch_sizes": [2],
                          "frameworks": ["torch", "jax"], "strategies": ["single"]}, exclude=[],
                  bare=[{"each": {}}])
    loops = {r.cfg.framework: r for r in suite.bench.bare}
    assert loops["jax"].loop == "jax" and loops["torch"].loop == "torch"
    assert loops["jax"].script == "benchmarks/bare_loop_jax.py" and loops["jax"].store == "bare"
    assert bare_args(loops["jax"], "cpu") == ["--model", "gpt2", "--flavor", "tiny", "--batch-size", "2", "--precision",
                                              "fp32", "--device", "cpu", "--seed", "0", "--warmup", "1", "--steps", "2"]
    assert loops["jax"].identity() != dataclasses_replace(loops["jax"], loop="torch").identity()


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_the_mp_loop_resizes_the_model_as_the_strategy_options_do():
    suite = parse_suite({"description": "x", "device": "cpu", "warmup": 1, "steps": 2, "cases": [
        {"model": "face", "flavor": "tiny", "precision": "fp32", "batch_size": 4, "strategy": "partial-fc",
         "strategy_options": {"classes": 300}},
        {"model": "wide-deep", "flavor": "tiny", "precision": "fp32", "batch_size": 8, "strategy": "embedding-shard",
         "strategy_options": {"shard": "table", "vocab_scale": 2}}], "bare": [{"each": {}, "loop": "mp"}]},
        Path("bench.yaml"))
    face, wdl = suite.bench.bare
    assert face.script == "benchmarks/bare_mp.py" and face.cfg.case_key() == suite.cases[0].case_key()
    assert bare_args(face, "cuda")[-2:] == ["--resize", "classes=300"]
    assert bare_args(wdl, "cpu")[-2:] == ["--resize", "vocab_scale=2"]  # shard: table is how, not what
    assert "--sgd" not in bare_args(wdl, "cpu")


def test_commands_resolve_their_placeholders():
    cmd = Command("x", "after", ("micro", "io", "--store", "{store}", "--note", "{out}/a"))
    assert cmd.resolved({"out": "/o", "store": "/o/store", "bare": "/o/bare", "variants": "/o/v"}) == [
        "micro", "io", "--store", "/o/store", "--note", "/o/a"]
    suite = parse(commands=[{"name": "t", "when": "table", "dlscale": ["predict", "--validate", "{store}"]},
                            {"name": "io", "when": "after", "gpus": 2, "time_limit": 60,
                             "dlscale": ["micro", "io", "--seconds", 0.5, "--store", "{store}"]}])
    t, io = suite.bench.commands
    assert (t.when, t.argv, t.script) == ("table", ("predict", "--validate", "{store}"), False)
    assert io.argv[3] == "0.5" and io.gpus == 2 and io.time_limit == 60.0 and suite.bench.when("after") == [io]


@pytest.mark.parametrize("sections, where, what", [
    ({"bare": {"model": "gpt2"}}, "key 'bare'", "expected a list"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "torchvisoin": True}]},
     "key 'bare[0].torchvisoin'", "did you mean 'torchvision'"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "strategy": "fsdp", "devices": 2}]},
     "key 'bare[0]'", "the bare loop runs single on one device or ddp"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "strategy": "ddp", "devices": 1}]},
     "key 'bare[0]'", "ddp on 2 or more"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "precision": "amp-fp16"}]},
     "key 'bare[0]'", "precisions amp-bf16, fp32"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "torchvision": True}]},
     "key 'bare[0]'", "torchvision: true is for resnet50"),
    ({"bare": [{"model": "gpt2", "flavor": "tiny", "batch_size": 2, "sgd": "adam"}]},
     "key 'bare[0].sgd'", "expected one of auto, foreach, fused"),
    ({"bare": [{"each": {"model": "bert-base"}}]}, "key 'bare[0].each'", "matches no case"),
    ({"bare": [{"each": {"colour": 1}}]}, "key 'bare[0].each'", "key 'colour' is unknown"),
    ({"bare": [{"each": {}, "steps": 3}]}, "key 'bare[0].steps'", "unknown key"),
    ({"bare": [{"each": {}}, {"each": {"devices": 1}}]}, "key 'bare[1]'", "the same bare run as bare[0]"),
    ({"compare": [{"name": "x", "a": {"label": "t"}, "b": {"label": "u"}, "ignore": ["colour"]}]},
     "key 'compare[0].ignore'", "'colour' is not a field of the case identity"),
    ({"compare": [{"name": "X y", "a": {}, "b": {"label": "u"}}]}, "key 'compare[0].name'", "lowercase"),
    ({"compare": [{"name": "x", "a": {"store": "bare"}, "b": {}}]}, "key 'compare[0].a.store'",
     "no bare runs"),
    ({"compare": [{"name": "x", "a": {"store": "elsewhere"}, "b": {}}]}, "key 'compare[0].a.store'",
     "expected one of dlscale, bare, variants"),
    ({"compare": [{"name": "x", "a": {}, "b": {}}]}, "key 'compare[0]'", "select the same records"),
    ({"compares": []}, "key 'compares'", "did you mean 'compare'"),
    ({"bare": [{"each": {}, "loop": "pytorch"}]}, "key 'bare[0].loop'", "expected one of torch, jax, mp"),
    ({"bare": [{"each": {"devices": 2}, "loop": "mp"}]}, "key 'bare[0]'", "loop mp runs one process on one device"),
    ({"bare": [{"each": {"devices": 1}, "loop": "jax"}]}, "key 'bare[0]'", "loop jax trains JAX models"),
    ({"bare": [{"each": {"devices": 1}, "loop": "mp", "sgd": "fused"}]}, "key 'bare[0]'",
     "sgd are variants of loop torch"),
    ({"bare": [{"each": {}, "loop": "torch"}, {"each": {"devices": 1}}]}, "key 'bare[1]'", "the same bare run"),
    ({"commands": {"name": "x"}}, "key 'commands'", "expected a list of commands"),
    ({"commands": [{"name": "x", "when": "before", "dlscale": "data make tokens"}]}, "key 'commands[0].dlscale'",
     "never a shell string"),
    ({"commands": [{"name": "x", "when": "before", "dlscale": ["run", "--model", "gpt2"]}]},
     "key 'commands[0].dlscale[0]'", "a before command runs dlscale data or micro, not 'run'"),
    ({"commands": [{"name": "x", "when": "table", "dlscale": ["micro", "io"]}]}, "key 'commands[0].dlscale[0]'",
     "report or compare or predict"),
    ({"commands": [{"name": "x", "when": "later", "dlscale": ["micro", "io"]}]}, "key 'commands[0].when'",
     "expected one of before, after, table"),
    ({"commands": [{"name": "report", "when": "table", "dlscale": ["report", "{store}"]}]},
     "key 'commands[0].name'", "not report, by-label"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro", "io"]},
                   {"name": "x", "when": "after", "dlscale": ["micro", "io"]}]}, "key 'commands[1].name'",
     "already the name of another command"),
    ({"commands": [{"name": "x", "when": "table", "dlscale": ["report"], "script": ["k.py"]}]}, "key 'commands[0]'",
     "give one of dlscale"),
    ({"commands": [{"name": "x", "when": "table", "script": ["../evil.py"]}]}, "key 'commands[0].script[0]'",
     "file name of a benchmarks/ script"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro", "io", "--store", "{home}"]}]},
     "key 'commands[0].dlscale[3]'", "the only placeholders are {out}, {store}, {bare}, {variants}"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro", True]}]}, "key 'commands[0].dlscale[1]'",
     "expected a string or a number"),
    ({"commands": [{"name": "x", "when": "table", "dlscale": ["report", "{store}", "--format", "md"]}]},
     "key 'commands[0]'", "the driver adds --format md|json"),
    ({"commands": [{"name": "x", "when": "before", "dlscale": ["data"], "creates": "{out}/x"}]},
     "key 'commands[0].creates'", "a literal path"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro"], "gpus": 0}]}, "key 'commands[0].gpus'",
     "a GPU count >= 1"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro"], "time_limit": -1}]},
     "key 'commands[0].time_limit'", "time-limit"),
    ({"commands": [{"name": "x", "when": "after", "dlscale": ["micro"], "shell": True}]},
     "key 'commands[0].shell'", "unknown key"),
])
def test_bad_sections_one_line_naming_the_key(sections, where, what):
    with pytest.raises(ConfigError) as e:
        parse(**sections)
    msg = str(e.value)
    assert where in msg and what in msg and "\n" not in msg, msg


def test_driver_bad_suite_exits_2_before_writing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the driver sets the hosts' variables
    bad = tmp_path / "bad.yaml"
    bad.write_text("description: x\nmatrix: {models: [gpt2], batch_sizes: [2]}\nbare: [{each: {}, sgd: adam}]\n")
    out = tmp_path / "out"
    assert RUN.main([str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "bare[0].sgd" in err and "expected one of auto, foreach, fused" in err
    assert not out.exists()
    assert RUN.main([str(ROOT / "benchmarks" / "suites" / "smoke-cpu.yaml"), "--filter", "model=bert-base",
                     "--out", str(out)]) == 2
    assert "no case of suite smoke-cpu matches --filter model=bert-base" in capsys.readouterr().err
    assert not out.exists()


# ----------------------------------------------------------------------------- compare --ignore

def _rec(rid, samples, strategy="ddp", nproc=2, env=None, options=None, label=None, batch=128):
    r = F.run_record(rid, "bert-base", "amp-bf16", batch, strategy, 1, nproc, samples, label=label)
    if env:
        r["config"]["env"] = env
    if options:
        r["config"]["strategy_options"] = options
    r["case_key"] = F._case_key(r["config"])
    return r


def _compare(capsys, store, *argv):
    rc = dlscale_main(["compare", str(store), *map(str, argv), "--format", "json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_compare_ignore_pairs_variants_with_their_reference(tmp_path, capsys):
    store = tmp_path / "s"
    F.write_store(store, [
        _rec("base", [100, 101, 99, 102, 98], label="default"),
        _rec("one", [50, 50.5, 49.5, 51, 49], strategy="single", nproc=1, label="default"),
        _rec("hi", [110, 111.1, 108.9, 112.2, 107.8], env={"TORCH_NCCL_HIGH_PRIORITY": 1}, label="variant"),
        _rec("hook", [90, 90.9, 89.1, 91.8, 88.2], options={"comm_hook": "bf16"}, label="variant"),
    ])
    rc, doc, err = _compare(capsys, store, "--label-a", "default", "--label-b", "variant", "--filter-a", "devices=2",
                            "--ignore", "env,strategy_options")
    assert rc == 0, err
    got = {c["record_b"]: c for c in doc["cases"]}
    assert set(got) == {"hi", "hook"} and {c["record_a"] for c in got.values()} == {"base"}
    assert got["hi"]["ratio"] == pytest.approx(1.1) and got["hi"]["verdict"] == "faster"
    assert got["hook"]["ratio"] == pytest.approx(0.9) and got["hook"]["verdict"] == "slower"
    assert got["hi"]["a_differs"] == "env={}" and got["hook"]["a_differs"] == "strategy_options={}"
    assert "TORCH_NCCL_HIGH_PRIORITY=1" in got["hi"]["case"] and "comm_hook=bf16" in got["hook"]["case"]
    assert doc["method"]["paired_on"] == {"case fields without": ["env", "strategy_options"]}
    # without --ignore the variants are other cases: nothing pairs
    rc, doc, _ = _compare(capsys, store, "--label-a", "default", "--label-b", "variant")
    assert rc == 0 and all(c["ratio"] is None for c in doc["cases"])


def test_compare_ignore_across_strategies_and_device_counts(tmp_path, capsys):
    store = tmp_path / "s"
    F.write_store(store, [
        _rec("ddp", [100, 101, 99], label="x"),
        _rec("fsdp", [95, 96, 94], strategy="fsdp", options={"shard": "zero2"}, label="x"),
        _rec("single", [55, 55, 55], strategy="single", nproc=1, label="x"),
    ])
    rc, doc, err = _compare(capsys, store, "--filter-a", "strategy=ddp", "--filter-b", "strategy=fsdp,single",
                            "--ignore", "strategy,strategy_options,nproc_per_node")
    assert rc == 0, err
    ratios = {c["record_b"]: c["ratio"] for c in doc["cases"]}
    assert ratios == {"fsdp": pytest.approx(0.95), "single": pytest.approx(0.55)}


def test_compare_ignore_refuses_an_ambiguous_side_a_and_bad_options(tmp_path, capsys):
    store = tmp_path / "s"
    F.write_store(store, [_rec("ddp", [100, 101, 99]), _rec("fsdp", [95, 96, 94], strategy="fsdp")])
    for argv, what in (
            (["--ignore", "strategy"], "side A: two cases are the same once strategy are left out"),
            (["--ignore", "colour"], "--ignore colour: not a field of the case identity"),
            (["--ignore", "label"], "--ignore label: not a field of the case identity"),
            (["--filter-a", "colour=1"], "--filter-a key 'colour' is unknown"),
            (["--filter-b", "devices=x"], "--filter-b devices: expected integers")):
        rc, _, err = _compare(capsys, store, store, *argv)
        assert rc == 2 and what in err and err.strip().count("\n") == 0, err


# ----------------------------------------------------------------------------- report --group-by label

def test_report_by_label_one_table_with_the_varying_fields(tmp_path, capsys):
    store = tmp_path / "s"
    F.write_store(store, [
        _rec("b64", [640, 640, 640], strategy="single", nproc=1, batch=64, label="curve"),
        _rec("b128", [1000, 1000, 1000], strategy="single", nproc=1, batch=128, label="curve"),
        _rec("ddp", [1900, 1900, 1900], batch=128, label="curve"),
        _rec("other", [5, 5, 5], strategy="single", nproc=1, batch=8, label="else"),
    ])
    assert dlscale_main(["report", str(store), "--group-by", "label", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    curve = next(t for t in doc["tables"] if t["label"] == "curve")
    assert curve["varying"] == ["batch_size", "strategy"]
    assert curve["fixed"]["model"] == "bert-base"
    rows = {r["record_id"]: r for r in curve["rows"]}
    assert set(rows) == {"b64", "b128", "ddp"}
    assert rows["ddp"]["scaling_efficiency"] == pytest.approx(0.95)  # against b128 single, as in DLPerf's table
    assert rows["b64"]["median_samples_per_s"] == 640
    assert dlscale_main(["report", str(store), "--group-by", "label"]) == 0
    md = capsys.readouterr().out
    table = md.split("## label `curve`")[1].split("## ")[0]
    assert "| batch_size | strategy | node_num |" in table
    assert "| 128 | ddp | 1 | 2 | 1900.00 | 1.90 | 95.0 |" in table
    assert dlscale_main(["report", str(store), "--group-by", "label", "--format", "html"]) == 2


# ----------------------------------------------------------------------------- the driver, end to end

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One driver run of the CPU smoke suite (a tiny GPT-2 through dlscale and the bare loop)."""
    out = tmp_path_factory.mktemp("bench") / "smoke"
    t = time.monotonic()
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "smoke-cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    return out, p, time.monotonic() - t


@pytest.mark.slow
def test_driver_runs_dlscale_and_the_bare_loop_and_makes_the_tables(smoke):
    out, p, seconds = smoke
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    bare = [json.loads(x) for x in (out / "bare" / "results.jsonl").read_text().splitlines()]
    runs = [json.loads(x) for x in (out / "store" / "results.jsonl").read_text().splitlines()]
    assert len(bare) == len(runs) == 1 and bare[0]["status"] == runs[0]["status"] == "ok"
    assert bare[0]["case_key"] == runs[0]["case_key"] and bare[0]["bare"] == {
        "script": "benchmarks/bare_loop.py", "variant": {}}
    assert bare[0]["command"].startswith("python benchmarks/bare_loop.py --model gpt2 --flavor tiny")
    assert bare[0]["env"]["env_vars"].get("NCCL_NVLS_ENABLE") == "0"  # the hosts' variables were set
    vs = json.loads((out / "vs-bare.json").read_text())
    (case,) = vs["cases"]
    med_bare, med_dl = bare[0]["summary"]["samples_per_s"]["median"], runs[0]["summary"]["samples_per_s"]["median"]
    assert case["median_a"] == pytest.approx(med_bare) and case["median_b"] == pytest.approx(med_dl)
    assert case["ratio"] == pytest.approx(med_dl / med_bare)
    assert f"| {case['ratio']:.3f} |" in (out / "vs-bare.md").read_text()
    index = (out / "index.md").read_text()
    for name in ("report.md", "report.json", "by-label.md", "bare.md", "vs-bare.md", "vs-bare.json"):
        assert f"| [{name}]({name}) |" in index and (out / name).is_file()
    assert "not made" not in index and (out / "env.json").is_file() and (out / "sweep.log").is_file()
    print(f"driver run: {seconds:.1f} s")


@pytest.mark.slow
def test_driver_resumes_and_packs(smoke):
    out, p, _ = smoke
    assert p.returncode == 0
    q = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "smoke-cpu", "--out", str(out),
                        "--pack"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert q.returncode == 0, q.stderr[-2000:]
    assert "[bare 1/1] done" in q.stdout and "1 already ok" in q.stdout
    archive = out.with_name("smoke.tgz")
    assert archive.is_file() and not out.exists()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "smoke/index.md" in names and "smoke/bare/results.jsonl" in names
