"""Log parsers on log text written here in each tool's documented format (hand-computed figures)."""
import re

import pytest

from dlscale import ConfigError
from helpers_cli import names
from dlscale.external.parsers import (LogLine, ParseError, ParseOptions, get_parser, parse_file, parser_names)


def numbers(text: str) -> set[int]:
    """The whole numbers a message states."""
    return {int(n) for n in re.findall(r"(?<![\d.])\d+(?![\d.])", text)}


def opts(**kw):
    return ParseOptions(**{"warmup": 20, "steps": 30, **kw})


# ----------------------------------------------------------------------------- log writers

def titan_log(tps, steps=(1, 10, 20, 30, 40, 50, 60)):
    """torchtitan's MetricsProcessor.log lines, colours included, behind its logger prefix."""
    out = ["[rank0]:[titan] 2025-01-01 10:00:00,000 - root - INFO - Training starts at step 1"]
    for s, t in zip(steps, tps):
        out.append(f"[rank0]:[titan] 2025-01-01 10:00:{s:02d},000 - root - INFO - \x1b[31mstep: {s:2}  "
                   f"\x1b[32mloss:  8.1234  \x1b[33mgrad_norm:  1.2345  \x1b[36mmemory: 12.34GiB(15.50%)  "
                   f"\x1b[34mtps: {t:,}  \x1b[36mtflops: 123.45  \x1b[35mmfu: 12.50%\x1b[39m")
        if s == 30:
            out.append(f"[rank0]:[titan] - root - INFO - \x1b[33mvalidate step: {s:2}  loss:  8.0  tps: 99")
    return out


def megatron_log(ms, gbs=16, interval=10):
    out = ["training ..."]
    for i, t in enumerate(ms, 1):
        it = i * interval
        out.append(f" [2025-04-13 23:41:{i:02d}] iteration {it:8d}/{1000:8d} | consumed samples: {it * gbs:12d} | "
                   f"elapsed time per iteration (ms): {t:.1f} | throughput per GPU (TFLOP/s/GPU): {100 + i:.1f} | "
                   f"learning rate: 4.000000E-05 | global batch size: {gbs:5d} | lm loss: 1.072453E+01 | "
                   f"loss scale: 1.0 | grad norm: 3.874 | number of skipped iterations:   0 | "
                   f"number of nan iterations:   0 |")
        if i == 1:
            out.append("[Rank 0] (after 10 iterations) memory (MB) | allocated: 1464.3 | max allocated: 1464.3")
    return out


def deepspeed_log(durations, batch=32, every=10, start_step=2, old=False):
    """DeepSpeed's ThroughputTimer lines from per-step durations (seconds), as the timer computes them."""
    out, total = [], 0.0
    for s, d in enumerate(durations, 1):
        if s > start_step:  # the timer starts once global_step_count >= start_step
            total += d
        if s % every == 0:
            avg = batch * (s - start_step) / total
            out.append(f"[2023-11-07 01:55:23,711] [INFO] [logging.py:96:log_dist] [Rank 0] step={s}, skipped=0, "
                       f"lr=[5e-05], mom=[(0.9, 0.95)]")
            if old:
                out.append(f"[2022-08-29 06:58:56,176] [INFO] [timer.py:198:stop] 0/{s}, "
                           f"RunningAvgSamplesPerSec={avg!r}, CurrSamplesPerSec={batch / d!r}, "
                           f"MemAllocated=0.36GB, MaxMemAllocated=15.06GB")
            else:
                out.append(f"[2023-11-07 01:55:23,714] [INFO] [timer.py:260:stop] epoch=0/micro_step={s * 4}/"
                           f"global_step={s}, RunningAvgSamplesPerSec={avg!r}, CurrSamplesPerSec={batch / d!r}, "
                           f"MemAllocated=4.32GB, MaxMemAllocated=38.49GB")
    return out


def hf_lines(step_s, logging_steps=2, batch=8, v5=True, times=True, t0=1000.0):
    """The Trainer's stdout: one log dict every logging_steps steps, then the final metrics."""
    q = (lambda v: f"'{v:.4g}'") if v5 else (lambda v: repr(float(v)))
    out, t = [LogLine("  0%|          | 0/40 [00:00<?, ?it/s]", t0)], t0
    for s, d in enumerate(step_s, 1):
        t += d
        if s % logging_steps == 0:
            out.append(LogLine("{'loss': %s, 'grad_norm': %s, 'learning_rate': %s, 'epoch': %s}"
                               % (q(10.5 - s / 100), q(3.2), q(5e-05), q(s / len(step_s))), t if times else None))
    runtime = sum(step_s)
    steps_ps, samples_ps = len(step_s) / runtime, len(step_s) * batch / runtime
    out.append(LogLine("{'train_runtime': %s, 'train_samples_per_second': %s, 'train_steps_per_second': %s, "
                       "'train_loss': %s, 'epoch': %s}" % (q(runtime), q(samples_ps), q(steps_ps), q(10.2), q(1.0)),
                       t + 0.1 if times else None))
    return out


