"""The strategies' host work (``strategies.HostCosts``: seconds per FSDP unit, per tensor-parallel Linear) fitted
on measured records.

A sample (``evidence.record_samples`` reads them from a store) is a measured run of a sharded strategy (fsdp or tensor parallel, on one GPU or more) with the
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
from typing import Any, Iterable

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
