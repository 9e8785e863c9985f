"""Time to quality: the text corpus, --until's target and checks, the record fields, the report table."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dlscale import ConfigError
from dlscale.cli import main
from dlscale.case.config import FIELDS, RunConfig, workload_fields
from dlscale.inputs.corpus import END_OF_DOC, CorpusOptions, make_text_corpus
from dlscale.quality import target as qt

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)


def _source(root: Path, n: int = 12) -> Path:
    """A folder of small, distinct text files (and one that is not text, which must be skipped)."""
    root.mkdir(parents=True)
    for i in range(n):
        body = "".join(f"def f{i}_{k}(x):\n    return x * {k} + {i}  # line {k}\n" for k in range(40 + i))
        (root / f"mod{i:02d}.py").write_text(body)
    (root / "binary.txt").write_bytes(b"\x00\x01\x02 not text")
    (root / "ignored.json").write_text("{}")
    return root


def _corpus(tmp_path: Path, name: str, **kw) -> dict:
    src = kw.pop("source", None) or str(_source(tmp_path / f"src-{name}"))
    return make_text_corpus(CorpusOptions(str(tmp_path / name), source=src, val_share=0.25, **kw))


# ---------------------------------------------------------------------------- the corpus

def test_corpus_is_reproducible_from_its_seed_and_its_manifest_says_what_went_in(tmp_path):
    src = str(_source(tmp_path / "src"))
    a = make_text_corpus(CorpusOptions(str(tmp_path / "a"), source=src, val_share=0.25, seed=3))
    b = make_text_corpus(CorpusOptions(str(tmp_path / "b"), source=src, val_share=0.25, seed=3))
    c = make_text_corpus(CorpusOptions(str(tmp_path / "c"), source=src, val_share=0.25, seed=4))
    for name in ("train.bin", "val.bin"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert a["files"] == b["files"] and a["train_sha256"] == b["train_sha256"]
    assert [f["path"] for f in c["files"]] != [f["path"] for f in a["files"]]  # another seed, another order
    assert "binary.txt" not in {f["path"] for f in a["files"]}
    assert all(f["path"].endswith(".py") for f in a["files"])
    for f in a["files"]:
        data = (Path(src) / f["path"]).read_bytes()
        assert f["bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()
    manifest = json.loads((tmp_path / "a" / "dlscale-data.json").read_text())
    assert manifest["seed"] == 3 and manifest["tokenizer"] == "bytes" and manifest["files"] == a["files"]
    assert manifest["train_sha256"] == hashlib.sha256((tmp_path / "a" / "train.bin").read_bytes()).hexdigest()


def test_byte_corpus_holds_each_split_file_once_in_order(tmp_path):
    m = _corpus(tmp_path, "c", seed=1)
    val = [f for f in m["files"] if f["split"] == "val"]
    train = [f for f in m["files"] if f["split"] == "train"]
    assert val and train and not {f["path"] for f in val} & {f["path"] for f in train}
    for split, files in (("train", train), ("val", val)):
        ids = np.fromfile(tmp_path / "c" / f"{split}.bin", dtype=np.uint16)
        docs = bytes(ids.astype(np.uint8)).split(bytes([END_OF_DOC]))[:-1]
        src = Path(m["source"])
        assert docs == [(src / f["path"]).read_bytes() for f in files]
        assert m[f"{split}_tokens"] == ids.size == sum(f["bytes"] for f in files) + len(files)


def test_bpe_corpus_stays_inside_its_vocabulary_and_is_trained_on_train_only(tmp_path):
    pytest.importorskip("tokenizers", reason="Hugging Face tokenizers not installed")
    m = _corpus(tmp_path, "bpe", tokenizer="bpe", vocab=300)
    ids = np.fromfile(tmp_path / "bpe" / "train.bin", dtype=np.uint16)
    assert m["vocab"] <= 300 and int(ids.max()) < m["vocab"]
    assert (tmp_path / "bpe" / "tokenizer.json").is_file()
    assert m["train_tokens"] < m["train_text_bytes"]  # merges: fewer tokens than bytes


@pytest.mark.parametrize("argv", [["--tokenizer", "bpe", "--vocab", "100"], ["--val-share", "1.5"],
                                  ["--size", "10"], ["--source", "/nonexistent/folder"]])
def test_corpus_bad_input_is_one_line_exit_2_nothing_written(tmp_path, capsys, argv):
    out = tmp_path / "out"
    rc = main(["data", "make", "text-corpus", "--out", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and not out.exists()


# ---------------------------------------------------------------------------- the target and the rate

@pytest.mark.parametrize("text,metric,value", [("val_loss<=3.5", "val_loss", 3.5), (" val_acc >= 0.9 ", "val_acc", 0.9)])
def test_targets_parse(text, metric, value):
    t = qt.parse_target(text)
    assert (t.metric, t.value) == (metric, value)
    assert t.reached(value) and not t.reached(None) and not t.reached(math.nan)


def test_target_direction():
    loss, acc = qt.parse_target("val_loss<=2"), qt.parse_target("val_acc>=0.5")
    assert loss.reached(1.9) and not loss.reached(2.1)
    assert acc.reached(0.6) and not acc.reached(0.4)


@pytest.mark.parametrize("text", ["val_loss>=3", "val_acc<=0.5", "acc>=0.5", "val_loss<3", "val_loss<=-1",
                                  "val_acc>=1.5", "val_loss<=inf", "val_loss", ""])
def test_bad_targets_are_refused(text):
    with pytest.raises(ConfigError):
        qt.parse_target(text)


def test_learning_rate_rule_by_hand():
    assert qt.lr_at(0, 1.0, "constant", 4, 100) == pytest.approx(0.25)  # warm-up: (step + 1) / 4
    assert qt.lr_at(3, 1.0, "cosine", 4, 100) == pytest.approx(1.0)
    assert qt.lr_at(52, 1.0, "cosine", 4, 100) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way down the cosine
    assert qt.lr_at(100, 1.0, "cosine", 4, 100) == pytest.approx(0.1)
    assert qt.lr_at(52, 1.0, "linear", 4, 100) == pytest.approx(1.0 - 0.9 * 0.5)
    assert qt.lr_at(70, 2.0, "constant", 0, 100) == 2.0
    cfg = RunConfig(data="tokens:/x/train.bin", until="val_loss<=3", batch_size=8, lr=0.001, lr_scale="linear")
    assert qt.peak_lr(cfg, 0.5, 32) == pytest.approx(0.004)  # one device's batch 8 -> global 32: x4
    sqrt = RunConfig(data="tokens:/x/train.bin", until="val_loss<=3", batch_size=8, lr=0.001, lr_scale="sqrt",
                     lr_ref_batch=16)
    assert qt.peak_lr(sqrt, 0.5, 64) == pytest.approx(0.002)  # sqrt(64 / 16) = 2
    assert qt.peak_lr(RunConfig(data="tokens:/x/train.bin", until="val_loss<=3"), 0.5, 64) == 0.5  # the model's


def test_quality_fields_leave_existing_case_keys_alone():
    new = set(qt.DEFAULTS) | {"until"}
    assert new <= set(FIELDS)
    assert not new & set(workload_fields(RunConfig().to_dict()))
    a = RunConfig(data="tokens:/x/train.bin", until="val_loss<=3")
    assert a.case_key() != RunConfig(data="tokens:/x/train.bin", until="val_loss<=2").case_key()


def test_repeats_of_a_quality_case_run_over_seeds():
    cfg = RunConfig(data="tokens:/x/train.bin", until="val_loss<=3", seed=7)
    assert [qt.repeat_config(cfg, i).seed for i in range(3)] == [7, 8, 9]
    assert qt.repeat_config(RunConfig(seed=7), 2).seed == 7  # throughput repeats: the same case


def test_chunks_end_at_evaluations_and_at_the_end_of_the_warm_up():
    pytest.importorskip("torch")
    from dlscale.quality.loop import _next_stop, _why_stop

    cfg = RunConfig(data="tokens:/x/train.bin", until="val_loss<=3", eval_every=10, warmup=15, max_steps=20)
    total = qt.horizon(cfg)
    assert total == 35
    stops, s = [], 0
    while s < total:
        s = _next_stop(cfg, s, total)
        stops.append(s)
    assert stops == [10, 15, 20, 30, 35]
    assert _why_stop(3.5, 20, total, False, cfg) is None  # keep training
    assert "35" in _why_stop(3.5, 35, total, False, cfg)  # the step budget, named
    assert "time-limit" in _why_stop(3.5, 20, total, True, cfg)
    assert _why_stop(None, 20, total, False, cfg)  # no validation loss: a reason, not a crash


def test_the_rate_reaches_the_optimizer_that_steps():
    torch = pytest.importorskip("torch")
    from dlscale.quality.loop import _apply_lr

    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=1.0)
    _apply_lr(opt, 0.25)
    assert opt.param_groups[0]["lr"] == 0.25
    opt.param_groups[0]["lr"] = torch.tensor(1.0)  # a capturable optimizer's rate is a tensor: filled in place
    held = opt.param_groups[0]["lr"]
    _apply_lr(opt, 0.5)
    assert opt.param_groups[0]["lr"] is held and float(held) == 0.5

    class Wrapper:  # an outer optimizer whose groups carry no rate (FSDP's shard-local one)
        param_groups = [{"params": [p]}]

    _apply_lr(Wrapper(), 0.5)
    assert "lr" not in Wrapper.param_groups[0]


# ---------------------------------------------------------------------------- bad input of `run`

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("corpus")
    make_text_corpus(CorpusOptions(str(tmp / "c"), source=str(_source(tmp / "src", 30)), val_share=0.1))
    return tmp / "c"


@pytest.mark.parametrize("extra", [
    ["--until", "val_loss<=3"],  # no real data: synthetic batches have no validation split
    ["--eval-every", "5"],  # an --until option without --until
    ["--data", "{train}", "--until", "val_acc>=0.5"],  # gpt2 reports no accuracy
    ["--data", "{train}", "--until", "val_loss<=3", "--eval-batches", "100000"],  # split too small
    ["--data", "{train}", "--until", "val_loss<=3", "--eval-data", "tokens:{dir}/missing.bin"],
    ["--data", "{train}", "--until", "val_loss<=3", "--batch-size", "max"],
])
def test_run_bad_quality_input_is_one_line_exit_2_before_anything(corpus, tmp_path, capsys, extra):
    store = tmp_path / "store"
    argv = [a.format(train=f"tokens:{corpus / 'train.bin'}", dir=corpus) for a in extra]
    rc = main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--batch-size", "2",
               "--store", str(store), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert not (store / "results.jsonl").exists()


# ---------------------------------------------------------------------------- records and the report

def _quality(seed: int, ttq: float | None, gb: int, steps: int | None) -> dict:
    reached = ttq is not None
    return {"target": "val_loss<=3", "reached": reached, "reason": None if reached else "not reached in 50 steps",
            "seed": seed, "samples_to_target": steps * gb if reached else None,
            "steps_to_target": steps if reached else None, "time_to_target_s": ttq,
            "wall_to_target_s": ttq + 1.0 if reached else None, "final_val": 2.9 if reached else 3.2,
            "lr": {"peak": 0.001, "schedule": "constant", "scale": "none"},
            "curve": [{"step": 0, "samples": 0, "train_s": 0.0, "val": 6.0}]}


def _qrec(rid: str, nproc: int, samples_per_s: float, ttqs: list[float | None], steps: int) -> dict:
    rec = F.run_record(rid, "gpt2", "fp32", 8, "single" if nproc == 1 else "ddp", 1, nproc,
                       [samples_per_s] * len(ttqs))
    rec["config"].update(flavor="tiny", data="tokens:/c/train.bin", until="val_loss<=3")
    rec["case_key"] = RunConfig.from_dict(rec["config"]).case_key()
    gb = 8 * nproc
    rec["global_batch"] = gb
    for i, (rep, ttq) in enumerate(zip(rec["repeats"], ttqs)):
        rep["quality"] = _quality(i, ttq, gb, steps)
    rec["quality"] = qt.summarize(rec["repeats"])
    return rec


def test_summary_over_repeats_counts_and_flags():
    rec = _qrec("q", 1, 100.0, [10.0, None, 14.0], 40)
    s = rec["quality"]
    assert (s["repeats"], s["reached"], s["all_reached"]) == (3, 2, False)
    assert s["time_to_target_s"]["median"] == 12.0 and s["time_to_target_s"]["n"] == 2
    assert s["reached_seeds"] == [0, 2] and "flag" in s and s["reasons"] == ["not reached in 50 steps"]
    assert qt.summarize([{"status": "ok"}]) is None  # a throughput record has none


def test_report_time_to_quality_table_and_speedups_by_hand(tmp_path, capsys):
    F.write_store(tmp_path / "s", [
        _qrec("one", 1, 100.0, [10.0, 12.0, 11.0], 40),
        _qrec("two", 2, 190.0, [7.0, 8.0, 9.0], 30),
        _qrec("four", 4, 360.0, [6.0, 7.0, None], 25),
    ])
    assert main(["report", str(tmp_path / "s"), "--format", "json"]) == 0
    groups = json.loads(capsys.readouterr().out)["time_to_quality"]
    assert len(groups) == 1
    rows = {r["devices"]: r for r in groups[0]["rows"]}
    assert rows[2]["throughput_speedup"] == pytest.approx(190 / 100)
    assert rows[2]["ttq_speedup"] == pytest.approx(11.0 / 8.0)  # the medians of the reached repeats
    assert rows[4]["ttq_speedup"] == pytest.approx(11.0 / 6.5)
    assert rows[1]["quality"]["samples_to_target"]["median"] == 40 * 8
    assert rows[4]["quality"]["reached"] == 2 and rows[2]["quality"]["all_reached"]
    assert main(["report", str(tmp_path / "s")]) == 0
    md = capsys.readouterr().out
    section = md[md.index("## Time to quality"):]
    table = [ln for ln in section.splitlines() if ln.startswith("| ")][1:]
    assert len(table) == 3
    cols = [c.strip() for c in table[1].strip("|").split("|")]
    assert cols[-2:] == ["1.38", "2"]  # TTQ speedup, and the rank by time to target
    assert [r["ttq_rank"] for r in groups[0]["rows"]] == [3, 2, 1]
    assert "2/3 ⚠" in table[2]
    html = tmp_path / "r.html"
    assert main(["report", str(tmp_path / "s"), "--format", "html", "--output", str(html)]) == 0
    page = html.read_text()
    section = page[page.index('<h2 id="quality">'):]
    assert 'href="#quality"' in page and section.index("<img") < section.index("</section>")  # table and plot


def test_compare_by_time_to_quality(tmp_path, capsys):
    """Five seeds a side: B reaches the target in half A's time (speedup 2, significant); a
    throughput-only case is left out; a repeat that missed the target is not resampled."""
    a = _qrec("a", 2, 100.0, [10.0, 12.0, 11.0, 13.0, None], 40)
    b = _qrec("b", 2, 100.0, [5.0, 6.0, 5.5, 6.5, 5.25], 40)
    plain = F.run_record("p", "gpt2", "fp32", 8, "single", 1, 1, [50.0] * 5)
    F.write_store(tmp_path / "A", [a, plain])
    F.write_store(tmp_path / "B", [b, plain])
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--metric", "time-to-quality",
                 "--format", "json"]) == 0
    pairs = json.loads(capsys.readouterr().out)["cases"]
    assert len(pairs) == 1
    (p,) = pairs
    assert (p["n_a"], p["n_b"]) == (4, 5)
    assert p["median_a"] == pytest.approx(11.5) and p["median_b"] == pytest.approx(5.5)
    assert p["ratio"] == pytest.approx(11.5 / 5.5) and p["verdict"] == "faster"
    assert main(["compare", str(tmp_path / "A"), str(tmp_path / "B"), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["cases"]) == 2  # throughput: every case


# ---------------------------------------------------------------------------- end to end

def _train(corpus: Path, store: Path, *extra: str) -> int:
    return main(["run", "--model", "gpt2", "--flavor", "tiny", "--device", "cpu", "--precision", "fp32",
                 "--batch-size", "4", "--data", f"tokens:{corpus / 'train.bin'}", "--data-workers", "0",
                 "--warmup", "2", "--eval-every", "4", "--eval-batches", "1", "--lr", "0.003", "--no-monitor",
                 "--store", str(store), *extra])


@pytest.mark.slow
def test_tiny_gpt2_reaches_a_val_loss_target_at_1_and_2_processes_and_records_a_miss(corpus, tmp_path,
                                                                                      single_in_process, capsys,
                                                                                      monkeypatch):
    """single at batch 8 and ddp at 2 x 4 train the same global batch: besides reaching the target,
    ddp's validation curve must be single's (accuracy parity, the validation loss and not only the
    training losses); a target out of reach is a result, exit 0, with the reason."""
    from dlscale.results import parity

    from dlscale.train import energy

    class Meter:  # the CPU package counter: 12 J over whatever the worker brackets
        def stop(self):
            return {"gpu_j": None, "cpu_j": 12.0, "gpus_read": 0, "gpus_unsupported": 0, "cpu_packages_read": 1,
                    "read_s": 1.0}

    monkeypatch.setattr(energy, "start", lambda denv, uuids=None: Meter())  # the in-process ranks only
    store = tmp_path / "store"
    with single_in_process():
        assert _train(corpus, store, "--until", "val_loss<=5.0", "--max-steps", "40", "--repeats", "2",
                      "--batch-size", "8") == 0
        assert _train(corpus, store, "--until", "val_loss<=5.0", "--max-steps", "40", "--repeats", "1",
                      "--batch-size", "4", "--strategy", "ddp", "--nproc-per-node", "2") == 0
        assert _train(corpus, store, "--until", "val_loss<=0.01", "--max-steps", "4", "--repeats", "1") == 0
    capsys.readouterr()
    recs = [json.loads(ln) for ln in (store / "results.jsonl").read_text().splitlines()]
    one, two, miss = recs
    for rec in (one, two):
        q = rec["quality"]
        assert rec["status"] == "ok" and q["all_reached"] and q["reached"] == rec["config"]["repeats"]
        for rep in rec["repeats"]:
            rq = rep["quality"]
            curve = rq["curve"]
            assert curve[0]["step"] == 0 and curve[-1]["val"] <= 5.0 < curve[0]["val"]
            assert rq["samples_to_target"] == rq["steps_to_target"] * rec["global_batch"]
            assert 0 < rq["time_to_target_s"] <= rq["wall_to_target_s"]
    assert [r["quality"]["seed"] for r in one["repeats"]] == [0, 1]
    assert two["global_batch"] == one["global_batch"] == 8
    single_curve, ddp_curve = one["repeats"][0]["quality"]["curve"], two["repeats"][0]["quality"]["curve"]
    assert [p["step"] for p in ddp_curve] == [p["step"] for p in single_curve]
    tol = parity.tolerance("cpu", "fp32")
    for a, b in zip(single_curve, ddp_curve):
        assert abs(a["val"] - b["val"]) <= tol * abs(a["val"]), (a, b)
    mq = miss["quality"]
    assert miss["status"] == "ok" and mq["reached"] == 0 and mq["flag"]
    rep = miss["repeats"][0]["quality"]
    assert rep["reached"] is False and rep["reason"] and rep["steps_trained"] == 2 + 4
    # energy as a window run records it, per sample of every step the counters spanned
    for rec in (one, miss):
        for r in rec["repeats"]:
            samples = r["quality"]["steps_trained"] * rec["global_batch"]
            assert r["energy"]["cpu_j"] == 12.0 and r["energy"]["j_per_sample"] == pytest.approx(12.0 / samples)
    assert one["summary"]["joules_per_sample"] is not None
    assert main(["report", str(store), "--format", "json"]) == 0
    groups = json.loads(capsys.readouterr().out)["time_to_quality"]
    hit = next(g for g in groups if "val_loss<=5" in g["title"])
    assert {r["devices"] for r in hit["rows"]} == {1, 2}
    assert all(r["ttq_speedup"] is not None and r["throughput_speedup"] is not None for r in hit["rows"])
