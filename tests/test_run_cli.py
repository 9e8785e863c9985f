"""`dlscale run` end to end on the CPU: real torchrun, real gloo process groups, tiny models.

The cases in CASES run in this process (tests/helpers_cli.py), once per module, those the selected
tests name (``@cases``) two at a time, all of them when the first is read; the unwritable-store case
runs on its own (in this process too: it must fail before any process starts). A rank killed at the
time limit: tests/test_faults_procs.py.
"""
import json
import re
import time

import pytest

import helpers_cli
from dlscale.results.store import ResultStore
from helpers_cli import RunsAhead, cases

FAST = ["--flavor", "tiny", "--precision", "fp32", "--device", "cpu", "--repeats", "1"]
_TRAIN = ["--warmup", "3", "--steps", "2", "--json"]
# name -> `dlscale run` arguments (the store is the module's folder of that name)
CASES = {
    # 1 process with batch 8: the reference of the DDP runs (3 warm-up + 2 timed steps); DDP's
    # gradient averaging does not depend on the model (other models: tests/test_strategies.py)
    "single-gpt2": ["--model", "gpt2", *FAST, *_TRAIN, "--strategy", "single", "--batch-size", "8"],
    "ddp-gpt2": ["--model", "gpt2", *FAST, *_TRAIN, "--strategy", "ddp", "--nproc-per-node", "2", "--batch-size", "4"],
    # the hook rounds every gradient bucket to fp16 at any rank count: one rank, trained in this process
    "ddp-fp16-hook": ["--model", "gpt2", *FAST, *_TRAIN, "--strategy", "ddp", "--nproc-per-node", "1",
                      "--batch-size", "8", "-o", "comm_hook=fp16", "-o", "static_graph=false"],
    "repeats": ["--model", "resnet50", "--flavor", "tiny", "--precision", "fp32", "--device", "cpu",
                "--strategy", "single", "--batch-size", "4", "--grad-accum", "2", "--clip-grad-norm", "1.0",
                "--warmup", "1", "--steps", "3", "--repeats", "2"],
    # a rank's failure becomes the record's status and exit code by the same code at any rank count: one
    # process, trained in this process (a real out-of-memory of two ranks: tests/test_faults_procs.py)
    "oom": ["--model", "gpt2", *FAST, "--strategy", "single", "--batch-size", "2",
            "--warmup", "2", "--steps", "2", "--inject-failure", "oom@1:0"],
    "crash": ["--model", "gpt2", *FAST, "--strategy", "single", "--batch-size", "2",
              "--warmup", "1", "--steps", "2", "--inject-failure", "crash@2:0", "--repeats", "3"],
}
# the costliest first in the run-ahead batch (the DDP cases)
COST = {"repeats": 0, "ddp-fp16-hook": 0, "single-gpt2": 0, "oom": 0, "crash": 0}


def dlscale(*args, env=None):
    """``dlscale ARGS`` in this process (tests/helpers_cli.py); its torchrun and workers are real."""
    return helpers_cli.dlscale(*args, env=env)


def one_record(store_dir):
    recs = ResultStore(store_dir).load().records
    assert len(recs) == 1, recs
    return recs[0]


def _choices(kind: str) -> tuple[str, ...]:
    from dlscale.models import model_names
    from dlscale.train.precision import PRECISIONS
    from dlscale.strategies import strategy_names

    return {"model": tuple(model_names()), "strategy": tuple(strategy_names()), "precision": tuple(PRECISIONS)}[kind]