# ----------------------------------------------------------------------------- good logs

def test_registry_lists_every_parser():
    assert parser_names() == ["deepspeed", "dlperf", "hf-trainer", "megatron", "regex", "torchtitan"]
    with pytest.raises(ConfigError, match=names("'nope'", *parser_names())):  # the value and every choice
        get_parser("nope")



def test_torchtitan_skips_warmup_intervals_and_takes_harmonic_mean_times_world():
    # lines at steps 1, 10, 20, 30 ... cover (0,1], (1,10], (10,20], (20,30] ...; W=20: 30, 40, 50 form N=30
    r = get_parser("torchtitan").parse(titan_log([10, 900, 1000, 3000, 4000, 6000, 7000]), opts(world_size=2))
    assert r.unit == "tok" and r.skipped_steps == 20 and r.window_steps == 30 and r.steps_seen == 60
    assert r.samples_per_s == pytest.approx(2 * 3 / (1 / 3000 + 1 / 4000 + 1 / 6000))  # 8000 tok/s
    assert r.per_step_samples_per_s == [6000, 8000, 12000]
    assert r.extra["mfu_pct"] == pytest.approx(12.5) and r.extra["tflops_per_device"] == pytest.approx(123.45)
    assert not r.warnings


def test_torchtitan_window_straddling_warmup_starts_later_and_short_window_warns():
    r = get_parser("torchtitan").parse(titan_log([10, 900, 1000, 3000, 4000, 6000, 7000]),
                                       opts(warmup=15, steps=100))
    assert r.skipped_steps == 20  # the (10, 20] line straddles step 15: skipped whole
    assert r.window_steps == 40 and {40, 100} <= numbers(r.warnings[0]), r.warnings  # the steps held and asked


def test_megatron_total_samples_over_total_time():
    r = get_parser("megatron").parse(megatron_log([2000, 1000, 500, 400, 800, 1000]), opts())
    assert r.samples_per_s == pytest.approx(3 * 10 * 16 / (10 * (0.5 + 0.4 + 0.8)))  # 28.235
    assert r.step_times_ms == [500, 400, 800] and r.window_s == pytest.approx(17.0)
    assert r.extra["global_batch"] == 16 and r.extra["tflops_per_device"] == pytest.approx(104.0)


@pytest.mark.parametrize("old", [False, True])
def test_deepspeed_window_from_running_averages(old):
    durations = [0.5] * 20 + [0.25] * 40
    r = get_parser("deepspeed").parse(deepspeed_log(durations, old=old), opts())
    # steps 21..50 at 0.25 s, 32 samples each: 128 samples/s, whatever the warm-up steps took
    assert r.samples_per_s == pytest.approx(128.0)
    assert (r.skipped_steps, r.window_steps) == (20, 30)


def test_deepspeed_without_anchor_uses_printed_steps_and_warns():
    durations = [0.5] * 20 + [0.25] * 40
    r = get_parser("deepspeed").parse(deepspeed_log(durations, every=25), opts(warmup=20, steps=40))
    # prints at 25 and 50 only: no print inside the warm-up -> CurrSamplesPerSec of steps 25 and 50
    assert r.samples_per_s == pytest.approx(128.0) and "printed steps" in r.warnings[0]


def test_deepspeed_samples_per_sec_lines():
    lines = [f"Model Parameters: 0.125 B, Latency: 1.00s, TFLOPs: 10.00, Samples/sec: {v:.2f}, Time/seq 0.12s, "
             f"Batch Size: 8, Sequence Length: 512" for v in [5.0] * 20 + [8.0, 16.0]]
    r = get_parser("deepspeed").parse(lines, opts(steps=2))
    assert r.samples_per_s == pytest.approx(2 / (1 / 8 + 1 / 16))


