"""Hostile input: every input ends in one line and the right exit code, never a hang or
a traceback; the diagnosis names what happened (docs/faults.md)."""
import time

import pytest

from dlscale.cli import EXIT_FAILED, main
from dlscale.case.procs import EXIT_INTERRUPTED, ProcResult


def run(*argv):
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dlscale: error:"), err
    return err[0]


# ----------------------------------------------------------------------------- the --metric regex

@pytest.mark.slow
def test_a_catastrophic_metric_regex_ends_within_the_time_limit(monkeypatch):
    """(a+)+b over 34 a's backtracks for hours; the parse runs in a child bounded by the case's limit
    and the case is recorded ``timeout``. A plain expression gives the same values as in-process."""
    from dlscale.external import spawner as sp
    from dlscale.external.case import ExternalCase
    from dlscale.case.procs import ProcResult

    lines = ["a" * 34]
    monkeypatch.setattr(sp, "spawn", lambda cmd, limit, env=None, on_line=None, cwd=None: (
        [on_line(x) for x in lines], ProcResult(0, False, 0.5))[1])
    case = ExternalCase(command=["true"], parser="regex", metric="(?P<value>(a+)+)b", unit="seq", model="gpt2", precision="fp32",
                        batch_size=4, warmup=0, steps=1, repeats=1, time_limit=1.5, monitor=False)
    t0 = time.monotonic()
    _, (r0,) = sp.ExternalSpawner(case, "cpu")(0)
    assert time.monotonic() - t0 < 10
    assert r0["status"] == "timeout" and "--metric" in r0["error"]
    lines[:] = [f"samples/sec: {v}" for v in (10, 20)]
    case = ExternalCase(command=["true"], parser="regex", metric=r"samples/sec: (?P<value>[0-9]+)", unit="seq",
                        model="gpt2", precision="fp32", batch_size=4, warmup=0, steps=2, repeats=1, time_limit=5, monitor=False)
    _, (r0,) = sp.ExternalSpawner(case, "cpu")(0)
    assert r0["status"] == "ok" and r0["per_step_samples_per_s"] == [10.0, 20.0]


# ----------------------------------------------------------------------------- what import reads

@pytest.mark.parametrize("fmt", [["--format", "table"], ["--format", "dlperf-json", "--precision", "fp32"],
                                 ["--format", "hf-trainer", "--model", "gpt2", "--precision", "fp32"]])
def test_import_refuses_a_fifo_and_a_device_without_reading(tmp_path, capsys, fmt):
    import os

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)  # opening it to read would block until a writer comes: it must never be opened
    for path in (fifo, "/dev/zero"):
        assert run("import", path, *fmt, "--store", tmp_path / "st") == 2
        assert str(path) in one_line(capsys)
    assert not (tmp_path / "st").exists()


def test_import_refuses_a_file_over_the_bound(tmp_path, capsys, monkeypatch):
    import dlscale.importers as imp

    table = tmp_path / "t.yaml"
    table.write_text("x" * 100)
    monkeypatch.setattr(imp, "MAX_INPUT_BYTES", 99)
    assert run("import", table, "--format", "table", "--dry-run") == 2
    one_line(capsys)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "run1.log").write_text("x" * 100)
    assert run("import", logs, "--format", "megatron-log", "--model", "gpt2", "--batch-size", "4",
               "--precision", "fp32", "--dry-run") == 2
    assert "run1.log" in one_line(capsys)


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("name, text, fmt", [
    ("t.yaml", f"description: {_deep(1000)}\n", ["--format", "table"]),
    ("d.json", f'{{"gpt2": {_deep(1000)}}}', ["--format", "dlperf-json", "--precision", "fp32"]),
    ("t.yaml", None, ["--format", "table"]),  # raw bytes
    ("t.csv", None, ["--format", "table", "--source", "s", "--tool", "t", "--model", "gpt2", "--gpu", "V100"]),
])
def test_import_of_deep_nesting_or_raw_bytes_is_one_line(tmp_path, capsys, name, text, fmt):
    import random

    f = tmp_path / name
    if text is None:
        f.write_bytes(bytes(random.Random(0).randrange(128, 256) for _ in range(100_000)))
    else:
        f.write_text(text)
    assert run("import", f, *fmt, "--store", tmp_path / "st") == 2
    assert str(f) in one_line(capsys)
    assert not (tmp_path / "st").exists()


