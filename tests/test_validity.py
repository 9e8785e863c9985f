"""Validity of a measurement: every condition injected into a record is flagged in the record's
validity, in the console and in the HTML report (rendered in headless chromium); the monitor
separates the case's CPU time from other processes'; the launcher stores ``record["validity"]``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from dlscale import console
from dlscale.results import validity
from dlscale.cli import main
from dlscale.results.store import ResultStore

CHROMIUM = "/usr/bin/chromium"
GIB = 2 ** 30


def record(rid: str = "r-sound", *, devices: int = 1, samples=(100.0, 101.0, 99.0, 100.5, 99.5), steps: int = 20,
           window_s: float = 2.0, device: str = "cpu", strategy: str | None = None, util: dict | None = None,
           omp: str | None = "1", step_ms: list[float] | None = None) -> dict:
    """A sound run record (5 repeats, 20 steps, 2 s windows, steady steps, no other load)."""
    strategy = strategy or ("single" if devices == 1 else "ddp")
    cfg = {"model": "gpt2", "flavor": "tiny", "strategy": strategy, "nproc_per_node": devices, "nnodes": 1,
           "batch_size": 8, "precision": "fp32", "compile": False, "clip_grad_norm": None, "grad_accum": 1,
           "warmup": 5, "steps": steps, "repeats": len(samples), "device": device, "seed": 0,
           "time_limit": 600.0, "collective_timeout": 300.0, "strategy_options": {}, "label": None,
           "monitor": True, "sample_interval": 0.1, "breakdown": False, "profile": False, "inject_failure": None}
    base_util = {"nvml": device == "cuda", "n_gpus": 1 if device == "cuda" else 0, "n_samples": 20,
                 "cpu_util_pct_mean": 50.0, "other_cpu_pct_mean": 2.0, "other_cpu_cores_mean": 0.04,
                 "case_n_cores": 2, "cpu_steal_pct_mean": 0.5}
    if device == "cuda":
        base_util.update({"gpu_throttle_frac": 0.0, "gpu_throttle_reasons": [], "gpu_pids_comparable": True,
                          "gpu_foreign_procs_max": 0, "gpu_foreign_pids": []})
    base_util.update(util or {})
    reps = []
    for i, s in enumerate(samples):
        times = step_ms or [window_s / steps * 1e3] * steps
        reps.append({"repeat": i, "status": "ok", "samples_per_s": s, "window_s": window_s, "step_times_ms": times,
                     "utilisation": dict(base_util), "warmup_losses": [6.2, 6.1], "loss_after": 5.9,
                     "loss_scope": "global"})
    med = statistics.median(samples)
    return {"schema": "dlscale.record/1", "kind": "run", "id": rid, "created": "2026-01-01T00:00:00+00:00",
            "case_key": f"key-{rid}", "label": None, "config": cfg, "device_type": device, "world_size": devices,
            "status": "ok", "error": None, "omp_num_threads": omp,
            "env": {"host": "h", "cpu_count": 2, "cpu_affinity_count": 2},
            "ranks": [{"rank": r, "host": "h", "device": device} for r in range(devices)],
            "model": {"unit": "seq", "seq_len": 64, "params": 1000, "flops_per_sample": 1e6},
            "global_batch": 8 * devices, "repeats": reps, "utilisation": dict(base_util), "breakdown": None,
            "summary": {"samples_per_s": {"n": len(samples), "median": med, "mean": statistics.fmean(samples),
                                          "min": min(samples), "max": max(samples),
                                          "stdev": statistics.stdev(samples) if len(samples) > 1 else None},
                        "samples_per_s_per_device": med / devices, "tokens_per_s": med * 64,
                        "step_ms_p50": 100.0, "step_ms_p90": 100.0, "mfu": None, "peak_rss_bytes": GIB}}


def with_breakdown(rec: dict, step_ms: float) -> dict:
    """The record with a step breakdown whose phases sum to ``step_ms``."""
    rec["breakdown"] = {"supported": True, "steps": 10, "data_ms": 0.0, "forward_ms": step_ms / 3,
                        "backward_ms": step_ms * 2 / 3, "optimizer_ms": 0.0, "step_ms": step_ms, "host_ahead": True}
    return rec


# (check, severity, record): each record carries one condition on top of a sound one
RECORD_CONDITIONS = [
    ("short_window", validity.WARN, lambda: record("r-short", window_s=0.3)),
    ("few_steps", validity.NOTE, lambda: record("r-steps", steps=5)),
    ("few_repeats", validity.NOTE, lambda: record("r-reps", samples=(100.0, 101.0))),
    ("high_cv", validity.WARN, lambda: record("r-cv", samples=(100.0, 130.0, 80.0, 120.0, 90.0))),
    ("drift", validity.WARN, lambda: record("r-drift", step_ms=[100.0] * 10 + [125.0] * 10)),
    # one 400 ms step among 19 of 100 ms: (400 - 100) / 2300 = 13 % of the window; medians unmoved
    ("stall", validity.WARN, lambda: record("r-stall", step_ms=[100.0] * 10 + [400.0] + [100.0] * 9)),
    ("competing_cpu", validity.WARN, lambda: record("r-cpu", util={"other_cpu_pct_mean": 45.0,
                                                                    "other_cpu_cores_mean": 0.9})),
    ("cpu_steal", validity.WARN, lambda: record("r-steal", util={"cpu_steal_pct_mean": 12.5})),
    ("throttled", validity.WARN, lambda: record("r-throttle", device="cuda", util={
        "gpu_throttle_frac": 0.4, "gpu_throttle_reasons": ["hw_thermal_slowdown"]})),
    ("competing_gpu", validity.WARN, lambda: record("r-gpu", device="cuda", util={
        "gpu_foreign_procs_max": 1, "gpu_foreign_pids": [4242]})),
    ("oversubscribed", validity.WARN, lambda: record("r-over", devices=2, omp="2")),
    # the window's steps are 2 s / 20 = 100 ms; the breakdown's phases sum to 110 ms
    ("breakdown_gap", validity.NOTE, lambda: with_breakdown(record("r-bd"), 110.0)),
]


def test_a_sound_record_has_no_flag():
    v = validity.assess(record())
    assert v.flags == [] and v.sound
    v = validity.assess(record(device="cuda"))
    assert v.flags == [] and v.sound and not v.unchecked


@pytest.mark.parametrize("check, severity, make", RECORD_CONDITIONS, ids=[c[0] for c in RECORD_CONDITIONS])
def test_each_condition_is_flagged_in_record_and_console(check, severity, make, capsys):
    rec = make()
    v = validity.assess(rec)
    flags = {f.check: f for f in v.flags}
    assert set(flags) == {check}, v.flags  # exactly the injected condition
    assert flags[check].severity == severity and flags[check].reason
    assert v.sound is (severity != validity.WARN)
    # round trip through the record, as the launcher stores it
    rec["validity"] = v.to_dict()
    assert validity.Validity.from_dict(json.loads(json.dumps(rec["validity"]))).flags == v.flags
    console.print_result(rec)
    out = capsys.readouterr().out
    mark = console.WARN_MARK if severity == validity.WARN else console.NOTE_MARK
    assert f"# {mark} {check}: {flags[check].reason}" in out
    assert ("flagged" in out.splitlines()[2]) is (severity == validity.WARN)


def test_hand_computed_values_in_the_reasons():
    f = validity.assess(record("x", samples=(100.0, 130.0, 80.0, 120.0, 90.0))).flags[0]
    # stdev of (100, 130, 80, 120, 90) = 20.7364..., mean 104 -> CV 19.9 %
    assert f.value == pytest.approx(20.73644135 / 104, rel=1e-6) and "19.9 %" in f.reason
    assert validity.drift([10, 10, 12, 12]) == pytest.approx(0.2)
    assert validity.drift([10, 12, 11, 11, 12, 10]) == pytest.approx(0.0)  # medians of (10,12,11), (11,12,10)
    # median 10; the 40 ms step is over 3 x 10 and costs 40 - 10 = 30 of 130 ms; 25 ms is not a stall
    assert validity.stalls([10] * 8 + [40, 10]) == (1, 40, pytest.approx(30 / 130))
    assert validity.stalls([10] * 8 + [25, 10]) == (0, 0.0, 0.0)
    over = validity.assess(record("o", devices=2, omp="2")).flags[0]
    assert over.value == 4 and over.limit == 2
    # breakdown against the window's 100 ms step: 104 ms is within 5 %, 94 ms is 6 % short
    assert validity.assess(with_breakdown(record("b1"), 104.0)).flags == []
    gap = validity.assess(with_breakdown(record("b2"), 94.0)).flags[0]
    assert gap.check == "breakdown_gap" and gap.value == pytest.approx(-0.06) and "-6.0 %" in gap.reason
    # the window's step is the median over repeats of each repeat's median step
    rec = with_breakdown(record("b3", samples=(100.0, 100.0, 100.0)), 100.0)
    for r, t in zip(rec["repeats"], (80.0, 90.0, 200.0)):
        r["step_times_ms"] = [t] * 20
    assert validity.assess(rec).flags[0].value == pytest.approx(100 / 90 - 1)
    unsupported = record("b4")
    unsupported["breakdown"] = {"supported": False, "reason": "pipeline schedule"}
    assert "breakdown_gap" not in validity.assess(unsupported).unchecked


def test_unchecked_checks_say_why():
    rec = record("no-mon")
    for r in rec["repeats"]:
        r["utilisation"] = None
    rec["utilisation"] = None
    rec["config"]["monitor"] = False
    v = validity.assess(rec)
    why = v.unchecked["competing_cpu"]  # the option that turned the sampling off
    assert why == v.unchecked["cpu_steal"] and "--no-monitor" in why and "older record" not in why, why
    assert "older record" in validity.assess(record("no-steal", util={"cpu_steal_pct_mean": None})).unchecked["cpu_steal"]
    old = record("old", device="cuda", util={"other_cpu_pct_mean": None})
    for r in old["repeats"]:
        for k in ("gpu_throttle_frac", "gpu_pids_comparable"):
            r["utilisation"].pop(k)
    v = validity.assess(old)
    assert "older record" in v.unchecked["competing_cpu"] and "older record" in v.unchecked["throttled"]
    container = record("ctr", device="cuda", util={"gpu_pids_comparable": False, "gpu_foreign_procs_max": 3})
    v = validity.assess(container)
    assert "competing_gpu" not in {f.check for f in v.flags} and "namespace" in v.unchecked["competing_gpu"]


# (check, case record, baseline record): flags on a speedup / efficiency
def _pair(check: str) -> tuple[dict, dict, float]:
    base = record("b-" + check)
    if check == "above_ideal":
        case = record("c-" + check, devices=2, samples=(460.0, 461.0, 459.0, 460.5, 459.5))
    elif check == "baseline_threads":
        case = record("c-" + check, devices=2, samples=(190.0, 191.0, 189.0, 190.5, 189.5))
        base = record("b-" + check, omp="2")
    else:  # baseline_procedure
        case = record("c-" + check, devices=2, samples=(190.0, 191.0, 189.0, 190.5, 189.5))
        base["config"]["steps"] = 40
    eff = statistics.median(s["samples_per_s"] for s in case["repeats"]) / 100.0 / 2
    return case, base, eff


@pytest.mark.parametrize("check", ["above_ideal", "baseline_threads", "baseline_procedure"])
def test_comparison_flags(check):
    case, base, eff = _pair(check)
    flags = validity.compare_flags(case, base, eff)
    assert [f.check for f in flags] == [check], flags


def test_above_ideal_within_noise_is_not_flagged_and_without_noise_estimate_is():
    base = record("b", samples=(100.0, 104.0, 96.0, 102.0, 98.0))  # CV 3.2 %
    case = record("c", devices=2, samples=(206.0, 214.0, 198.0, 210.0, 202.0))  # 103 %: within 2 x 4.5 %
    assert validity.compare_flags(case, base, 1.03) == []
    few = record("c2", devices=2, samples=(206.0, 210.0))
    assert [f.check for f in validity.compare_flags(few, base, 1.04)] == ["above_ideal"]
    assert validity.compare_flags(base, base, 1.0) == []  # a baseline against itself


def _store(tmp_path: Path) -> Path:
    """Every record condition as its own case, and the three comparison conditions as 2-process cases."""
    recs = []
    for i, (check, _, make) in enumerate(RECORD_CONDITIONS):
        rec = make()
        rec["label"] = rec["config"]["label"] = check  # one table per condition
        recs.append(rec)
    for check in ("above_ideal", "baseline_threads", "baseline_procedure"):
        case, base, _ = _pair(check)
        for r in (case, base):
            r["label"] = r["config"]["label"] = check
        recs += [base, case]
    store = tmp_path / "results"
    store.mkdir()
    (store / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return store


def test_report_formats_carry_every_flag(tmp_path, capsys):
    store = _store(tmp_path)
    checks = [c for c, _, _ in RECORD_CONDITIONS] + ["above_ideal", "baseline_threads", "baseline_procedure"]
    assert main(["report", str(store)]) == 0
    md = capsys.readouterr().out
    for check in checks:
        assert f" {check}: " in md, check
    assert main(["report", str(store), "--format", "csv"]) == 0
    csv_text = capsys.readouterr().out
    for check in checks:
        assert check in csv_text
    assert main(["report", str(store), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    seen = set()
    for entries in doc["dlperf"].values():
        for e in entries.values():
            seen |= {f["check"] for f in (e.get("validity") or {}).get("flags", [])}
            seen |= {f["check"] for f in e.get("speedup_flags") or []}
    assert seen >= set(checks)


@pytest.mark.slow  # renders PNG/SVG plots with matplotlib: seconds, kept out of the quick tier
def test_efficiency_plot_marks_flags_and_one_device_tables_draw_no_scaling(tmp_path):
    from dlscale.report.data import Filters, build_report, load_records
    from dlscale.report.plots import render_plots

    report = build_report(load_records(_store(tmp_path)), Filters(labels=["above_ideal", "short_window"]))
    plots = render_plots(report)
    by_group = {g.name: {p.stem[len(g.slug) + 2:] for p in plots if p.key == g.name} for g in report.groups}
    above = next(g for g in report.groups if g.label == "above_ideal" and g.strategy == "ddp")
    assert {"throughput", "speedup", "efficiency"} <= by_group[above.name]
    # one-device tables: nothing to scale, so no throughput/speedup/efficiency plot (step times stay)
    one_dev = [g for g in report.groups if all(r.devices == 1 for r in g.rows)]
    assert len(one_dev) == 2  # short_window, and the above_ideal baseline's own table
    for g in one_dev:
        assert not by_group[g.name] & {"throughput", "speedup", "efficiency"} and "step_times" in by_group[g.name]


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no /usr/bin/chromium here (CI installs it)")
def test_html_report_shows_every_flag_in_chromium(tmp_path, capsys):
    store = _store(tmp_path)
    html = tmp_path / "report.html"
    assert main(["report", str(store), "--format", "html", "--no-plots", "-o", str(html)]) == 0
    capsys.readouterr()
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
           "--disable-background-networking", f"--user-data-dir={tmp_path / 'ud'}", "--dump-dom", html.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    assert "</html>" in dom
    for check, severity, _ in RECORD_CONDITIONS:
        assert f"{check}: " in dom, check  # the reason, in the notes under the table
        cls = "l flag" if severity == validity.WARN else "l note"
        assert f'<td class="{cls}" title="{check}: ' in dom, check  # the validity cell, with its tooltip
    for check in ("above_ideal", "baseline_threads", "baseline_procedure"):
        assert f'<td class="flag" title="{check}: ' in dom, check  # speedup and efficiency cells
    assert dom.count('<li class="flag">') >= 10


# ----------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_run_stores_validity_and_the_monitor_sees_a_competing_process(tmp_path):
    """A real run of 8 steps beside a busy process outside the case: the record holds few_steps,
    few_repeats and competing_cpu, and the console prints them."""
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 120: pass"])
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            rc = main(["run", "--model", "gpt2", "--flavor", "tiny", "--strategy", "single", "--batch-size", "4",
                       "--warmup", "2", "--steps", "8", "--repeats", "1", "--device", "cpu", "--precision", "fp32",
                       "--sample-interval", "0.02", "--store", str(tmp_path), "--time-limit", "240"])
    finally:
        busy.kill()
        busy.wait()
    assert rc == 0, out.getvalue()
    rec = ResultStore(tmp_path).load().records[-1]
    checks = {f["check"] for f in rec["validity"]["flags"]}
    assert {"few_steps", "few_repeats", "competing_cpu"} <= checks, rec["validity"]
    u = rec["repeats"][0]["utilisation"]
    assert u["other_cpu_cores_mean"] > 0.5 and u["case_cpu_cores_mean"] > 0.2, u  # the busy loop is one core
    text = out.getvalue()
    # the console's flag lines: mark and check (the format), each once
    assert text.count("# ! competing_cpu:") == 1 and text.count("# ? few_steps:") == 1, text



def test_side_by_side_compares_one_device_cases_with_verdicts_and_thread_flags(tmp_path, capsys):
    """One-device cases of one workload (eager single, compiled single, ddp at another thread
    count) meet in one table with compare's verdicts; the thread difference is flagged."""
    eager = record("e")
    compiled = record("c", samples=(130.0, 131.0, 129.0, 130.5, 129.5))
    compiled["config"]["compile"] = True
    ddp = record("d", strategy="ddp", samples=(99.0, 101.0, 100.0, 100.5, 99.5), omp="2")
    store = tmp_path / "results"
    store.mkdir()
    (store / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (eager, compiled, ddp)))
    assert main(["report", str(store), "--format", "json"]) == 0
    (table,) = json.loads(capsys.readouterr().out)["side_by_side"]
    by = {c["case"]: c for c in table["cases"]}
    from dlscale.report.compare import FASTER, SAME

    assert by["single · eager"]["reference"] and by["single · compiled"]["verdict"] == FASTER
    assert by["single · compiled"]["ratio"] == pytest.approx(1.3)
    assert by["ddp · eager"]["verdict"] == SAME  # compare's verdict, not a re-typed copy of it
    assert [f["check"] for f in by["ddp · eager"]["flags"]] == ["baseline_threads"]
    assert main(["report", str(store)]) == 0
    md = capsys.readouterr().out
    assert "## Side by side (same workload, different settings)" in md
    assert "| single · compiled | 130.00 | 1.300 |" in md and "⚠ baseline_threads" in md


def test_a_decode_process_without_mps_gets_a_note():
    """GPU decode in its own process time-slices the GPU with the training process unless MPS runs:
    a note where the record says no MPS daemon ran, unchecked where it does not say, nothing with MPS
    or without the option."""
    def checks(mps, process=True):
        rec = record(device="cuda")
        rec["config"]["data_decode_process"] = process
        if mps != "unknown":
            rec["env"]["mps_daemon"] = mps
        v = validity.assess(rec)
        return [f.check for f in v.flags], v.unchecked
    flags, unchecked = checks(False)
    assert "decode_process_time_sliced" in flags and validity.assess(record(device="cuda")).sound
    assert "decode_process_time_sliced" not in checks(True)[0]
    assert "decode_process_time_sliced" in checks("unknown")[1]
    assert "decode_process_time_sliced" not in checks(False, process=False)[0]
