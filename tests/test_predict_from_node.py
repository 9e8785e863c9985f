"""Predicting from a node record alone (no 1-device figure), and step times of tables counted in tokens."""
from __future__ import annotations

import json
import math

import pytest
import yaml

from dlscale import ConfigError
from dlscale.importers.table import yaml_table_records
from dlscale.perfmodel.core import parse_shapes
from dlscale.perfmodel.inputs import ModelOptions, Query
from dlscale.perfmodel.law import OverheadLaw
from helpers_cli import names
from dlscale.perfmodel.predict import predict_workload
from dlscale.perfmodel.validate import validate

LAW = OverheadLaw({"ln_gpus": 0.02}, {"sqrt_ln_nodes": 0.04}, {"from-node": [0.1, 0.05]})
OPTS = ModelOptions(law=LAW, param_sizes="uniform")
T1 = 0.100  # the 1-device step the node rows below are built from (s)
AR8 = 2 * 7 / 8 * 4e8 / 100e9  # the node's all-reduce: 1e8 fp32 gradients over 8 GPUs at 100 GB/s, no latency


def table(tmp_path, rows, **top) -> list[dict]:
    doc = {"format": "dlscale-table/1", "source": "hand-made (tests)", "tool": "test", "model": "m", "unit": "seq",
           "params": 100_000_000, "hardware": {"gpu": "Test GPU", "gpus_per_node": 8},
           "system": {"intra": {"busbw_gbps": 100, "latency_us": 0, "source": "stated"},
                      "inter": {"busbw_gbps": 12.5, "latency_us": 0, "source": "stated"},
                      "overlap": "none", "grad_bytes_per_param": 4},
           "defaults": {"precision": "fp32"}, "rows": rows, **top}
    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(doc))
    return yaml_table_records([p])


def node_rows(extra=()):
    t_node = T1 * (1 + 0.02 * math.log(8)) + AR8
    return [{"batch_size": 4, "nodes": 1, "gpus_per_node": 8, "throughput": 8 * 4 / t_node}, *extra]


def test_one_device_step_inferred_from_the_node(tmp_path):
    """Without a 1-device row the 1-device step is what the model turns into the node's measured step:
    t_node = t_1 (1 + 0.02 ln 8) + the all-reduce, solved for t_1 (100 ms, by construction)."""
    pred = predict_workload(table(tmp_path, node_rows()), Query(), OPTS, parse_shapes("1x4,1x8,2x8"))
    assert pred.inputs["step_ms"] == pytest.approx(T1 * 1e3, rel=1e-9)
    assert pred.inputs["one_device_inferred"] is True
    assert "1x8" in pred.inputs["step_source"]  # the measured shape it was inferred from
    one, four, node, two = pred.rows
    assert four.prediction.basis == "from-node"  # the node's overhead scaled down by the law, not one GPU's
    assert one.measured_samples_per_s is None and one.prediction.basis == "from-node"  # no measured 1x1
    assert one.prediction.samples_per_s == pytest.approx(4 / T1)
    assert node.prediction.basis == "measured" and node.prediction.node_overhead_s == pytest.approx(
        0.02 * T1 * math.log(8))
    # two nodes: the node's step, the inter-node all-reduce's share, the law's sqrt(ln 2) term on it
    p = two.prediction
    assert p.basis == "from-node"
    t_node = T1 * (1 + 0.02 * math.log(8)) + AR8
    assert p.net_overhead_s == pytest.approx(0.04 * t_node * math.sqrt(math.log(2)))
    # nothing above two nodes scaling ideally from the measured one: not the prediction, not its band
    assert p.samples_per_s < p.high <= 2 * 8 * 4 / t_node * (1 + 1e-12) < p.ideal_samples_per_s


def test_node_only_series_validated_from_the_node_not_from_one_gpu(tmp_path):
    recs = table(tmp_path, node_rows([{"batch_size": 4, "nodes": 2, "gpus_per_node": 8, "throughput": 500.0}]))
    val = validate(recs, Query(), OPTS)
    assert [(r.shape, r.protocol) for r in val.rows] == [("2x8", "from-node")]
    pred = predict_workload([r for r in recs if r["config"]["nnodes"] == 1], Query(), OPTS, parse_shapes("2x8"))
    assert val.rows[0].predicted == pytest.approx(pred.rows[-1].prediction.samples_per_s)
    assert any("no 1-device baseline (from-1-gpu)" in s for s in val.skipped)


