"""Records and input: a finished measurement is never lost, an unreadable store entry is
skipped and named, and no input (inductor options, Slurm strings, report labels) runs code."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from dlscale import ConfigError, cli
from dlscale.results import store as store_mod
from dlscale.commands import slurm as slurm_cmd
from dlscale.case.config import RunConfig, validate_case
from dlscale.results.store import EXIT_NOT_STORED, ResultStore, StoreError, new_record

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "report_store" / "results.jsonl"
CASE = ["--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--precision", "fp32", "--batch-size", "8",
        "--warmup", "1", "--steps", "2", "--repeats", "1"]
SUITE = """name: t
device: cpu
warmup: 1
steps: 2
repeats: 1
matrix:
  - models: [gpt2]
    flavors: [tiny]
    precisions: [fp32]
    batch_sizes: [8]
    devices: [1, 2]
"""


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("dlscale: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


@pytest.fixture
def recovery_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "recovery"
    d.mkdir()
    monkeypatch.setenv("DLSCALE_RECOVERY_DIR", str(d))
    return d


def fail_writes_to(monkeypatch, root: Path, err: int = errno.ENOSPC, partial: bool = True) -> None:
    """os.write into files below ``root`` writes part of the data once, then fails with ``err``."""
    real = os.write

    def write(fd, data):
        if str(root) in os.readlink(f"/proc/self/fd/{fd}"):
            if partial and len(data) > 8:
                real(fd, data[:len(data) // 2])  # a full disk takes part of the line
                return len(data) // 2
            raise OSError(err, os.strerror(err))
        return real(fd, data)

    monkeypatch.setattr(store_mod.os, "write", write)


# ----------------------------------------------------------------------------- writing

def test_check_writable_refuses_a_store_that_cannot_take_series(tmp_path):
    (tmp_path / "st").mkdir()
    (tmp_path / "st" / "series").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"series") as e:  # the entry in the way named
        ResultStore(tmp_path / "st").check_writable()
    assert "\n" not in str(e.value)


def test_check_writable_refuses_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 << 30, 10 << 30, 1000))
    with pytest.raises(ConfigError, match=r"MiB") as e:  # what is free, one line
        ResultStore(tmp_path / "st").check_writable()
    assert "\n" not in str(e.value)
    ResultStore(tmp_path / "st").check_writable(expected_bytes=100)


def test_enospc_leaves_no_partial_line_and_keeps_the_record(tmp_path, monkeypatch, recovery_dir):
    st = ResultStore(tmp_path / "st")
    first = new_record("run", status="ok", case_key="k1")
    st.append(first)
    before = st.file.read_bytes()
    rec = new_record("run", status="ok", case_key="k2", summary={"samples_per_s": {"median": 12.5}})
    fail_writes_to(monkeypatch, st.root)
    with pytest.raises(StoreError) as e:
        st.append_or_recover(rec)
    assert st.file.read_bytes() == before  # the half-written line was cut off
    assert e.value.exit_code == EXIT_NOT_STORED == 7
    msg = str(e.value)
    assert "\n" not in msg and str(e.value.recovery) in msg and "No space left" in msg
    kept = e.value.recovery.read_text().splitlines()
    assert len(kept) == 1 and json.loads(kept[0])["id"] == rec["id"]
    # the recovery file is a store entry as it is: moved into the store, the record is there
    monkeypatch.undo()
    shutil.move(str(e.value.recovery), st.root / "recovered.jsonl")
    assert {r["id"] for r in st.load().records} == {first["id"], rec["id"]}


def test_unwritable_store_keeps_the_record(tmp_path, recovery_dir):
    root = tmp_path / "gone"
    st = ResultStore(root)
    root.write_text("the store was replaced by a file")  # mkdir and open fail
    rec = new_record("run", status="ok")
    with pytest.raises(StoreError) as e:
        st.append_or_recover(rec)
    assert e.value.exit_code == EXIT_NOT_STORED and str(e.value.recovery) in str(e.value)
    assert e.value.recovery.parent == recovery_dir
    assert json.loads(e.value.recovery.read_text())["id"] == rec["id"]


def test_no_recovery_place_puts_the_record_in_the_message(tmp_path, monkeypatch):
    monkeypatch.setattr(store_mod, "recovery_dirs", lambda: [str(tmp_path / "nowhere")])
    root = tmp_path / "file"
    root.write_text("x")
    rec = new_record("run", status="ok")
    with pytest.raises(StoreError) as e:
        ResultStore(root).append_or_recover(rec)
    assert e.value.recovery is None and rec["id"] in str(e.value) and "\n" not in str(e.value)


def test_sweep_stops_with_exit_7_naming_the_recovery_file(tmp_path, monkeypatch, capsys, recovery_dir):
    from dlscale.commands import sweep

    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE)
    root = tmp_path / "st"

    class Fake:
        def __init__(self, cfg):
            self.d = new_record("run", status="ok", case_key=cfg.case_key(), world_size=cfg.world_size)

        def to_dict(self):
            return self.d

    monkeypatch.setattr(sweep, "_run_one", lambda p, *a, **k: Fake(p.cfg))
    fail_writes_to(monkeypatch, root)
    rc = cli.main(["sweep", str(suite), "--store", str(root)])
    out, err = capsys.readouterr()
    assert rc == EXIT_NOT_STORED
    line = one_error_line(err)
    kept = list(recovery_dir.glob("dlscale-unstored-*.jsonl"))
    assert len(kept) == 1 and str(kept[0]) in line
    assert "[1/2]" in out and "[2/2]" not in out  # it stopped at the first case the store refused
    assert not (root / "results.jsonl").exists() or (root / "results.jsonl").read_bytes() == b""


# ----------------------------------------------------------------------------- reading

def bad_store(tmp_path: Path) -> tuple[Path, list[str]]:
    """A store with good records beside entries that cannot be read; returns the bad names."""
    root = tmp_path / "st"
    root.mkdir()
    shutil.copy(FIXTURE, root / "results.jsonl")
    (root / "x.jsonl").mkdir()
    (root / "dangling.jsonl").symlink_to(root / "no-such-file")
    (root / "loop.jsonl").symlink_to(root / "loop.jsonl")
    (root / "latin1.jsonl").write_bytes(b'{"schema": "dlscale.record/1", "label": "caf\xe9"}\n')
    bad = ["x.jsonl", "dangling.jsonl", "loop.jsonl", "latin1.jsonl"]
    if os.geteuid() != 0:  # root reads a mode-000 file anyway
        (root / "closed.jsonl").write_text("{}\n")
        (root / "closed.jsonl").chmod(0)
        bad.append("closed.jsonl")
    return root, bad


def test_load_skips_and_names_unreadable_entries(tmp_path):
    root, bad = bad_store(tmp_path)
    good = ResultStore(root / "results.jsonl").load()
    loaded = ResultStore(root).load()
    assert [r["id"] for r in loaded.records] == [r["id"] for r in good.records] and good.records
    warning = loaded.warning()
    assert "\n" not in warning and all(name in warning for name in bad)
    assert "not UTF-8" in warning and "a directory" in warning


def test_report_keeps_the_rest_of_a_store_with_bad_entries(tmp_path, capsys):
    root, bad = bad_store(tmp_path)
    rc = cli.main(["report", str(root)])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err and "### " in out
    warnings = [ln for ln in err.splitlines() if "x.jsonl" in ln]
    assert len(warnings) == 1 and all(name in warnings[0] for name in bad)


def test_sweep_dry_run_keeps_done_cases_of_a_store_with_bad_entries(tmp_path, capsys):
    from dlscale.case.suite import load_suite

    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE)
    root, bad = bad_store(tmp_path)
    done = load_suite(str(suite)).cases[0]
    ResultStore(root).append(new_record("run", status="ok", case_key=done.case_key()))
    rc = cli.main(["sweep", str(suite), "--store", str(root), "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err
    assert re.search(r"\b1 to run, 1 already ok\b", out), out  # the plan's counts, as the dry run prints them
    assert len([ln for ln in err.splitlines() if "x.jsonl" in ln]) == 1


def test_sweep_dry_run_refuses_a_store_it_cannot_read(tmp_path, capsys):
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE)
    root = tmp_path / "st"
    root.symlink_to(root)  # a looping link: exists, cannot be read; never "an empty store"
    rc = cli.main(["sweep", str(suite), "--store", str(root), "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2 and str(root) in one_error_line(err)
    assert "to run" not in out


def test_suite_that_is_not_utf8_is_one_line(tmp_path, capsys):
    suite = tmp_path / "latin1.yaml"
    suite.write_bytes(SUITE.replace("name: t", "name: caf\xe9").encode("latin-1"))
    rc = cli.main(["sweep", str(suite), "--dry-run"])
    assert rc == 2 and "latin1.yaml" in one_error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- inductor options

@pytest.mark.parametrize("options", [
    {"cpp.cxx": "/tmp/PWNED-prog"}, {"cpp.cxx": ["/tmp/PWNED-prog"]}, {"cpp.cxx": [None, "/tmp/prog"]},
    {"cuda.cuda_cxx": "/tmp/prog"}, {"cuda.cutlass_dir": "/tmp"}, {"global_cache_dir": "/tmp"},
    {"trace.debug_dir": "/tmp"}, {"cuda.compile_opt_level": "-O3 -fplugin=/tmp/x.so"},
    {"aot_inductor.output_path": "/tmp/x"}, {"cpp.gemm_cache_blocking": "4,1,8"},
    {"coordinate_descent_tuning": {"a": 1}}])
def test_inductor_options_that_could_run_code_are_refused(options):
    with pytest.raises(ConfigError, match=r"inductor-option") as e:
        validate_case(RunConfig(compile=True, inductor_options=options))
    assert "\n" not in str(e.value) and next(iter(options)) in str(e.value)  # the option named


def test_inductor_options_that_are_plain_settings_pass():
    validate_case(RunConfig(compile=True, inductor_options={
        "coordinate_descent_tuning": True, "triton.max_tiles": 3, "memory_pool": "none", "cpp.simdlen": 8}))


def test_inductor_program_on_the_command_line_and_in_a_suite_is_exit_2(tmp_path, capsys):
    rc = cli.main(["run", *CASE, "--compile", "--inductor-option", "cpp.cxx=/tmp/PWNED-prog",
                   "--store", str(tmp_path / "st")])
    assert rc == 2 and "cpp.cxx" in one_error_line(capsys.readouterr().err)  # the setting named
    assert not (tmp_path / "st").exists()
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE + "    compile: [true]\n    inductor_options: [{cpp.cxx: [/tmp/PWNED-prog]}]\n")
    rc = cli.main(["sweep", str(suite), "--dry-run", "--store", str(tmp_path / "st")])
    assert rc == 2 and "cpp.cxx" in one_error_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- slurm scripts

@pytest.mark.parametrize("argv", [
    ["--job-name", "x\ntouch PWNED"], ["--time", "10\ntouch PWNED"], ["--account", "a\ntouch PWNED"],
    ["--partition", "p\rtouch PWNED"], ["--sbatch-option=--exclusive\ntouch PWNED"],
    ["--store", "st\ntouch PWNED"], ["--label", "l\ntouch PWNED"], ["--time", "1:2:3:4"], ["--time", "soon"],
    ["--cpus-per-task", "-1"], ["--cpus-per-task", "0"]])
def test_slurm_refuses_strings_that_break_the_script(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["slurm", "--dry-run", *CASE, *argv])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    line = one_error_line(err)
    assert argv[0].split("=")[0].lstrip("-") in line, line  # the option refused named
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("time", ["30", "30:00", "02:00:00", "1-00", "1-02:00", "1-02:00:00", "UNLIMITED"])
def test_slurm_takes_its_time_formats(time, capsys):
    assert cli.main(["slurm", "--dry-run", *CASE, "--time", time]) == 0
    assert f"#SBATCH --time={time}\n" in capsys.readouterr().out


@pytest.mark.slow
def test_generated_script_runs_no_injected_command(tmp_path):
    """Hostile but printable strings, and a command line holding a newline, run nothing when the
    generated script runs (srun/scontrol are stubs that record their arguments)."""
    work = tmp_path / "work"
    work.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    for name in ("srun", "scontrol", "sbatch"):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "{name}" "$@" >> "{calls}"\necho node1\n')
        stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    payload = "x; touch PWNED1 $(touch PWNED2) `touch PWNED3` 'q\" && touch PWNED4"
    cfg = RunConfig(model="gpt2", flavor="tiny", device="cpu", precision="fp32", label=payload)
    store = str(work / "st $(touch PWNED5);touch PWNED6")
    script = slurm_cmd.render_script([cfg], slurm_cmd.SlurmJob(
        nodes=1, per_node=1, store=store, job_name="j", account="a",  # hostile names: refused (test_slurm)
        sbatch_options=["--comment=$(touch PWNED9)"], python="python3; touch PWNED10",
        command="dlscale slurm --label 'a\ntouch PWNED11'\rtouch PWNED12"))
    assert all(not ln.startswith("touch") for ln in script.splitlines())
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "node1"}
    r = subprocess.run(["bash", str(path)], cwd=work, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in work.iterdir()) == []  # no PWNED file, nothing else either
    args = calls.read_text().splitlines()
    assert payload in args and store in args and "python3; touch PWNED10" in args


# ----------------------------------------------------------------------------- markdown labels

def test_markdown_report_escapes_labels(tmp_path):
    from dlscale.report import render
    from dlscale.report.data import build_report, load_records

    root = tmp_path / "st"
    root.mkdir()
    label = "x\n# injected <script>alert(1)</script> | *b* _i_ `c` [l](u)"
    lines = []
    for ln in FIXTURE.read_text().splitlines():
        rec = json.loads(ln)
        rec["label"] = label
        if isinstance(rec.get("config"), dict):
            rec["config"]["label"] = label
        lines.append(json.dumps(rec))
    (root / "results.jsonl").write_text("\n".join(lines) + "\n")
    md = render.to_markdown(build_report(load_records(root)))
    headings = [ln for ln in md.splitlines() if "injected" in ln and ln.startswith("### ")]
    assert headings
    for h in headings:
        assert "<script>" not in h and "\\<script\\>" in h
        assert "\\#" in h and "\\|" in h and "\\*b\\*" in h and "\\_i\\_" in h and "\\`c\\`" in h and "\\[l\\]" in h
    assert not any(ln.startswith("# injected") for ln in md.splitlines())


def test_import_exits_7_and_keeps_the_record_when_the_store_fails(tmp_path, monkeypatch, capsys, recovery_dir):
    """Every command that appends goes through append_or_recover; the CLI maps StoreError to exit 7."""
    table = Path(__file__).parent / "fixtures" / "tables" / "mxnet-bert-base-v100.yaml"
    root = tmp_path / "st"
    fail_writes_to(monkeypatch, root)
    rc = cli.main(["import", str(table), "--format", "table", "--store", str(root)])
    _, err = capsys.readouterr()
    assert rc == EXIT_NOT_STORED
    line = one_error_line(err)
    kept = list(recovery_dir.glob("dlscale-unstored-*.jsonl"))
    assert len(kept) == 1 and str(kept[0]) in line
    assert json.loads(kept[0].read_text())["kind"] == "imported"


def test_a_multi_line_error_keeps_what_failed_on_one_line():
    from dlscale.train.worker import _one_line

    dali = RuntimeError("Critical error when building pipeline:\nError in MIXED operator `decoders.image_slice`,\n"
                        "which was used in the pipeline definition with the following traceback:\n\n  File x\n"
                        "encountered:\n\nnvImageCodec library not found")
    assert _one_line(dali) == ("RuntimeError: Critical error when building pipeline: Error in MIXED operator "
                               "`decoders.image_slice`,")
    assert _one_line(ValueError("bad value\nsecond line")) == "ValueError: bad value"
    assert _one_line(RuntimeError("")) == "RuntimeError:"  # nothing after the colon to add
    long = _one_line(RuntimeError("x:\n" + "y" * 900))  # a bounded line, cut, not the whole message
    assert "\n" not in long and long.startswith("RuntimeError: x: y") and len(long) < 900