# argv -> what the one line must name: the option or key and the value at fault, and what is allowed
# where there is a list (a name in brackets: every choice of that registry)
@pytest.mark.parametrize("argv,named", [
    (["--model", "resnet51"], ("resnet51", "[model]")),
    (["--strategy", "zero9"], ("zero9", "[strategy]")),
    (["--precision", "fp4"], ("fp4", "[precision]")),
    (["--batch-size", "0"], ("batch-size", "1")),
    (["--steps", "0"], ("steps", "1")),
    (["--grad-accum", "0"], ("grad-accum", "1")),
    (["--strategy", "single", "--nproc-per-node", "2"], ("single", "2")),
    (["--device", "cuda"], ("CUDA",)),
    (["--option", "bucket_cap"], ("--option", "KEY=VALUE")),
    (["--strategy", "ddp", "-o", "bucket=3"], ("ddp", "bucket")),
    (["--strategy", "ddp", "-o", "comm_hook=int8"], ("comm_hook", "int8", "none", "bf16", "fp16")),
    (["--strategy", "ddp", "-o", "bucket_cap_mb=0"], ("bucket_cap_mb", "0")),
    (["--strategy", "ddp", "-o", "static_graph=maybe"], ("static_graph", "maybe", "true", "false")),
    (["--strategy", "ddp", "-o", "compiled_autograd=true"], ("compiled_autograd", "--compile")),
    (["--strategy", "ddp", "-o", "compiled_autograd=true", "-o", "comm_hook=fp16", "--compile"],
     ("compiled_autograd", "comm_hook=fp16")),
    (["--strategy", "ddp", "-o", "compiled_autograd=true", "--compile", "--compile-mode", "reduce-overhead"],
     ("compiled_autograd", "reduce-overhead")),
])
def test_bad_input_is_one_line_exit_2_and_nothing_stored(tmp_path, capsys, argv, named):
    from dlscale.cli import main

    store = tmp_path / "store"
    try:
        code = main(["run", "--flavor", "tiny", "--store", str(store), *argv])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlscale: error:"), err
    for word in named:
        for want in (_choices(word[1:-1]) if word.startswith("[") else (word,)):
            assert want in lines[0], (want, lines[0])
    assert "Traceback" not in out + err
    assert not (store / "results.jsonl").exists() or ResultStore(store).load().records == []


@pytest.mark.slow
def test_unwritable_store_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    t = time.monotonic()
    p = dlscale("run", "--model", "gpt2", *FAST, "--store", str(blocker / "st"))  # in this process: no torch import
    assert p.returncode == 2 and "not writable" in p.stderr
    assert "rank 0" not in p.stdout  # no worker was started
    assert time.monotonic() - t < 30


def test_help_lists_every_option_with_default(capsys):
    from dlscale.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--model", "--strategy", "--nproc-per-node", "--batch-size", "--precision", "--compile",
                "--clip-grad-norm", "--grad-accum", "--warmup", "--steps", "--repeats", "--time-limit",
                "--store"):
        assert opt in out
    assert "(default: 20)" in out and "(default: 100)" in out and "(default: 5)" in out


@pytest.fixture(scope="module")
def case(tmp_path_factory, request, single_in_process):
    """name -> (the finished `dlscale run` of CASES[name], its store), run once per module, all the
    selected tests' cases at once when the first is read. The `single` cases (the references of
    the DDP runs, "repeats") train in this process (conftest.py ``single_in_process``: the same
    `dlscale run`, record and store, no torchrun); every DDP case starts its torchrun and workers.
    """
    root = tmp_path_factory.mktemp("run-cli")
    args = lambda name: ["run", *CASES[name], "--store", str(root / name)]  # noqa: E731
    ahead, done = RunsAhead(args, ahead=None, cost=lambda name: COST.get(name, 2)), {}
    ahead.start(request)

    def get(name: str):
        if name not in done:
            done[name] = (ahead.take(name) or dlscale(*args(name)), root / name)
        return done[name]

    with single_in_process():
        yield get
    ahead.finish(request)


