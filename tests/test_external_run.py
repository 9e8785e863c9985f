"""`dlscale run --command`: bad input before anything starts, and real commands under the machinery."""
import json
import os
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.schema import validate_record
from dlscale.results.store import ResultStore
from helpers_cli import dlscale_many

TOOLS = Path(__file__).parent / "tools"
PY = shlex.quote(sys.executable)


def run(*argv):
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code


def records(store):
    return ResultStore(store).load().records


# ----------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("argv,fragment", [
    (["--command", "python x.py"], "--command needs --parser NAME"),
    (["--command", "python x.py", "--parser", "regex", "--precision", "fp32", "--unit", "img"], "needs --metric"),
    (["--command", "", "--parser", "regex"], "--command is empty"),
    (["--command", "python 'x.py", "--parser", "regex"], "cannot be split into arguments"),
    (["--command", "no-such-program-xyz", "--parser", "hf-trainer"], "program 'no-such-program-xyz' is not on PATH"),
    (["--command", "python x.py", "--parser", "regex", "--unit", "img"], "needs --metric"),
    (["--command", "python x.py", "--parser", "regex", "--unit", "img", "--metric", "rate ([0-9]+)"],
     "has no named group 'value'"),
    (["--command", "python x.py", "--parser", "regex", "--unit", "img", "--metric", "rate (?P<value>[0-9]+"],
     "is not a valid regular expression"),
    (["--command", "python x.py", "--parser", "regex", "--metric", "(?P<value>[0-9]+)"], "needs --unit"),
    (["--command", "python x.py", "--parser", "megatron", "--metric", "(?P<value>[0-9]+)"],
     "--metric is the regex parser's"),
    (["--command", "python x.py", "--parser", "megatron", "--breakdown"], "--breakdown does not apply to --command"),
    (["--command", "python x.py", "--parser", "megatron", "--flavor", "tiny"], "--flavor does not apply"),
    (["--command", "python x.py", "--parser", "megatron", "--data-decoder", "torchvision"],
     "--data-decoder does not apply"),
    (["--command", "python x.py", "--parser", "megatron", "--batch-size", "max"], "--batch-size max does not apply"),
    (["--command", "python x.py", "--parser", "megatron", "--precision", "fp4"], "unknown precision 'fp4'"),
    (["--command", "python x.py", "--parser", "megatron", "--cwd", "/no/such/dir"], "is not a directory"),
    (["--command", "python x.py", "--parser", "hf-trainer", "-o", "logging_steps=0"], "logging_steps must be"),
    (["--parser", "regex"], "--parser applies to --command runs only"),
])
def test_bad_input_one_line_exit_2_nothing_started(tmp_path, capsys, argv, fragment):
    store = tmp_path / "st"
    if "--command" in argv and "--precision" not in argv:
        argv = [*argv, "--precision", "fp32"]  # the workload's description; its own checks come first
    code = run("run", "--store", str(store), *argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("dlscale: error:") and fragment in err, err
    assert not (store / "results.jsonl").exists() or records(store) == []


def test_help_names_the_external_options(capsys):
    assert run("run", "--help") == 0
    out = capsys.readouterr().out
    for opt in ("--command CMD", "--parser", "--metric REGEX", "--unit", "--seq-len", "--cwd DIR", "--stack NAME"):
        assert opt in out


# ----------------------------------------------------------------------------- real commands

def py(code: str) -> str:
    return f"{PY} -c {shlex.quote(code)}"


@pytest.mark.slow
def test_failures_are_recorded_with_status_and_exit_code(tmp_path, capsys):
    store = tmp_path / "st"
    base = ["run", "--store", str(store), "--parser", "regex", "--metric", r"rate: (?P<value>[0-9.]+)", "--unit",
            "img", "--precision", "fp32", "--warmup", "1", "--steps", "3", "--repeats", "2", "--no-monitor", "--device",
            "cpu"]
    # exit 1 without a window: failed (exit 5), the last line quoted
    assert run(*base, "--command", py("import sys; print('loading'); print('boom', file=sys.stderr); sys.exit(1)")) == 5
    # an out-of-memory message: oom (exit 3)
    assert run(*base, "--command", py("import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to "
                                      "allocate 2.00 GiB'); sys.exit(1)")) == 3
    # exit 0 but no throughput lines: failed, the parser's one-line reason
    assert run(*base, "--command", py("print('done')")) == 5
    # the window logged in full, then a crash on the way out: ok, with a warning; each repeat a fresh process
    assert run(*base, "--command", py("import os, sys\nprint('pid', os.getpid())\nfor i in range(6): "
                                      "print(f'rate: {100 + i}')\nsys.exit(3)")) == 0
    recs = records(store)
    assert [r["status"] for r in recs] == ["failed", "oom", "failed", "ok"]
    # the exit code and the command's last output (its stderr's line, after the stdout one)
    failed = recs[0]["error"]
    assert re.findall(r"\d+", failed) == ["1"] and failed.endswith("boom") and "loading" not in failed, failed
    assert len(recs[0]["repeats"]) == 1
    assert "CUDA out of memory" in recs[1]["error"]
    assert recs[2]["error"].startswith("regex ") and "exited" not in recs[2]["error"]  # the parser is the cause
    warned = recs[3]["repeats"][0]["warning"]  # the exit code, and that the window came before it
    assert re.findall(r"\d+", warned) == ["3"] and "window" in warned and "\n" not in warned, warned
    pids = {(store / r["log"]).read_text().split("pid ", 1)[1].split()[0] for r in recs[3]["repeats"]}
    assert len(recs[3]["repeats"]) == 2 and len(pids) == 2
    assert recs[3]["summary"]["samples_per_s"]["median"] == pytest.approx(3 / (1 / 101 + 1 / 102 + 1 / 103))
    assert all(validate_record(r) is None for r in recs)
    capsys.readouterr()


@pytest.mark.slow
def test_an_interrupted_external_run_keeps_its_finished_repeats(tmp_path, capsys, monkeypatch):
    """A signal during the second repeat: the first repeat is stored (status interrupted), exit 130."""
    from dlscale.external import measure

    real = measure.ExternalSpawner.__call__

    def second_interrupted(self, i):
        if i == 1:
            raise KeyboardInterrupt("SIGTERM")
        return real(self, i)

    monkeypatch.setattr(measure.ExternalSpawner, "__call__", second_interrupted)
    store = tmp_path / "st"
    assert run("run", "--store", str(store), "--parser", "regex", "--metric", r"rate: (?P<value>[0-9.]+)", "--unit",
               "img", "--precision", "fp32", "--warmup", "1", "--steps", "3", "--repeats", "3", "--no-monitor",
               "--device", "cpu", "--command", py("for i in range(6): print(f'rate: {100 + i}')")) == 130
    err = capsys.readouterr().err
    said = [ln for ln in err.splitlines() if ln.startswith("dlscale:")]
    assert len(said) == 1 and "SIGTERM" in said[0] and str(store) in said[0], err  # the signal, where the repeat is
    (rec,) = records(store)
    assert rec["kind"] == "external" and rec["status"] == "interrupted" and len(rec["repeats"]) == 1
    assert re.search(r"\b2/3\b", rec["error"]) and rec["summary"]["samples_per_s"]["n"] == 1  # repeat 2 of 3
    assert validate_record(rec) is None


@pytest.mark.slow
def test_time_limit_kills_the_whole_tree(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "print('rate: 1', flush=True)\n"
            "time.sleep(120)\n")
    t = time.monotonic()
    assert run("run", "--store", str(tmp_path / "st"), "--command", py(code), "--parser", "regex", "--metric",
               r"rate: (?P<value>[0-9.]+)", "--unit", "img", "--precision", "fp32", "--time-limit", "3", "--repeats", "1",
               "--no-monitor", "--device", "cpu") == 4
    assert time.monotonic() - t < 60
    (rec,) = records(tmp_path / "st")
    assert rec["status"] == "timeout" and rec["error"], rec["error"]

    pid = int(pidfile.read_text())
    for _ in range(50):  # the grandchild went with its session
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {pid} survived the time limit")


@pytest.fixture(scope="module")
def torchrun_store(tmp_path_factory, single_in_process):
    """One plain torchrun script (2 worker processes) under --command beside a native tiny run; the two
    at the same time (tests/helpers_cli.py), into one store. The native run is a `single` case,
    trained in this process (conftest.py ``single_in_process``): the report's row beside the
    external one is what it is for."""
    store = tmp_path_factory.mktemp("ext") / "store"
    cmd = (f"{PY} -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node 2 "
           f"{shlex.quote(str(TOOLS / 'torchrun_regex_train.py'))} --steps 12 --batch-size 4")
    with single_in_process():
        done = dlscale_many([
            ["run", "--command", cmd, "--parser", "regex", "--metric", r"samples/sec: (?P<value>[0-9.]+)",
             "--unit", "seq", "--model", "gpt2", "--batch-size", "4", "--nproc-per-node", "2", "--precision",
             "fp32", "--warmup", "4", "--steps", "6", "--repeats", "1", "--device", "cpu", "--stack",
             "plain torchrun", "--sample-interval", "0.2", "--store", str(store)],
            ["run", "--model", "gpt2", "--flavor", "tiny", "--batch-size", "4", "--precision", "fp32", "--device",
             "cpu", "--repeats", "1", "--warmup", "2", "--steps", "3", "--nproc-per-node", "1", "--store", str(store)]])
    for p in done:
        if isinstance(p, BaseException):
            raise p
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return store


@pytest.mark.slow
def test_external_torchrun_record_with_logs_and_series(torchrun_store):
    ext = [r for r in records(torchrun_store) if r["kind"] == "external"]
    assert len(ext) == 1
    rec = ext[0]
    assert rec["status"] == "ok" and rec["config"]["command"][1:3] == ["-m", "torch.distributed.run"]
    assert rec["config"]["framework"] == "plain torchrun" and rec["world_size"] == 2 and rec["global_batch"] == 8
    for rep in rec["repeats"]:
        assert "world 2" in (torchrun_store / rep["log"]).read_text()
        assert rep["parse"]["skipped_steps"] == 4 and rep["parse"]["window_steps"] == 6
        assert all((torchrun_store / s).is_file() for s in rep["series"])
        # sampled over the parsed window (a window shorter than the interval has no sample, and says so)
        u = rep["utilisation"]
        assert u["scope"] == "window" and (u["n_samples"] >= 1 or "no samples between" in u["sampling_error"])
        assert len(rep["per_step_samples_per_s"]) == 6 and rep["step_times_ms"]
    s = rec["summary"]["samples_per_s"]
    # --model gpt2 names the registered model, whose 1024 tokens are only assumed: no tokens/s from them
    assert s["n"] == 1 and s["median"] > 0 and rec["summary"]["tokens_per_s"] is None
    assert rec["model"]["seq_len_source"] == "assumed"
    assert rec["env"]["torch"] and rec["external"]["parser"] == "regex"


@pytest.mark.slow
def test_schema_holds_for_native_and_external_records(torchrun_store):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) not installed")
    from dlscale.schema import record_schema

    recs = records(torchrun_store)
    assert {r["kind"] for r in recs} == {"run", "external"}
    v = jsonschema.Draft202012Validator(record_schema())
    for r in recs:
        assert validate_record(r) is None
        assert list(v.iter_errors(r)) == []


