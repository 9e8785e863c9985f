"""Model-parallel workloads: wide-deep + embedding-shard, face + partial-fc, rpc-pipeline.

Fast tier: the models' shapes against hand counts, the Zipf ids, row-block initialisation that
does not depend on the sharding, the table plan, the class split, the ArcFace margin against
its formula, bad input (exit 2, one line, nothing stored), unsupported combinations, and the
degree-1 path (one process, groups of one rank) against `single`, through the worker's own
``train`` in this process (a one-rank gloo group; no process is started).

Slow tier (torchrun, 2 or 4 CPU processes, shared through a module-scoped store): loss parity of
the sharded runs against the same global batch trained by one process (fp32; the in-process
`single` run above) or, for the face model whose BatchNorm sees each rank's slice, against
`ddp` on the same ranks (its arithmetic, rank by rank, in this process: ``_ddp_here``); the
exchange volumes in the records; and the DLPerf report over them.
The torchrun cases the selected tests name (``@cases``) run two at a time when the first is read
(tests/helpers_cli.py): a case spends much of its time on one core (torchrun's agent starting, the exit).
"""
from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from dlscale import ConfigError
from dlscale.cli import main as cli_main
from dlscale.case.config import RunConfig
from dlscale.fmt import fmt_num
from dlscale.models import count_parameters, get_model
from helpers_cli import RunsAhead, cases, names

REL = 1e-5  # fp32, one thread per process: measured differences ~1e-7
# face against ddp (SGD lr 0.1 on a loss ~50; the class-sharded normaliser sums in another order):
# 2e-6 with torch's AVX2 CPU kernels, 1.7e-5 with its AVX-512 ones (ATEN_CPU_CAPABILITY)
FACE_REL = 1e-4
WARMUP = 3
STEPS = 1  # loss_after follows WARMUP + STEPS (+ nothing else on the CPU) optimizer steps in every run


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_main(args)
    return rc, out.getvalue(), err.getvalue()


def _close(a: float, b: float, rel: float = REL) -> bool:
    return abs(a - b) <= rel * abs(b)


def _meta(spec):
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return spec.build()


def _tiny_rows() -> int:
    """The tiny wide-deep's embedding rows, deep and wide tables together, as the model is built."""
    m = _meta(get_model("wide-deep", "tiny"))
    return sum(m.deep.rows) + sum(m.wide.rows)


# ---------------------------------------------------------------- wide-deep model


def test_wide_deep_full_shape_and_flops():
    spec = get_model("wide-deep", "full")
    m = _meta(spec)
    deep, wide = 1_737_709, 144_108 + 447_097  # Criteo's 26 categorical columns; 2 crossed features
    mlp = (26 * 16 + 13) * 1024 + 1024 + 6 * (1024 * 1024 + 1024) + 1024 + 1
    assert count_parameters(m) == deep * 16 + wide + mlp + 1  # + the wide bias
    assert len(m.deep.rows) == 26 and m.deep.dim == 16 and len(m.wide.rows) == 2
    macs = (26 * 16 + 13) * 1024 + 6 * 1024 * 1024 + 1024
    assert spec.flops_per_sample == 3 * 2 * macs
    assert spec.unit == "sample" and spec.blocks is None


def test_wide_deep_resize_knobs():
    spec = get_model("wide-deep", "full").resize(fields=3, vocab_scale=2, dim=4)
    m = _meta(spec)
    assert m.deep.rows == (2 * 1460, 2 * 558, 2 * 335378) and m.deep.dim == 4
    assert m.wide.rows == (2 * 144108, 2 * 447097)
    with pytest.raises(ConfigError, match=r"fields.*26.*27"):  # the option, its bound and the value
        get_model("wide-deep", "full").resize(fields=27)
    with pytest.raises(ConfigError, match=names("wide-deep", "rows", "fields", "vocab_scale", "dim")):  # asked, allowed
        get_model("wide-deep", "full").resize(rows=3)
    with pytest.raises(ConfigError, match="vocab_scale.*1"):
        get_model("wide-deep", "tiny").resize(vocab_scale=0)


def test_zipf_ids_range_skew_and_scatter():
    from dlscale.models.wide_deep import _PRIMES, zipf_ids

    rows = (1000, 7, 1)
    ids = zipf_ids(20000, rows, 1.0, torch.Generator().manual_seed(0))
    assert ids.dtype == torch.long and ids.shape == (20000, 3)
    for f, n in enumerate(rows):
        assert int(ids[:, f].min()) >= 0 and int(ids[:, f].max()) < n
    # rank 0 (scattered to id 0) has probability ln 2 / ln(n + 1) under the continuous 1/x law
    share = float((ids[:, 0] == 0).float().mean())
    assert abs(share - math.log(2) / math.log(1001)) < 0.01
    top = torch.bincount(ids[:, 0], minlength=1000).sort(descending=True).values
    assert top[0] > 50 * 20000 / 1000  # far above uniform
    # the scatter is a bijection: rank k -> k * p mod n hits every row once
    p = next(q for q in _PRIMES if 1000 % q)
    assert sorted((k * p) % 1000 for k in range(1000)) == list(range(1000))
    # hot rows are not all at the start of the table
    assert int(torch.bincount(ids[:, 0], minlength=1000).argsort(descending=True)[1]) != 1


