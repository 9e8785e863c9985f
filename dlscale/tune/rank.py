"""The order in which candidates are measured: the performance model's predicted throughput.

``rank`` is the one entry point the search calls. Today it uses the first-order step model of
``dlscale plan`` (dlscale/plan.py ``predict_step``: compute at a fraction of the peak, tensor and
pipeline terms, the exposed data-parallel communication), evaluated at the micro-batch times the
accumulation (the gradients are exchanged once per optimizer step). A step model for every
strategy (dlscale/perfmodel) replaces it here, behind the same signature.
"""
from __future__ import annotations

from dataclasses import dataclass

from dlscale import ConfigError

CPU_NOMINAL_FLOPS = 1e11  # no peak is known for a CPU: the ranking needs an order, not the figure
BASIS = "first-order step model (dlscale/plan.py predict_step)"


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


@dataclass
class Ranked:
    candidate: object  # space.Candidate
    predicted_samples_per_s: float | None  # None: the model cannot say (no plan for it)
    basis: str
    rank: int = 0  # 1 = the model's first


def predict(cand, machine: TuneMachine) -> float | None:
    """Predicted samples/s of the whole job for one candidate, None where there is no model."""
    from dlscale.memplan import plan_memory
    from dlscale.plan import Machine, predict_step
    from dlscale.tune.prune import workload_of

    if cand.layout is None:
        return None
    cfg = cand.cfg
    try:
        work = workload_of(cfg)
        m = Machine(gpus=machine.world, nodes=machine.nodes, memory_bytes=machine.memory_bytes,
                    peak_flops=machine.peak_flops or CPU_NOMINAL_FLOPS, efficiency=machine.efficiency,
                    intra_busbw=machine.intra_busbw, inter_busbw=machine.inter_busbw)
        params_dev = plan_memory(work, cand.layout, cfg.batch_size).detail["params_on_device"]
        per_step = cfg.batch_size * cfg.grad_accum  # one optimizer step's samples on a data-parallel rank
        step = predict_step(work, cand.layout, per_step, m, params_dev)["step_s"]
    except (ConfigError, KeyError, ValueError, ZeroDivisionError):
        return None
    return per_step * cand.layout.dp / step if step > 0 else None


def _order(r: Ranked) -> tuple:
    c = r.candidate.cfg
    # ties (the first-order model is linear in the batch): larger micro-batches, no recomputation, eager first
    return (r.predicted_samples_per_s is None, -(r.predicted_samples_per_s or 0.0), -c.batch_size, c.grad_accum,
            c.activation_checkpointing != "none", c.compile)


def rank(candidates: list, machine: TuneMachine) -> list[Ranked]:
    """The candidates best first by predicted throughput; those the model cannot predict last
    (largest batch first). The single place the tune asks the performance model."""
    out = []
    for c in candidates:
        p = predict(c, machine)
        out.append(Ranked(c, p, BASIS if p is not None else "no model (no memory layout or architecture)"))
    out.sort(key=_order)
    for i, r in enumerate(out, 1):
        r.rank = i
    return out
