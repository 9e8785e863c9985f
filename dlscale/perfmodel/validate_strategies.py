"""Checking the strategy model (``strategies``) on published sharded-training tables and on the project's own
multi-GPU records of fsdp, tensor, pipeline and hybrid.

Protocols, each a measured point predicted from something else:

* ``from-node`` / ``from-multinode``: from the same configuration of the same source at the fewest devices (a node,
  or fewer nodes): the compute rate inferred there, the communication of the larger shape modelled;
* ``fitted-rate``: from nothing of the case's own source: the compute rate is the median of the rates inferred on
  every other source's points of the same precision class (bf16 or float8), the same default for every system;
* ``micro-layer``: from nothing of the case's own source nor any throughput: the compute rate of the block's
  ``micro layer`` forward+backward row (hidden, MLP width, heads, kv heads, sequence length and precision of
  the case; one GPU of the project), each block at that rate, scaled by the blocks of the busiest stage, the
  embedding and head at the same rate, and the strategy's communication modelled;
* ``from-1-gpu``: the project's own records, each multi-GPU record from the 1-GPU record of its store.

Published tables are the ``dlscale-table/1`` fixtures whose rows carry ``x-parallel`` (the configuration) and whose
table carries ``x-model`` (the model's shape).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from dlscale.perfmodel.core import Link, Links, error_pct
from dlscale.perfmodel.evidence import (
    block_floor, layer_timing, record_candidate, record_samples, record_tokens_per_s,
)
from dlscale.perfmodel.host import fit_host_costs
from dlscale.perfmodel.strategies import (
    Candidate, Evidence, Machine, Reference, calibrate, predict, throughput,
)

H100_PEAK = 989.4e12  # dense bf16 of the H100 / H200 SXM datasheets (the rate is fitted; the peak scales MFU only)
PARALLEL_KEYS = ("dp_replicate", "dp_shard", "tp", "pp", "zero", "microbatches", "schedule", "virtual",
                 "sequence_parallel", "checkpointing", "head_sharded", "balance", "dp_overlap", "param_bytes",
                 "grad_bytes", "blocks_per_unit")


@dataclass(frozen=True)
class Case:
    """One measured point: where it is from, the model, its configuration and machine, tokens/s per GPU."""

    source: str
    table: str
    arch: Any
    candidate: Candidate
    machine: Machine
    measured: float
    note: str = ""

    @property
    def family(self) -> str:
        c = self.candidate
        if c.tp == 1 and c.pp == 1:
            return {0: "ddp", 1: "zero1"}.get(c.zero, "hsdp" if c.dp_replicate > 1 else "fsdp")
        if c.dp == 1 and (c.tp == 1) != (c.pp == 1):
            return "tensor" if c.tp > 1 else "pipeline"
        return "hybrid"

    @property
    def precision_class(self) -> str:
        return "float8" if self.candidate.precision == "fp8" else "bf16"


@dataclass
class Row:
    case: Case
    protocol: str
    predicted: float
    basis_ref: str
    limited_by: str

    @property
    def error_pct(self) -> float:
        return error_pct(self.predicted, self.case.measured)


# ----------------------------------------------------------------------------- reading

def _arch(model: dict[str, Any], seq_len: int) -> Any:
    from dlscale.models import BlockLayout, TransformerArch  # torch: keeps start-up light

    layout = BlockLayout(attention="attn", mlp="mlp", colwise=(), rowwise=(), norms=(), fused_qkv=None)
    # Llama-style unless the table says otherwise (GPT-3: GELU, LayerNorm, biases, tied, learned positions)
    return TransformerArch(n_layers=model["n_layers"], hidden=model["hidden"], n_heads=model["n_heads"],
                           ffn_hidden=model["ffn_hidden"], vocab=model["vocab"], seq_len=seq_len, layout=layout,
                           n_kv_heads=model.get("n_kv_heads"), mlp=model.get("mlp", "swiglu"),
                           norm=model.get("norm", "rmsnorm"), bias=bool(model.get("bias", False)),
                           tied_embeddings=bool(model.get("tied_embeddings", False)),
                           position_table=int(model.get("position_table", 0)))


def _links(system: dict[str, Any]) -> Links:
    def link(d):
        return Link(float(d["busbw_gbps"]) * 1e9, float(d.get("latency_us") or 0) * 1e-6) if d else None

    return Links(intra={0: link(system.get("intra"))}, inter=link(system.get("inter")))


def table_cases(path: Path) -> list[Case]:
    """The cases of one table file (none unless it carries ``x-model``)."""
    text = path.read_text()
    if "x-model" not in text:  # most tables are data-parallel ones: skip them before the (slow) YAML parse
        return []
    t = yaml.safe_load(text)
    if not isinstance(t, dict) or "x-model" not in t:
        return []
    arch = _arch(t["x-model"], int(t["seq_len"]))
    links = _links(t.get("system") or {})
    source = str(t["source"]).split(" (")[0].split(",")[0]  # the page: its tables are one source
    out = []
    for row in t["rows"]:
        r = {**(t.get("defaults") or {}), **row}
        if r.get("status", "ok") != "ok":
            continue
        par = {k: v for k, v in (r.get("x-parallel") or {}).items() if k in PARALLEL_KEYS}
        cand = Candidate(strategy=r.get("strategy", "ddp"), batch_size=int(r["batch_size"]),
                         precision="fp8" if r.get("x-float8") else r.get("precision", "amp-bf16"),
                         compiled=bool(r.get("compile")), **par)
        gpus = int(r["nodes"]) * int(r["gpus_per_node"])
        machine = Machine(gpus, int(r["gpus_per_node"]), H100_PEAK, links)
        out.append(Case(source, path.name, arch, cand, machine, float(r["throughput"]) / gpus, str(r.get("note", ""))))
    return out


def published_cases(dirs: Iterable[Path]) -> list[Case]:
    return [c for d in dirs for p in sorted(Path(d).glob("*.yaml")) for c in table_cases(p)]


def own_cases(stores: dict[str, list[dict[str, Any]]], links: Links) -> list[tuple[Case, Reference]]:
    """Each ok multi-GPU fsdp/hsdp/tensor/pipeline/hybrid record of a store with the 1-GPU record of its workload
    (model, flavour, batch, precision, compile, checkpointing), as (case, the 1-GPU reference)."""
    from dlscale.models import get_model  # torch: keeps start-up light

    ones: dict[tuple, tuple[str, Reference]] = {}  # the newest 1-GPU record of each workload, any store
    multi = []
    for name, records in stores.items():
        for rec in sorted(records, key=lambda r: str(r.get("created") or "")):
            cfg = rec.get("config") or {}
            if rec.get("kind", "run") != "run" or rec.get("status") != "ok" or not cfg.get("model"):
                continue
            cand = record_candidate(rec)
            if cand is None:
                continue
            arch = get_model(cfg["model"], cfg.get("flavor") or "full").arch
            tps = record_tokens_per_s(rec, arch.seq_len)
            peak = float((rec.get("summary") or {}).get("peak_flops") or H100_PEAK)
            key = (cfg["model"], cfg.get("flavor"), cand.batch_size, cand.precision, cand.compiled, cand.checkpointing,
                   str((rec.get("summary") or {}).get("device_name")))
            machine = Machine(cand.devices, int(cfg.get("nproc_per_node") or 1), peak, links)
            if cand.devices == 1 and cand.strategy == "single" and tps:
                ref = Reference(cand, machine, tps, f"{name} {str(rec.get('id'))[:8]}")
                ones[key] = (name, ref)
                ones[(name, *key)] = (name, ref)
            elif cand.devices > 1 and cand.strategy in ("fsdp", "hsdp", "tensor", "pipeline", "hybrid") and tps:
                multi.append((key, Case(name, name, arch, cand, machine, tps, f"{cfg['model']} {cand.label}")))
    # a store without the 1-GPU record of its workload takes the newest of another store on the same GPU model
    pairs = [(key, case, (ones.get((case.source, *key)) or ones[key])[1]) for key, case in multi
             if key in ones or (case.source, *key) in ones]
    return [_with_floor(stores, key, case, ref) for key, case, ref in pairs]


def _with_floor(stores: dict[str, list[dict[str, Any]]], key: tuple, case: Case, ref: Reference
                ) -> tuple[Case, Reference]:
    """The case and its reference on a machine with the block floor measured in the other stores (never its own:
    a pipeline record's timed pieces are part of the run predicted)."""
    others = [r for name, recs in stores.items() if name != case.source for r in recs]
    model, flavor, _, _, compiled, _, device = key
    floor, _ = block_floor(others, model, flavor or "full", compiled, device)
    return (replace(case, machine=replace(case.machine, block_floor_s=floor)),
            replace(ref, machine=replace(ref.machine, block_floor_s=floor)))


# ----------------------------------------------------------------------------- protocols

def _row(case: Case, protocol: str, evidence: Evidence) -> Row:
    p = predict(case.candidate, case.arch, case.machine, evidence)
    return Row(case, protocol, p.tokens_per_s_per_device, p.evidence, p.limited_by)


def _same_but_dp(a: Candidate, b: Candidate) -> bool:
    return replace(a, dp_shard=1, dp_replicate=1) == replace(b, dp_shard=1, dp_replicate=1)


def from_smaller(cases: list[Case]) -> list[Row]:
    """Each case predicted from the same configuration of its source at the fewest devices (from-node,
    from-multinode); where the source has the model only in another configuration at fewer devices, from that
    (other-strategy)."""
    rows = []
    for c in cases:
        smaller = [o for o in cases if o.source == c.source and o.arch == c.arch and o.candidate.devices < c.candidate.devices
                   and o.precision_class == c.precision_class]
        same = [o for o in smaller if _same_but_dp(o.candidate, c.candidate)]
        if not smaller:
            continue
        ref = min(same or smaller, key=lambda o: o.candidate.devices)
        protocol = ("other-strategy" if not same else
                    "from-node" if ref.candidate.devices <= ref.machine.gpus_per_node else "from-multinode")
        evidence = Evidence((Reference(ref.candidate, ref.machine, ref.measured, ref.table),))
        rows.append(replace(_row(c, protocol, evidence), protocol=protocol))
    return rows


def inferred_rate(case: Case) -> float:
    return calibrate(Reference(case.candidate, case.machine, case.measured, case.table), case.arch)[0]


def fitted_rates(cases: list[Case], exclude_source: str | None = None) -> dict[str, float]:
    """The median inferred compute rate per precision class over the cases not of ``exclude_source``."""
    by: dict[str, list[float]] = {}
    for c in cases:
        if c.source != exclude_source:
            by.setdefault(c.precision_class, []).append(inferred_rate(c))
    return {k: statistics.median(v) for k, v in by.items()}


def held_out_by_source(cases: list[Case]) -> list[Row]:
    """Each case predicted at the compute rate fitted on every other source (``fitted-rate``)."""
    rows = []
    for src in sorted({c.source for c in cases}):
        rates = fitted_rates(cases, exclude_source=src)
        for c in (c for c in cases if c.source == src):
            if c.precision_class not in rates:
                continue
            rows.append(_row(c, "fitted-rate", Evidence(assumed_mfu=rates[c.precision_class])))
    return rows


def micro_layer_batch(c: Candidate) -> int:
    """The batch one block runs at a time: the micro-batch of a pipeline, else the rank's batch."""
    return c.batch_size // c.microbatches if c.pp > 1 else c.batch_size


def from_micro_layer(cases: list[Case], records: list[dict[str, Any]], fused_fp8: bool = True
                     ) -> tuple[list[Row], list[tuple[Case, str]]]:
    """Each case predicted from the ``micro layer`` row of its block shape (``micro-layer``), and the cases
    without one with why. Every published float8 implementation fuses its casts (torchao under torch.compile,
    Transformer Engine), so a float8 case takes only a compiled fp8 row, never an eager one (``fused_fp8``
    False: the eager rows too, to show what they would give, not a prediction)."""
    rows, skipped = [], []
    for c in cases:
        cand = c.candidate
        fused = cand.compiled or (fused_fp8 and cand.precision == "fp8")
        lt = layer_timing(records, c.arch, micro_layer_batch(cand), cand.precision, fused)
        if lt is None:
            why = ("no compiled fp8 row (the fp8 rows are eager: unfused casts)" if cand.precision == "fp8"
                   and layer_timing(records, c.arch, 1, "amp-bf16") else "no row of its block shape")
            skipped.append((c, why))
            continue
        rows.append(_row(c, "micro-layer", Evidence(layer=lt)))
    return rows, skipped


def own_host_samples(stores: dict[str, list[dict[str, Any]]], links: Links) -> list:
    """Every store's host samples (``evidence.record_samples``), their block floor measured in the other stores."""
    out = []
    for name, records in stores.items():
        others = [r for n, recs in stores.items() if n != name for r in recs]
        out += record_samples(records, name, links, H100_PEAK,
                              lambda model, flavor, compiled: block_floor(others, model, flavor, compiled)[0])
    return out


def own_rows(pairs: list[tuple[Case, Reference]], samples: list = ()) -> list[Row]:
    """Each case from its 1-GPU reference, the host costs fitted on the samples of the other stores."""
    return [_row(case, "from-1-gpu", Evidence((ref,), host_costs=fit_host_costs(samples, exclude_source=case.source)))
            for case, ref in pairs]


def repeat_rows(pairs: list[tuple[Case, Reference]]) -> list[Row]:
    """Each case "predicted" by the median measurement of the same configuration in the other stores: the error no
    model from a reference can beat, since the same configuration measured another day differs by this much."""
    cases = [c for c, _ in pairs]
    rows = []
    for c in cases:
        same = [o.measured for o in cases if o.source != c.source and o.arch == c.arch and o.candidate == c.candidate]
        if same:
            rows.append(Row(c, "repeat in another store", statistics.median(same), "", ""))
    return rows


def ranking(cases: list[Case]) -> list[tuple[str, list[tuple[str, float, float]], bool]]:
    """For each source, model and GPU count with several published configurations: the configurations ranked by
    the model (at the rate fitted without the source), with their measured figure, and whether the fastest
    published one is in the model's top three."""
    out = []
    groups: dict[tuple, list[Case]] = {}
    for c in cases:
        groups.setdefault((c.source, c.arch.n_layers, c.arch.hidden, c.candidate.devices, c.precision_class,
                           c.candidate.compiled), []).append(c)
    for (src, _, _, gpus, _, _), cs in groups.items():
        if len(cs) < 2:
            continue
        rate = fitted_rates(cases, exclude_source=src).get(cs[0].precision_class)
        if rate is None:
            continue
        pred = [(c, throughput(c.candidate, c.arch, c.machine, rate)) for c in cs]
        pred.sort(key=lambda cp: -cp[1])
        fastest = max(cs, key=lambda c: c.measured)
        top3 = [c for c, _ in pred[:3]]
        out.append((f"{src}, {gpus} GPUs", [(c.candidate.label, p, c.measured) for c, p in pred], fastest in top3))
    return out


def summary(rows: list[Row]) -> list[tuple[str, str, str, int, float, float]]:
    """(source, family, protocol, n, mean |error| %, max |error| %) for every group of rows."""
    keys = sorted({(r.case.source, r.case.family, r.protocol) for r in rows})
    out = []
    for k in keys:
        errs = [abs(r.error_pct) for r in rows if (r.case.source, r.case.family, r.protocol) == k]
        out.append((*k, len(errs), sum(errs) / len(errs), max(errs)))
    return out
