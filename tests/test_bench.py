"""Benchmark suites (bare, compare and commands sections), the driver benchmarks/run.py with its
yardsticks (bare_loop.py, bare_loop_jax.py, bare_mp.py), compare --ignore and --filter-a/-b and its
real-data columns, report --group-by label, benchmarks/kernels.py; each GPU suite in a tiny CPU
version through the driver."""
from __future__ import annotations

import contextlib
import importlib.util
import gzip
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from unittest import mock

import pytest

import yaml

from dlscale import ConfigError, frameworks
from dlscale.case import benchsuite
from dlscale.case.benchsuite import BareRun, Command, bare_args
from dlscale.cli import main as dlscale_main
from dlscale.case.config import RunConfig
from dlscale.case.suite import load_bench_suite, load_suite, parse_suite
from helpers_cli import names

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


def driver(*argv: str) -> subprocess.CompletedProcess:
    """``benchmarks/run.py ARGV`` from the checkout, in this process: the driver already runs its
    dlscale sweep and tables in its own process, its bare runs, commands and table scripts are
    processes as always; this skips a fresh interpreter's ~5 s of torch import and environment
    reading. The hosts' variables it sets are undone afterwards."""
    out, err = io.StringIO(), io.StringIO()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with mock.patch.dict(os.environ), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = RUN.main([str(a) for a in argv])
    finally:
        os.chdir(cwd)
    return subprocess.CompletedProcess(["benchmarks/run.py", *argv], rc, out.getvalue(), err.getvalue())


# ----------------------------------------------------------------------------- suite sections

# the llama suite's load checks activation checkpointing on Llama 1B, 3B and 8B, each built (on the
# meta device) for it: seconds, out of the quick tier while the check builds the model per case
BUILDS_FOR_SECONDS = {"llama"}


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow) if p.stem in BUILDS_FOR_SECONDS else p
                                  for p in sorted(SUITES.glob("*.yaml"))], ids=lambda p: p.stem)
def test_every_benchmark_suite_loads(path):
    if "framework: jax" in path.read_text() and not HAVE_JAX:
        pytest.skip("JAX is not installed (pip install -e '.[jax]')")
    suite = load_bench_suite(path)  # data sets its before commands make are checked when made
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
    with pytest.raises(ConfigError, match=names(str(tok))) as e:  # the file the case reads, missing
        load_suite(path)
    assert re.search("no such file|does not exist|not found", str(e.value)), e.value
    suite = load_bench_suite(path)  # the file is the command's to make: only the model is checked now
    assert [c.name for c in suite.bench.when("before")] == ["tokens"] and suite.bench.commands[0].creates == str(tok)
    bad = tmp_path / "bad.yaml"  # a model that cannot read tokens is still refused
    bad.write_text(path.read_text().replace("model: gpt2", "model: resnet50"))
    with pytest.raises(ConfigError, match=names("resnet50", str(tok), "imagefolder")) as e:  # model, data, need
        load_bench_suite(bad)
    assert "no such file" not in str(e.value)  # the kind of data refused, not its absence


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


def test_the_jax_loop_runs_single_on_one_device_or_ddp_on_several():
    ok = [RunConfig(model="gpt2", flavor="tiny", framework="jax", strategy="single"),
          RunConfig(model="gpt2", flavor="tiny", framework="jax", strategy="ddp", nproc_per_node=2)]
    for cfg in ok:
        benchsuite.LOOPS["jax"].check(BareRun(cfg, loop="jax"))
    for bad in (RunConfig(model="gpt2", flavor="tiny", framework="jax", strategy="ddp"),
                RunConfig(model="gpt2", flavor="tiny", framework="jax", strategy="single", nproc_per_node=2)):
        with pytest.raises(ConfigError, match="loop jax.*single.*ddp"):  # the loop and what it runs
            benchsuite.LOOPS["jax"].check(BareRun(bad, loop="jax"))


# the cheapest XLA CPU optimisation: compiles faster, the same arithmetic on every rank
FAST_XLA = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
JAX_LOOP = [str(ROOT / "benchmarks" / "bare_loop_jax.py"), "--model", "gpt2", "--flavor", "tiny", "--batch-size", "2",
            "--precision", "fp32", "--device", "cpu", "--warmup", "1"]


def _last_json(stdout: str) -> dict:
    return json.loads([ln for ln in stdout.splitlines() if ln.startswith("{")][-1])


