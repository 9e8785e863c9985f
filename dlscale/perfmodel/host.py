"""The strategies' host work (``strategies.HostCosts``: seconds per FSDP unit, per tensor-parallel Linear) fitted
on measured records.

A sample is a measured run of a sharded strategy (fsdp or tensor parallel, on one GPU or more) with the
single-device run of the same workload (model, batch, precision, compile setting, GPU) from the same store. The
single run gives the compute rate, the model the GPU's critical path of the sharded run at that rate; where the
measured step is longer than that path by more than ``HOST_BOUND`` the host set the step (the step model's
``max(GPU path, host work)``), and the sample implies its coefficient::

    coefficient = (measured step - block passes x block floor) / (FSDP units, or block passes x sharded Linears)

A sample whose step the GPU path explains only bounds the coefficient from above and is left out. Each
coefficient is the median of its samples, per compile setting; none: 0 (nothing added).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable

from dlscale.perfmodel.strategies import (Candidate, HostCosts, Machine, Reference, calibrate, step_terms,
                                          tokens_per_step)

# A measured step this much above the modelled GPU path is host-bound: above the run-to-run spread of the
# project's repeated two-GPU records (a few per cent) and the compute rate's error from one GPU to two.
HOST_BOUND = 0.10
FSDP, TP = "fsdp_unit_s", "tp_linear_s"


@dataclass(frozen=True)
class HostSample:
    """A measured sharded run and the single-device run its GPU path is calibrated on."""

    source: str
    candidate: Candidate
    arch: Any
    machine: Machine
    tokens_per_s_per_device: float
    reference: Reference
    label: str = ""

    @property
    def step_s(self) -> float:
        return tokens_per_step(self.candidate, self.arch) / self.candidate.devices / self.tokens_per_s_per_device


def implied(s: HostSample) -> tuple[str, float] | None:
    """(the coefficient, its value) a host-bound sample implies; None for a GPU-bound one or one whose host work
    mixes FSDP units and tensor-parallel Linears."""
    c = s.candidate
    kind = TP if c.tp > 1 and c.zero < 2 else FSDP if c.zero >= 2 and c.tp == 1 else None
    if kind is None:
        return None
    eff, _ = calibrate(s.reference, s.arch)
    bare = replace(s.machine, host=HostCosts())
    t = step_terms(c, s.arch, bare, eff)
    if s.step_s <= (1 + HOST_BOUND) * t.step_s:
        return None
    count = step_terms(c, s.arch, replace(bare, host=HostCosts(**{kind: 1.0})), eff).host_s - t.host_s
    return (kind, (s.step_s - t.host_s) / count) if count > 0 else None


def fit_host_costs(samples: Iterable[HostSample], exclude_source: str | None = None
                   ) -> dict[tuple[bool, bool], HostCosts]:
    """The median implied coefficient of each kind over the samples not of ``exclude_source``, keyed by (compile
    setting, several ranks): one rank's FSDP collectives have no peer to wait for, so its units cost the host
    less than several ranks' do; a kind without samples of the rank count takes the other count's."""
    by: dict[tuple[bool, bool, str], list[float]] = {}
    for s in samples:
        if s.source == exclude_source:
            continue
        got = implied(s)
        if got is not None:
            by.setdefault((s.candidate.compiled, s.candidate.devices > 1, got[0]), []).append(got[1])
    out = {}
    for compiled in sorted({k[0] for k in by}):
        for multi in (False, True):
            vals = {kind: by.get((compiled, multi, kind)) or by.get((compiled, not multi, kind)) or []
                    for kind in (FSDP, TP)}
            what = ", ".join(f"{kind} from {len(v)}" for kind, v in vals.items() if v)
            out[(compiled, multi)] = HostCosts(**{k: statistics.median(v) for k, v in vals.items() if v},
                                               source=f"median of host-bound records ({what})")
    return out


def _workload(rec: dict[str, Any]) -> tuple:
    cfg = rec.get("config") or {}
    return (cfg.get("model"), cfg.get("flavor") or "full", cfg.get("batch_size"), cfg.get("precision"),
            bool(cfg.get("compile")), cfg.get("activation_checkpointing") or "none",
            str((rec.get("summary") or {}).get("device_name")))


def record_samples(records: list[dict[str, Any]], source: str, links: Any, peak_flops: float,
                   floor: Callable[[str, str, bool], float]) -> list[HostSample]:
    """The samples of one store: each ok fsdp / tensor run with the newest single-device run of its workload in
    the same store; ``floor(model, flavor, compiled)``: the block floor their machines take."""
    from dlscale.models import get_model
    from dlscale.perfmodel.evidence import record_candidate, record_tokens_per_s

    singles: dict[tuple, Reference] = {}
    runs = []
    for rec in sorted(records, key=lambda r: str(r.get("created") or "")):
        cfg = rec.get("config") or {}
        if rec.get("kind", "run") != "run" or rec.get("status") != "ok" or not cfg.get("model"):
            continue
        cand = record_candidate(rec)
        if cand is None or cand.strategy not in ("single", "fsdp", "tensor"):
            continue
        arch = get_model(cfg["model"], cfg.get("flavor") or "full").arch
        tps = record_tokens_per_s(rec, arch.seq_len)
        if not tps:
            continue
        peak = float((rec.get("summary") or {}).get("peak_flops") or peak_flops)
        machine = Machine(cand.devices, int(cfg.get("nproc_per_node") or 1), peak, links,
                          block_floor_s=floor(cfg["model"], cfg.get("flavor") or "full", cand.compiled))
        ident = f"{source} {str(rec.get('id'))[:8]}"
        if cand.strategy == "single":
            singles[_workload(rec)] = Reference(cand, machine, tps, ident)
        else:
            runs.append((_workload(rec), (cand, arch, machine, tps, ident)))
    return [HostSample(source, cand, arch, machine, tps, singles[key], ident)
            for key, (cand, arch, machine, tps, ident) in runs if key in singles]
