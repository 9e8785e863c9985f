"""`dlscale slurm`: job scripts, bad input, and jobs on a real single-node Slurm.

The Slurm jobs need slurmctld, slurmd and munge (`.ci/setup-slurm.sh` installs and starts
them). When Slurm is not up, the fixture starts it with that script if it can (root, packages
installed) and stops what it started; otherwise the job tests are skipped with the reason.
"""
from __future__ import annotations

import os
import random
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from dlscale import cli
from dlscale.commands import slurm as slurm_cmd
from dlscale.case.caseargs import config_from_args
from dlscale.case.config import RunConfig
from dlscale.results.store import ResultStore

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / ".ci" / "setup-slurm.sh"
CASE = ["--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--precision", "fp32", "--batch-size", "8",
        "--warmup", "1", "--steps", "2", "--repeats", "1", "--time-limit", "80", "--collective-timeout", "30"]


def dry_run(capsys, *argv: str) -> str:
    assert cli.main(["slurm", "--dry-run", *argv]) == 0
    return capsys.readouterr().out


# ------------------------------------------------------------------------------ scripts

def test_case_options_round_trip():
    """Every RunConfig field survives the trip through `dlscale run` options (to_cli_args)."""
    import dataclasses

    from dlscale.case.caseargs import check_round_trip, to_cli_args

    names = {f.name for f in dataclasses.fields(RunConfig)}
    values = dict(model="bert-base", flavor="tiny", strategy="fsdp", nproc_per_node=4, nnodes=3, batch_size=7,
                  precision="amp-fp16", compile=True, compile_mode="max-autotune-no-cudagraphs",
                  inductor_options={"coordinate_descent_tuning": True, "triton.max_tiles": 3},
                  clip_grad_norm=1.5, activation_checkpointing="selective", grad_accum=2, threads=3, warmup=3,
                  steps=9, env={"TORCH_NCCL_HIGH_PRIORITY": 1, "NCCL_ALGO": "Ring"},
                  repeats=2, device="cuda", seed=5, time_limit=77.5, collective_timeout=12.0,
                  strategy_options={"bucket_cap_mb": 50, "mode": "full", "flag": True, "text": "50"},
                  label="my run", inject_failure="crash@1:2", monitor=False, sample_interval=0.5,
                  breakdown=True, profile=True, data="imagefolder:/data/train", data_workers=3, data_decode="gpu",
                  data_decoder="nvimgcodec", data_cpu_share=0.375, data_decode_process=True, data_decode_sm_share=0.3,
                  data_decode_priority="low",
                  data_cold_read=True, data_prefetch=4,
                  optimizer_graph=True, checkpoint_every=4, checkpoint_mode="async", checkpoint_dir="/ckpt",
                  min_window_s=1.5, until="val_loss<=2.5", eval_every=7, eval_batches=3,
                  eval_data="tokens:/data/val.bin", max_steps=40, lr=0.002, lr_schedule="cosine", lr_warmup=5,
                  lr_scale="sqrt", lr_ref_batch=64)
    cfg = RunConfig(**{k: v for k, v in values.items() if k in names})
    search = RunConfig(batch_size="max", max_batch_start=4, max_batch_cap=60, framework="jax")
    untested = sorted(n for n in names if getattr(cfg, n) == getattr(RunConfig(), n)
                      and getattr(search, n) == getattr(RunConfig(), n))
    assert not untested, f"give these new RunConfig fields a non-default value in this test: {untested}"
    for c in (cfg, search):
        check_round_trip(c)  # raises DlscaleError on any difference
        args = cli.build_parser().parse_args(["run", *to_cli_args(c)])
        assert config_from_args(args) == c


def test_round_trip_check_catches_a_dropped_option(monkeypatch):
    from dlscale import DlscaleError
    from dlscale.case import caseargs

    real = caseargs.to_cli_args
    monkeypatch.setattr(caseargs, "to_cli_args", lambda cfg: [a for a in real(cfg) if a != "--compile"])
    with pytest.raises(DlscaleError, match="compile"):  # the field the command line lost
        caseargs.check_round_trip(RunConfig(compile=True))