def test_the_jax_loop_alone_trains_on_one_device_of_several():
    """A process that sees several devices (a GPU host shows it all its GPUs) trains on its first
    alone, and on every process's one device under torchrun (the two-process run below)."""
    loop = _load("bench_bare_loop_jax", ROOT / "benchmarks" / "bare_loop_jax.py")
    assert loop.mesh_devices(("d0", "d1"), 1) == ["d0"]
    assert loop.mesh_devices(("d0", "d1"), 2) == ["d0", "d1"]
    assert loop.mesh_devices(("d0",), 1) == ["d0"]


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_JAX, reason="JAX is not installed (pip install -e '.[jax]')")
def test_the_jax_loop_trains_data_parallel_under_torchrun(tmp_path):
    """Two processes, gloo CPU collectives: each writes its rank file, rank 0 the global throughput."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XLA_FLAGS": FAST_XLA}
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        *JAX_LOOP, "--steps", "1", "--out", str(tmp_path)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = _last_json(p.stdout)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert line["world"] == 2 and [r["dp_size"] for r in ranks] == [2, 2]
    assert line["samples_per_s"] == pytest.approx(1 * 2 * 2 / ranks[0]["window_s"])
    assert ranks[0]["loss_last"] == pytest.approx(ranks[1]["loss_last"])  # one replicated loss
    assert line["devices"] == 2


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


def test_external_cases_take_the_suite_settings_and_resolve_their_script():
    suite = parse(external=[{"script": ["hf_gpt2_train.py", "--steps", 8, "--out", "{out}/hf"],
                             "parser": "hf-trainer", "model": "gpt2", "batch_size": 2, "precision": "fp32",
                             "repeats": 2}])
    (run,) = suite.bench.external
    c = run.case
    assert (c.warmup, c.steps, c.repeats, c.label, c.device, c.strategy) == (1, 2, 2, "t", "cpu", "single")
    resolved = run.resolved({"out": "/o"}, Path("/b"), "py")
    assert resolved.command == ["py", "/b/hf_gpt2_train.py", "--steps", "8", "--out", "/o/hf"]
    assert suite.bench.with_overrides({"steps": 5}).external[0].case.steps == 5


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
    ({"commands": [{"name": "x", "when": "during", "script": ["gpu_load.py"], "creates": "x"}]},
     "key 'commands[0].creates'", "a during command is a load"),
    ({"commands": [{"name": "x", "when": "during", "dlscale": ["report"]}]}, "key 'commands[0].dlscale[0]'",
     "a during command runs dlscale micro"),
    ({"bare": [{"each": {}, "loop": "hf-llama"}]}, "key 'bare[0]'", "loop hf-llama trains Hugging Face's Llama"),
    ({"external": {"command": ["x"]}}, "key 'external'", "expected a list of external cases"),
    ({"external": [{"command": ["x"], "script": ["a.py"], "parser": "regex"}]}, "key 'external[0]'",
     "give one of command"),
    ({"external": [{"script": ["../a.py"], "parser": "hf-trainer", "model": "gpt2", "batch_size": 2,
                    "precision": "fp32"}]}, "key 'external[0].script[0]'", "file name of a benchmarks/ script"),
    ({"external": [{"command": ["x"], "parser": "hf-trainer", "model": "gpt2", "batch_size": 2}]},
     "key 'external[0]'", "an external case needs precision"),
    ({"external": [{"command": ["x"], "parser": "hf-trainer", "model": "gpt2", "batch_size": 2,
                    "precision": "fp32", "compile": "yes"}]}, "key 'external[0].compile'", "expected bool"),
    ({"external": [{"command": ["x"], "parser": "hf-trainer", "model": "gpt2", "batch_size": 2,
                    "precision": "fp32", "shell": True}]}, "key 'external[0].shell'", "unknown key"),
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
    assert err.count("\n") == 0 and "bare[0].sgd" in err and all(v in err for v in ("auto", "foreach", "fused"))
    assert not out.exists()
    assert RUN.main([str(ROOT / "benchmarks" / "suites" / "smoke-cpu.yaml"), "--filter", "model=bert-base",
                     "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "smoke-cpu" in err and "model=bert-base" in err, err
    assert not out.exists()


def test_driver_decides_which_commands_run(tmp_path):
    plan = RUN.Plan(suite=None, path=tmp_path / "s.yaml", out=tmp_path / "out", case_idx=[0], bare=[], filters=[])
    made = tmp_path / "made"
    made.write_text("x")
    io = Command("io", "after", ("micro", "io", "--store", "{store}"), gpus=2)
    state = {"io": {"argv": io.resolved(RUN.places(plan)), "status": "ok"}}
    assert RUN.command_action(io, plan, 1, {}, False) == ("skip", "needs 2 GPUs, this machine has 1")
    assert RUN.command_action(io, plan, None, {}, False) == ("run", "")  # on the CPU any rank count runs
    assert RUN.command_action(io, plan, 2, state, False) == ("done", "ok in commands.json")
    assert RUN.command_action(io, plan, 2, state, True) == ("run", "")
    assert RUN.command_action(io, plan, 2, {"io": {**state["io"], "argv": ["other"]}}, False)[0] == "run"
    mk = Command("mk", "before", ("data", "make", "tokens"), creates=str(made))
    assert RUN.command_action(mk, plan, None, {}, True) == ("done", f"{made} exists")  # never made twice
    assert RUN.command_line(io, plan)[1:] == ["-m", "dlscale", "micro", "io", "--store", str(tmp_path / "out" / "store")]
    script = Command("k", "table", ("kernels.py", "{store}"), script=True)
    assert RUN.command_line(script, plan)[1:] == [str(ROOT / "benchmarks" / "kernels.py"), str(tmp_path / "out" / "store")]


def _side(line: str) -> tuple[str, str]:
    """(side, filters asked) that a line of ``unmade_compares`` names as matched by nothing."""
    m = re.search(r"\b([AB])'s \(([^()]*)\)", line)
    assert m, line
    return m[1], m[2]


def test_driver_says_which_comparisons_a_filter_leaves_without_a_side(tmp_path):
    """data-gpu filtered to one decoder leaves its synthetic cases out: the vs-synthetic tables (and the
    decoder-against-decoder one) cannot be made, unless the store already holds such records."""
    from dlscale.results.store import ResultStore, new_record

    args = RUN.build_parser().parse_args(["data-gpu", "--filter", "data_decoder=torchvision",
                                          "--out", str(tmp_path / "out")])
    said = RUN.unmade_compares(RUN.make_plan(args))
    assert [line.split(":")[0] for line in said] == ["compare vs-synthetic-torchvision",
                                                      "compare vs-synthetic-nvimgcodec",
                                                      "compare nvimgcodec-vs-torchvision"]
    assert _side(said[0]) == ("A", "data=synthetic") and _side(said[2]) == ("B", "data_decoder=nvimgcodec")
    assert all(f"compare-{line.split(':')[0].split()[1]}.md" in line for line in said)  # the file not made
    # a synthetic record from an earlier call in the same --out: torchvision against synthetic is made;
    # nvImageCodec's side is still missing
    cfg = RunConfig(model="resnet50", batch_size=256, precision="amp-bf16", device="cuda").to_dict()
    ResultStore(tmp_path / "out" / "store").append(new_record("run", config=cfg, status="ok"))
    said = RUN.unmade_compares(RUN.make_plan(args))
    assert [line.split(":")[0] for line in said] == ["compare vs-synthetic-nvimgcodec",
                                                      "compare nvimgcodec-vs-torchvision"]
    assert _side(said[0]) == ("B", "data=imagefolder:/tmp/dlscale-data/imgs, data_decoder=nvimgcodec")
    whole = RUN.build_parser().parse_args(["data-gpu", "--out", str(tmp_path / "all")])
    assert RUN.unmade_compares(RUN.make_plan(whole)) == []


@pytest.mark.slow
def test_a_failed_before_command_stops_the_measurements(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the driver sets the hosts' variables
    taken = tmp_path / "taken"
    (taken / "x").mkdir(parents=True)  # `data make` refuses a folder that is not empty
    suite = tmp_path / "s.yaml"
    suite.write_text(yaml.safe_dump({
        "description": "x", "device": "cpu", "warmup": 1, "steps": 2, "repeats": 1, "monitor": False,
        "cases": [{"model": "gpt2", "flavor": "tiny", "precision": "fp32", "batch_size": 2}],
        "commands": [{"name": "tokens", "when": "before", "time_limit": 120,
                      "dlscale": ["data", "make", "tokens", "--out", str(taken), "--size", "1k"]}]}))
    out = tmp_path / "out"
    assert RUN.main([str(suite), "--out", str(out)]) == 5
    printed = capsys.readouterr().out
    said = [ln for ln in printed.splitlines() if "[before tokens]" in ln and "exit 2" in ln]
    assert len(said) == 1 and str(taken) in printed, printed  # the command's own error passes through
    assert not (out / "store").exists() and json.loads((out / "commands.json").read_text())["tokens"]["status"] \
        == "failed (exit 2)"
    (line,) = [ln for ln in (out / "index.md").read_text().splitlines() if ln.startswith("- before commands:")]
    assert "tokens" in line and "exit 2" in line, line



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


def test_compare_of_real_data_against_synthetic_shows_the_input_pipeline(tmp_path, capsys):
    syn = F.run_record("syn", "resnet50", "amp-bf16", 256, "single", 1, 1, [3000, 3010, 2990], unit="img")
    real = F.run_record("cpu", "resnet50", "amp-bf16", 256, "single", 1, 1, [2400, 2410, 2390], unit="img", steps=320)
    real["config"]["data"] = "imagefolder:/data/inet"
    real["data"] = {"data_wait_share_max": 0.2, "data_gpu_idle_share_max": 0.12, "input_bound": True,
                    "loader_cpu_cores_total": 6.0, "samples_per_loader_core_s": 400.0,
                    "wait_may_be_understated": False}
    real["case_key"] = F._case_key(real["config"])
    F.write_store(tmp_path / "s", [syn, real])
    rc, doc, err = _compare(capsys, tmp_path / "s", "--filter-a", "data=synthetic", "--filter-b",
                            "data=imagefolder:/data/inet", "--ignore", "data,data_decode,steps")
    assert rc == 0, err
    (case,) = doc["cases"]
    assert case["ratio"] == pytest.approx(0.8) and case["a_differs"] == "data=synthetic, steps=20"
    assert case["b_data_wait_pct"] == pytest.approx(20.0) and case["b_input_verdict"] == "input-bound"
    assert case["b_data_gpu_idle_pct"] == pytest.approx(12.0)
    assert case["b_loader_cores"] == 6.0 and case["b_loader_cores_for_a"] == pytest.approx(3000 / 400)
    assert "data imagefolder:/data/inet (cpu decode)" in case["case"]
    assert dlscale_main(["compare", str(tmp_path / "s"), "--filter-a", "data=synthetic", "--filter-b",
                         "data=imagefolder:/data/inet", "--ignore", "data,data_decode,steps"]) == 0
    md = capsys.readouterr().out
    assert ("| B data wait (%) | B GPU idle for data (%) | B verdict | B loader CPU (cores) | B loader cores for "
            "A's rate | verdict |") in md
    assert "| 20.00 | 12.00 | input-bound | 6.0 | 7.5 |" in md
    rc, doc, _ = _compare(capsys, tmp_path / "s", tmp_path / "s", "--filter-a", "data=synthetic", "--filter-b",
                          "data=synthetic")  # synthetic on both sides: no such columns
    assert rc == 0 and "b_data_wait_pct" not in doc["cases"][0]


# ----------------------------------------------------------------------------- benchmarks/kernels.py

def _trace(kernels: list[tuple[str, float]], jax_style: bool) -> dict:
    """A Chrome trace with these (name, µs) device events: torch.profiler's shape or JAX's."""
    if not jax_style:
        return {"traceEvents": [{"ph": "X", "cat": "kernel", "name": n, "dur": d, "pid": 0, "tid": 7, "ts": 0}
                                for n, d in kernels] + [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 999,
                                                         "pid": 1, "tid": 1, "ts": 0}]}
    meta = [{"ph": "M", "name": "process_name", "pid": 3, "args": {"name": "/device:GPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 3, "tid": 1, "args": {"name": "Stream #13"}},
            {"ph": "M", "name": "thread_name", "pid": 3, "tid": 2, "args": {"name": "XLA Ops"}}]
    return {"traceEvents": meta + [{"ph": "X", "name": n, "dur": d, "pid": 3, "tid": 1, "ts": 0} for n, d in kernels]
            + [{"ph": "X", "name": "fusion.1", "dur": 5000, "pid": 3, "tid": 2, "ts": 0}]}  # a derived line


def test_kernels_by_kind_from_a_torch_and_a_jax_trace(tmp_path, capsys):
    store = tmp_path / "s"
    (store / "traces").mkdir(parents=True)
    torch_rec = F.run_record("tc", "gpt2", "amp-bf16", 16, "single", 1, 1, [480, 481, 479])
    torch_rec["config"]["compile"] = True
    jax_rec = F.run_record("jx", "gpt2", "amp-bf16", 16, "single", 1, 1, [450, 451, 449])
    jax_rec["config"]["framework"] = "jax"
    for rec in (torch_rec, jax_rec):
        rec["case_key"] = F._case_key(rec["config"])
        rec["trace"] = f"traces/{rec['id']}.json"
    # 3 profiled steps each: torch 6 ms of flash attention and 9 ms of gemm; JAX 12 ms of cuDNN
    # attention and 9 ms of gemm, plus 1.5 ms of fusions
    (store / "traces" / "tc.json").write_text(json.dumps(_trace(
        [("flash_fwd_kernel", 2000.0)] * 3 + [("sm90_xmma_gemm_bf16", 3000.0)] * 3, jax_style=False)))
    (store / "traces" / "jx.json").write_text(json.dumps(_trace(
        [("cudnn_generated_fort_native_sdpa", 4000.0)] * 3 + [("nvjet_gemm", 3000.0)] * 3
        + [("loop_add_fusion", 500.0)] * 3, jax_style=True)))
    F.write_store(store, [torch_rec, jax_rec, F.run_record("other", "bert-base", "amp-bf16", 8, "single", 1, 1, [1])])
    assert KERNELS.main([str(store), "--filter", "model=gpt2", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    a, b = doc["records"]
    assert (a["record_id"], b["record_id"]) == ("tc", "jx") and a["profiled_steps"] == b["profiled_steps"] == 3
    assert a["by_kind"]["attention"]["ms_per_step"] == pytest.approx(2.0)
    assert a["by_kind"]["matmul"] == {"ms_per_step": pytest.approx(3.0), "kernels_per_step": pytest.approx(1.0)}
    assert b["by_kind"]["attention"]["ms_per_step"] == pytest.approx(4.0)  # the derived XLA Ops line is not counted
    assert b["by_kind"]["other"]["ms_per_step"] == pytest.approx(0.5) and b["total_ms_per_step"] == pytest.approx(7.5)
    assert list(doc["difference_b_minus_a"]) == ["attention", "other", "matmul"]
    assert doc["difference_b_minus_a"]["attention"] == pytest.approx(2.0)
    assert KERNELS.main([str(store), "--filter", "model=gpt2"]) == 0
    md = capsys.readouterr().out
    assert "| attention | 2.00 | 1 | 4.00 | 1 | +2.00 |" in md and "Largest difference: **attention**" in md
    assert "gpt2 b16 amp-bf16 torch compiled single x1" in md and "gpt2 b16 amp-bf16 jax single x1" in md
    assert KERNELS.main([str(store), "--filter", "model=resnet50"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1  # one line: no trace to read
    # an archived store keeps its traces gzipped beside the names its records give
    for name in ("tc.json", "jx.json"):
        raw = store / "traces" / name
        raw.with_name(name + ".gz").write_bytes(gzip.compress(raw.read_bytes()))
        raw.unlink()
    assert KERNELS.main([str(store), "--filter", "model=gpt2"]) == 0
    assert capsys.readouterr().out == md


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
def smoke(tmp_path_factory, single_in_process):
    """One driver run of the CPU smoke suite (a tiny GPT-2 through dlscale and the bare loop). Its
    `single` case trains in this process (conftest.py ``single_in_process``: the same record, no
    torchrun start); the driver's bookkeeping and tables are what the tests below check."""
    out = tmp_path_factory.mktemp("bench") / "smoke"
    t = time.monotonic()
    with single_in_process():
        p = driver("smoke-cpu", "--out", out)
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
    q = driver("smoke-cpu", "--out", out, "--pack")
    assert q.returncode == 0, q.stderr[-2000:]
    assert "[bare 1/1] done" in q.stdout and "1 already ok" in q.stdout
    archive = out.with_name("smoke.tgz")
    assert archive.is_file() and not out.exists()
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "smoke/index.md" in names and "smoke/bare/results.jsonl" in names