def test_make_batch_deterministic_and_sliceable():
    spec = get_model("wide-deep", "tiny")
    a = spec.make_batch(8, torch.device("cpu"), torch.Generator().manual_seed(3))
    b = spec.make_batch(8, torch.device("cpu"), torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    dense, wide, deep, labels = a
    assert dense.shape == (8, 4) and wide.shape == (8, 2) and deep.shape == (8, 5) and labels.shape == (8,)
    assert set(labels.tolist()) <= {0.0, 1.0}


def test_fill_rows_does_not_depend_on_the_sharding(monkeypatch):
    from dlscale.models import _rows

    monkeypatch.setattr(_rows, "BLOCK_ROWS", 7)  # slices then cross block boundaries
    whole = _rows.fill_rows(torch.empty(30, 3), 0, 30, seed=11, table=2, kind="uniform", scale=0.05)
    parts = [_rows.fill_rows(torch.empty(e - s, 3), s, 30, 11, 2, "uniform", 0.05)
             for s, e in ((0, 5), (5, 19), (19, 30))]
    assert torch.equal(torch.cat(parts), whole)
    assert float(whole.abs().max()) <= 0.05 and whole.std() > 0
    other = _rows.fill_rows(torch.empty(30, 3), 0, 30, seed=11, table=3, kind="uniform", scale=0.05)
    assert not torch.equal(other, whole)  # each table its own stream
    with pytest.raises(ValueError, match="30"):  # the table's rows named
        _rows.fill_rows(torch.empty(5, 3), 28, 30, 11, 2, "uniform", 0.05)


def test_table_plan_greedy_by_bytes():
    from dlscale.strategies.embedding_shard import plan_tables

    sizes = [("w", 0, 100, 1), ("d", 0, 10, 16), ("d", 1, 50, 16), ("d", 2, 30, 16)]  # bytes 100, 160, 800, 480
    owner = plan_tables(sizes, 2)
    # largest first to the emptiest rank: d1 (800) -> 0, d2 (480) -> 1, d0 (160) -> 1, w0 (100) -> 1
    assert owner == {("d", 1): 0, ("d", 2): 1, ("d", 0): 1, ("w", 0): 1}



class _Rank:
    """Stands for the process group of one rank in ``_ThreadA2A`` (the exchange passes it as ``group``)."""

    def __init__(self, rank: int):
        self.rank = rank


class _ThreadA2A:
    """``dist.all_to_all_single`` between threads standing for the K ranks of one group, counting calls."""

    def __init__(self, k: int):
        import threading

        self.k, self.barrier, self.box, self.calls = k, threading.Barrier(k, timeout=60), {}, [0] * k

    def __call__(self, out, inp, out_splits=None, in_splits=None, group=None):
        me, k = group.rank, self.k
        self.calls[me] += 1
        self.box[me] = inp.split(in_splits or [inp.shape[0] // k] * k)
        self.barrier.wait()
        out.copy_(torch.cat([self.box[j][me] for j in range(k)]))
        self.barrier.wait()  # nobody refills the box before everyone has read it


def _exchange_ranks(monkeypatch, tables: dict, mode: str, k: int, ids: list[torch.Tensor], coef: list[torch.Tensor]):
    """K threads, each one rank of ``embedding-shard`` over ``tables`` (name -> FusedTables) with its
    slice of the global ``ids`` (one per table): forward, loss sum(out x coef), backward.
    Returns per rank (outputs, its ShardedTables, the exchange's volume) and the calls per rank."""
    import threading

    from dlscale.strategies.embedding_shard import Exchange, ShardedTables, plan_tables

    sizes = [(g, f, r, t.dim) for g, t in tables.items() for f, r in enumerate(t.rows)]
    owners = plan_tables(sizes, k) if mode == "table" else None
    fake = _ThreadA2A(k)
    monkeypatch.setattr(dist, "all_to_all_single", fake)
    b = ids[0].shape[0] // k
    got: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def rank(r):
        try:
            sts = [ShardedTables(t, mode, [owners[(g, f)] for f in range(len(t.rows))] if owners else None, r, k,
                                 torch.device("cpu")) for g, t in tables.items()]
            ex = Exchange(sts, _Rank(r), k, r, 1.0 / k)
            mine = slice(r * b, (r + 1) * b)
            outs = ex(*[x[mine] for x in ids])
            sum((o * c[mine]).sum() for o, c in zip(outs, coef)).backward()
            got[r] = (outs, sts, ex.volume())
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)
            fake.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return got, fake.calls


@pytest.mark.parametrize("mode, k", [("table", 2), ("table", 3), ("row", 2), ("row", 3)])
def test_exchange_matches_the_plain_lookups(monkeypatch, mode, k):
    """K ranks (threads, all-to-all between them) exchange wide and deep together: every rank gets
    the whole model's vectors for its slice bit for bit, each shard's gradient is the whole
    table's for its rows (loss: the mean over ranks), and a training step makes one id, one vector
    and one gradient all-to-all (row-wise: one count all-to-all more), whatever the tables."""
    from dlscale.models.wide_deep import FusedTables

    tables = {"wide": FusedTables((4, 3), 1, seed=1, table_base=0),
              "deep": FusedTables((5, 6, 2, 9), 2, seed=1, table_base=2)}
    gen = torch.Generator().manual_seed(5)
    b = 3 * k
    ids = [torch.stack([torch.randint(0, r, (b,), generator=gen) for r in t.rows], 1) for t in tables.values()]
    coef = [torch.randn(b, len(t.rows), t.dim, generator=gen) for t in tables.values()]
    for t in tables.values():
        t.reset_parameters()
    ref = [t(x) for t, x in zip(tables.values(), ids)]
    (sum((o * c).sum() for o, c in zip(ref, coef)) / k).backward()
    got, calls = _exchange_ranks(monkeypatch, tables, mode, k, ids, coef)
    assert calls == [4 if mode == "row" else 3] * k
    for r, (outs, sts, _) in got.items():
        mine = slice(r * 3, (r + 1) * 3)
        for o, want in zip(outs, ref):
            assert torch.equal(o, want[mine].detach())
        for st, t in zip(sts, tables.values()):
            whole = t.weight.grad.split(t.rows)
            for f, rows in enumerate(t.rows):
                if mode == "table":
                    lo, n = (0, rows) if st.owners[f] == r else (0, 0)
                else:
                    lo = r * st.block[f]
                    n = max(0, min(st.block[f], rows - lo))
                mine_rows = st.weight.grad[st.off_t[f]:st.off_t[f] + n]
                torch.testing.assert_close(mine_rows, whole[f][lo:lo + n], rtol=0, atol=1e-6)


def test_exchange_volume_by_hand(monkeypatch):
    """The bytes each rank sends to the other, on hand-made ids (2 ranks, 2 ids each; int64 ids,
    fp32 vectors of width 1 (wide) and 2 (deep))."""
    from dlscale.models.wide_deep import FusedTables

    tables = {"wide": FusedTables((4, 3), 1, seed=1, table_base=0),
              "deep": FusedTables((5, 6, 2), 2, seed=1, table_base=2)}
    wide = torch.tensor([[0, 2], [3, 1], [1, 0], [1, 2]])  # rank 0: rows 0-1, rank 1: rows 2-3
    deep = torch.tensor([[4, 0, 1], [1, 5, 0], [2, 3, 0], [0, 0, 1]])
    coef = [torch.ones(4, 2, 1), torch.ones(4, 3, 2)]
    # table-wise, greedy by bytes: deep1 (12) -> 0, deep0 (10) -> 1, deep2 (4) -> 1, wide0 (4) -> 0,
    # wide1 (3) -> 1. Rank 0 sends its 2 x (wide1, deep0, deep2) ids = 2 + 4 and gets 2 + 2 x 2
    # floats back; it serves rank 1's 2 x (wide0, deep1): 2 + 2 x 2 floats
    got, _ = _exchange_ranks(monkeypatch, tables, "table", 2, [wide, deep], coef)
    assert got[0][2] == {"ids": 8 * 6, "vectors": 4 * 6, "gradients": 4 * 10, "counts": 0}
    assert got[1][2] == {"ids": 8 * 4, "vectors": 4 * 10, "gradients": 4 * 6, "counts": 0}
    # row-wise, blocks wide (2, 2), deep (3, 3, 1): rank 0's ids owned by rank 1: wide 3, 2 and
    # deep 4, 5, 1 (2 + 3 ids; 2 x 1 + 3 x 2 gradient floats); rank 1's owned by rank 0: wide 1, 1,
    # 0 and deep 2, 0, 0, 0 (3 + 4: 3 x 1 + 4 x 2 vector floats); counts: one int64 per table
    got, _ = _exchange_ranks(monkeypatch, tables, "row", 2, [wide, deep], coef)
    assert got[0][2] == {"ids": 8 * 5, "vectors": 4 * 11, "gradients": 4 * 8, "counts": 8 * 2}


def test_one_rank_keeps_the_batch_as_it_is(monkeypatch):
    """One rank (either mode): the shard is the whole table, every id is the rank's own (looked up
    here, in the batch's order plus the fields' offsets, nothing permuted), and no collective is
    called (a group of one has nothing to move). Outputs and gradients are the plain modules'."""
    from dlscale.models.wide_deep import FusedTables
    from dlscale.strategies.embedding_shard import Exchange, ShardedTables

    tables = [FusedTables((5, 7, 3), 2, seed=1, table_base=0), FusedTables((4, 2), 1, seed=1, table_base=3)]
    for t in tables:
        t.reset_parameters()
    ids = [torch.tensor([[4, 6, 2], [0, 3, 1]]), torch.tensor([[3, 1], [2, 0]])]
    ref = [t(x) for t, x in zip(tables, ids)]
    sum((o * o).sum() for o in ref).backward()
    sent = []
    monkeypatch.setattr(dist, "all_to_all_single",
                        lambda out, inp, out_splits=None, in_splits=None, group=None:
                        sent.append((out.numel(), inp.numel(), out_splits, in_splits)))
    for mode in ("table", "row"):
        sts = [ShardedTables(t, mode, [0] * len(t.rows) if mode == "table" else None, 0, 1, torch.device("cpu"))
               for t in tables]
        assert all(torch.equal(st.weight, t.weight) for st, t in zip(sts, tables))
        ex = Exchange(sts, None, 1, 0, 1.0)
        plan = ex._fixed_plan(2, torch.device("cpu"))
        assert plan.order is None and plan.perms == [None, None] and plan.others == 0
        assert plan.self_n == [2 * 3, 2 * 2] and plan.self_el == [2 * 3 * 2, 2 * 2 * 1]
        assert plan.out_ids_n == plan.in_ids_n == plan.out_vec_n == plan.in_vec_n == 0
        assert plan.out_ids is plan.in_ids is plan.out_vec is plan.in_vec is None
        sent.clear()
        outs = ex(*ids)
        sum((o * o).sum() for o in outs).backward()
        assert sent == []  # a group of one moves nothing: no collective
        for o, want in zip(outs, ref):
            assert torch.equal(o, want.detach())
        for st, t in zip(sts, tables):
            assert torch.equal(st.weight.grad, t.weight.grad)
        assert ex.volume() == {"ids": 0, "vectors": 0, "gradients": 0, "counts": 0}


def test_one_rank_of_copies_scales_the_gradients():
    """shards=1 at more than one rank (a whole copy of the tables on each): the lookups are the
    plain modules', their gradients scaled by 1/world before the copies' all-reduce sums them."""
    from dlscale.models.wide_deep import FusedTables
    from dlscale.strategies.embedding_shard import Exchange, ShardedTables

    table = FusedTables((5, 7), 2, seed=1, table_base=0)
    table.reset_parameters()
    ids = torch.tensor([[4, 6], [0, 3], [2, 2]])
    (table(ids) ** 2).sum().backward()
    st = ShardedTables(table, "row", None, 0, 1, torch.device("cpu"))
    ex = Exchange([st], None, 1, 0, 0.25)
    (out,) = ex(ids)
    (out ** 2).sum().backward()
    assert torch.equal(out, table(ids).detach())
    torch.testing.assert_close(st.weight.grad, 0.25 * table.weight.grad, rtol=0, atol=0)
    with torch.no_grad():  # no gradient, no hook (the evaluation pass)
        assert torch.equal(ex(ids)[0], out.detach())


def test_degree_one_collectives_per_step(world1, monkeypatch):
    """At one rank a training step (forward, backward, optimizer step) of embedding-shard makes no
    collective: this rank's own ids never go through one, so the group of one has nothing to move
    (at two ranks: three all-to-alls a step, wide and deep together; test_exchange_* below)."""
    from dlscale.strategies import DistEnv, get_strategy, resolve_spec

    calls: list[str] = []
    names = ("all_to_all_single", "all_to_all", "all_reduce", "all_gather", "all_gather_into_tensor",
             "all_gather_object", "reduce_scatter_tensor", "broadcast", "barrier")

    def counted(name, fn):
        def call(*args, **kwargs):
            calls.append(name)
            return fn(*args, **kwargs)
        return call

    for shard in ("table", "row"):
        cfg = RunConfig(model="wide-deep", flavor="tiny", strategy="embedding-shard", device="cpu",
                        precision="fp32", batch_size=8, strategy_options={"shard": shard})
        spec = resolve_spec(cfg)
        with torch.random.fork_rng(devices=[]):
            model = spec.build()
        par = get_strategy("embedding-shard").fn(model, spec, cfg, DistEnv(0, 1, 0, 1, torch.device("cpu"), "gloo"))
        batch = spec.make_batch(8, torch.device("cpu"), torch.Generator().manual_seed(1))

        def step():
            par.module(*batch).backward()
            par.optimizer.step()
            par.optimizer.zero_grad(set_to_none=True)

        step()  # the first records the exchange volume (an all_gather_object)
        with monkeypatch.context() as m:
            calls.clear()
            for n in names:
                m.setattr(dist, n, counted(n, getattr(dist, n)))
            step()
            step()
        assert calls == [], (shard, calls)


# ---------------------------------------------------------------- face model


def test_face_full_shape_and_flops():
    spec = get_model("face", "full")
    m = _meta(spec)
    assert m.margin.weight.shape == (85_742, 512)
    backbone = count_parameters(m) - 85_742 * 512
    assert backbone == 43_590_848  # iresnet50 at 112x112 (arcface_torch), the fixed BatchNorm1d weight included
    # forward: 6.31 GMACs for the backbone (InsightFace lists r50 at 6.3 G; FlopCounterMode on the meta
    # device gives the same 12,618,661,888), 2 x 512 x N for the head
    from dlscale.models.face import _CONFIGS, backbone_forward_flops

    bb = backbone_forward_flops(_CONFIGS["full"])
    assert bb == 12_618_661_888
    assert spec.flops_per_sample == 3 * (bb + 2 * 512 * 85_742)
    big = get_model("face", "full").resize(classes=2_000_000)
    assert big.flops_per_sample - spec.flops_per_sample == 3 * 2 * 512 * (2_000_000 - 85_742)
    with pytest.raises(ConfigError, match="classes.*2"):
        spec.resize(classes=1)


def test_face_flops_as_torch_counts_them():
    """The analytic backbone count against FlopCounterMode on the tiny model (CPU tensors)."""
    from torch.utils.flop_counter import FlopCounterMode

    from dlscale.models.face import _CONFIGS, backbone_forward_flops

    with torch.random.fork_rng(devices=[]):
        m = get_model("face", "tiny").build().eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        m.features(m.layer4(m.layer3(m.layer2(m.layer1(m.embed(torch.zeros(1, 3, 32, 32)))))))
    assert counter.get_total_flops() == backbone_forward_flops(_CONFIGS["tiny"]) == 2_648_064


def test_arcface_margin_matches_its_formula():
    from dlscale.models.face import arcface_logits

    cos = torch.tensor([[0.5, 0.2, -0.9], [0.1, 0.3, 0.7]])
    target = torch.tensor([0, -1])
    out = arcface_logits(cos, target, scale=64.0, margin=0.5)
    theta = math.acos(0.5)
    assert math.isclose(float(out[0, 0]), 64 * math.cos(theta + 0.5), rel_tol=1e-6)
    assert torch.allclose(out[0, 1:], 64 * cos[0, 1:]) and torch.allclose(out[1], 64 * cos[1])  # row 1: no target here
    # past theta + m > pi: cos(theta) - m sin(m) style fallback, cos - sin(pi - m) * m
    far = arcface_logits(torch.tensor([[-0.95]]), torch.tensor([0]), 1.0, 0.5)
    assert math.isclose(float(far), -0.95 - math.sin(math.pi - 0.5) * 0.5, rel_tol=1e-6)


def test_class_range_covers_every_class_once():
    from dlscale.strategies.partial_fc import class_range

    assert [class_range(51, 2, r) for r in range(2)] == [(0, 26), (26, 51)]
    ranges = [class_range(10, 4, r) for r in range(4)]
    assert ranges == [(0, 3), (3, 6), (6, 8), (8, 10)]


# ---------------------------------------------------------------- bad input and unsupported (no process)


@pytest.mark.parametrize("model, strategy, nproc, opts, expect", [
    ("wide-deep", "embedding-shard", 2, ["shards=3"], "embedding-shard shards 3 does not divide the 2 processes"),
    ("wide-deep", "embedding-shard", 2, ["fields=6"], "fields must be 1..5 (the sparse fields whose sizes are known)"),
    ("wide-deep", "embedding-shard", 2, ["shard=column"], "option shard must be one of row, table"),
    ("wide-deep", "embedding-shard", 4, ["shard=table", "fields=1"],
     "shard=table: 3 tables cannot fill 4 shards"),
    ("face", "partial-fc", 4, ["classes=3"], "partial-fc classes 3 is below the 4 processes"),
    ("face", "partial-fc", 2, ["classes=1"], "face classes must be an integer >= 2"),
    ("wide-deep", "rpc-pipeline", 2, [], "wide-deep has no blocks (spec.blocks) to split into pipeline stages"),
    ("gpt2", "rpc-pipeline", 2, ["microbatches=3"], "rpc-pipeline microbatches 3 do not divide the batch size 4"),
    ("gpt2", "rpc-pipeline", 3, [], "3 pipeline stages (3 ranks) but gpt2 (tiny) has only 2 blocks"),
])
def test_bad_input(tmp_path, model, strategy, nproc, opts, expect):
    store = tmp_path / "store"
    args = ["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", str(nproc),
            "--batch-size", "4", "--device", "cpu", "--store", str(store)]
    for o in opts:
        args += ["-o", o]
    rc, out, err = _cli(args)
    assert rc == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlscale: error:") and expect in lines[0], err
    assert not store.exists() or not any(store.iterdir())


@pytest.mark.parametrize("model, strategy, extra, reason", [
    ("gpt2", "embedding-shard", [], "shards embedding tables"),
    ("resnet50", "partial-fc", [], "shards a margin-softmax classifier"),
    ("wide-deep", "embedding-shard", ["--precision", "amp-fp16"], "runs fp32 or amp-bf16"),
    ("face", "partial-fc", ["--clip-grad-norm", "1.0"], "does not clip gradients"),
    ("gpt2", "rpc-pipeline", ["--compile"], "is not compiled"),
])
def test_unsupported_recorded(tmp_path, model, strategy, extra, reason):
    rc, out, err = _cli(["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", "2",
                         "--device", "cpu", "--store", str(tmp_path), "--json", *extra])
    rec = json.loads(out[out.index("{"):])
    assert rc == 6 and rec["status"] == "unsupported" and reason in rec["error"], rec["error"]


# ---------------------------------------------------------------- the degree-1 path, in this process


@pytest.fixture(scope="module")
def world1(tmp_path_factory):
    """A one-rank gloo group in this process, for the worker's own ``train`` (no process started)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this test process")
    path = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each torchrun worker: the same summation order
    yield
    torch.set_num_threads(threads)
    dist.destroy_process_group()


def _train_here(tmp_path_factory, **kw) -> dict:
    """One case through ``dlscale.train.worker.train`` on the one-rank group (fp32, tiny)."""
    from dlscale.strategies import DistEnv
    from dlscale.train.worker import train

    cfg = RunConfig(device="cpu", flavor="tiny", warmup=WARMUP, steps=STEPS, repeats=1, monitor=False,
                    precision="fp32", **kw)
    result: dict = {}
    denv = DistEnv(0, 1, 0, 1, torch.device("cpu"), "gloo")
    with torch.random.fork_rng(devices=[]):
        train(cfg, denv, result, tmp_path_factory.mktemp("case"))
    assert result["status"] == "ok"
    return result


_HERE: dict[tuple, dict] = {}


def _here(tmp_path_factory, **kw) -> dict:
    key = json.dumps(kw, sort_keys=True)
    if key not in _HERE:
        _HERE[key] = _train_here(tmp_path_factory, **kw)
    return _HERE[key]


@pytest.mark.parametrize("strategy, opts", [
    ("embedding-shard", {}),
    ("embedding-shard", {"shard": "table"}),
])
def test_wide_deep_degree_one_equals_single(world1, tmp_path_factory, strategy, opts):
    ref = _here(tmp_path_factory, model="wide-deep", strategy="single", batch_size=16, grad_accum=2)
    got = _here(tmp_path_factory, model="wide-deep", strategy=strategy, batch_size=16, grad_accum=2,
                strategy_options=opts)
    assert got["warmup_losses"] == ref["warmup_losses"]  # same arithmetic: bit for bit
    assert got["loss_after"] == ref["loss_after"]
    ex = got["strategy_info"]["exchange_bytes_per_step"]
    assert ex["max_per_rank"] == 0 and ex["per_rank"] == [0]  # nothing leaves a one-rank group
    assert got["strategy_info"]["rows_held_per_rank"] == [_tiny_rows()]


def test_face_degree_one_equals_single(world1, tmp_path_factory):
    ref = _here(tmp_path_factory, model="face", strategy="single", batch_size=8)
    got = _here(tmp_path_factory, model="face", strategy="partial-fc", batch_size=8)
    for g, r in zip(got["warmup_losses"], ref["warmup_losses"]):
        assert _close(g, r), (got["warmup_losses"], ref["warmup_losses"])  # own softmax vs F.cross_entropy
    assert _close(got["loss_after"], ref["loss_after"])
    assert [tuple(r) for r in got["strategy_info"]["class_ranges"]] == [(0, 50)]


def test_face_resized_head_trains(world1, tmp_path_factory):
    got = _here(tmp_path_factory, model="face", strategy="partial-fc", batch_size=8,
                strategy_options={"classes": 1000})
    assert got["strategy_info"]["classes"] == 1000 and got["strategy_info"]["head_bytes_per_rank"] == [1000 * 16 * 4]
    assert got["params"] == 12_640 + 1000 * 16  # tiny backbone + the resized head
    assert all(math.isfinite(x) for x in got["warmup_losses"])


# ---------------------------------------------------------------- multi-process parity (torchrun, gloo)


_RECORDS: dict[tuple, dict] = {}
_AHEAD: RunsAhead


def _key(model: str, strategy: str, nproc: int, batch: int, *opts: str, accum: int = 1) -> tuple:
    """The key of one case, as _run takes its arguments."""
    return (model, strategy, nproc, batch, opts, accum)


def _args(store: Path, key: tuple) -> list[str]:
    """`dlscale run` of the case ``key`` into ``store``."""
    model, strategy, nproc, batch, opts, accum = key
    args = ["run", "--model", model, "--flavor", "tiny", "--strategy", strategy, "--nproc-per-node", str(nproc),
            "--batch-size", str(batch), "--grad-accum", str(accum), "--precision", "fp32", "--warmup", str(WARMUP),
            "--steps", str(STEPS), "--repeats", "1", "--device", "cpu", "--store", str(store), "--json",
            "--time-limit", "300"]
    for o in opts:
        args += ["-o", o]
    return args


@pytest.fixture(scope="module")
def store(tmp_path_factory, request) -> Path:
    """The module's store; the cases the selected tests name (@cases) run into it two at a time
    (tests/helpers_cli.py), all of them when the first is read."""
    global _AHEAD
    path = tmp_path_factory.mktemp("mp-store")
    _AHEAD = RunsAhead(lambda key: _args(path, key), ahead=8)
    _AHEAD.start(request)
    yield path
    _AHEAD.finish(request)


def _run(store: Path, model: str, strategy: str, nproc: int, batch: int, *opts: str, accum: int = 1) -> dict:
    key = _key(model, strategy, nproc, batch, *opts, accum=accum)
    if key in _RECORDS:
        return _RECORDS[key]
    done = _AHEAD.take(key)
    rc, out, err = (done.returncode, done.stdout, done.stderr) if done else _cli(_args(store, key))
    rec = json.loads(out[out.index("{"):])
    assert rec["status"] == "ok" and rc == 0, (rec["error"], (rec["repeats"] or [{}])[0].get("output_tail", "")[-3000:])
    _RECORDS[key] = rec
    return rec


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    mp = pytest.MonkeyPatch()
    mp.setenv("OMP_NUM_THREADS", "1")
    yield
    mp.undo()


@pytest.mark.slow
@cases(_key("wide-deep", "embedding-shard", 2, 16, "shard=row", accum=2))
def test_embedding_shard_row_matches_single(world1, tmp_path_factory, store):
    """2 ranks, row-wise, 2 accumulated micro-batches: the trained model's loss on the global batch."""
    ref = _here(tmp_path_factory, model="wide-deep", strategy="single", batch_size=32, grad_accum=2)
    rec = _run(store, "wide-deep", "embedding-shard", 2, 16, "shard=row", accum=2)
    assert _close(rec["repeats"][0]["loss_after"], ref["loss_after"])
    info = rec["strategy_info"]
    assert info["shards"] == 2 and info["replicas"] == 1
    assert sum(info["rows_held_per_rank"]) == info["table_rows"] == _tiny_rows()
    ex = info["exchange_bytes_per_step"]
    # per micro-batch: ids out, vectors back, gradients out; both ranks exchange, counts 8 B per group
    assert ex["max_per_rank"] == max(ex["per_rank"]) > 0 and ex["by_kind_rank0"]["counts"] == 2 * 2 * 8
    kinds = ex["by_kind_rank0"]
    assert kinds["ids"] > 0 and kinds["gradients"] > 0 and kinds["vectors"] > 0


def _ddp_here(world1, model: str, batch: int, ranks: int) -> tuple[float, float]:
    """(first loss, loss_after) of ``ddp`` over ``ranks`` processes at ``batch`` each, trained here:
    the worker's own model, optimizer and per-rank slices of the global batch; each step every
    rank's forward from rank 0's BatchNorm buffers (DDP's broadcast_buffers) and the gradient of
    the ranks' mean loss (DDP's averaged all-reduce); the eval loss on each rank's slice with rank
    0's buffers, averaged (the worker's global loss). One process instead of a torchrun agent and
    ``ranks`` workers: measured equal, bit for bit, to the 2-process ddp record of the face model."""
    from types import SimpleNamespace

    from dlscale.strategies import DistEnv, resolve_spec
    from dlscale.train.worker import build_parallel, make_batches

    cfg = RunConfig(device="cpu", flavor="tiny", model=model, strategy="single", batch_size=batch, precision="fp32",
                    warmup=WARMUP, steps=STEPS, monitor=False)
    spec, cpu = resolve_spec(cfg), torch.device("cpu")
    with torch.random.fork_rng(devices=[]):
        par, _ = build_parallel(spec, cfg, DistEnv(0, 1, 0, 1, cpu, "gloo"))
        module, opt = par.module, par.optimizer
        shape = SimpleNamespace(dp_size=ranks, devices_per_process=1)  # what make_batches reads of a strategy
        slices = [make_batches(spec, cfg, shape, r, cpu)[0] for r in range(ranks)]

        def set_buffers(values):
            for (_, b), v in zip(module.named_buffers(), values):
                b.copy_(v)

        first = None
        for _ in range(WARMUP + STEPS):
            start, losses = [b.clone() for b in module.buffers()], []
            for r, batch_r in enumerate(slices):
                set_buffers(start)  # every rank's forward starts from rank 0's buffers
                loss = module(*batch_r)
                (loss / ranks).backward()
                losses.append(float(loss.detach()))
                if r == 0:
                    rank0 = [b.clone() for b in module.buffers()]
            set_buffers(rank0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            first = sum(losses) / ranks if first is None else first
        module.eval()
        with torch.no_grad():
            after = sum(float(module(*b)) for b in slices) / ranks
    return first, after


@pytest.mark.slow
@cases(_key("face", "partial-fc", 2, 8))
def test_partial_fc_matches_ddp(world1, store):
    """Class-sharded head (50 classes: 25 + 25) against ddp on the same 2 ranks (BatchNorm per rank in
    both), that ddp trained in this process (_ddp_here)."""
    first, ref_after = _ddp_here(world1, "face", 8, 2)
    rec = _run(store, "face", "partial-fc", 2, 8)
    after = rec["repeats"][0]["loss_after"]
    assert _close(after, ref_after, FACE_REL), (after, ref_after)
    assert _close(rec["repeats"][0]["loss_first"], first, FACE_REL)
    assert abs(after - first) > 10 * FACE_REL * abs(first)  # training moved the loss well past the tolerance
    info = rec["strategy_info"]
    assert info["class_ranges"] == [[0, 25], [25, 50]]
    ex = info["exchange_bytes_per_step"]
    assert ex["by_collective"]["features_allgather"] == 8 * 16 * 4  # (n-1)/n of 2 x 8 rows of 16 floats
    assert ex["max_per_rank"] == sum(ex["by_collective"].values())


@pytest.mark.slow
@cases(_key("gpt2", "rpc-pipeline", 2, 8, accum=2))
def test_rpc_pipeline_matches_single(world1, tmp_path_factory, store):
    """Two stages over RPC, 4 micro-batches, 2 accumulated batches: rank 0's per-step losses."""
    ref = _here(tmp_path_factory, model="gpt2", strategy="single", batch_size=8, grad_accum=2)
    rec = _run(store, "gpt2", "rpc-pipeline", 2, 8, accum=2)
    got = rec["repeats"][0]["warmup_losses"]
    assert len(got) == WARMUP and all(_close(g, r) for g, r in zip(got, ref["warmup_losses"])), (got, ref)
    info = rec["strategy_info"]
    assert info["tied_params"] == 1 and info["num_stages"] == 2 and info["microbatches"] == 4
    # stage 0 hands on (B/4) x 64 tokens x 64 floats per micro-batch, 4 micro-batches, 2 batches
    assert info["exchange_bytes_per_step"]["max_per_rank"] == 2 * 4 * (2 * 64 * 64 * 4)
    assert rec["repeats"][0]["window_s"] > 0


@pytest.mark.slow
def test_report_renders_the_workloads(store):
    """The DLPerf tables over the records above: latency for the CTR model, exchange volume for all."""
    for key in [("wide-deep", "embedding-shard", 2, 16, ("shard=row",), 2), ("face", "partial-fc", 2, 8, (), 1)]:
        if key not in _RECORDS:
            pytest.skip("needs the parity runs of this module")
    rc, out, err = _cli(["report", str(store)])
    assert rc == 0, err

    def header(title: str) -> str:  # the column line of the first table whose title starts so
        part = out[out.index(title):]
        return next(line for line in part.splitlines() if line.startswith("| node_num"))

    wd = header("### wide-deep (tiny) · fp32 · eager · embedding-shard")
    assert "throughput median (sample/s)" in wd and "step p50 / p90 (ms)" in wd and "exchange (MB/step/rank)" in wd
    face = header("### face (tiny) · fp32 · eager · partial-fc")
    assert "throughput median (img/s)" in face and "exchange (MB/step/rank)" in face
    assert "step p50" not in face  # latency is the CTR tables' column
    rows = out[out.index("### wide-deep (tiny) · fp32 · eager · embedding-shard"):].splitlines()
    cells = next(line for line in rows if line.startswith("| 1 | 2 |")).split("|")
    rec = _RECORDS[("wide-deep", "embedding-shard", 2, 16, ("shard=row",), 2)]
    ex = rec["strategy_info"]["exchange_bytes_per_step"]
    # the exchange column, MB = 10^6 B, in the report's number format (small values keep their digits)
    column = [c.strip() for c in wd.split("|")].index("exchange (MB/step/rank)")
    assert cells[column].strip() == fmt_num(ex["max_per_rank"] / 1e6, 1)