@pytest.mark.slow
def test_report_puts_external_beside_native_and_marks_it(torchrun_store, tmp_path):
    out = tmp_path / "r.md"
    assert run("report", str(torchrun_store), "--format", "md", "--output", str(out)) == 0
    md = out.read_text()
    assert "### external: plain torchrun (parser regex) — gpt2" in md
    assert "## Stacks side by side" in md
    stacks = md.split("## Stacks side by side")[1].split("\n## ")[0]
    assert "| dlscale single eager | measured |" in stacks and "| plain torchrun | external |" in stacks
    out = tmp_path / "r.json"
    assert run("report", str(torchrun_store), "--format", "json", "--output", str(out)) == 0
    rep = json.loads(out.read_text())
    assert {g["kind"] for g in rep["groups"].values()} == {"run", "external"}
    assert {r["kind"] for r in rep["stacks"][0]["rows"]} == {"measured", "external"}


def test_a_model_of_sizes_is_free_text_and_one_of_full_is_registered():
    """llama's flavours are sizes (no ``full``): the case builds, and dlscale assumes no shape for it."""
    from dlscale.external.case import ExternalCase

    sized = ExternalCase(command=["true"], parser="torchtitan", model="llama", batch_size=4, precision="amp-bf16",
                         seq_len=2048)
    assert sized.registered_spec() is None
    assert sized.workload_seq_len() == 2048
    full = ExternalCase(command=["true"], parser="hf-trainer", model="gpt2", batch_size=4, precision="amp-bf16")
    assert full.registered_spec() is not None and full.registered_spec().flavor == "full"