# ----------------------------------------------------------------------------- the GPU suites, tiny, on the CPU

TINY_BATCH = {"resnet50": 2, "bert-base": 2, "gpt2": 2, "wide-deep": 16, "face": 4}
ON_CPU = {"device": "cpu", "threads": 1, "warmup": 1, "steps": 2, "repeats": 1, "time_limit": 240, "monitor": False,
          "collective_timeout": 60}


def tiny_suite(name: str, tmp: Path, edit=None) -> Path:
    """benchmarks/suites/NAME.yaml made tiny for the CPU: tiny flavours in fp32 at small batches, one
    repeat of 2 steps, data sets under ``tmp``; ``edit(data)`` changes the rest. Written to tmp/NAME.yaml."""
    data = yaml.safe_load((SUITES / f"{name}.yaml").read_text())
    data.update(ON_CPU)
    moved = lambda v: v.replace("/tmp/dlscale-data", str(tmp / "data")) if isinstance(v, str) else v  # noqa: E731

    def shrink(entry: dict) -> None:
        for k in ("steps", "warmup", "repeats", "time_limit"):
            entry.pop(k, None)
        if "model" in entry:
            entry.update(flavor="tiny", precision="fp32", batch_size=TINY_BATCH[entry["model"]])
        if "data" in entry:
            entry["data"] = moved(entry["data"])

    for block in data.get("matrix") or []:
        block.update(flavors=["tiny"], precisions=["fp32"], batch_sizes=[TINY_BATCH[block["models"][0]]])
    for entry in (data.get("cases") or []) + (data.get("bare") or []):
        shrink(entry)
    for spec in data.get("compare") or []:
        for side in (spec.get("a") or {}, spec.get("b") or {}):
            if "data" in side:
                side["data"] = [moved(v) for v in side["data"]] if isinstance(side["data"], list) else moved(side["data"])
    for cmd in data.get("commands") or []:
        for key in ("dlscale", "script"):
            if key in cmd:
                cmd[key] = [moved(a) for a in cmd[key]]
        if "creates" in cmd:
            cmd["creates"] = moved(cmd["creates"])
    if edit:
        edit(data)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def drive(path: Path, out: Path, *args: str) -> subprocess.CompletedProcess:
    return driver(path, "--out", out, *args)