@pytest.mark.slow
@pytest.mark.parametrize("model", [pytest.param(m, marks=cases(f"single-{m}", f"ddp-{m}")) for m in ("gpt2",)])
def test_ddp_matches_single_process_on_same_global_batch(case, model):
    """2-process gloo DDP with batch 4 each trains exactly like one process with batch 8."""
    (single, single_store), (ddp, ddp_store) = case(f"single-{model}"), case(f"ddp-{model}")
    assert single.returncode == 0, single.stderr[-2000:]
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    rs, rd = one_record(single_store), one_record(ddp_store)
    # 3 warm-up + 2 timed optimizer steps, then the loss of the trained model on the same data
    ls, ld = rs["repeats"][0]["loss_after"], rd["repeats"][0]["loss_after"]
    assert ls is not None and ld == pytest.approx(ls, rel=1e-4)
    # the first step's loss (before any update) averages the same samples
    assert rd["repeats"][0]["warmup_losses"][0] == pytest.approx(rs["repeats"][0]["warmup_losses"][0], rel=0.05)

    # the record of the DDP run holds what DESIGN.md requires
    assert rd["status"] == "ok" and rd["error"] is None
    assert rd["world_size"] == 2 and rd["global_batch"] == 8
    assert [r["rank"] for r in rd["ranks"]] == [0, 1]
    assert all(r["device"] == "cpu" and r["host"] for r in rd["ranks"])
    env = rd["env"]
    for key in ("dlscale", "git_sha", "torch", "cuda", "nccl", "driver", "gpus", "host", "cpu", "topology",
                "env_vars", "mps_daemon"):
        assert key in env
    rep = rd["repeats"][0]
    assert len(rep["step_times_ms"]) == 2 and all(t > 0 for t in rep["step_times_ms"])
    assert rep["samples_per_s"] == pytest.approx(2 * 8 / rep["window_s"])
    s = rd["summary"]
    assert s["samples_per_s"]["median"] == rep["samples_per_s"]
    assert s["mfu"] is None and s["peak_flops"] is None  # no peak known for a CPU
    assert s["tokens_per_s"] == pytest.approx(s["samples_per_s"]["median"] * rd["model"]["seq_len"])
    assert rd["model"]["params"] > 0 and rd["model"]["flops_per_sample"] > 0
    assert rd["config"]["model"] == model and rd["case_key"]


@pytest.mark.slow
@cases("single-gpt2", "ddp-fp16-hook")
def test_ddp_fp16_comm_hook_trains_like_single(case):
    """-o comm_hook=fp16 all-reduces in fp16: same training within fp16 rounding, recorded; false parses as False."""
    (single, single_store), (ddp, ddp_store) = case("single-gpt2"), case("ddp-fp16-hook")
    assert single.returncode == 0, single.stderr[-2000:]
    assert ddp.returncode == 0, ddp.stderr[-2000:]
    rs, rd = one_record(single_store), one_record(ddp_store)
    info = rd["strategy_info"]
    assert info["comm_hook"] == "fp16" and info["static_graph"] is False
    ls, ld = rs["repeats"][0]["loss_after"], rd["repeats"][0]["loss_after"]
    assert ld == pytest.approx(ls, rel=1e-2)


@pytest.mark.slow
@cases("repeats")
def test_repeats_table_and_grad_accum(case):
    p, store = case("repeats")
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert re.search(r"#   grad_accum +: 2\n", out)  # the header repeats every parameter
    assert "#   rank 0/1" in out and "repeat 2/2" in out
    assert "samples/s" in out and "p90 ms" in out and "record " in out
    rec = one_record(store)
    assert rec["global_batch"] == 8
    assert rec["summary"]["samples_per_s"]["n"] == 2
    assert len(rec["repeats"]) == 2


@pytest.mark.slow
@cases("oom")
def test_injected_oom_in_one_rank_records_oom_exit_3(case):
    p, store = case("oom")
    assert p.returncode == 3, p.stderr[-2000:]
    rec = one_record(store)
    assert rec["status"] == "oom"
    assert rec["error"].startswith("rank 0:"), rec["error"]  # the rank named

    assert rec["summary"] is None


@pytest.mark.slow
@cases("crash")
def test_crash_records_failed_exit_5(case):
    p, store = case("crash")
    assert p.returncode == 5, p.stderr[-2000:]
    rec = one_record(store)
    assert rec["status"] == "failed" and "rank 0" in rec["error"] and "injected crash" in rec["error"]
    assert len(rec["repeats"]) == 1  # a failed repeat stops the case


