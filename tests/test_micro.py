"""dlscale micro: formulas by hand, CPU runs that write records, a real 2-process gloo comm run."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import helpers_cli
from dlscale import ConfigError
from dlscale.cli import main as cli_main
from dlscale.micro import common
from dlscale.micro.bandwidth import bandwidth_bytes
from dlscale.micro.comm import OPS, algbw_busbw, busbw_factor, op_layout, size_sweep
from dlscale.micro.layer import layer_flops
from dlscale.micro.matmul import matmul_flops, parse_shape
from dlscale.micro.peaks import peak_bandwidth

ROW_STATUSES = {"ok", "unsupported", "oom", "failed"}


def records(store: Path) -> list[dict]:
    f = store / "results.jsonl"
    if not f.exists():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def check_record(rec: dict, micro: str) -> None:
    assert rec["kind"] == "micro" and rec["micro"] == micro
    assert rec["schema"] == "dlscale.record/1"
    for key in ("id", "created", "status", "error", "config", "env", "results", "plot"):
        assert key in rec, key
    plot = rec["plot"]
    assert set(plot) >= {"x", "y", "series", "xlabel", "ylabel", "logx"}
    for row in rec["results"]:
        assert row["status"] in ROW_STATUSES
        assert plot["x"] in row and plot["y"] in row
        if plot["series"]:
            assert plot["series"] in row
    assert rec["env"]["torch"]


# ---------------------------------------------------------------------------------------------
# formulas against hand-computed numbers

def test_matmul_flops_by_hand():
    assert matmul_flops(2, 3, 4) == 48
    assert matmul_flops(8192, 8192, 8192) == 1_099_511_627_776
    assert matmul_flops(4096, 1024, 512) == 4_294_967_296
    assert parse_shape("4096x1024x512") == (4096, 1024, 512)
    for bad in ("12x3", "0x1x1", "axbxc", "1x2x3x4"):
        with pytest.raises(ConfigError):
            parse_shape(bad)


def test_layer_flops_bert_base_by_hand():
    # b=1, s=128, h=768, f=3072
    f = layer_flops("bert", 1, 128, 768, 3072)
    assert f["attn_proj"] == 603_979_776        # 8*128*768^2
    assert f["attn_core"] == 50_331_648         # 4*128^2*768
    assert f["ffn"] == 1_207_959_552            # 4*128*768*3072 = 16*128*768^2
    assert f["cross_proj"] == f["cross_core"] == 0
    assert f["forward"] == 1_862_270_976
    assert f["forward_backward"] == 5_586_812_928
    # same numbers for the other encoder-shaped layers
    assert layer_flops("gpt2", 1, 128, 768, 3072)["forward"] == 1_862_270_976
    assert layer_flops("t5-encoder", 1, 128, 768, 3072)["forward"] == 1_862_270_976


def test_layer_flops_gpt2_large_closed_form():
    # 24*b*s*h^2 + 4*b*s^2*h with b=2, s=1024, h=1024 (d_ff = 4h)
    f = layer_flops("gpt2", 2, 1024, 1024, 4096)
    assert f["forward"] == 51_539_607_552 + 8_589_934_592 == 60_129_542_144
    assert f["forward_backward"] == 180_388_626_432


def test_layer_flops_t5_decoder_by_hand():
    # encoder length = s: 32*b*s*h^2 + 8*b*s^2*h = 2,415,919,104 + 100,663,296
    assert layer_flops("t5-decoder", 1, 128, 768, 3072)["forward"] == 2_516_582_400
    # encoder length 64: self 603,979,776 + 50,331,648; ffn 1,207,959,552;
    # cross proj 4*128*768^2 + 4*64*768^2 = 452,984,832; cross core 4*128*64*768 = 25,165,824
    f = layer_flops("t5-decoder", 1, 128, 768, 3072, enc_seq=64)
    assert f["cross_proj"] == 452_984_832
    assert f["cross_core"] == 25_165_824
    assert f["forward"] == 2_340_421_632
    assert f["forward_backward"] == 3 * 2_340_421_632
    with pytest.raises(ConfigError):
        layer_flops("vit", 1, 1, 1, 1)


def test_layer_flops_llama_grouped_query_swiglu_by_hand():
    # llama tiny: h=64, f=128, 4 heads of 16, 2 kv heads: k = 32; b=1, s=8
    f = layer_flops("llama", 1, 8, 64, 128, kv_dim=32)
    assert f["attn_proj"] == 4 * 8 * 64 * 64 + 4 * 8 * 64 * 32 == 196_608  # Q, O: h x h; K, V: h x k
    assert f["attn_core"] == 4 * 8 * 8 * 64 == 16_384
    assert f["ffn"] == 6 * 8 * 64 * 128 == 393_216  # three SwiGLU matrices
    assert f["forward"] == 606_208 and f["forward_backward"] == 3 * 606_208
    # without grouped heads the projections are the multi-head 8*b*s*h^2
    assert layer_flops("llama", 1, 8, 64, 128)["attn_proj"] == 8 * 8 * 64 * 64


def test_layer_llama_and_gpt3_are_the_model_blocks():
    import torch

    from dlscale.micro.layer import build_layer
    from dlscale.models import gpt2, llama

    block = build_layer("llama", "tiny", max_seq=16)
    assert isinstance(block, llama.Block)
    # by hand: wq, wo 64x64; wk, wv 64x32 (2 of 4 heads shared); w1, w2, w3 64x128; two RMSNorms of 64
    assert sum(p.numel() for p in block.parameters()) == 2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64
    assert block(torch.randn(2, 16, 64)).shape == (2, 16, 64)
    gpt = build_layer("gpt3", "tiny")
    assert isinstance(gpt, gpt2.Block)
    assert gpt.mlp.fc.out_features == 256  # d_ff = 4 x d_model


def test_layer_record_feeds_the_strategy_model(tmp_path):
    from dlscale.models._arch import BlockLayout, TransformerArch
    from dlscale.perfmodel.evidence import layer_timing

    store = tmp_path / "st"
    assert cli_main(["micro", "layer", "--device", "cpu", "--model", "llama", "--size", "tiny", "--batch-size", "1",
                     "--seq-len", "8,16", "--warmup", "0", "--steps", "1", "--store", str(store)]) == 0
    (rec,) = records(store)
    check_record(rec, "layer")
    assert [r["seq"] for r in rec["results"]] == [8, 8, 16, 16]
    assert {r["kv_heads"] for r in rec["results"]} == {2}
    arch = TransformerArch(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, vocab=512, seq_len=16,
                           layout=BlockLayout("attn", "mlp", (), (), ()), mlp="swiglu", norm="rmsnorm", bias=False)
    both = rec["results"][3]
    lt = layer_timing([rec], arch, batch=1, precision="fp32")  # the CPU's rows are fp32
    assert layer_timing([rec], arch, batch=1, precision="amp-bf16") is None
    assert lt.flops == both["flops"] == layer_flops("llama", 1, 16, 64, 128, kv_dim=32)["forward_backward"]
    assert lt.seconds == pytest.approx(both["time_us"] * 1e-6)


def test_layer_fp8_on_cpu_is_unsupported_not_failed(tmp_path):
    store = tmp_path / "st"
    rc = cli_main(["micro", "layer", "--device", "cpu", "--model", "llama", "--size", "tiny", "--precision", "fp8",
                   "--batch-size", "1", "--seq-len", "8", "--warmup", "0", "--steps", "1", "--store", str(store)])
    assert rc == 0
    (rec,) = records(store)
    assert rec["status"] == "unsupported"
    assert [(r["precision"], r["status"], r["time_us"]) for r in rec["results"]] == [("fp8", "unsupported", None)] * 2
    # eager (no --compile): the rows say their float8 casts are unfused, not torchao's compiled speed
    assert {(r["compiled"], r["fp8_casts"]) for r in rec["results"]} == {(False, "unfused")}


@pytest.mark.slow
def test_layer_compile_times_the_compiled_block(tmp_path):
    import torch._inductor.config

    store = tmp_path / "st"
    # scalar C++ kernels: each builds in about half the time of the vector ones (as test_compiling's run);
    # config.patch restores the setting (monkeypatch's undo deletes a config key it read as None)
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        assert cli_main(["micro", "layer", "--device", "cpu", "--model", "llama", "--size", "tiny", "--compile",
                         "--precision", "fp32", "--batch-size", "1", "--seq-len", "8", "--warmup", "1",
                         "--steps", "1", "--store", str(store)]) == 0
    (rec,) = records(store)
    assert [(r["status"], r["compiled"]) for r in rec["results"]] == [("ok", True)] * 2
    assert "fp8_casts" not in rec["results"][0] and rec["config"]["resolved"]["compiled"] is True


def test_bandwidth_bytes():
    size = 64 * 2**20
    assert bandwidth_bytes("copy", size) == 2 * size
    assert bandwidth_bytes("scale", size) == 2 * size
    assert bandwidth_bytes("add", size) == 3 * size
    with pytest.raises(ConfigError):
        bandwidth_bytes("triad", size)


@pytest.mark.parametrize("n,all_reduce,split", [(2, 1.0, 0.5), (4, 1.5, 0.75), (8, 1.75, 0.875)])
def test_busbw_factors_match_nccl_tests(n, all_reduce, split):
    # nccl-tests doc/PERFORMANCE.md: allreduce 2(n-1)/n; reducescatter, allgather, alltoall (n-1)/n;
    # broadcast, reduce 1
    assert busbw_factor("all_reduce", n) == pytest.approx(all_reduce)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert busbw_factor(op, n) == pytest.approx(split)
    for op in ("broadcast", "reduce"):
        assert busbw_factor(op, n) == 1.0
    # 1 GiB all_reduce in 10 ms: algbw = 107.37 GB/s
    alg, bus = algbw_busbw("all_reduce", 2**30, 0.01, n)
    assert alg == pytest.approx(107.3741824)
    assert bus == pytest.approx(107.3741824 * all_reduce)


def test_busbw_one_rank_and_bad_op():
    assert busbw_factor("all_reduce", 1) == 0.0
    assert busbw_factor("all_gather", 1) == 0.0
    assert busbw_factor("broadcast", 1) == 1.0
    with pytest.raises(ConfigError):
        busbw_factor("gather", 2)


def test_comm_sizes_follow_nccl_tests():
    assert size_sweep(8, 64, 2) == [8, 16, 32, 64]
    assert size_sweep(8, 100, 2) == [8, 16, 32, 64, 100]
    assert size_sweep(1024, 1024, 2) == [1024]
    with pytest.raises(ConfigError):
        size_sweep(2048, 1024, 2)
    with pytest.raises(ConfigError):
        size_sweep(8, 1024, 1)
    # S = the whole array: all_gather/reduce_scatter/all_to_all = n x per-rank chunk
    assert op_layout("all_gather", 2**20, 4, 4) == (65536, 2**20)
    assert op_layout("reduce_scatter", 2**20, 8, 4) == (32768, 2**20)
    assert op_layout("all_to_all", 8, 4, 4) == (1, 16)        # at least one element per rank
    assert op_layout("all_reduce", 8, 4, 4) == (2, 8)
    assert op_layout("all_reduce", 10, 4, 4) == (2, 8)        # whole elements
    assert op_layout("broadcast", 1, 2, 2) == (1, 2)


def test_parse_bytes():
    assert common.parse_bytes("8") == 8
    assert common.parse_bytes("64K") == 65536
    assert common.parse_bytes("1M") == 2**20
    assert common.parse_bytes("1G") == common.parse_bytes("1GiB") == common.parse_bytes("1gb") == 2**30
    assert common.parse_bytes("1.5K") == 1536
    for bad in ("12Q", "", "0", "-1M", "M"):
        with pytest.raises(ConfigError):
            common.parse_bytes(bad)


def test_memory_bandwidth_table():
    assert peak_bandwidth("NVIDIA H100 80GB HBM3")[0] == 3.35e12
    assert peak_bandwidth("NVIDIA H100 PCIe")[0] == 2.0e12
    assert peak_bandwidth("NVIDIA H200")[0] == 4.8e12
    assert peak_bandwidth("NVIDIA A100-SXM4-80GB")[0] == 2.039e12
    assert peak_bandwidth("NVIDIA A100 80GB PCIe")[0] == 1.935e12
    assert peak_bandwidth("NVIDIA A100-SXM4-40GB")[0] == 1.555e12
    assert peak_bandwidth("Tesla V100-SXM2-16GB")[0] == 0.9e12
    assert peak_bandwidth("NVIDIA H100 80GB HBM3")[1]  # a source is named
    assert peak_bandwidth("AMD EPYC 7763") == (None, None)
    assert peak_bandwidth("NVIDIA GH200 480GB") == (None, None)
    assert peak_bandwidth(None) == (None, None)


def test_record_status_and_exit_codes():
    assert common.record_status([{"status": "ok"}, {"status": "unsupported"}]) == "ok"
    assert common.record_status([{"status": "unsupported"}]) == "unsupported"
    assert common.record_status([{"status": "ok"}, {"status": "oom"}]) == "oom"
    assert common.record_status([{"status": "oom"}, {"status": "failed"}]) == "failed"
    assert common.exit_code("ok") == common.exit_code("unsupported") == 0
    assert common.exit_code("oom") == 3
    assert common.exit_code("failed") == 5


def test_comm_checks_catch_wrong_results():
    """Buffers filled for rank 0 of 2 but never communicated must fail the check."""
    import torch

    from dlscale.micro.comm_worker import _Case

    cpu = torch.device("cpu")
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert not _Case(op, 5, 2, 0, "fp32", cpu).check(), op
    # with one rank every collective is the identity (output = input): that passes...
    for op in ("all_reduce", "broadcast", "reduce"):
        assert _Case(op, 5, 1, 0, "bf16", cpu).check(), op
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        case = _Case(op, 5, 1, 0, "bf16", cpu)
        case.out.copy_(case.inp)
        assert case.check(), op
        # ...and one wrong element fails
        case.out[3] += 1
        assert not case.check(), op


# ---------------------------------------------------------------------------------------------
# CPU runs through the CLI (in this process) write records

def test_matmul_cpu_writes_record(tmp_path, capsys):
    store = tmp_path / "st"
    rc = cli_main(["micro", "matmul", "--device", "cpu", "--sizes", "16,32", "--shape", "8x16x24",
                   "--dtype", "fp32,bf16,tf32", "--warmup", "1", "--steps", "2", "--store", str(store)])
    assert rc == 0
    (rec,) = records(store)
    check_record(rec, "matmul")
    assert rec["status"] == "ok"
    rows = rec["results"]
    assert len(rows) == 3 * 3
    by = {(r["shape"], r["dtype"]): r for r in rows}
    ok = by[("32x32x32", "fp32")]
    assert ok["status"] == "ok" and ok["flops"] == 2 * 32**3
    assert ok["tflops"] == pytest.approx(ok["flops"] / (ok["time_us"] * 1e-6) / 1e12)
    assert ok["pct_of_peak"] is None  # no CPU peak in the table
    assert by[("8x16x24", "bf16")]["status"] == "ok"
    tf = by[("16x16x16", "tf32")]
    assert tf["status"] == "unsupported" and "tf32" in tf["reason"] and tf["time_us"] is None
    out = capsys.readouterr().out
    assert rec["id"] in out  # the record it appended is named


def test_tf32_on_cpu_is_unsupported_not_a_crash(tmp_path):
    store = tmp_path / "st"
    rc = cli_main(["micro", "matmul", "--device", "cpu", "--sizes", "16", "--dtype", "tf32",
                   "--store", str(store)])
    assert rc == 0
    (rec,) = records(store)
    assert rec["status"] == "unsupported"
    assert [r["status"] for r in rec["results"]] == ["unsupported"]


def test_bandwidth_cpu_writes_record(tmp_path):
    store = tmp_path / "st"
    rc = cli_main(["micro", "bandwidth", "--device", "cpu", "--size", "64K,256K", "--warmup", "1",
                   "--steps", "3", "--store", str(store)])
    assert rc == 0
    (rec,) = records(store)
    check_record(rec, "bandwidth")
    assert rec["status"] == "ok"
    assert [(r["op"], r["size_bytes"]) for r in rec["results"]] == [
        ("copy", 65536), ("scale", 65536), ("add", 65536), ("copy", 262144), ("scale", 262144), ("add", 262144)]
    for r in rec["results"]:
        assert r["bytes_moved"] == bandwidth_bytes(r["op"], r["size_bytes"])
        assert r["gbps"] == pytest.approx(r["bytes_moved"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["peak_gbps"] is None and r["pct_of_peak"] is None


@pytest.mark.parametrize("kind", ["bert", "gpt2", "t5-encoder", "t5-decoder"])
def test_layer_cpu_writes_record(tmp_path, kind):
    store = tmp_path / "st"
    rc = cli_main(["micro", "layer", "--device", "cpu", "--model", kind, "--batch-size", "1", "--seq-len", "8",
                   "--warmup", "0", "--steps", "1", "--store", str(store)])
    assert rc == 0
    (rec,) = records(store)
    check_record(rec, "layer")
    assert rec["status"] == "ok"
    fwd, both = rec["results"]
    assert (fwd["pass"], both["pass"]) == ("forward", "forward+backward")
    assert fwd["precision"] == "fp32" and fwd["d_model"] == 768 and fwd["heads"] == 12
    assert fwd["flops"] == layer_flops(kind, 1, 8, 768, 3072)["forward"]
    assert both["flops"] == 3 * fwd["flops"]
    assert fwd["tflops"] > 0 and both["tflops"] > 0


def test_layer_modules_shapes():
    import torch

    from dlscale.micro.layer import build_layer

    layer = build_layer("t5-decoder", "large")
    x, mem = torch.randn(1, 4, 1024), torch.randn(1, 6, 1024)
    assert layer(x, mem).shape == (1, 4, 1024)
    assert not any(n.endswith("bias") for n, _ in layer.named_parameters())  # T5: no biases
    assert build_layer("gpt2", "base")(torch.randn(2, 5, 768)).shape == (2, 5, 768)


# ---------------------------------------------------------------------------------------------
# bad input: exit 2, one line on stderr, nothing in the store

BAD = [
    ["micro", "matmul", "--dtype", "fp8"],
    ["micro", "matmul", "--shape", "12x3"],
    ["micro", "matmul", "--nproc-per-node", "2"],
    ["micro", "bandwidth", "--size", "12Q"],
    ["micro", "bandwidth", "--op", "triad"],
    ["micro", "layer", "--model", "vit"],
    ["micro", "layer", "--size", "xl"],
    ["micro", "layer", "--precision", "int8"],
    ["micro", "layer", "--model", "llama", "--size", "base"],
    ["micro", "layer", "--model", "llama", "--dropout", "0.1"],
    ["micro", "comm", "--op", "gather"],
    ["micro", "comm", "--min-bytes", "2M", "--max-bytes", "1M"],
    ["micro", "comm", "--max-bytes", "lots"],
    ["micro", "comm", "--nproc-per-node", "0"],
    ["micro", "comm", "--dtype", "int8"],
    ["micro", "comm", "--steps", "0"],
    ["micro", "comm", "--warmup", "x"],
]


@pytest.mark.parametrize("argv", BAD, ids=[" ".join(a[1:]) for a in BAD])
def test_bad_input_exits_2(tmp_path, capsys, argv):
    store = tmp_path / "st"
    try:
        rc = cli_main(argv + ["--device", "cpu", "--store", str(store)])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("dlscale: error:")
    assert not store.exists()


def test_a_bad_op_in_a_list_is_named_with_the_choices(tmp_path, capsys):
    store = tmp_path / "st"
    try:
        rc = cli_main(["micro", "comm", "--op", "all_reduce,bogus", "--nproc-per-node", "2", "--store", str(store)])
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    assert rc == 2
    (line,) = capsys.readouterr().err.strip().splitlines()  # one line naming the bad value and the choices
    assert "'bogus'" in line and all(op in line for op in OPS)
    assert not store.exists()


@pytest.mark.parametrize("verb", ["matmul", "bandwidth", "layer", "comm"])
def test_help_lists_defaults(capsys, verb):
    with pytest.raises(SystemExit) as e:
        cli_main(["micro", verb, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for opt in ("--nproc-per-node", "--device", "--warmup", "--steps", "--store"):
        assert opt in out
    assert out.count("default") >= 5


# ---------------------------------------------------------------------------------------------
# real 2-process gloo runs through the CLI

@pytest.mark.slow
def test_comm_gloo_two_ranks_every_op(tmp_path, monkeypatch):
    # dlscale in this process (tests/helpers_cli.py): its torchrun and 2 gloo workers are real
    monkeypatch.delenv("DLSCALE_MICRO_COMM_INJECT_FAILURE", raising=False)
    store = tmp_path / "st"
    p = helpers_cli.dlscale("micro", "comm", "--op", "all", "--nproc-per-node", "2", "--max-bytes", "4K",
                            "--warmup", "1", "--steps", "3", "--device", "cpu", "--store", str(store))
    assert p.returncode == 0, p.stdout + p.stderr
    (rec,) = records(store)
    check_record(rec, "comm")
    assert rec["status"] == "ok" and rec["error"] is None
    assert rec["nranks"] == 2 and rec["backend"] == "gloo"
    rows = rec["results"]
    ops = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
    assert {r["op"] for r in rows} == set(ops)
    for op in ops:
        sizes = [r["bytes"] for r in rows if r["op"] == op]
        assert sizes == [2**k for k in range(3, 13)], op  # 8 B .. 4 KiB, factor 2
    for r in rows:
        assert r["status"] == "ok" and r["correct"] is True, r
        assert r["nranks"] == 2
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * busbw_factor(r["op"], 2))
    assert rec["id"] in p.stdout


def test_comm_worker_failure_exits_5(tmp_path, monkeypatch):
    """A rank that fails after its first row: the run is failed (exit 5), the failed rank named, the
    rows written before it kept. The worker is the real one, as rank 0 of a one-rank gloo group in
    this process in place of torchrun's ranks (the two-rank run: test_comm_gloo_two_ranks_every_op;
    torchrun's end of a failed rank: tests/test_faults_procs.py)."""
    import contextlib
    import io
    import socket

    import torch.distributed as dist

    from dlscale.case.procs import ProcResult
    from dlscale.micro import comm, comm_worker

    def one_rank_here(module, args, nproc, time_limit, on_line=None):
        assert module == comm.WORKER_MODULE and nproc == 2
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(port), "DLSCALE_MICRO_COMM_INJECT_FAILURE": "0"}.items():
            monkeypatch.setenv(k, v)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), pytest.raises(RuntimeError, match="injected"):
                comm_worker.main(list(args))
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        for line in out.getvalue().splitlines():
            on_line(line)
        return ProcResult(1, False, 0.1, out.getvalue(), ["torchrun", module])

    monkeypatch.setattr(comm, "spawn_torchrun", one_rank_here)
    store = tmp_path / "st"
    p = helpers_cli.dlscale("micro", "comm", "--op", "all_reduce", "--nproc-per-node", "2", "--max-bytes", "64",
                            "--warmup", "0", "--steps", "2", "--device", "cpu", "--store", str(store))
    assert p.returncode == 5, p.stdout + p.stderr
    (rec,) = records(store)
    assert rec["status"] == "failed"
    assert "rank 0:" in rec["error"]  # the failed rank named
    assert len(rec["results"]) == 1 and rec["results"][0]["correct"] is True  # kept what it measured