def records(store: Path) -> list[dict]:
    return [json.loads(x) for f in sorted(store.glob("*.jsonl")) for x in f.read_text().splitlines()]


def _args(cmd: list, **values) -> list:
    """A command's argument list with the values after these options replaced."""
    out = list(cmd)
    for opt, v in values.items():
        out[out.index("--" + opt.replace("_", "-")) + 1] = v
    return out


@pytest.fixture(scope="module")
def data_run(drivers_ahead, tmp_path_factory):
    """data.yaml, tiny: the data sets made by its before commands, GPT-2 synthetic and from the token
    file, micro io after (an AHEAD suite); then a dry run of the same call here (everything done)."""
    tmp, p, seconds = _ahead_run(drivers_ahead, tmp_path_factory, "data")
    again = drive(tmp / "data.yaml", tmp / "out", "--filter", "model=gpt2", "--dry-run")
    return tmp, p, again, seconds


@pytest.mark.slow
def test_data_suite_makes_its_data_then_compares_real_with_synthetic(data_run):
    tmp, p, again, seconds = data_run
    out = tmp / "out"
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert (tmp / "data" / "imgs" / "dlscale-data.json").is_file() and (tmp / "data" / "tok" / "tokens.bin").is_file()
    state = json.loads((out / "commands.json").read_text())
    assert {k: v["status"] for k, v in state.items()} == {"images": "ok", "tokens": "ok", "micro-io": "ok"}
    recs = records(out / "store")
    runs = {r["config"]["data"]: r for r in recs if r["kind"] == "run"}
    assert set(runs) == {"synthetic", f"tokens:{tmp}/data/tok/tokens.bin:uint16"} and \
        all(r["status"] == "ok" for r in runs.values())
    assert [r["micro"] for r in recs if r["kind"] == "micro"] == ["io"]
    (case,) = json.loads((out / "compare-vs-synthetic.json").read_text())["cases"]
    syn, tok = runs["synthetic"], runs[f"tokens:{tmp}/data/tok/tokens.bin:uint16"]
    med = lambda r: r["summary"]["samples_per_s"]["median"]  # noqa: E731
    assert case["record_a"] == syn["id"] and case["record_b"] == tok["id"]
    assert case["ratio"] == pytest.approx(med(tok) / med(syn))
    assert case["b_data_wait_pct"] == pytest.approx(tok["data"]["data_wait_share_max"] * 100)
    per_core = tok["data"]["samples_per_loader_core_s"]  # None when the loader's CPU time rounds to 0
    assert case["b_loader_cores_for_a"] == (pytest.approx(med(syn) / per_core) if per_core else None)
    index = (out / "index.md").read_text()
    assert "| [compare-vs-synthetic.md](compare-vs-synthetic.md) |" in index and "not made" not in index
    assert "- before commands: 2, 2 ran" in index and "- after commands: 1, 1 ran" in index
    assert again.returncode == 0, again.stderr[-2000:]
    assert "before  done  images" in again.stdout and "after  done  micro-io" in again.stdout
    print(f"data suite, tiny: {seconds:.1f} s")


