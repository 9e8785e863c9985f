"""Fast unit tests: statistics and formulas against hand-computed values, config validation, store."""
import dataclasses
import json
import os
import re

import pytest

from dlscale import ConfigError
from dlscale.results import metrics
from dlscale.case.config import RunConfig, parse_injection
from dlscale.results.store import SCHEMA, ResultStore, new_record, ok_case_keys
from helpers_cli import names

# ../shared/published/mxnet-bert-base-v100.md: MXNet BERT-base fp32 b32, 7 runs per case
PUBLISHED = {
    "1n1g": ([149.88, 150.90, 150.04, 149.53, 150.12, 150.14, 150.11], 150.11, 150.10),
    "1n2g": ([270.28, 268.86, 272.09, 273.02, 269.99, 271.05, 267.29], 270.28, 270.37),
    "1n4g": ([538.91, 549.75, 536.96, 549.03, 533.45, 538.50, 537.05], 538.50, 540.52),
    "1n8g": ([1047.02, 1050.76, 1075.79, 1036.56, 1058.60, 1075.74, 1061.91], 1058.60, 1058.05),
    "4n8g": ([3698.92, 3673.42, 3658.23, 3666.21, 3671.45, 3668.26, 3693.44], 3671.45, 3675.70),
}
# the published speedups of the same table
PUBLISHED_SPEEDUP = {"1n2g": (2, 1.80), "1n4g": (4, 3.59), "1n8g": (8, 7.05), "4n8g": (32, 24.46)}


@pytest.mark.parametrize("case", sorted(PUBLISHED))
def test_summarize_reproduces_published_median_and_mean(case):
    runs, median, mean = PUBLISHED[case]
    s = metrics.summarize(runs)
    assert s["n"] == 7
    assert round(s["median"], 2) == median
    assert round(s["mean"], 2) == mean
    assert s["min"] == min(runs) and s["max"] == max(runs)


@pytest.mark.parametrize("case", sorted(PUBLISHED_SPEEDUP))
def test_speedup_and_efficiency_reproduce_published(case):
    devices, published = PUBLISHED_SPEEDUP[case]
    base = metrics.summarize(PUBLISHED["1n1g"][0])["median"]
    med = metrics.summarize(PUBLISHED[case][0])["median"]
    sp = metrics.speedup(med, base)
    assert round(sp, 2) == published
    assert metrics.scaling_efficiency(sp, devices) == pytest.approx(sp / devices)


def test_speedup_without_baseline_is_missing():
    assert metrics.speedup(100.0, None) is None
    assert metrics.scaling_efficiency(None, 4) is None


def test_stdev_is_sample_stdev():
    # values 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sum of squares 32, sample variance 32/7
    s = metrics.summarize([2, 4, 4, 4, 5, 5, 7, 9])
    assert s["stdev"] == pytest.approx((32 / 7) ** 0.5)
    assert metrics.summarize([3.0])["stdev"] is None  # one value: no spread, not zero
    assert metrics.summarize([])["median"] is None


def test_percentile_linear_interpolation():
    xs = [10, 20, 30, 40]
    assert metrics.percentile(xs, 50) == 25  # halfway between 20 and 30
    assert metrics.percentile(xs, 90) == pytest.approx(37)  # pos 2.7: 30 + 0.7 * 10
    assert metrics.percentile(xs, 0) == 10 and metrics.percentile(xs, 100) == 40
    with pytest.raises(ValueError):
        metrics.percentile([], 50)


def test_throughput_and_mfu_by_hand():
    # 100 steps x global batch 32 in 8 s = 400 samples/s
    assert metrics.throughput(100, 32, 8.0) == 400.0
    # GPT-2 124M: 875.69 GFLOP/sample at 458 seq/s on a 989.4 TFLOP/s device = 40.5 %
    assert metrics.mfu(875_690_459_136, 458, 989.4e12) == pytest.approx(0.4054, abs=1e-4)
    assert metrics.mfu(1e9, 100, None) is None


