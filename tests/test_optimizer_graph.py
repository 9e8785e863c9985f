"""--optimizer-graph: the optimizer step captured once and replayed (dlscale/train/step.py).

CUDA graphs need a GPU; here the capture is replaced by one that records the body and replays it
eagerly, so what is checked is the policy around the graph: when it is captured, that a replay
trains as the eager step does, that moved gradients are captured again and that too many moves
end in the eager step, and which cases are refused before anything starts."""
from __future__ import annotations

import pytest
import torch

from torch.optim.optimizer import register_optimizer_step_pre_hook

from dlscale import ConfigError
from dlscale.case.config import RunConfig, validate_case, validate_for_launch
from dlscale.train.step import GRAPH_MAX_CAPTURES, GRAPH_WARMUP, GraphedOptimizerStep, optimizer_step


class FakeCapture:
    """Records each capture (and that the optimizer was marked capturable during it). Like a CUDA
    graph, a replay reads the gradient tensors that were in place at its capture, whatever
    ``.grad`` holds now: a replay of the wrong graph trains on stale gradients."""

    def __init__(self, opt):
        self.opt, self.captures, self.replays = opt, 0, 0

    def __call__(self, body):
        assert all(g["capturable"] for g in self.opt.param_groups)
        self.captures += 1
        params = [p for g in self.opt.param_groups for p in g["params"]]
        bound = [p.grad for p in params]

        def replay():
            self.replays += 1
            now = [p.grad for p in params]
            for p, g in zip(params, bound):
                p.grad = g
            try:
                body()
            finally:
                for p, g in zip(params, now):
                    p.grad = g
        return replay


def _model_and_grads(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    params = list(model.parameters())
    grads = [[torch.randn_like(p) for p in params] for _ in range(8)]
    return model, params, grads


def _set_grads(params, bufs, values):
    """The gradients of one step, written into the same buffers (fixed addresses, as DDP's buckets)."""
    for p, b, v in zip(params, bufs, values):
        b.copy_(v)
        p.grad = b


def _train_beside_eager(clip, layouts: int):
    """The graphed step and torch's eager step trained side by side on the same gradients, written
    into ``layouts`` sets of buffers in turn (the allocator's recurring layouts). Returns the graphed
    step, its stand-in capture, and both models' parameters."""
    _, params, grads = _model_and_grads()
    _, ref_params, _ = _model_and_grads()
    opt = torch.optim.AdamW(params, lr=0.1)
    ref_opt = torch.optim.AdamW(ref_params, lr=0.1)
    fake = FakeCapture(opt)
    graphed = GraphedOptimizerStep(opt, params, clip=clip, capture=fake)
    bufs = [[torch.zeros_like(p) for p in params] for _ in range(layouts)]
    for i, g in enumerate(grads):
        _set_grads(params, bufs[i % layouts], g)
        graphed()
        assert all(p.grad is None for p in params)  # zeroed (set to None) after every step
        for p, v in zip(ref_params, g):
            p.grad = v.clone()
        optimizer_step(ref_opt, None, ref_params, clip)
    return graphed, fake, params, ref_params


def test_replayed_steps_train_as_the_eager_step():
    graphed, fake, params, ref_params = _train_beside_eager(clip=0.5, layouts=1)
    steps = len(_model_and_grads()[2])
    assert fake.captures == 1 and graphed.info["captures"] == 1
    assert fake.replays == steps - GRAPH_WARMUP == graphed.info["replays"]
    for p, r in zip(params, ref_params):
        assert torch.equal(p, r)
    assert not params[0].equal(_model_and_grads()[1][0])  # it trained
    assert all(not g["capturable"] for g in graphed.opt.param_groups)  # restored after the capture


def test_moved_gradients_are_captured_again_then_given_up():
    model, params, grads = _model_and_grads()
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    fake = FakeCapture(opt)
    graphed = GraphedOptimizerStep(opt, params, clip=None, capture=fake)
    steps = GRAPH_WARMUP + GRAPH_MAX_CAPTURES + 2
    for i in range(steps):
        for p, v in zip(params, grads[i % len(grads)]):
            p.grad = v.clone()  # new tensors every step: new addresses
        graphed()
    assert "capturable" not in opt.param_groups[0]  # SGD has no such flag: none left behind
    assert graphed.info["captures"] == GRAPH_MAX_CAPTURES == fake.captures
    assert graphed.info["abandoned"] is True
    assert graphed.info["replays"] == GRAPH_MAX_CAPTURES  # after giving up, eager
    assert graphed.eager_steps == steps - GRAPH_MAX_CAPTURES


def test_recurring_gradient_layouts_get_a_graph_each():
    graphed, fake, params, ref_params = _train_beside_eager(clip=None, layouts=2)
    steps = len(_model_and_grads()[2])
    assert graphed.info == {"captures": 2, "replays": steps - GRAPH_WARMUP, "abandoned": False}
    for p, r in zip(params, ref_params):
        assert torch.equal(p, r)


def test_eager_block_steps_without_the_graph():
    model, params, grads = _model_and_grads()
    opt = torch.optim.AdamW(params, lr=0.1)
    fake = FakeCapture(opt)
    graphed = GraphedOptimizerStep(opt, params, clip=None, capture=fake)
    bufs = [torch.zeros_like(p) for p in params]
    for g in grads[:GRAPH_WARMUP + 1]:
        _set_grads(params, bufs, g)
        graphed()
    seen = []
    handle = register_optimizer_step_pre_hook(lambda *a: seen.append(1))
    try:
        with graphed.eager():
            _set_grads(params, bufs, grads[-1])
            graphed()
    finally:
        handle.remove()
    assert seen == [1] and fake.replays == 1  # the hook fired: the step ran eagerly, not replayed
    assert graphed.info["abandoned"] is False


@pytest.mark.parametrize("fields, words", [
    ({"strategy": "fsdp", "nproc_per_node": 2}, "works with strategy ddp"),
    ({"strategy": "single"}, "--nproc-per-node 1"),
    ({"strategy": "ddp", "precision": "amp-fp16"}, "gradient scaler"),
    ({"strategy": "ddp", "nproc_per_node": 2, "strategy_options": {"optimizer_in_backward": True}},
     "optimizer_in_backward .* does not go with optimizer-graph"),
    ({"strategy": "ddp", "warmup": GRAPH_WARMUP}, f"needs --warmup {GRAPH_WARMUP + 1} or more"),
])
def test_refused_cases(fields, words):
    cfg = RunConfig(model="gpt2", flavor="tiny", device="cpu", optimizer_graph=True, **fields)
    with pytest.raises(ConfigError, match=words):
        validate_case(cfg)


def test_refused_without_cuda():
    cfg = RunConfig(model="gpt2", flavor="tiny", device="cpu", strategy="ddp", optimizer_graph=True)
    validate_case(cfg)  # possible in itself ...
    with pytest.raises(ConfigError, match="CUDA.*cpu"):  # what it needs, what it got
        validate_for_launch(cfg)  # ... but not on this machine's CPU


def test_part_of_the_case_only_when_on():
    from dlscale.case.config import workload_fields

    off = RunConfig(model="gpt2", flavor="tiny")
    assert "optimizer_graph" not in workload_fields(off.to_dict())  # stored keys stay as they were
    assert off.case_key() != RunConfig(model="gpt2", flavor="tiny", optimizer_graph=True).case_key()