@pytest.fixture(scope="module")
def mp_run(tmp_path_factory, single_in_process):
    """mp.yaml, tiny, wide-deep only: single and embedding-shard table/row, the plain loop (loop mp),
    and its interleaved command (the three cases beside the plain loop in one process), tiny too.
    The three cases (one process each: embedding-shard at degree 1) train in this process
    (conftest.py ``single_in_process``); the plain loop and the command are processes."""
    tmp = tmp_path_factory.mktemp("mp")

    def one_interleaved(d):
        d["commands"] = [c for c in d["commands"] if c["name"] == "interleaved"]
        d["commands"][0]["script"] += ["--flavor", "tiny", "--batch-size", "64", "--device", "cpu", "--warmup", "2",
                                       "--steps", "3", "--rounds", "2"]

    t = time.monotonic()
    with single_in_process():
        p = drive(tiny_suite("mp", tmp, one_interleaved), tmp / "out", "--filter", "model=wide-deep")
    return tmp / "out", p, time.monotonic() - t


@pytest.mark.slow
def test_mp_suite_measures_the_sharded_paths_against_the_plain_loop(mp_run):
    out, p, seconds = mp_run
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    (bare,) = records(out / "bare")
    runs = {(r["config"]["strategy"], r["config"]["strategy_options"].get("shard")): r for r in records(out / "store")}
    assert bare["status"] == "ok" and bare["bare"] == {"script": "benchmarks/bare_mp.py", "variant": {}}
    assert bare["case_key"] == runs[("single", None)]["case_key"] and bare["summary"]["step_ms_p50"] > 0
    assert bare["command"].startswith("python benchmarks/bare_mp.py --model wide-deep --flavor tiny")
    doc = json.loads((out / "compare-sharded-vs-plain.json").read_text())
    got = {c["record_b"]: c for c in doc["cases"]}
    assert set(got) == {r["id"] for r in runs.values()} and {c["record_a"] for c in got.values()} == {bare["id"]}
    for r in runs.values():
        assert got[r["id"]]["ratio"] == pytest.approx(r["summary"]["samples_per_s"]["median"]
                                                      / bare["summary"]["samples_per_s"]["median"])
    assert "| [vs-bare.md](vs-bare.md) |" in (out / "index.md").read_text()
    # the interleaved A/B: every side built from one seed and batch computes the same losses
    assert json.loads((out / "commands.json").read_text())["interleaved"]["status"] == "ok"
    line = next(ln for ln in (out / "commands.log").read_text().splitlines() if ln.startswith('{"bench": "mp_interleaved"'))
    ab = json.loads(line)
    assert set(ab["cases"]) == {"single", "embedding-shard shard=table", "embedding-shard shard=row"}
    assert len(ab["rounds"]) == 2 and all(c["ratio_median"] > 0 for c in ab["cases"].values())
    for case in ab["cases"].values():
        for key in ("first_loss_no_dropout", "second_loss"):
            assert case[key] == pytest.approx(ab["plain_loss"][key], rel=1e-6)
    print(f"mp suite, tiny: {seconds:.1f} s")