def test_peak_table():
    assert metrics.peak_flops("NVIDIA H200", "bf16")[0] == 989.4e12
    assert metrics.peak_flops("NVIDIA H100 80GB HBM3", "tf32")[0] == 494.7e12
    assert metrics.peak_flops("NVIDIA H100 PCIe", "bf16")[0] == 756e12
    assert metrics.peak_flops("NVIDIA A100-SXM4-80GB", "fp16")[0] == 312e12
    assert metrics.peak_flops("Tesla V100-SXM2-16GB", "bf16") == (None, None)  # no bf16 on Volta
    assert metrics.peak_flops("cpu", "fp32") == (None, None)
    assert metrics.peak_flops(None, "bf16") == (None, None)
    value, source = metrics.peak_flops("NVIDIA H200", "bf16")
    assert "datasheet" in source
    assert metrics.precision_dtype("fp32", "cuda") == "tf32"
    assert metrics.precision_dtype("fp32", "cpu") == "fp32"
    assert metrics.precision_dtype("amp-fp16", "cuda") == "fp16"


# Device names as torch.cuda.get_device_name / nvidia-smi / ROCm print them -> (table row, bf16, fp16, tf32)
DEVICE_NAMES = [
    ("NVIDIA B200", "B200", 2.25e15, 2.25e15, 1.1e15),
    ("NVIDIA GB200", "GB200", 2.5e15, 2.5e15, 1.25e15),  # the superchip's GPU, not the HGX B200's figures
    ("NVIDIA GH200 480GB", "GH200", 989.4e12, 989.4e12, 494.7e12),
    ("NVIDIA H200", "H200 SXM", 989.4e12, 989.4e12, 494.7e12),
    ("NVIDIA H200 NVL", "H200 NVL", 835e12, 835e12, 417.5e12),
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4e12, 989.4e12, 494.7e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756e12, 756e12, 378e12),
    ("NVIDIA H100 NVL", "H100 NVL", 835e12, 835e12, 417.5e12),
    ("NVIDIA A100-SXM4-40GB", "A100", 312e12, 312e12, 156e12),
    ("NVIDIA A100-SXM4-80GB", "A100", 312e12, 312e12, 156e12),
    ("NVIDIA A100-PCIE-40GB", "A100", 312e12, 312e12, 156e12),
    ("NVIDIA A100 80GB PCIe", "A100", 312e12, 312e12, 156e12),
    ("NVIDIA A10", "A10", 125e12, 125e12, 62.5e12),
    ("NVIDIA A10G", "A10G", 70e12, 70e12, 35e12),  # not an A10: a different part
    ("NVIDIA L4", "L4", 121e12, 121e12, 60e12),
    ("NVIDIA L40S", "L40S", 362.05e12, 362.05e12, 183e12),
    ("NVIDIA L40", "L40", 181.05e12, 181.05e12, 90.5e12),  # not an L40S, not an L4
    ("Tesla V100-SXM2-16GB", "V100 SXM2", None, 125e12, None),
    ("Tesla V100-SXM2-32GB", "V100 SXM2", None, 125e12, None),
    ("Tesla V100-PCIE-16GB", "V100 PCIe", None, 112e12, None),  # never the SXM2 peak
    ("Tesla V100-PCIE-32GB", "V100 PCIe", None, 112e12, None),
    ("Tesla V100S-PCIE-32GB", "V100S PCIe", None, 130e12, None),
    ("Tesla V100-FHHL-16GB", None, None, None, None),  # a lower-clocked card: unknown, not SXM2's
    ("AMD Instinct MI300X", "MI300X", 1307.4e12, 1307.4e12, 653.7e12),
    ("AMD Instinct MI250X", "MI250X", 383e12, 383e12, None),  # no TF32 on CDNA2
    ("AMD Instinct MI250X / MI250", None, None, None, None),  # ambiguous: MI250 has less
]


@pytest.mark.parametrize("name, row, bf16, fp16, tf32", DEVICE_NAMES, ids=[d[0] for d in DEVICE_NAMES])
def test_peak_table_matches_real_device_names(name, row, bf16, fp16, tf32):
    entry = metrics.peak_entry(name)
    assert (entry.name if entry else None) == row
    for dtype, want in (("bf16", bf16), ("fp16", fp16), ("tf32", tf32)):
        value, source = metrics.peak_flops(name, dtype)
        assert value == want
        assert (source is not None) is (want is not None)


