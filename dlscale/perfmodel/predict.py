"""A workload's predicted scaling over cluster shapes, with the measured points beside it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlscale.perfmodel.core import ONE, Shape, error_pct
from dlscale.perfmodel.inputs import (BuiltModel, ModelOptions, Query, build_model, check_shapes, model_info,
                                      pick_workload, short_id)
from dlscale.perfmodel.model import ShapePrediction
from dlscale.report.data import rec_config, rec_device_type

NODE_COUNTS = (2, 4, 8, 16, 32, 64, 128)  # default multi-node shapes (with an inter-node link): these x node size


def default_shapes(limit: int | None, has_inter: bool, nodes: list[int] | None = None) -> list[Shape]:
    """Powers of two up to the node, then (with an inter-node link) 2..128 nodes of that node."""
    g0 = limit or 8
    out = ([Shape(1, n) for n in (2, 4, 8, 16, 32) if n < g0] + [Shape(1, g0)]) if g0 > 1 else []
    if has_inter or nodes:
        out += [Shape(m, g0) for m in (nodes or NODE_COUNTS) if m > 1]
    return out or [ONE]


@dataclass
class PredictedRow:
    prediction: ShapePrediction
    measured_samples_per_s: float | None = None
    measured_record: str | None = None
    measured_kind: str | None = None
    calibration_point: bool = False

    def to_dict(self, base_sps: float) -> dict[str, Any]:
        d = self.prediction.to_dict()
        m = self.measured_samples_per_s
        d.update(measured_samples_per_s=m, measured_record=self.measured_record, measured_kind=self.measured_kind,
                 measured_speedup=m / base_sps if m else None,
                 error_pct=error_pct(self.prediction.samples_per_s, m) if m else None,
                 calibration_point=self.calibration_point)
        return d


@dataclass
class Prediction:
    model: str
    unit: str
    workload: dict[str, Any]
    device_type: str
    flavor: str
    inputs: dict[str, Any]
    rows: list[PredictedRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    built: BuiltModel | None = None

    @property
    def what(self) -> str:
        """'CPU, tiny flavour' style qualifiers: a prediction from CPU or tiny-model records says so."""
        bits = []
        if self.device_type == "cpu":
            bits.append("CPU records")
        if self.flavor != "full":
            bits.append(f"{self.flavor} flavour")
        return ", ".join(bits)

    def row(self, shape: Shape) -> PredictedRow | None:
        return next((r for r in self.rows if r.prediction.shape == shape), None)

    def to_dict(self) -> dict[str, Any]:
        base = self.rows[0].prediction.ideal_samples_per_s if self.rows else 1.0
        return {"model": self.model, "unit": self.unit, "workload": self.workload, "device_type": self.device_type,
                "flavor": self.flavor, "qualifier": self.what or None, "inputs": self.inputs,
                "rows": [r.to_dict(base) for r in self.rows], "notes": self.notes}


def predict_workload(records: list[dict[str, Any]], query: Query, opts: ModelOptions,
                     shapes: list[Shape] | None = None, nodes: list[int] | None = None,
                     store: str = "the store") -> Prediction:
    """Everything ``dlscale predict`` shows: inputs with their sources, one row per shape (1x1 first)."""
    w = pick_workload(records, query, store, opts.strategy)
    built = build_model(w, records, opts)
    m = built.model
    shapes = list(shapes) if shapes else default_shapes(built.limit, m.links.inter is not None, nodes)
    check_shapes(shapes, m.links, built.limit, built.limit_why)
    measured = w.measured(opts.strategy)
    calib = {p.shape for p in m.measured}
    other_host = m.host is not None and m.host.other_host  # the records ran on a host of other cores
    one = None if m.t1_inferred else built.base  # the 1x1 record; none where t_1 was inferred from the node
    out = []
    for sh in [ONE] + [s for s in shapes if s != ONE]:
        mr = None if other_host else one if sh == ONE else measured.get(sh)
        out.append(PredictedRow(m.predict(sh), mr.median if mr else None,
                                str(mr.record.get("id")) if mr else None, mr.record.get("kind") if mr else None,
                                sh in calib))
    base = built.base
    cfg = rec_config(base.record)
    notes = [f"compute split: {m.compute.split}",
             f"gradients: {built.info['params']:,.0f} params x {built.info['bytes_per_gradient']:g} B "
             f"({built.info['bytes_per_gradient_source']}); {built.info['bucket_layout']}",
             "all-reduce of S bytes on M nodes x g GPUs: 2(g-1) a + 2S(g-1)/g / B_intra(g) in the node; across "
             "nodes the faster of a ring (2(M-1) a + 2S(M-1)/M / B_inter) and NCCL's tree (2 log2(M) a + S / "
             "B_inter), B_inter per node" if m.links.inter_algorithm == "auto" else
             f"inter-node all-reduce: {m.links.inter_algorithm}",
             f"overhead: {built.info['overhead_source']}",
             "band: the spread of the measured inputs (1-device record, the node point it rests on) and, for that "
             "basis, how far below and above their prediction 80 % of the law's held-out points fell on each side "
             "(docs/perfmodel.md); never above ideal",
             f"measured column: the newest ok {opts.strategy} record of each shape at the strategy's defaults "
             f"(a variant with strategy options or the optimizer graph only where no default run exists; 1x1: "
             + ("none, the 1-device step is inferred from the node's)" if m.t1_inferred else "the baseline record)")
             + (f"; empty: the records ran on {m.host.record_cores} cores a host, the prediction is for "
                f"{m.host.cores} (--host-cores)" if other_host else "")]
    for r in out:
        notes += [n for n in r.prediction.notes if n not in notes]
    stated = [k for k in m.links.intra if k > 0]
    big = [s.gpus_per_node for s in shapes if stated and s.gpus_per_node > max(stated)]
    if big:
        notes.append(f"the intra-node figure was measured or stated at {max(stated)} GPUs and is used for "
                     f"{max(big)} GPUs per node (a ring's busbw changes little with its length on a switched "
                     f"node; on a ring topology it may not hold)")
    return Prediction(str(cfg.get("model")), str(model_info(base.record).get("unit") or "sample"), w.fields,
                      rec_device_type(base.record), str(cfg.get("flavor") or "full"),
                      built.info | {"baseline_short": short_id(base.record)}, out, notes, built)