def test_a_suite_nested_1000_deep_is_one_line(tmp_path, capsys):
    s = tmp_path / "s.yaml"
    s.write_text(f"description: {_deep(1000)}\ncases: []\n")
    assert run("sweep", s, "--dry-run", "--store", tmp_path / "st") == 2
    assert "s.yaml" in one_line(capsys)


# ----------------------------------------------------------------------------- data make tokens

def test_make_tokens_refuses_what_the_disk_cannot_hold_before_writing(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    assert run("data", "make", "tokens", "--out", out, "--size", "999999G") == 2
    one_line(capsys)
    assert list(tmp_path.iterdir()) == []  # not even the folder
    assert run("data", "make", "tokens", "--out", "/proc/x", "--size", "1k") == 2
    assert "/proc/x" in one_line(capsys)


@pytest.mark.parametrize("fault, code", [(OSError(28, "No space left on device"), EXIT_FAILED),
                                         (KeyboardInterrupt(), EXIT_INTERRUPTED)])
def test_make_tokens_removes_a_partial_set(tmp_path, capsys, monkeypatch, fault, code):
    from dlscale.inputs import make

    def partial(path, *a):
        path.write_bytes(b"\0" * 1000)
        raise fault

    monkeypatch.setattr(make, "_write_tokens", partial)
    assert run("data", "make", "tokens", "--out", tmp_path / "t", "--size", "1M") == code
    assert len([ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]) == 1
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "given").mkdir()  # a folder the user made stays, empty
    assert run("data", "make", "tokens", "--out", tmp_path / "given", "--size", "1M") == code
    assert list((tmp_path / "given").iterdir()) == []


# ----------------------------------------------------------------------------- diagnosis

def _torchrun_killed(rank: int, code: int) -> str:
    return ("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n====\nRoot Cause (first observed "
            f"failure):\n[0]:\n  rank      : {rank} (local_rank: {rank})\n  exitcode  : {code} (pid: 4242)\n====")


def test_a_stopped_rank_killed_after_its_peers_collective_timeout_is_a_timeout_naming_it():
    """SIGSTOPped rank 1 cannot act on torchrun's SIGTERM after rank 0's collective timeout, and is
    SIGKILLed 30 s later: the stall is the cause, not the kill (nor the OOM killer)."""
    from dlscale.case import launch

    ranks = [{"rank": 0, "status": "failed", "error": "RuntimeError: Timed out waiting 8000ms for recv operation"}]
    status, error = launch.classify(ProcResult(1, False, 0.0, _torchrun_killed(1, -9)), ranks, 2)
    first = error.split(";")[0]  # the cause comes first: the stalled rank, not its kill nor its peer
    assert status == "timeout" and first.startswith("rank 1 ") and "SIGKILL" not in first, error
    assert "out-of-memory" not in error
    # a rank killed first (its peer failed otherwise, or not at all) stays the cause
    peer = [{"rank": 0, "status": "failed", "error": "RuntimeError: Connection closed by peer"}]
    for rs in ([], peer):
        status, error = launch.classify(ProcResult(1, False, 0.0, _torchrun_killed(1, -9)), rs, 2)
        first = error.split(";")[0]
        assert status == "failed" and first.startswith("rank 1 ") and "SIGKILL" in first, error


# ----------------------------------------------------------------------------- imported numbers

TABLE = ("format: dlscale-table/1\nsource: s\ntool: t\nmodel: gpt2\nunit: seq\nhardware: {gpu: V100}\nrows:\n"
         "  - {batch_size: %s, nodes: 1, gpus_per_node: 1, precision: fp32, %s}\n")


@pytest.mark.parametrize("batch, figure, fragment", [
    ("4", "throughput: 1.7e+308", "throughput"),
    ("4", "runs: [1.0e+308, 2.0]", "runs"),
    ("4", "throughput: 1" + "0" * 5000, "digits"),
    (str(10 ** 20), "throughput: 5.0", "batch_size"),
    ("4", "runs: [1e300, 2.0]", "1.0e+300"),  # YAML 1.1 text: the line says how to write the number
])
def test_import_refuses_implausible_numbers(tmp_path, capsys, batch, figure, fragment):
    t = tmp_path / "t.yaml"
    t.write_text(TABLE % (batch, figure))
    assert run("import", t, "--format", "table", "--store", tmp_path / "st") == 2
    assert fragment in one_line(capsys)
    assert not (tmp_path / "st").exists()


