"""Helpers shared by the strategy files (not a strategy: names starting with "_" are not registered).

* ``parse_options``: a strategy's ``-o key=value`` knobs, typed from their defaults; unknown
  names and bad values raise ConfigError (one line, naming what is allowed).
* ``optimizer_recipe``: the class and keyword arguments of the model's default optimizer, taken
  from ``make_optimizer`` itself so that wrappers (ZeroRedundancyOptimizer, DeepSpeed) build the
  very same optimizer.
* ``autocast``: the worker's autocast, for strategies that run their own step (pipelines).
"""
from __future__ import annotations

import inspect
from typing import Any

import torch

from dlscale import ConfigError
from dlscale.models import TransformerArch
from dlscale.strategies import make_optimizer
from dlscale.train import precision

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(strategy: str, key: str, value: Any, default: Any, choices=None) -> Any:
    where = f"strategy {strategy} option {key}"
    if choices is not None:
        value = str(value).lower() if not isinstance(value, (int, float)) or isinstance(value, bool) else value
        if value not in choices:
            raise ConfigError(f"{where} must be one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        s = str(value).lower()
        if s in _TRUE:
            return True
        if s in _FALSE:
            return False
        raise ConfigError(f"{where} must be true or false, got {value!r}")
    if isinstance(default, int) or (default is None and isinstance(value, int)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    return value


def parse_options(strategy: str, cfg, defaults: dict[str, Any],
                  choices: dict[str, tuple] | None = None) -> dict[str, Any]:
    """``cfg.strategy_options`` merged over ``defaults``, each value typed like its default.

    Unknown names raise ConfigError listing the allowed ones (or saying there are none).
    """
    return parse_option_dict(strategy, dict(cfg.strategy_options or {}), defaults, choices)


def parse_option_dict(strategy: str, given: dict[str, Any], defaults: dict[str, Any],
                      choices: dict[str, tuple] | None = None) -> dict[str, Any]:
    """``parse_options`` of an options dict (a record's, a planner candidate's)."""
    choices = choices or {}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        allowed = ", ".join(defaults) if defaults else "none (this strategy has no options)"
        raise ConfigError(f"unknown {strategy} option(s) {', '.join(unknown)}; allowed: {allowed}")
    out = dict(defaults)
    for key, value in given.items():
        out[key] = _coerce(strategy, key, value, defaults[key], choices.get(key))
    return out


def optimizer_recipe(spec, cfg, device: torch.device) -> tuple[type, dict[str, Any]]:
    """(optimizer class, constructor kwargs) of ``make_optimizer`` for this model and device."""
    probe = torch.zeros(1, device=device, requires_grad=True)
    opt = make_optimizer([probe], spec, cfg, device)
    cls = type(opt)
    accepted = set(inspect.signature(cls.__init__).parameters) - {"self", "params"}
    kwargs = {k: v for k, v in opt.defaults.items() if k in accepted}
    return cls, kwargs


def autocast(cfg, device: torch.device):
    """The same autocast context the worker's standard step uses (a no-op for fp32)."""
    return precision.autocast(cfg.precision, device.type)


def is_transformer(spec) -> bool:
    """Models with a typed transformer architecture (shape and block layout): gpt2, bert-base, llama."""
    return isinstance(spec.arch, TransformerArch)


def require_divides(what: str, degree: int, of_what: str, total: int) -> None:
    if degree < 1:
        raise ConfigError(f"{what} must be >= 1, got {degree}")
    if total % degree:
        raise ConfigError(f"{what} {degree} does not divide {of_what} {total}")


def unique_params(modules) -> list[torch.nn.Parameter]:
    seen, out = set(), []
    for m in modules:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


class ShardLocalOptimizer:
    """The model's optimizer, stepping each rank's local shards of DTensor parameters as plain tensors.

    Why: FSDP2's parameters are DTensors, and torch's AdamW on DTensors sends every fused/foreach
    call through DTensor's dispatch and sharding propagation, tens of microseconds of host time
    per parameter and step. FSDP's host work already sits close to a 124M model's GPU step, and
    when the host slows (BERT-base on an H200 VM: 6.6 ms for the optimizer in such a spell, 0.9 ms
    otherwise; docs/results/h200.md) the step stretches; less host work is more headroom. AdamW
    and SGD update every element from that element's own gradient and state, so updating the
    local shards in place is the same update. The outer ``param_groups`` keep the DTensors, so global-norm clipping and
    GradScaler's unscale still see (and reduce over) the whole model; their in-place changes to
    the gradients reach the shards, whose ``.grad`` alias the DTensor gradients' local tensors.
    Only for parameters whose gradients are complete on every rank (FSDP: Shard(0); HSDP's
    (Replicate, Shard)), not for tensor parallel's Partial gradients.
    """

    _step_supports_amp_scaling = False  # GradScaler unscales first, then calls step()

    def __init__(self, params, make):
        from torch.distributed.tensor import DTensor  # torch: only FSDP's processes need its module

        self._dtensor = DTensor  # resolved once: _local runs for every parameter and gradient each step
        self.param_groups = [{"params": [p for p in params if p.requires_grad]}]
        self._make = make  # list of tensors -> the model's optimizer over them
        self._inner = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def _local(self, p: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():  # no_grad: to_local() aliases the shard (no autograd function)
            return p.to_local() if isinstance(p, self._dtensor) else p

    def _bind(self) -> None:
        """Build the inner optimizer over the shards, at the first step: FSDP2 may re-point a
        parameter's shard at its lazy initialisation (the first forward), never afterwards."""
        self._pairs = [(p, self._local(p)) for p in self.param_groups[0]["params"]]
        self._inner = self._make([loc for _, loc in self._pairs])

    def step(self, closure=None):
        if self._inner is None:
            self._bind()
        for p, loc in self._pairs:
            g = p.grad
            loc.grad = None if g is None else self._local(g)
        try:
            return self._inner.step(closure)
        finally:
            for _, loc in self._pairs:
                loc.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.param_groups[0]["params"]:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