def _perfmodel_edit(d):
    d["matrix"] = [b for b in d["matrix"] if b["models"] == ["gpt2"]]
    d["matrix"][0]["devices"] = [1, 2]
    d["commands"] = [c for c in d["commands"] if c["name"] in ("comm-2", "validate")]
    d["commands"][0]["dlscale"] += ["--max-bytes", "1M", "--factor", 16, "--device", "cpu"]


def _jax_edit(d):  # no torch.compile on this CPU: torch eager carries the torch profile instead
    d["cases"] = [c for c in d["cases"] if c["model"] == "gpt2" and not c.get("compile")]
    d["cases"][0]["profile"] = True


def _data_edit(d):
    images, tokens, io = d["commands"]
    images["dlscale"] = _args(images["dlscale"], size=16, classes=2)
    tokens["dlscale"] = _args(tokens["dlscale"], size="20k", vocab=500)
    io["dlscale"] = _args(io["dlscale"], seconds=0.3) + ["--flavor", "tiny", "--workers", "1", "--batch-size", 4,
                                                         "--device", "cpu"]


# tiny suites whose driver runs start as processes with the module:
# (suite, its edit, the driver's further arguments, the test that reads it)
AHEAD = [("data", _data_edit, ("--filter", "model=gpt2"),
          "test_data_suite_makes_its_data_then_compares_real_with_synthetic"),
         ("perfmodel", _perfmodel_edit, (), "test_perfmodel_suite_measures_the_pair_and_validates_the_model_on_it"),
         ("jax", _jax_edit, (), "test_jax_suite_runs_the_jax_yardstick_and_the_kernel_table")]