def test_one_implausible_record_never_makes_a_store_unreportable(tmp_path, capsys):
    """Records written before the bounds (or edited by hand) are skipped and named; the rest is reported."""
    import json

    t, st = tmp_path / "t.yaml", tmp_path / "st"
    t.write_text(TABLE % ("4", "runs: [5.0, 6.0]"))
    assert run("import", t, "--format", "table", "--store", st) == 0
    good = (st / "results.jsonl").read_text()
    bad = []
    for path, value in ((("summary", "samples_per_s", "median"), 1.7e308), (("repeats", 0, "samples_per_s"), 1e308),
                        (("config", "batch_size"), 10 ** 20)):
        r = json.loads(good)
        *head, last = path
        o = r
        for k in head:
            o = o[k]
        o[last] = value
        bad.append(json.dumps(r))
    digits = good.replace('"samples_per_s": 5.0', '"samples_per_s": 1' + "0" * 5000, 1)
    assert digits != good
    (st / "results.jsonl").write_text(good + "\n".join(bad) + "\n" + digits)
    from dlscale.results.store import ResultStore

    loaded = ResultStore(st).load()
    assert len(loaded.records) == 1 and [n for _, n, _ in loaded.skipped] == [2, 3, 4, 5]
    for fmt in ("md", "html", "json", "csv"):
        assert run("report", st, "--format", fmt, "--output", tmp_path / f"r.{fmt}") == 0
        assert "gpt2" in (tmp_path / f"r.{fmt}").read_text()


# ----------------------------------------------------------------------------- absurd sizes, refused up front

