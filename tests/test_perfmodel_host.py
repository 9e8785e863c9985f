"""The strategy model's host-work term (strategies.host_s, max(GPU path, host)), its fit on records
(perfmodel/host.py) and the calibration cache, by hand on tiny shapes."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dlscale.models import get_model
from dlscale.perfmodel import host as hm
from dlscale.perfmodel import strategies as sm
from dlscale.perfmodel.core import Link, Links
from dlscale.perfmodel.strategies import Candidate, Evidence, HostCosts, Machine, Reference, predict, step_terms

ARCH = get_model("llama", "tiny").arch
LINKS = Links(intra={0: Link(100e9, 5e-6)})
FLOOR = 1e-3


def _machine(gpus: int, host: HostCosts = HostCosts()) -> Machine:
    return Machine(gpus, 8, 100e12, LINKS, block_floor_s=FLOOR, host=host)


def test_without_host_costs_the_step_is_the_gpu_path():
    for c in (Candidate("fsdp", dp_shard=2, zero=3, batch_size=2), Candidate("tensor", tp=2, batch_size=2)):
        t = step_terms(c, ARCH, _machine(2), 0.5)
        assert t.host_s == pytest.approx(ARCH.n_layers * FLOOR)  # the blocks' own launches only
        assert t.host_exposed_s == 0.0 and t.step_s >= t.host_s


@pytest.mark.parametrize("bpu", [1, 2])
def test_fsdp_units_set_the_step_when_the_host_is_longer(bpu):
    c = Candidate("fsdp", dp_shard=2, zero=3, batch_size=2, blocks_per_unit=bpu)
    gpu = step_terms(c, ARCH, _machine(2), 0.5).step_s
    unit = 10 * gpu  # far above the GPU path: the host sets the step
    t = step_terms(c, ARCH, _machine(2, HostCosts(fsdp_unit_s=unit)), 0.5)
    units = -(-ARCH.n_layers // bpu) + 1  # the blocks' units and the root
    assert t.step_s == pytest.approx(ARCH.n_layers * FLOOR + units * unit)
    assert t.host_exposed_s == pytest.approx(t.step_s - gpu)
    p = predict(c, ARCH, _machine(2, HostCosts(fsdp_unit_s=unit)), Evidence(assumed_mfu=0.5))
    assert p.limited_by == "host work"
    # the replicated strategies have no units: the coefficient adds nothing
    ddp = Candidate("ddp", dp_replicate=2, batch_size=2)
    assert step_terms(ddp, ARCH, _machine(2, HostCosts(fsdp_unit_s=unit)), 0.5) == step_terms(ddp, ARCH, _machine(2), 0.5)


def test_tensor_parallel_linears_add_per_block_pass():
    c = Candidate("tensor", tp=2, batch_size=2)
    per = 1.0
    t = step_terms(c, ARCH, _machine(2, HostCosts(tp_linear_s=per)), 0.5)
    linears = len(ARCH.layout.colwise) + len(ARCH.layout.rowwise)
    assert t.step_s == pytest.approx(ARCH.n_layers * (FLOOR + linears * per))
    # a pipeline's busiest stage runs m micro-batches of its blocks
    pc = Candidate("hybrid", tp=2, pp=2, batch_size=4, microbatches=4)
    tp_ = step_terms(pc, ARCH, _machine(4, HostCosts(tp_linear_s=per)), 0.5)
    blocks, _ = sm.stage_blocks(ARCH.n_layers, 2, 0.0, "time")
    assert tp_.host_s >= 4 * blocks * (FLOOR + linears * per) * 0.999
    assert tp_.step_s == pytest.approx(tp_.host_s)


def _sample(cand: Candidate, coef: dict, source: str = "a") -> hm.HostSample:
    """A run measured as the model with ``coef`` gives it, and its single-device reference."""
    single = Candidate("single", batch_size=cand.batch_size)
    ref = Reference(single, _machine(1), sm.throughput(single, ARCH, _machine(1), 0.5), "ref")
    measured = sm.throughput(cand, ARCH, _machine(cand.devices, HostCosts(**coef)), 0.5)
    return hm.HostSample(source, cand, ARCH, _machine(cand.devices), measured, ref)


def test_the_fit_recovers_a_host_bound_coefficient_and_skips_gpu_bound_runs():
    fsdp = Candidate("fsdp", dp_shard=2, zero=2, batch_size=2)
    tp = Candidate("tensor", tp=2, batch_size=2)
    gpu = step_terms(fsdp, ARCH, _machine(2), 0.5).step_s
    big, small = {"fsdp_unit_s": 5 * gpu}, {"fsdp_unit_s": 1e-9}
    samples = [_sample(fsdp, big), _sample(fsdp, small, "b"), _sample(tp, {"tp_linear_s": gpu}, "c")]
    assert hm.implied(samples[1]) is None  # its step the GPU path explains
    fit = hm.fit_host_costs(samples)
    assert fit[(False, True)].fsdp_unit_s == pytest.approx(big["fsdp_unit_s"], rel=1e-6)
    assert fit[(False, True)].tp_linear_s == pytest.approx(gpu, rel=1e-6)
    # one-rank costs borrow the several-rank samples where there are none of their own
    assert fit[(False, False)].fsdp_unit_s == fit[(False, True)].fsdp_unit_s
    held_out = hm.fit_host_costs(samples, exclude_source="a")
    assert not held_out[(False, True)].fsdp_unit_s
    # predict takes the fitted costs of the candidate's compile setting and rank count
    p = predict(fsdp, ARCH, _machine(2), Evidence(assumed_mfu=0.5, host_costs=fit))
    assert p.step_s == pytest.approx(1 / samples[0].tokens_per_s_per_device * sm.tokens_per_step(fsdp, ARCH) / 2)


def test_calibration_is_computed_once_per_reference(monkeypatch):
    calls = []
    real = sm._calibrate
    monkeypatch.setattr(sm, "_calibrate", lambda ref, arch: calls.append(1) or real(ref, arch))
    c = Candidate("fsdp", dp_shard=2, zero=3, batch_size=2)
    m = Machine(2, 8, 100e12, LINKS)  # no floor: the throughput follows the rate
    ref = Reference(c, m, sm.throughput(c, ARCH, m, 0.37), "cache-test")
    first = sm.calibrate(ref, ARCH)
    again = sm.calibrate(replace(ref), ARCH)  # an equal reference, another object (Links is not hashable)
    assert first == again and len(calls) == 1
    assert first[0] == pytest.approx(0.37, rel=1e-3)
    sm.calibrate(replace(ref, tokens_per_s_per_device=ref.tokens_per_s_per_device / 2), ARCH)
    assert len(calls) == 2


def test_a_one_gpu_fsdp_record_keeps_its_strategy_and_is_no_single_reference():
    from dlscale.perfmodel.evidence import record_candidate

    def rec(strategy, opts):
        return {"status": "ok", "config": {"model": "gpt2", "flavor": "full", "strategy": strategy,
                                           "strategy_options": opts, "nproc_per_node": 1, "batch_size": 4}}
    one_fsdp = record_candidate(rec("fsdp", {"shard": "zero2"}))
    assert (one_fsdp.strategy, one_fsdp.zero, one_fsdp.devices) == ("fsdp", 2, 1)
    assert record_candidate(rec("ddp", {})).strategy == "single"
    target = replace(one_fsdp, dp_shard=2)
    refs = (Reference(one_fsdp, _machine(1), 1e5, "fsdp"),
            Reference(record_candidate(rec("single", {})), _machine(1), 1e5, "single"))
    ref, basis = sm.pick_reference(target, _machine(2), Evidence(refs))
    assert (ref.ref, basis) == ("single", "from-1-gpu")