@pytest.fixture(scope="module", autouse=True)
def drivers_ahead(request, tmp_path_factory):
    """The AHEAD suites whose tests are selected, run one after the other by one ``benchmarks/run.py``
    process started when the module starts (tests/tools/driver_here.py --many: one interpreter's
    imports for all of them, each run with its own output files and exit code): they run beside this
    process's own driver runs (smoke, mp), all mostly one core's work; their one-process torch cases
    train in the driver's process (as ``single_in_process`` does here). name -> (its folder, the
    process, the monotonic start)."""
    selected = {i.name for i in request.session.items if getattr(i, "module", None) is request.module}
    started, plan = {}, []
    for name, edit, args, test in AHEAD:
        if test in selected and (name != "jax" or HAVE_JAX):
            tmp = tmp_path_factory.mktemp(name)
            path = tiny_suite(name, tmp, edit)
            plan.append({"argv": [str(path), "--out", str(tmp / "out"), *args], "stdout": str(tmp / "driver.out"),
                         "stderr": str(tmp / "driver.err"), "rc": str(tmp / "driver.rc")})
            started[name] = tmp
    proc = None
    if plan:
        plan_file = tmp_path_factory.mktemp("ahead") / "plan.json"
        plan_file.write_text(json.dumps(plan))
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "tools" / "driver_here.py"), "--many",
                                 str(plan_file)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    t = time.monotonic()
    yield {name: (tmp, proc, t) for name, tmp in started.items()}
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def _ahead_run(drivers_ahead, tmp_path_factory, name: str):
    """(its folder, the driver's CompletedProcess, seconds) of the AHEAD suite ``name`` (its results in
    FOLDER/out); run here (in this process) when it was not started with the module."""
    if name not in drivers_ahead:
        tmp = tmp_path_factory.mktemp(name)
        edit, args = next((e, a) for n, e, a, _ in AHEAD if n == name)
        t = time.monotonic()
        p = drive(tiny_suite(name, tmp, edit), tmp / "out", *args)
        return tmp, p, time.monotonic() - t
    tmp, proc, t = drivers_ahead[name]
    rc_file, deadline = tmp / "driver.rc", time.monotonic() + 600
    while not rc_file.exists():  # the runs before it end first; the process ends after the last
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the AHEAD driver process ended (or timed out) before the {name} suite's run ended: "
                        f"{(proc.stderr.read() if proc.poll() is not None else '')[-2000:]}", pytrace=False)
        time.sleep(0.1)
    p = subprocess.CompletedProcess(proc.args, int(rc_file.read_text()), (tmp / "driver.out").read_text(),
                                    (tmp / "driver.err").read_text())
    return tmp, p, time.monotonic() - t


@pytest.fixture(scope="module")
def perfmodel_run(drivers_ahead, tmp_path_factory):
    """perfmodel.yaml, tiny: GPT-2 on 1 and 2 processes, the 2-rank all-reduce before, predict --validate."""
    tmp, p, seconds = _ahead_run(drivers_ahead, tmp_path_factory, "perfmodel")
    return tmp / "out", p, seconds


@pytest.mark.slow
def test_perfmodel_suite_measures_the_pair_and_validates_the_model_on_it(perfmodel_run):
    out, p, seconds = perfmodel_run
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    recs = records(out / "store")
    assert sorted((r["kind"], r.get("world_size")) for r in recs if r["kind"] == "run") == [("run", 1), ("run", 2)]
    assert [r["micro"] for r in recs if r["kind"] == "micro"] == ["comm"]
    ddp = next(r for r in recs if r.get("world_size") == 2)
    (row,) = json.loads((out / "validate.json").read_text())["rows"]  # the 2-process record from the 1-process one
    assert ddp["id"].startswith(row["record"]) and (row["devices"], row["protocol"]) == (2, "from-1-gpu")
    assert row["measured"] == pytest.approx(ddp["summary"]["samples_per_s"]["median"])
    index = (out / "index.md").read_text()
    assert "`dlscale predict --validate store --format md > validate.md`" in index and "not made" not in index
    print(f"perfmodel suite, tiny: {seconds:.1f} s")