def test_regex_harmonic_mean_of_matched_values():
    lines = ["noise"] + [f"step {i} loss 1.0 samples/sec: {v}" for i, v in enumerate([50.0] * 2 + [100, 200, 400, 9])]
    p = get_parser("regex")
    o = opts(warmup=2, steps=3, metric=r"samples/sec: (?P<value>[0-9.]+)", unit="img", global_batch=10)
    r = p.parse(lines, o)
    assert r.samples_per_s == pytest.approx(3 / (1 / 100 + 1 / 200 + 1 / 400))
    assert r.step_times_ms == pytest.approx([100.0, 50.0, 25.0]) and r.unit == "sample"
    o.options = {"steps_per_line": 2, "scale": 2}
    r = p.parse(lines, o)  # each line now covers 2 steps: W=2 skips one line, N=3 takes two lines (4 steps)
    assert (r.skipped_steps, r.window_steps) == (2, 4) and r.samples_per_s == pytest.approx(2 * 2 / (1 / 50 + 1 / 100))


@pytest.mark.parametrize("metric,unit,fragment", [
    (None, "img", "needs --metric"),
    ("samples/sec: ([0-9.]+)", "img", "has no named group 'value'"),
    ("samples/sec: (?P<value>[0-9.]+", "img", "is not a valid regular expression"),
    ("(?P<value>[0-9.]+)", "images", "needs --unit, one of img, seq, tok"),
])
def test_regex_bad_metric_is_config_error(metric, unit, fragment):
    with pytest.raises(ConfigError, match=fragment):
        get_parser("regex").check(opts(metric=metric, unit=unit))


@pytest.mark.parametrize("v5", [True, False])
def test_hf_trainer_live_arrival_times(v5):
    step_s = [0.5] * 10 + [0.25] * 30  # 40 steps, logged every 2, 8 samples per step
    r = get_parser("hf-trainer").parse(hf_lines(step_s, v5=v5), opts(warmup=10, steps=20))
    assert r.samples_per_s == pytest.approx(8 / 0.25, rel=1e-9)  # steps 11-30 only
    assert (r.skipped_steps, r.window_steps) == (10, 20)
    assert r.window_t == pytest.approx((1005.0, 1010.0))
    assert r.extra["trainer_samples_per_s"] == pytest.approx(25.6, rel=1e-3)  # the Trainer's whole-run figure
    assert r.step_times_ms == pytest.approx([250.0] * 10)  # mean step time of each 2-step line


def test_hf_trainer_saved_log_falls_back_to_whole_run_with_warning():
    step_s = [0.5] * 10 + [0.25] * 30
    r = get_parser("hf-trainer").parse(hf_lines(step_s, times=False), opts(warmup=10, steps=20))
    assert r.samples_per_s == pytest.approx(25.6) and "warm-up" in r.warnings[0], r.warnings  # what it includes


def test_hf_trainer_state_json():
    import json
    state = {"global_step": 40, "train_batch_size": 8, "log_history": [
        {"loss": 10.5, "step": 2, "epoch": 0.05},
        {"train_runtime": 12.5, "train_samples_per_second": 25.6, "train_steps_per_second": 3.2,
         "train_loss": 10.2, "total_flos": 1e12, "epoch": 1.0, "step": 40}]}
    r = get_parser("hf-trainer").parse(json.dumps(state, indent=2).splitlines(), opts())
    assert r.samples_per_s == 25.6 and r.window_steps == 40 and r.warnings


def test_hf_trainer_logging_first_step():
    step_s = [0.5] * 10 + [0.25] * 30
    lines = hf_lines(step_s, logging_steps=5)
    # logging_first_step: an extra line after step 1
    lines.insert(1, LogLine("{'loss': '10.9', 'grad_norm': '3', 'learning_rate': '5e-05', 'epoch': '0.025'}", 1000.5))
    r = get_parser("hf-trainer").parse(lines, opts(warmup=10, steps=20))
    assert r.samples_per_s == pytest.approx(32.0) and r.skipped_steps == 10


def dlperf_mxnet(per_iter, ranks=2, seq=128):
    """gluon-nlp run_pretraining.py lines, one per rank and iteration (K tokens/s of that rank)."""
    out = []
    for s, v in enumerate(per_iter, 1):
        for _ in range(ranks):
            out.append(f"INFO:root:[step {s}]\tmlm_loss=7.33858\tmlm_acc=4.24\tnsp_loss=0.68\tnsp_acc=54.02\t"
                       f"throughput={v}K tks/s\tlr=0.0000100 time=0.82, latency=820.4 ms/batch")
    return out


def test_dlperf_mxnet_median_over_ranks_arithmetic_mean_over_window():
    lines = dlperf_mxnet([9.9, 9.9, 19.2, 19.3, 19.4, 1.0])
    r = get_parser("dlperf").parse(lines, opts(warmup=2, steps=3, world_size=2, seq_len=128))
    # DLPerf: X * 1000 / 128 * devices, mean over iterations 3-5
    assert r.samples_per_s == pytest.approx((19.2 + 19.3 + 19.4) / 3 * 1000 / 128 * 2)
    assert r.window_steps == 3 and r.skipped_steps == 2