def test_every_peak_row_has_a_source_and_dense_figures():
    for e in metrics.PEAK_FLOPS:
        assert e.source and ("datasheet" in e.source or "specifications" in e.source or "data sheet" in e.source)
        f = e.flops
        assert f.get("bf16", 0) <= f.get("fp8", float("inf")) and f.get("tf32", 0) <= f.get("fp16", float("inf"))
        assert f["fp32"] < f["fp16"]  # fp32 is the CUDA-core (or matrix) figure, far below the tensor peaks


@pytest.mark.parametrize("field,value,fragment", [
    ("batch_size", 0, "batch-size must be >= 1"),
    ("steps", 0, "steps must be >= 1"),
    ("grad_accum", 0, "grad-accum must be >= 1"),
    ("repeats", -1, "repeats must be >= 1"),
    ("warmup", -1, "warmup must be >= 0"),
    ("precision", "fp4", "unknown precision 'fp4'; choose one of: fp32, amp-bf16, amp-fp16, fp8"),
    ("device", "tpu", "unknown device 'tpu'"),
    ("clip_grad_norm", 0.0, "clip-grad-norm must be > 0"),
    ("time_limit", 0, "time-limit must be > 0"),
    ("batch_size", True, "batch-size must be an integer"),
])
def test_config_rejects_bad_values(field, value, fragment):
    with pytest.raises(ConfigError) as e:
        RunConfig(**{field: value})
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_config_roundtrip_and_case_key():
    cfg = RunConfig(model="bert-base", batch_size=32, repeats=3)
    again = RunConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg
    # repeats and labels do not change what is measured; batch size does
    assert RunConfig(model="bert-base", batch_size=32, repeats=7, label="x").case_key() == cfg.case_key()
    assert RunConfig(model="bert-base", batch_size=64).case_key() != cfg.case_key()
    with pytest.raises(ConfigError, match=names("modle", *(f.name for f in dataclasses.fields(RunConfig)))):
        RunConfig.from_dict({"modle": "gpt2"})


def test_injection_parsing():
    assert parse_injection("oom@3:1") == ("oom", 3, 1)
    assert parse_injection("crash@0") == ("crash", 0, None)
    for bad in ("boom@1", "oom", "oom@x"):
        with pytest.raises(ConfigError):
            parse_injection(bad)


def test_store_append_load_and_torn_lines(tmp_path):
    store = ResultStore(tmp_path / "st")
    a = new_record("run", status="ok", case_key="k1", value=1)
    store.append(a)
    # a killed writer leaves a torn line without newline; a foreign line sneaks in too
    with open(store.file, "a") as f:
        f.write('{"not": "ours"}\n')
        f.write('{"schema": "' + SCHEMA + '", "kind": "run", "trunc')
    b = new_record("run", status="oom", case_key="k2", value=2)
    store.append(b)  # must start on a fresh line, leaving only the torn one broken
    loaded = store.load()
    assert [r["id"] for r in loaded.records] == [a["id"], b["id"]]
    assert len(loaded.skipped) == 2
    warning = loaded.warning()  # one line: how many lines were skipped, in which file
    assert "\n" not in warning and re.findall(r"\d+", warning)[0] == "2" and store.file.name in warning, warning
    assert ok_case_keys(loaded.records) == {"k1"}
    assert store.load(kind="micro").records == []


def test_store_never_rewrites(tmp_path):
    store = ResultStore(tmp_path)
    store.append(new_record("run", status="ok"))
    before = store.file.read_bytes()
    store.append(new_record("run", status="ok"))
    after = store.file.read_bytes()
    assert after.startswith(before) and len(after) > len(before)


def test_store_unwritable_is_config_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="not writable"):
        ResultStore(blocker / "sub").check_writable()
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(ConfigError):
            ResultStore(ro / "x").check_writable()


def test_store_rejects_nan(tmp_path):
    store = ResultStore(tmp_path)
    store.append(new_record("run", status="ok", loss=float("nan")))
    rec = store.load().records[0]
    assert rec["loss"] is None