@pytest.fixture(scope="module")
def jax_run(drivers_ahead, tmp_path_factory):
    """jax.yaml, tiny, GPT-2 only: torch eager (profiled) and JAX (profiled), the JAX bare loop, kernels."""
    tmp, p, seconds = _ahead_run(drivers_ahead, tmp_path_factory, "jax")
    return tmp / "out", p, seconds


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_JAX, reason="JAX is not installed (pip install -e '.[jax]')")
def test_jax_suite_runs_the_jax_yardstick_and_the_kernel_table(jax_run):
    out, p, seconds = jax_run
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    (bare,) = records(out / "bare")
    runs = {r["config"]["framework"]: r for r in records(out / "store")}
    assert bare["status"] == "ok" and bare["bare"]["script"] == "benchmarks/bare_loop_jax.py"
    assert bare["case_key"] == runs["jax"]["case_key"] and bare["model"]["params"] == runs["jax"]["model"]["params"]
    (case,) = [c for c in json.loads((out / "vs-bare.json").read_text())["cases"] if c["record_a"]]
    assert case["record_b"] == runs["jax"]["id"] and case["ratio"] == pytest.approx(
        runs["jax"]["summary"]["samples_per_s"]["median"] / bare["summary"]["samples_per_s"]["median"])
    kernels = json.loads((out / "kernels.json").read_text())
    assert [r["record_id"] for r in kernels["records"]] == [runs["torch"]["id"], runs["jax"]["id"]]
    # a CPU trace has no device timeline: no kernel kinds, so no kernel table in the page
    assert not any(r["by_kind"] for r in kernels["records"]) and "| kind |" not in (out / "kernels.md").read_text()
    print(f"jax suite, tiny: {seconds:.1f} s")


@pytest.mark.parametrize("cases, expect", [
    (["embedding-shard:shard=diagonal"], "option shard must be one of row, table, got 'diagonal'"),
    (["nonsense"], "unknown strategy 'nonsense'"),
    (["single", "embedding-shard:dim=4"], "the cases size the model differently"),
])
def test_mp_interleaved_refuses_bad_cases_before_building(monkeypatch, capsys, cases, expect):
    """benchmarks/mp_interleaved.py: a bad case is one line and exit 2, before any model or process group."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    mod = _load("bench_mp_interleaved", ROOT / "benchmarks" / "mp_interleaved.py")
    monkeypatch.setattr(mod.dist, "init_process_group", lambda *a, **k: pytest.fail("a process group was started"))
    argv = ["--flavor", "tiny", "--device", "cpu"] + [x for c in cases for x in ("--case", c)]
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and expect in err[0], err


# ----------------------------------------------------------------------------- torchtitan's launcher

def _titan(monkeypatch, release):
    mod = _load("bench_titan_llama", ROOT / "benchmarks" / "titan_llama.py")
    monkeypatch.setattr(mod, "titan_release", lambda: release)
    return mod


@pytest.mark.parametrize("release, argv", [
    ((0, 2), ["--batch-size", "0"]),
    ((0, 2), ["--cuda-graphs"]),  # 0.2 has no CUDA graphs
    ((0, 3), ["--flavor", "70b"]),
    (None, []),  # torchtitan not installed
])
def test_titan_launcher_refuses_bad_input_in_one_line(monkeypatch, capsys, tmp_path, release, argv):
    mod = _titan(monkeypatch, release)
    with pytest.raises(SystemExit) as e:
        mod.main([*argv, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and err[-1].startswith("titan_llama.py: error:")
    assert not (tmp_path / "o").exists()


def test_titan_launcher_speaks_each_releases_options(monkeypatch, tmp_path):
    data = tmp_path / "d" / "data.json"
    v02 = _titan(monkeypatch, (0, 2))
    args, rest = v02.parse_args(["--flavor", "1b", "--compile", "--out", str(tmp_path), "--", "--x.y", "1"])
    argv = v02.titan_argv(args, data, rest)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--model.flavor"] == "1B" and pairs["--training.dataset-path"] == str(data.parent)
    assert pairs["--activation-checkpoint.mode"] == "none" and "--compile.enable" in argv
    assert argv[-2:] == ["--x.y", "1"] and not any("cuda-graphs" in a for a in argv)
    v03 = _titan(monkeypatch, (0, 3))
    args, rest = v03.parse_args(["--flavor", "8b", "--no-cuda-graphs", "--activation-checkpointing", "selective",
                                 "--out", str(tmp_path)])
    argv = v03.titan_argv(args, data, rest)
    pairs = dict(zip(argv, argv[1:]))
    assert pairs["--config"] == "llama_8b" and callable(getattr(v03, pairs["--config"]))
    assert "--training.disable-cuda-graphs" in argv and "--compile.no-enable" in argv
    assert argv[-1] == "activation-checkpoint:selective"  # tyro: the subcommand after the options


def test_titan_text_is_long_documents_written_once(monkeypatch, tmp_path):
    mod = _titan(monkeypatch, (0, 2))
    path = mod.write_text(tmp_path / "t", rows=mod.ROWS_PER_DOC * 2 + 1, seq_len=16)
    docs = [json.loads(line)["text"] for line in path.read_text().splitlines()]
    assert len(docs) == 4  # three documents hold the rows, one more to spare
    per_doc = mod.ROWS_PER_DOC * 16 / mod.TOKENS_PER_WORD
    assert all(len(d.split()) >= per_doc for d in docs) and len(set(docs)) == len(docs)
    before = path.stat().st_mtime_ns
    assert mod.write_text(tmp_path / "t", rows=1, seq_len=16) == path and path.stat().st_mtime_ns == before