def test_dlperf_oneflow_timestamps():
    lines = ["batch_size_per_device = 24", "gpu_num_per_node = 2", "num_nodes = 1"]
    t = 1598056519.0
    for s in range(10):
        t += 0.5 if s < 3 else 0.25
        lines.append(f"step: {s}, total_loss: 9.725, mlm_loss: 8.960, nsp_loss: 0.766, throughput: 54.982 {t!r}")
    r = get_parser("dlperf").parse(lines, opts(warmup=3, steps=5))
    assert r.samples_per_s == pytest.approx(48 * 5 / (5 * 0.25)) and r.window_s == pytest.approx(1.25)


# ----------------------------------------------------------------------------- bad logs

NOISE = ["Loading data...", "epoch 1 done", "Traceback (most recent call last):", "RuntimeError: boom"]
GOOD = {
    "torchtitan": (lambda: titan_log([10, 900, 1000, 3000, 4000, 6000, 7000]), {}),
    "megatron": (lambda: megatron_log([2000, 1000, 500, 400, 800, 1000]), {}),
    "deepspeed": (lambda: deepspeed_log([0.5] * 60), {}),
    "regex": (lambda: [f"samples/sec: {v}" for v in [1.0] * 60], {"metric": r"samples/sec: (?P<value>[0-9.]+)",
                                                                     "unit": "seq"}),
    "hf-trainer": (lambda: hf_lines([0.5] * 60), {}),
    "dlperf": (lambda: dlperf_mxnet([19.0] * 60), {"seq_len": 128, "world_size": 2}),
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_no_throughput_lines_names_file_and_parser(tmp_path, name):
    path = tmp_path / "run.log"
    path.write_text("\n".join(NOISE) + "\n")
    with pytest.raises(ParseError) as e:
        parse_file(get_parser(name), str(path), opts(**GOOD[name][1]))
    msg = str(e.value)
    assert msg.startswith(f"{path}: {name} parser: ") and "\n" not in msg


@pytest.mark.parametrize("name", sorted(GOOD))
def test_truncated_log_is_an_error(tmp_path, name):
    """A log cut before the warm-up ends (or, for the Trainer, before its final metrics)."""
    lines = GOOD[name][0]()
    lines = [ln.text if isinstance(ln, LogLine) else ln for ln in lines]
    cut = lines[: max(2, len(lines) // 8)]
    path = tmp_path / "cut.log"
    path.write_text("\n".join(cut) + "\n")
    with pytest.raises(ParseError) as e:
        parse_file(get_parser(name), str(path), opts(**GOOD[name][1], warmup=40))
    assert str(e.value).startswith(f"{path}: {name} parser: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(GOOD))
def test_wrong_tool_is_an_error(tmp_path, name):
    """Another tool's log given to this parser."""
    other = "megatron" if name != "megatron" else "torchtitan"
    lines = GOOD[other][0]()
    lines = [ln.text if isinstance(ln, LogLine) else ln for ln in lines]
    path = tmp_path / "other.log"
    path.write_text("\n".join(lines) + "\n")
    kw = dict(GOOD[name][1])
    if name == "regex":
        kw["metric"] = r"img/s: (?P<value>[0-9.]+)"
    with pytest.raises(ParseError) as e:
        parse_file(get_parser(name), str(path), opts(**kw))
    assert str(e.value).startswith(f"{path}: {name} parser: ")


def test_mxnet_missing_rank_line_is_truncated():
    lines = dlperf_mxnet([19.0] * 10)[:-1]
    with pytest.raises(ParseError) as e:
        get_parser("dlperf").parse(lines, opts(warmup=2, steps=8, world_size=2, seq_len=128))
    # the iteration short of lines, how many it has and how many ranks should have written one
    assert e.value.parser == "dlperf" and {10, 1, 2} <= numbers(e.value.message), e.value


def test_restarted_run_is_not_one_log():
    lines = titan_log([1, 2, 3, 4, 5, 6, 7]) + titan_log([1, 2, 3, 4, 5, 6, 7])
    with pytest.raises(ParseError) as e:
        get_parser("torchtitan").parse(lines, opts())
    # the step where the count starts again and the one before it: a restart, not a truncation
    assert e.value.parser == "torchtitan" and {1, 60} <= numbers(e.value.message), e.value