@pytest.mark.parametrize("argv, option", [
    (["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "80GiB", "--peak-tflops", "inf"], "peak-tflops"),
    (["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "1e300"], "gpu-memory"),
    (["plan", "--model", "gpt2", "--nproc-per-node", "8", "--gpu-memory", "1"], "gpu-memory"),
    (["predict", "{st}", "--shapes", "1000000x8"], "shapes"),
    (["cost", "{st}", "--tokens", "1e30"], "tokens"),
    (["micro", "matmul", "--device", "cpu", "--sizes", "10000000", "--store", "{st}"], "sizes"),
    (["micro", "bandwidth", "--device", "cpu", "--size", "1T", "--store", "{st}"], "size"),
])
def test_absurd_sizes_are_one_line_before_anything_runs(tmp_path, capsys, monkeypatch, argv, option):
    from dlscale.micro import common

    monkeypatch.setattr(common, "memory_bytes", lambda device: 64 << 30)  # not the host's: a fixed 64 GiB device
    st = tmp_path / "st"
    assert run(*[a.replace("{st}", str(st)) for a in argv]) == 2
    assert option in one_line(capsys)
    assert not st.exists()


def test_the_device_bound_lets_a_size_that_fits_through(monkeypatch):
    from dlscale import ConfigError
    from dlscale.micro import common

    monkeypatch.setattr(common, "memory_bytes", lambda device: 1000)
    common.check_fits(1000, "cpu", "--size")
    with pytest.raises(ConfigError):
        common.check_fits(1001, "cpu", "--size")


# ----------------------------------------------------------------------------- Markdown

def _live_html(md: str) -> list[str]:
    """Raw HTML a CommonMark + GFM-tables renderer would pass through (markdown-it-py, which rich brings)."""
    from markdown_it import MarkdownIt

    def walk(tokens):
        for t in tokens:
            if t.type in ("html_inline", "html_block"):
                yield t.content
            yield from walk(t.children or [])
    return list(walk(MarkdownIt("commonmark").enable("table").parse(md)))


def test_md_safe_leaves_no_live_html_and_keeps_code_spans():
    from dlscale.fmt import md_code, md_safe

    for text in ["a <b>c</b>", "label x`<img src=y onerror=alert(12)>", "| a` | <y> | b` |", "\\` <i> `",
                 "x " + md_code("x`<img src=q>") + " <u>", "<div>\nblock</div>", "`` a`b `` <s>"]:
        safe = md_safe(text)
        assert _live_html(safe) == [] and md_safe(safe) == safe, (text, safe)
    assert md_safe("a `<x>` b") == "a `<x>` b"  # in a code span a tag is already text
    assert _live_html(md_code("x`<img>`")) == [] and "<img>" in md_code("x`<img>`")


def test_markdown_outputs_pass_no_raw_html_from_labels_models_or_sources(tmp_path, capsys):
    t, a = tmp_path / "t.yaml", tmp_path / "a"
    t.write_text(TABLE.replace("model: gpt2", "model: '<i>m</i>'").replace("source: s", "source: '<img src=a>'")
                 .replace("tool: t", "tool: '`<script>x</script>'").replace("{gpu: V100}", "{gpu: '<u>V</u>'}")
                 % ("4", "runs: [5.0, 6.0]") + "  - {batch_size: 4, nodes: 1, gpus_per_node: 2, precision: fp32, "
                 "runs: [9.0, 9.5], strategy: fsdp}\n")
    assert run("import", t, "--format", "table", "--store", a, "--label", "x`<img src=y onerror=alert(12)>") == 0
    for argv in (["report", a], ["report", a, "--group-by", "label"], ["compare", a, a]):
        capsys.readouterr()
        assert run(*argv, "--format", "md") in (0, 1)
        out = capsys.readouterr().out
        assert ("<img src=" in out or "<i>" in out) and _live_html(out) == [], (argv, _live_html(out))


# ----------------------------------------------------------------------------- one sweep per store

SWEEP = "device: cpu\nsteps: 2\ncases:\n  - {model: gpt2, flavor: tiny, batch_size: 2, precision: fp32}\n"


def test_a_second_sweep_into_a_claimed_store_is_refused_naming_the_first(tmp_path, capsys):
    import os

    from dlscale.results.store import CLAIM_FILE, ResultStore

    suite, st = tmp_path / "s.yaml", tmp_path / "st"
    suite.write_text(SWEEP)
    with ResultStore(st).claim():
        assert run("sweep", suite, "--store", st) == 2
        assert str(os.getpid()) in one_line(capsys)
        assert run("sweep", suite, "--store", st, "--dry-run") == 0  # a dry run writes nothing: no claim needed
    assert not (st / "results.jsonl").exists()
    (st / CLAIM_FILE).write_text("999999999\n")  # left by a process that died: no flock holds it
    with ResultStore(st).claim():
        assert (st / CLAIM_FILE).read_text().strip() == str(os.getpid())


def test_a_store_that_is_a_file_is_named_as_one(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    for argv in (["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--steps", "1"],
                 ["sweep", tmp_path / "s.yaml"]):
        (tmp_path / "s.yaml").write_text(SWEEP)
        assert run(*argv, "--store", f) == 2
        assert "File exists" not in one_line(capsys)
    assert f.read_text() == "x"


# ----------------------------------------------------------------------------- inductor options

@pytest.mark.parametrize("options", [
    {"memory_pool": "/bin/sh"}, {"cpu_backend": "../../bin/sh"}, {"max_autotune_gemm_backends": "ATEN,/tmp/x"},
    {"post_grad_custom_post_pass": 1}, {"inductor_choices_class": True}, {"trace.enabled": True},
    {"trace.debug_dir": "st"}])
def test_inductor_values_that_name_paths_callables_or_write_files_are_refused(options):
    from dlscale import ConfigError
    from dlscale.train.compiling import check_options

    with pytest.raises(ConfigError, match=r"inductor-option ") as e:
        check_options(options)
    assert "\n" not in str(e.value) and next(iter(options)) in str(e.value)  # the setting named


def test_inductor_plain_values_still_pass():
    from dlscale.train.compiling import check_options

    check_options({"memory_pool": "none", "cpu_backend": "cpp", "max_autotune_gemm_backends": "ATEN,TRITON",
                   "reorder_prefetch_limit": 2, "cpp.simdlen": 8, "trace.enabled": False})


def test_a_callable_inductor_setting_is_exit_2_before_launch(tmp_path, capsys, monkeypatch):
    from dlscale.case import launch

    monkeypatch.setattr(launch, "measure", lambda *a, **k: pytest.fail("the case was launched"))
    assert run("run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--compile", "--inductor-option",
               "post_grad_custom_post_pass=1", "--store", tmp_path / "st") == 2
    assert "post_grad_custom_post_pass" in one_line(capsys)
    assert not (tmp_path / "st").exists()


# ----------------------------------------------------------------------------- leftovers

def _store_with_series(tmp_path, monkeypatch):
    import json
    import os

    from dlscale.results.store import ORPHAN_AGE_S, ResultStore, new_record

    st, rec = tmp_path / "st", new_record("run", status="ok")
    recovery = tmp_path / "recovery"
    recovery.mkdir()
    monkeypatch.setenv("DLSCALE_RECOVERY_DIR", str(recovery))
    ResultStore(st).append(rec)
    (st / "series").mkdir()
    kept_elsewhere = "ab" * 16
    (recovery / f"dlscale-unstored-{kept_elsewhere[:12]}-abcdef.jsonl").write_text("{}\n")
    names = {"mine": f"{rec['id']}-r0-rank0.jsonl", "orphan": f"{'cd' * 16}-r0-rank0.jsonl",
             "empty": f"{rec['id']}-r1-rank0.jsonl", "recovered": f"{kept_elsewhere}-r0-rank0.jsonl"}
    for what, name in names.items():
        (st / "series" / name).write_text("" if what == "empty" else json.dumps({"t": 1.0}) + "\n")
        old = time.time() - 2 * ORPHAN_AGE_S  # a recent one may belong to a case running on another node
        os.utime(st / "series" / name, (old, old))
    (st / "series" / f"{'ef' * 16}-r0-rank0.jsonl").write_text("{}\n")
    names["recent"] = f"{'ef' * 16}-r0-rank0.jsonl"
    return st, names


def test_a_writer_removes_series_no_record_will_name(tmp_path, monkeypatch):
    """A SIGKILLed sweep leaves series of a record never appended; a full disk leaves an empty one."""
    from dlscale.results.store import ResultStore

    st, names = _store_with_series(tmp_path, monkeypatch)
    ResultStore(st).check_writable()
    assert sorted(p.name for p in (st / "series").iterdir()) == sorted([names["mine"], names["recovered"],
                                                                         names["recent"]])


def test_series_stay_while_another_writer_runs(tmp_path, monkeypatch):
    import fcntl
    import os

    from dlscale.results.store import WRITERS_FILE, ResultStore

    st, names = _store_with_series(tmp_path, monkeypatch)
    fd = os.open(st / WRITERS_FILE, os.O_RDWR | os.O_CREAT)  # another writer's shared hold
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        ResultStore(st).check_writable()
        assert sorted(p.name for p in (st / "series").iterdir()) == sorted(names.values())
    finally:
        os.close(fd)


def test_a_burst_of_signals_lets_the_first_ones_clean_up_finish(monkeypatch, capsys):
    import signal

    from dlscale.case import procs
    from dlscale.commands import run as run_cmd

    finished = []

    def command(args):
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:  # the clean-up of the first signal, hit by a second
            signal.raise_signal(signal.SIGHUP)
            finished.append(True)

    before = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        monkeypatch.setattr(run_cmd, "cmd_env", command)
        assert main(["env"]) == procs.EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, before)
    assert finished and capsys.readouterr().err.strip() == "dlscale: interrupted by SIGTERM"


def test_an_interrupted_sampler_leaves_no_temp_file(tmp_path, monkeypatch):
    import subprocess
    import tempfile

    from dlscale import monitor

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def interrupted(*a, **k):
        raise KeyboardInterrupt("SIGTERM")

    s = monitor.HardwareSampler(0.1, nvml=False)
    monkeypatch.setattr(subprocess, "Popen", interrupted)  # the signal lands as the child starts
    with pytest.raises(KeyboardInterrupt):
        s.start()
    assert list(tmp_path.iterdir()) == []

    class Child:
        killed = False

        def kill(self):
            Child.killed = True

    s = monitor.HardwareSampler(0.1, nvml=False)
    s._proc, s._stderr_path = Child(), str(tmp_path / "x.err")
    (tmp_path / "x.err").write_text("")
    monkeypatch.setattr(s, "_stop", interrupted)  # the signal lands while it stops
    with pytest.raises(KeyboardInterrupt):
        s.stop()
    assert Child.killed and list(tmp_path.iterdir()) == []


def test_a_store_file_without_read_permission_is_named_as_such(tmp_path, monkeypatch):
    import builtins

    from dlscale.results.store import ResultStore, new_record

    st = ResultStore(tmp_path / "st")
    st.append(new_record("run", status="ok"))
    real = builtins.open

    def denied(path, *a, **k):  # as a non-root user sees a chmod 000 file
        if str(path) == str(st.file):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(builtins, "open", denied)
    warning = st.load().warning()
    assert str(st.file) in warning and "permission" in warning and "line(s)" not in warning
