"""The order in which candidates are measured: the performance model's predicted throughput.

``rank`` is the one entry point the search calls. It asks the strategy model of dlscale/perfmodel
(``predict_step``: compute from the best evidence the store holds, plus each strategy's
communication, minus what it hides) at the micro-batch times the accumulation (the gradients are
exchanged once per optimizer step). Each prediction says its basis: a measured record of the model,
a ``micro layer`` timing, or the assumed MFU where the store holds nothing of it.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlscale import ConfigError
from dlscale.perfmodel import strategies as sm
from dlscale.perfmodel.core import Link, Links
from dlscale.perfmodel.evidence import evidence_from_records

CPU_NOMINAL_FLOPS = 1e11  # no peak is known for a CPU: the ranking needs an order, not the figure


@dataclass(frozen=True)
class TuneMachine:
    """The devices the tune runs on, as the model needs them."""

    device_type: str
    world: int
    nodes: int
    memory_bytes: float
    peak_flops: float | None = None  # dense FLOP/s of one device in the compute dtype (None: unknown)
    efficiency: float = 0.40
    intra_busbw: float = 300e9  # bytes/s
    inter_busbw: float = 50e9
    mem_bw_bps: float = 0.0  # one device's memory bandwidth (0: unknown; the optimizer update is not priced)


@dataclass
class Ranked:
    candidate: object  # space.Candidate
    predicted_samples_per_s: float | None  # None: the model cannot say (no plan for it)
    basis: str
    rank: int = 0  # 1 = the model's first


def predict(cand, machine: TuneMachine, evidence=None) -> tuple[float, str] | None:
    """Predicted samples/s of the whole job for one candidate and the basis of its compute, None where
    the model cannot price it (no transformer architecture, no memory layout, a configuration it refuses)."""
    from dlscale.models import get_model  # torch: keeps start-up light

    cfg = cand.cfg
    arch = getattr(get_model(cfg.model, cfg.flavor), "arch", None)
    if cand.layout is None or arch is None:
        return None
    links = Links(intra={0: Link(machine.intra_busbw)}, inter=Link(machine.inter_busbw) if machine.nodes > 1 else None)
    m = sm.Machine(gpus=machine.world, gpus_per_node=max(1, machine.world // machine.nodes),
                   peak_flops=machine.peak_flops or CPU_NOMINAL_FLOPS, links=links, mem_bw_bps=machine.mem_bw_bps)
    per_step = cfg.batch_size * cfg.grad_accum  # one optimizer step's samples on a data-parallel rank
    c = sm.Candidate.from_layout(cand.layout, per_step, cfg.activation_checkpointing, cfg.precision, cfg.compile)
    try:
        p = sm.predict(c, arch, m, evidence or sm.Evidence(assumed_mfu=machine.efficiency))
    except (ConfigError, KeyError, ValueError, ZeroDivisionError):
        return None
    return p.tokens_per_s_per_device * c.devices / arch.seq_len, p.basis


def evidence_for(records: list, cfg, machine: TuneMachine):
    """What the store holds for the model (measured records, micro layer timings), as the model's
    evidence; the assumed MFU where it holds nothing."""
    links = Links(intra={0: Link(machine.intra_busbw)}, inter=Link(machine.inter_busbw))
    try:
        return evidence_from_records(records, cfg.model, cfg.flavor, machine.peak_flops or CPU_NOMINAL_FLOPS,
                                     links, cfg.batch_size, machine.efficiency)
    except (ConfigError, KeyError, ValueError, ZeroDivisionError, AttributeError):
        return None


def _order(r: Ranked) -> tuple:
    c = r.candidate.cfg
    # ties (the first-order model is linear in the batch): larger micro-batches, no recomputation, eager first
    return (r.predicted_samples_per_s is None, -(r.predicted_samples_per_s or 0.0), -c.batch_size, c.grad_accum,
            c.activation_checkpointing != "none", c.compile)


def rank(candidates: list, machine: TuneMachine, evidence=None) -> list[Ranked]:
    """The candidates best first by predicted throughput; those the model cannot predict last
    (largest batch first). The single place the tune asks the performance model."""
    out = []
    for c in candidates:
        p = predict(c, machine, evidence)
        out.append(Ranked(c, p[0], f"strategy model ({p[1]})") if p is not None
                   else Ranked(c, None, "no model (no memory layout or architecture)"))
    out.sort(key=_order)
    for i, r in enumerate(out, 1):
        r.rank = i
    return out