def test_suite_cases_keep_their_layout(capsys, tmp_path):
    pytest.importorskip("dlscale.case.suite", reason="suites (dlscale.case.suite) are not in this build")
    out = dry_run(capsys, "quick", "--nnodes", "1", "--nproc-per-node", "2", "--store", str(tmp_path))
    steps = [ln for ln in out.splitlines() if ln.startswith("step srun")]
    assert len(steps) >= 2
    assert any("--strategy single --nproc-per-node 1 " in s for s in steps)
    assert any("--strategy ddp --nproc-per-node 2 " in s for s in steps)
    assert cli.main(["slurm", "quick", "--dry-run", "--nnodes", "1", "--nproc-per-node", "1",
                     "--store", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # the case of 2 processes named against 1 x 1
    assert "ddp" in line and "1 x 1" in line, line


def test_largest_batch_cases_get_the_suite_cap(capsys, tmp_path):
    """A suite's max_batch_cap reaches the job's `dlscale run --batch-size max` (the flag wins)."""
    suite = tmp_path / "s.yaml"
    suite.write_text("device: cpu\nmax_batch_cap: 48\nwarmup: 1\nsteps: 2\nrepeats: 1\n"
                     "cases: [{model: gpt2, flavor: tiny, strategy: single, batch_size: max, precision: fp32},\n"
                     "        {model: gpt2, flavor: tiny, strategy: single, batch_size: 4, precision: fp32}]\n")
    steps = [ln for ln in dry_run(capsys, str(suite), "--store", str(tmp_path)).splitlines() if ln.startswith("step ")]
    assert len(steps) == 2
    assert "--batch-size max" in steps[0] and "--max-batch-cap 48" in steps[0]
    assert "--max-batch-cap" not in steps[1]
    out = dry_run(capsys, str(suite), "--max-batch-cap", "16", "--store", str(tmp_path))
    assert "--max-batch-cap 16" in out and "--max-batch-cap 48" not in out


def test_multinode_torchrun_script(capsys, tmp_path):
    out = dry_run(capsys, "--nnodes", "2", "--nproc-per-node", "4", "--model", "gpt2", "--partition", "gpu",
                  "--time", "00:30:00", "--account", "proj", "--cpus-per-task", "32",
                  "--sbatch-option=--exclusive", "--store", str(tmp_path))
    assert out.startswith("#!/bin/bash\n")
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --partition=gpu", "#SBATCH --time=00:30:00", "#SBATCH --account=proj",
                 "#SBATCH --cpus-per-task=32", "#SBATCH --exclusive",
                 f"#SBATCH --output={tmp_path}/slurm/%x-%j.out"):
        assert line in out.splitlines()
    step = next(ln for ln in out.splitlines() if ln.startswith("step srun"))
    assert "--ntasks=2 --ntasks-per-node=1" in step and "--kill-on-bad-exit=0" in step
    assert f"-m dlscale run --store {tmp_path}" in step
    assert "--nproc-per-node 4" in step and "--nnodes 2" in step and '--rdzv-endpoint "$head:$((port + 0))"' in step
    assert 'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in out
    assert not (tmp_path / "slurm").exists()  # --dry-run writes nothing
    r = subprocess.run(["bash", "-n"], input=out, text=True, capture_output=True)
    assert r.returncode == 0, r.stderr


def test_single_node_cpu_script_has_no_gpus_and_no_rendezvous(capsys, tmp_path):
    out = dry_run(capsys, "--nnodes", "1", "--nproc-per-node", "2", *CASE, "--store", str(tmp_path))
    assert "--gpus-per-node" not in out and "--rdzv-endpoint" not in out
    assert "--nnodes 1" in out and "--nproc-per-node 2" in out


def test_srun_mode_script(capsys, tmp_path):
    out = dry_run(capsys, "--nnodes", "2", "--nproc-per-node", "8", "--mode", "srun", "--store", str(tmp_path))
    assert "#SBATCH --ntasks-per-node=8" in out
    step = next(ln for ln in out.splitlines() if ln.startswith("step srun"))
    for opt in ("--nodes=2", "--ntasks=16", "--ntasks-per-node=8", "--gpus-per-node=8", "--kill-on-bad-exit=0"):
        assert opt in step.split()
    assert "-m dlscale slurm-task" in step and "--nnodes 2" in step


@pytest.mark.parametrize("argv, words", [
    (["--nnodes", "0"], ["nnodes must be >= 1"]),
    (["--nproc-per-node", "0"], ["nproc-per-node must be >= 1"]),
    (["--model", "nope"], ["nope"]),
    (["--port", "70000"], ["port"]),
    (["no-such-suite"], ["no-such-suite"]),
])
def test_bad_slurm_input_exits_2(argv, words, capsys, tmp_path):
    code = cli.main(["slurm", "--dry-run", "--store", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1
    for w in words:
        assert w in err


def test_old_allocation_options_still_work_with_a_warning(capsys, tmp_path):
    argv = ["slurm", "--dry-run", "--nodes", "2", "--gpus-per-node", "4", "--model", "gpt2", "--store", str(tmp_path)]
    assert cli.main(argv) == 0
    got = capsys.readouterr()
    assert "#SBATCH --nodes=2" in got.out and "#SBATCH --gpus-per-node=4" in got.out
    # one warning each, naming the old option and its successor
    warned = [ln for ln in got.err.splitlines() if ln.startswith("dlscale: warning:")]
    assert len(warned) == 2, got.err
    assert any(" --nodes " in w and "--nnodes" in w for w in warned), warned
    assert any("--gpus-per-node" in w and "--nproc-per-node" in w for w in warned), warned


def test_no_sbatch_is_bad_input(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(slurm_cmd.shutil, "which", lambda name: None)
    assert cli.main(["slurm", *CASE, "--store", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "sbatch" in line, line


def test_slurm_task_outside_slurm_and_wrong_world(capsys, monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            monkeypatch.delenv(k)
    assert cli.main(["slurm-task", *CASE, "--store", str(tmp_path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "Slurm" in line, line
    for k, v in {"SLURM_JOB_ID": "9", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "3",
                 "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "localhost"}.items():
        monkeypatch.setenv(k, v)
    assert cli.main(["slurm-task", *CASE, "--nproc-per-node", "2", "--store", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "3" in err and "2" in err, err  # the step's tasks and the case's
    assert not (tmp_path / "results.jsonl").exists()


# ------------------------------------------------------------------------ real Slurm

def _slurm_ready() -> bool:
    return SETUP.exists() and subprocess.run(["bash", str(SETUP), "status"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def slurm():
    if _slurm_ready():
        yield
        return
    if os.geteuid() != 0:
        pytest.skip("Slurm is not running and starting it needs root (run .ci/setup-slurm.sh)")
    missing = [t for t in ("slurmctld", "slurmd", "sbatch", "munged") if shutil.which(t) is None
               and not Path("/usr/sbin", t).exists()]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} missing): run .ci/setup-slurm.sh")
    r = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(f"could not start Slurm with .ci/setup-slurm.sh: {r.stderr.strip()[-300:]}")
    yield
    subprocess.run(["bash", str(SETUP), "stop"], capture_output=True, timeout=60)


def _submit(capsys, *argv: str) -> str:
    assert cli.main(["slurm", *argv]) == 0
    out = capsys.readouterr().out
    return out.split("submitted job ", 1)[1].split(":", 1)[0]


def _wait_job(job: str, timeout: float) -> str:
    """Wait until the job left the queue; returns its ExitCode (e.g. "0:0"), or "timeout"."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        q = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
        if q.returncode == 0 and not q.stdout.strip():
            break
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job], capture_output=True)
        return f"timeout (job {job} still queued/running after {timeout} s)"
    info = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    for tok in info.split():
        if tok.startswith("ExitCode="):
            return tok.split("=", 1)[1]
    return "?"


def _free_port() -> int:
    """A free port below the ephemeral range (32768+): a port the kernel may also hand out as a
    client's source port lets a client connecting early to it connect to itself."""
    for _ in range(200):
        port = random.randrange(20000, 30000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port in 20000-29999")


def _job_output(store: Path, name: str, job: str) -> str:
    p = store / "slurm" / f"{name}-{job}.out"
    return p.read_text() if p.exists() else f"(no job output at {p})"


@pytest.mark.slow
def test_slurm_job_lands_in_store(slurm, capsys, tmp_path):
    """One real job (the suite's one Slurm run): srun mode, one Slurm task per rank, the job script
    sbatch runs, the record in the store. torchrun mode's job is the same script around a local
    `dlscale run` (one task per node starting torchrun): its script, test_multinode_torchrun_script
    and test_single_node_cpu_script_has_no_gpus_and_no_rendezvous; its CPUs,
    test_the_job_requests_the_nodes_cpus_unless_told."""
    store, mode = tmp_path / "store", "srun"
    name = f"dlscale-test-{mode}"
    # 12 timed steps (not CASE's 2): a window of a few tenths of a second holds utilisation samples
    # (0.1 s apart); 2 tiny steps can fall between two samples, and the record then has none
    job = _submit(capsys, "--nnodes", "1", "--nproc-per-node", "2", *CASE, "--steps", "12", "--store", str(store),
                  "--mode", mode, "--job-name", name, "--label", f"slurm-{mode}", "--port", str(_free_port()),
                  "--profile")
    try:
        code = _wait_job(job, 120)  # ~20 s on an idle 2-core machine
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    out = _job_output(store, name, job)
    assert code == "0:0", out
    recs = ResultStore(store).load(kind="run").records
    assert len(recs) == 1, out
    rec = recs[0]
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["label"] == f"slurm-{mode}", out
    assert rec["summary"]["samples_per_s"]["median"] > 0
    assert len(rec["ranks"]) == 2
    # measured through launch.measure: the utilisation series and the trace as in a local run
    rep = rec["repeats"][0]
    assert rec["utilisation"]["cpu_util_pct_mean"] is not None, out
    assert rep["series"] and all((store / p).is_file() for p in rep["series"]), out
    assert rec["trace"] and (store / rec["trace"]).is_file(), out
    # srun: two Slurm tasks, rank from SLURM_PROCID and the world from the step's task count as real
    # srun sets them (a step of the wrong count: test_slurm_task_outside_slurm_and_wrong_world); task 0 recorded
    assert rec["rendezvous"]["backend"] == "slurm-srun" and rec["rendezvous"]["job_id"] == job
    assert rec["nodes"][0]["ranks"] == [0, 1]
    assert "dlscale slurm: done, exit 0" in out


# ------------------------------------------------------------------------------ hostile names, CPUs, output folder

@pytest.mark.parametrize("argv, option", [
    (["--job-name", "../../escaped"], "job-name"), (["--job-name", ""], "job-name"),
    (["--job-name", "a b"], "job-name"), (["--partition", "gpu --wrap=id"], "partition"),
    (["--account", "a --qos=high"], "account"), (["--store", 'st"x'], "store"),
])
def test_names_that_would_add_sbatch_options_or_leave_the_folder_are_refused(argv, option, capsys, tmp_path):
    code = cli.main(["slurm", "--dry-run", *CASE, "--store", str(tmp_path / "st"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and option in err[0], err
    assert not (tmp_path / "st").exists() and list(tmp_path.iterdir()) == []


def _sbatch_args(script: str, name: str) -> list[list[str]]:
    """The arguments sbatch reads from each #SBATCH line of ``name`` (it splits on spaces, honouring quotes)."""
    return [shlex.split(ln[len("#SBATCH "):]) for ln in script.splitlines() if ln.startswith(f"#SBATCH --{name}")]


def test_a_store_path_with_spaces_and_percent_is_one_output_argument(capsys, tmp_path):
    store = tmp_path / "my results %j"
    out = dry_run(capsys, *CASE, "--store", str(store))
    (arg,) = _sbatch_args(out, "output")
    assert arg == [f"--output={str(store).replace('%', '%%')}/slurm/%x-%j.out"]


def _step_cpus(script: str, cpus_on_node: int) -> list[str]:
    """--cpus-per-task of each step as bash would expand it on a node holding ``cpus_on_node`` CPUs
    (the script's two forms: the variable, and an integer share of it with a floor of 1)."""
    import re

    out = []
    for s in (ln for ln in script.splitlines() if ln.startswith("step srun")):
        for m in re.finditer(r"--cpus-per-task=(\$\(\((?P<expr>.*?)\)\)|(?P<word>\S+))", s):
            text = (m.group("expr") or m.group("word")).replace("${SLURM_CPUS_ON_NODE:-1}", str(cpus_on_node))
            cond = re.fullmatch(r"\s*(.+?)\s*\?\s*(.+?)\s*:\s*(.+?)\s*", text)
            if cond:
                a, b, c = (x.replace("/", "//") for x in cond.groups())
                text = str(eval(b) if eval(a) else eval(c))  # noqa: S307 - digits and operators only
            out.append(f"--cpus-per-task={int(text)}")
    return out


def test_the_job_requests_the_nodes_cpus_unless_told(capsys, tmp_path):
    out = dry_run(capsys, *CASE, "--nproc-per-node", "2", "--store", str(tmp_path))
    assert "#SBATCH --exclusive" in out.splitlines() and "#SBATCH --cpus-per-task" not in out
    assert _step_cpus(out, 16) == ["--cpus-per-task=16"]  # torchrun mode: one task holds the node's CPUs
    out = dry_run(capsys, *CASE, "--nproc-per-node", "4", "--mode", "srun", "--store", str(tmp_path))
    assert _step_cpus(out, 16) == ["--cpus-per-task=4"] and _step_cpus(out, 2) == ["--cpus-per-task=1"]
    out = dry_run(capsys, *CASE, "--cpus-per-task", "6", "--store", str(tmp_path))
    assert "#SBATCH --cpus-per-task=6" in out.splitlines() and "#SBATCH --exclusive" not in out.splitlines()
    assert _step_cpus(out, 16) == ["--cpus-per-task=6"]


def test_the_output_folder_exists_before_sbatch_runs(capsys, tmp_path, monkeypatch):
    seen = {}

    def sbatch(cmd, **kw):
        seen["script"] = Path(cmd[-1])
        seen["folder"] = (tmp_path / "st" / "slurm").is_dir()
        return subprocess.CompletedProcess(cmd, 0, stdout="42\n", stderr="")

    monkeypatch.setattr(slurm_cmd.shutil, "which", lambda name: "/usr/bin/sbatch")
    monkeypatch.setattr(slurm_cmd.subprocess, "run", sbatch)
    assert cli.main(["slurm", *CASE, "--store", str(tmp_path / "st")]) == 0
    assert seen["folder"] and seen["script"].parent == tmp_path / "st" / "slurm"
    assert cli.main(["slurm", "--dry-run", *CASE, "--store", str(tmp_path / "new")]) == 0
    assert str(tmp_path / "new" / "slurm") in capsys.readouterr().err and not (tmp_path / "new").exists()
