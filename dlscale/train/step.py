"""The end of a training step, shared by the worker's timed step and the breakdown's phased one,
and the same end captured once as a CUDA graph and replayed (``--optimizer-graph``)."""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch

from dlscale import ConfigError
from dlscale.strategies import get_strategy, strategy_names

# which strategies may capture the step: those that declare Capabilities.optimizer_graph (their step
# is the worker's own and their gradients stay at fixed addresses from step to step: ddp, views of its
# buckets; a single process's are new tensors each step, measured at more layouts than GRAPH_MAX_CAPTURES)
GRAPH_WARMUP = 2  # eager steps before the capture: the first makes the optimizer's state, DDP rebuilds its buckets
GRAPH_MAX_CAPTURES = 4  # gradient layouts (one graph each) before giving up: the gradients move every step


def optimizer_step(opt, scaler, params: list, clip: float | None) -> None:
    """The end of every training step: clip the global norm (unscaled first), step, zero grads."""
    if clip is not None:
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, clip)
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)


def check_optimizer_graph(cfg, device: str | None = None) -> None:
    """``--optimizer-graph`` is possible for this case (one-line ConfigError otherwise); ``device``
    is the resolved device type where the machine is known."""
    if not cfg.optimizer_graph:
        return
    what = "optimizer-graph (the optimizer step as a CUDA graph)"
    if cfg.framework != "torch":
        raise ConfigError(f"{what} is a torch option; framework {cfg.framework} compiles its own step")
    if not get_strategy(cfg.strategy).caps.optimizer_graph:
        able = [s for s in strategy_names() if get_strategy(s).caps.optimizer_graph]
        which = (f"strategy {' or '.join(able)} (one process: --strategy {able[0]} --nproc-per-node 1)"
                 if able else "a strategy that declares it")
        raise ConfigError(f"{what} works with {which}: gradients at fixed addresses; got {cfg.strategy}")
    if cfg.precision == "amp-fp16":
        raise ConfigError(f"{what} cannot run with amp-fp16: the gradient scaler reads its overflow check on "
                          f"the host every step; use amp-bf16 or fp32")
    if cfg.warmup < GRAPH_WARMUP + 1:  # the capture must not land in the timed window
        raise ConfigError(f"{what} captures at step {GRAPH_WARMUP + 1}: needs --warmup {GRAPH_WARMUP + 1} or more, "
                          f"got {cfg.warmup}")
    if device is not None and device != "cuda":
        raise ConfigError(f"{what} needs a CUDA device, got {device}")


class GraphedOptimizerStep:
    """``optimizer_step`` for CUDA: eager for ``GRAPH_WARMUP`` steps, then captured as a CUDA graph
    and replayed every step, so the host spends microseconds where the optimizer's Python (state
    lookups, grouping, clipping) took about a millisecond after the backward.

    A graph holds the addresses it was captured with. Parameters and optimizer state never move and
    DDP's gradients are views of its buckets, so DDP needs one graph. Anything that moves them (a
    gradient set to a new tensor) is caught: the gradients' addresses are checked every step and each
    layout gets a graph of its own (``captures``), up to ``GRAPH_MAX_CAPTURES``; a step with yet
    another layout ends the graphs and the step stays eager (``abandoned``). ``info`` is what the
    record keeps.

    ``capture(body) -> replay`` is torch's CUDA graph capture; tests pass their own.
    """

    def __init__(self, opt: torch.optim.Optimizer, params: list, clip: float | None,
                 capture: Callable[[Callable[[], None]], Callable[[], None]] | None = None):
        self.opt, self.params, self.clip = opt, params, clip
        self._capture = capture or _cuda_capture
        self._graphs: dict[tuple[int, ...], Callable[[], None]] = {}  # gradients' addresses -> replay
        self.eager_steps = 0
        self._eager = False  # inside eager(): step without the graph
        self.info: dict[str, Any] = {"captures": 0, "replays": 0, "abandoned": False}

    def _body(self) -> None:
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()

    def _grad_ptrs(self) -> tuple[int, ...]:
        return tuple(0 if p.grad is None else p.grad.data_ptr() for p in self.params)

    def _replay(self) -> Callable[[], None] | None:
        """The graph of the gradients' current addresses (captured now if they are new), or None: this
        step runs eagerly (warm-up, ``eager()``, or past ``GRAPH_MAX_CAPTURES`` layouts: abandoned)."""
        if self.eager_steps < GRAPH_WARMUP or self._eager or self.info["abandoned"]:
            return None
        ptrs = self._grad_ptrs()
        replay = self._graphs.get(ptrs)
        if replay is None:
            if len(self._graphs) >= GRAPH_MAX_CAPTURES:
                self.info["abandoned"] = True
                self._graphs.clear()
                return None
            replay = self._graphs[ptrs] = self._captured()
            self.info["captures"] += 1
        return replay

    def __call__(self) -> None:
        replay = self._replay()
        if replay is None:
            self.eager_steps += 1
            optimizer_step(self.opt, None, self.params, self.clip)
            return
        if torch.autograd._profiler_enabled():
            with torch.profiler.record_function("Optimizer.step#graph"):  # where ddp_tail.py finds the step
                replay()
        else:
            replay()
        self.info["replays"] += 1
        self.opt.zero_grad(set_to_none=True)

    def _captured(self) -> Callable[[], None]:
        groups = self.opt.param_groups
        saved = [g.get("capturable") for g in groups]
        for g in groups:  # torch refuses to capture an optimizer not marked capturable (AdamW; SGD has no flag)
            g["capturable"] = True
        try:
            return self._capture(self._body)
        finally:
            for g, s in zip(groups, saved):
                if s is None:
                    del g["capturable"]
                else:
                    g["capturable"] = s

    @contextlib.contextmanager
    def eager(self):
        """Steps in this block run the optimizer eagerly (its hooks fire: the model-state reading)."""
        self._eager = True
        try:
            yield
        finally:
            self._eager = False


def _cuda_capture(body: Callable[[], None]) -> Callable[[], None]:
    """``body`` captured on a side stream into a CUDA graph of its own; returns its replay.

    Not ``torch.cuda.graph``: that empties the allocator's cache first, which would hand the next
    backward's gradients new addresses and force another capture. Thread-local capture mode,
    because other threads of the process (NCCL's watchdog, a decode thread) keep using CUDA."""
    graph = torch.cuda.CUDAGraph()
    current = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            body()
        finally:
            graph.capture_end()
    current.wait_stream(side)
    return graph.replay