@pytest.mark.slow
def test_json_output_and_env_command(tmp_path, monkeypatch):
    # tuning variables travel into the record (and only those: an unrelated variable stays out)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("TORCH_NCCL_HIGH_PRIORITY", "1")
    monkeypatch.setenv("DLSCALE_TEST_UNRELATED", "x")
    p = dlscale("env", "--json")
    assert p.returncode == 0
    env = json.loads(p.stdout)
    assert env["torch"] and env["host"] and env["cpu_count"] >= 1
    assert env["env_vars"]["NCCL_DEBUG"] == "WARN" and env["env_vars"]["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    assert "DLSCALE_TEST_UNRELATED" not in env["env_vars"]
    text = dlscale("env").stdout
    assert "torch:" in text and "gpus:" in text


class _FakeTorchrun:
    """A spawner standing in for torchrun: each rank's file as a worker writes it, no process."""

    def __init__(self, rdzv=None, on_line=None, **kw):
        self.rdzv, self.on_line, self.env = rdzv, on_line, None

    def local_world(self, cfg):
        return cfg.world_size

    def start(self, cfg, workdir, env):
        from dlscale.case.procs import ProcResult

        res = {"rank": 0, "local_rank": 0, "world_size": 1, "host": "h", "device": "cpu", "pid": 1, "status": "ok",
               "error": None, "backend": "gloo", "threads": 1, "marks": {"started": time.time()}, "params": 10,
               "dp_size": 1, "window_s": 0.5, "step_times_ms": [50.0] * cfg.steps, "warmup_losses": [1.0],
               "loss_last": 0.9, "loss_after": 0.9, "loss_after_steps": cfg.warmup + cfg.steps, "loss_scope": "global"}
        (workdir / "rank0.json").write_text(json.dumps(res))
        return ProcResult(0, False, 1.0, "", ["fake"], time.time())


def test_one_run_resolves_its_case_once_and_runs_each_check_once(tmp_path, monkeypatch, capsys):
    """From `dlscale run` to the spawner (two repeats): the resolver runs once, every validator once,
    and the configuration module's checks are entered at most twice (the machine defaults' device,
    the resolver's validation)."""
    import sys

    from dlscale import frameworks, inputs
    from dlscale.case import config, launch, resolve
    from dlscale.train import checkpoint_timing, checkpointing, compiling, step
    from dlscale.cli import main
    from dlscale.quality import target

    calls: dict[str, int] = {}
    entered: list[str] = []

    def counted(module, name, *also):
        real = getattr(module, name)

        key = f"{module.__name__.rpartition('.')[2]}.{name}"

        def wrapper(*a, **kw):
            calls[key] = calls.get(key, 0) + 1
            if module is config and sys._getframe(1).f_globals.get("__name__") != "dlscale.case.config":
                entered.append(name)
            return real(*a, **kw)

        for m in (module, *also):
            monkeypatch.setattr(m, name, wrapper)

    counted(resolve, "resolve", launch)
    counted(config, "validate_for_launch", resolve)
    for name in ("validate_case", "resolve_device", "check_cpu_processes"):
        counted(config, name)
    for module, names in ((compiling, ("check_options", "check_strategy")), (step, ("check_optimizer_graph",)),
                          (frameworks, ("validate",)), (checkpointing, ("check_case",)),
                          (checkpoint_timing, ("check_case", "check_machine")),
                          (inputs, ("check_case", "check_machine")), (target, ("check_case",))):
        for name in names:
            counted(module, name)
    monkeypatch.setattr(launch, "TorchrunSpawner", _FakeTorchrun)
    assert main(["run", "--model", "gpt2", *FAST[:-2], "--repeats", "2", "--batch-size", "2", "--warmup", "1",
                 "--steps", "2", "--no-monitor", "--json", "--store", str(tmp_path)]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["status"] == "ok" and len(rec["repeats"]) == 2
    assert calls.pop("resolve.resolve") == 1 and calls.pop("config.resolve_device") <= 2
    assert calls and all(n == 1 for n in calls.values()), sorted(calls.items())  # every validator and check, once
    assert len(entered) <= 2, entered