def test_process_phases_by_hand():
    """Where a repeat's process time went: consecutive differences of rank 0's marks."""
    from dlscale.case.launch import process_phases

    marks = {"started": 102.0, "imported": 104.5, "process_group": 105.0, "built": 107.0, "warmed_up": 108.0,
             "window_done": 110.0, "finished": 110.5}
    assert process_phases(marks, 100.0, 111.5) == {"launch": 2.0, "import": 2.5, "init": 0.5, "build": 2.0,
                                                    "warmup": 1.0, "window": 2.0, "after": 0.5, "exit": 1.0}
    # a rank that failed while building: the missing phases' time goes to the next mark present
    assert process_phases({"started": 102.0, "imported": 104.5, "finished": 106.0}, 100.0, 107.0) == {
        "launch": 2.0, "import": 2.5, "after": 1.5, "exit": 1.0}
    assert process_phases(None, 0.0, 1.0) is None


def test_stored_records_keep_their_case_keys():
    """The sectioned RunConfig gives every stored record (the curated stores in docs/results/stores
    and the test fixtures) the key it was stored with."""
    from pathlib import Path

    here = Path(__file__).resolve().parent
    checked = 0
    for f in sorted([*(here.parent / "docs" / "results" / "stores").rglob("*.jsonl"),
                     *(here / "fixtures").rglob("*.jsonl")]):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("kind") != "run" or "config" not in rec:
                continue
            assert RunConfig.from_dict(rec["config"]).case_key() == rec["case_key"], (f.name, rec["id"])
            checked += 1
    assert checked >= 100


def test_every_field_reaches_cli_suite_and_filters():
    """One field's metadata is the whole of its plumbing: an axis field is a suite axis and, when
    marked, a filter key; every field with an option round-trips (tests/test_slurm.py)."""
    from dlscale.case.config import FIELDS
    from dlscale.case.suite import CASE_KEYS, EXPANSION_ORDER, MATCH_KEYS, SETTINGS

    for name, o in FIELDS.items():
        if o.axis and name not in ("nproc_per_node", "nnodes"):
            assert o.axis in EXPANSION_ORDER, name
        if o.match:
            assert {"nnodes": "nodes"}.get(name, name) in MATCH_KEYS, name
        if o.setting:
            assert name in SETTINGS, name
        assert name in CASE_KEYS or name in ("nproc_per_node", "nnodes"), name
    assert "compile_mode" in MATCH_KEYS  # the filter key the hand-written lists missed


@pytest.mark.parametrize("env, fragment", [
    ({"LD_PRELOAD": "x.so"}, "not a tuning variable"),
    ({"NCCL_NET_PLUGIN": "ib"}, "name a plugin, path, library or command"),
    ({"TORCHINDUCTOR_CACHE_DIR": "x"}, "name a plugin, path, library or command"),
    ({"NCCL_ALGO": "Ring;touch x"}, "plain word or number"),
    ({"NCCL_TUNER_PLUGIN": "x"}, "name a plugin, path, library or command"),
    ({"NCCL_ALGO": "/tmp/x"}, "plain word or number"),
])
def test_case_env_never_loads_code(env, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        RunConfig(env=env)
    ok = RunConfig(env={"TORCH_NCCL_HIGH_PRIORITY": 1, "NCCL_ALGO": "Ring"})
    assert ok.case_key() != RunConfig().case_key()  # part of the case; left out when empty


def test_sections_partition_the_fields_and_group_the_help():
    """Every field is in exactly one section, in field order; a case is each of its sections and
    its section copy holds the same values; ``dlscale run --help`` groups each section's options."""
    from dlscale.cli import build_parser
    from dlscale.case.config import FIELDS, SECTIONS, ModelSection

    names = [f.name for sec in SECTIONS for f in dataclasses.fields(sec)]
    assert names == list(FIELDS)  # no field twice, none left out, the suite's expansion order kept
    cfg = RunConfig(grad_accum=3, data_workers=None)
    assert all(isinstance(cfg, sec) for sec in SECTIONS)
    model = cfg.section(ModelSection)
    assert type(model) is ModelSection and model.grad_accum == 3 and not hasattr(model, "data_workers")
    model.grad_accum = 5
    assert cfg.grad_accum == 3
    assert set(cfg.to_dict()) == set(FIELDS)  # stored flat, as before the sections

    run = next(a for a in build_parser()._subparsers._group_actions[0].choices.items() if a[0] == "run")[1]
    grouped = {g.title: {a.dest for a in g._group_actions} for g in run._action_groups}
    for sec in SECTIONS:
        want = {f.name for f in dataclasses.fields(sec) if FIELDS[f.name].option(f.name)}
        assert grouped[f"{sec.title} options"] == want, sec.title