def test_node_only_series_above_ideal_across_nodes_is_flagged(tmp_path):
    t_node = T1 * (1 + 0.02 * math.log(8)) + AR8
    recs = table(tmp_path, node_rows([{"batch_size": 4, "nodes": 2, "gpus_per_node": 8,
                                       "throughput": 2 * 8 * 4 / t_node * 1.05}]))
    assert {r.flags for r in validate(recs, Query(), OPTS).rows} == {"above_ideal"}


def test_a_node_step_shorter_than_its_all_reduce_is_refused(tmp_path):
    rows = [{"batch_size": 4, "nodes": 1, "gpus_per_node": 8, "throughput": 8 * 4 / (0.5 * AR8)}]
    with pytest.raises(ConfigError, match="1x8"):
        predict_workload(table(tmp_path, rows), Query(), OPTS, parse_shapes("1x8"))


def test_token_throughput_steps_count_tokens(tmp_path):
    """A table in tokens/s: one step is batch x seq_len tokens (4 x 100 at 10,000 tok/s: 40 ms), not 4 of them."""
    rows = [{"batch_size": 4, "nodes": 1, "gpus_per_node": 1, "throughput": 10_000.0}]
    pred = predict_workload(table(tmp_path, rows, unit="tok", seq_len=100), Query(), OPTS, parse_shapes("1x2"))
    assert pred.inputs["step_ms"] == pytest.approx(40.0)
    assert pred.inputs["samples_per_device_step"] == 400
    with pytest.raises(ConfigError, match=names("--seq-len", "seq_len")):  # the option and the table's key
        predict_workload(table(tmp_path, rows, unit="tok"), Query(), OPTS, parse_shapes("1x2"))


def test_cost_of_a_token_table_from_its_node(tmp_path, capsys):
    """A tokens/s table: --tokens is the amount as it is (1e9 tokens at the node's rate), and the prediction
    beside the node's own record is not that record (nothing else to infer t_1 from: none)."""
    from dlscale.cli import main
    from dlscale.results.store import ResultStore

    recs = table(tmp_path, [{"batch_size": 4, "nodes": 1, "gpus_per_node": 8, "throughput": 100_000.0},
                            {"batch_size": 4, "nodes": 2, "gpus_per_node": 8, "throughput": 190_000.0}],
                 unit="tok", seq_len=100)
    store = ResultStore(tmp_path / "s")
    for r in recs:
        store.append(r)
    argv = ["cost", str(tmp_path / "s"), "--model", "m", "--tokens", "1e9", "--price-per-gpu-hour", "2",
            "--deadline-hours", "100", "--predicted", "--shapes", "1x8,2x8,4x8", "--format", "json"]
    assert main(argv) == 0
    rows = {r["shape"]: r for r in json.loads(capsys.readouterr().out)["options"]}
    assert rows["1x8"]["hours"] == pytest.approx(1e9 / 100_000.0 / 3600)
    assert rows["1x8"].get("predicted_hours") is None            # held out, the node leaves nothing to infer from
    assert rows["2x8"]["predicted_hours"] == pytest.approx(1e9 / rows["2x8"]["predicted_samples_per_s"] / 3600)
    assert rows["4x8"]["kind"] == "predicted"


def test_inferred_one_device_step_inverts_the_node_model():
    """Random links, buckets, overlap modes and laws: the node step the model makes of t_1 gives t_1 back."""
    import random

    from dlscale.perfmodel.core import Link, Links, Shape, compute_terms
    from dlscale.perfmodel.model import WorkloadModel, infer_t1_s

    rng = random.Random(11)
    for _ in range(200):
        t1, g = rng.uniform(0.005, 2.0), rng.choice([2, 4, 8, 16])
        law = OverheadLaw({"ln_gpus": rng.uniform(0, 0.2), "abs_ln_gpus": rng.choice([0.0, rng.uniform(0, 0.01)]),
                           "graph_split": rng.uniform(0, 0.1)})
        m = WorkloadModel(compute_terms(t1), 8, [rng.uniform(1e6, 3e8) for _ in range(rng.randint(1, 6))],
                          Links({0: Link(rng.uniform(1e9, 900e9), rng.uniform(0, 2e-5))}),
                          rng.choice(["none", "buckets", 0.5]), law, compiled=rng.random() < 0.5,
                          fixed_overhead_s=rng.choice([None, rng.uniform(0, 0.05)]))
        t_node = m.predict(Shape(1, g)).step_s
        guess = WorkloadModel(compute_terms(t_node), 8, m.buckets, m.links, m.overlap, law, compiled=m.compiled,
                              fixed_overhead_s=m.fixed_overhead_s)
        assert infer_t1_s(t_node, g, guess) == pytest.approx(t1, rel=1e-9, abs=1e-12)
