"""Pieces shared by the strategies that shard part of a model across ranks and keep the rest data
parallel (``embedding-shard``, ``partial-fc``); not a strategy (names starting with "_").

* ``ShardedPart``: what such a strategy shards, its ``check`` (the model has the part) and its
  ``model_spec`` (the model at the strategy's size knobs, built on the meta device), in one place;
* ``probed``: the meta model of a registered model at given knobs, built once per process (the
  checks and the option validation ask for it for every case);
* ``meta_spec``: the spec a sharding strategy trains: the model resized by its knobs and built on
  the meta device, so no rank ever holds the whole of a table it shards;
* ``materialize``: the model's other children allocated on the device (``to_empty``) after the
  sharded modules were swapped in;
* autograd-aware collectives: ``all_to_all`` (variable splits; its backward sends the gradients
  back, optionally scaled) and ``gather_rows`` (all-gather; backward: reduce-scatter, scaled);
* ``data_parallel``: DDP over what is not sharded (the sharded parameters ignored), nothing at one rank.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import ConfigError
from dlscale.models import get_model


def probe(spec) -> nn.Module:
    """The model built on the meta device (no memory, global RNG left as it was)."""
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        return spec.build()


@functools.lru_cache(maxsize=32)
def _probed(model: str, flavor: str, knobs: tuple[tuple[str, Any], ...]) -> nn.Module:
    return probe(resized(get_model(model, flavor), dict(knobs)))


def probed(model: str, flavor: str, knobs: dict[str, Any] | None = None) -> nn.Module:
    """The registered model at these size knobs, on the meta device, built once per (model, flavour,
    knobs) in a process: read it, do not change it."""
    return _probed(model, flavor, tuple(sorted((k, v) for k, v in (knobs or {}).items() if v is not None)))


@dataclasses.dataclass(frozen=True)
class ShardedPart:
    """What a sharding strategy shards, and the checks and spec that follow from it."""

    strategy: str
    # has(model) -> whether the (meta) model has the part the strategy shards
    has: Callable[[nn.Module], bool]
    needs: str  # what the part is, for the message when a model lacks it
    # knobs(cfg) -> the size knobs the strategy's options pass to spec.resize
    knobs: Callable[[Any], dict[str, Any]]

    def supports(self, cfg) -> bool:
        return self.has(probed(cfg.model, cfg.flavor))

    def check(self, cfg, env) -> str | None:
        """Why the case cannot run (recorded unsupported): the model has no such part."""
        if not self.supports(cfg):
            return f"{self.strategy} shards {self.needs}; this model has none"
        return None

    def model_spec(self, spec, cfg):
        """The spec the strategy trains: resized by its knobs and built on the meta device."""
        if not self.has(probed(spec.name, spec.flavor)):
            return spec
        return meta_spec(resized(spec, self.knobs(cfg)))


def resized(spec, knobs: dict[str, Any]):
    """``spec.resize(**knobs)`` for the knobs that are set; the spec itself when none is."""
    knobs = {k: v for k, v in knobs.items() if v is not None}
    if not knobs:
        return spec
    if spec.resize is None:
        raise ConfigError(f"{spec.name} has no size knobs; got {', '.join(sorted(knobs))}")
    return spec.resize(**knobs)


def meta_spec(spec):
    """``spec`` whose build runs on the meta device (a strategy then allocates what each rank holds)."""
    build = spec.build

    def on_meta() -> nn.Module:
        with torch.device("meta"):
            return build()

    return dataclasses.replace(spec, build=on_meta)


def materialize(model: nn.Module, skip: set[str], device: torch.device) -> None:
    """Allocate (uninitialised) every direct child of ``model`` not named in ``skip`` on ``device``."""
    if any(True for _ in model.parameters(recurse=False)) or any(True for _ in model.buffers(recurse=False)):
        raise ConfigError(f"{type(model).__name__} holds tensors outside its children; cannot materialise it")
    for name, child in model.named_children():
        if name not in skip:
            child.to_empty(device=device)


def data_parallel(model: nn.Module, ignore: list[str], denv) -> nn.Module:
    """DDP over ``model`` except the parameters named in ``ignore`` (each rank's own shards);
    the model itself when there is one rank (no data parallelism to do)."""
    if denv.world_size == 1:
        return model

    DDP._set_params_and_buffers_to_ignore_for_model(model, ignore)
    return DDP(model, device_ids=[denv.local_rank] if denv.device.type == "cuda" else None,
               gradient_as_bucket_view=True)


def _gather_single():
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _reduce_scatter_single():
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, grad_scale):
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        ctx.args = (out_splits, in_splits, group, grad_scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits, group, scale = ctx.args
        grad = grad.contiguous() if scale == 1.0 else grad * scale
        back = grad.new_empty((sum(in_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(back, grad, in_splits, out_splits, group=group)
        return back, None, None, None, None


def all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group, grad_scale: float = 1.0):
    """Rows of ``x`` (``in_splits[j]`` of them for rank j of ``group``) exchanged; the result holds
    ``out_splits[j]`` rows from rank j. Backward: the reverse exchange of the gradients x grad_scale."""
    return _AllToAll.apply(x, out_splits, in_splits, group, grad_scale)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size, grad_scale):
        out = x.new_empty((x.shape[0] * size,) + tuple(x.shape[1:]))
        _gather_single()(out, x.contiguous(), group=group)
        ctx.args = (group, size, grad_scale)
        return out

    @staticmethod
    def backward(ctx, grad):
        group, size, scale = ctx.args
        out = grad.new_empty((grad.shape[0] // size,) + tuple(grad.shape[1:]))
        _reduce_scatter_single()(out, grad.contiguous(), group=group)
        return (out if scale == 1.0 else out * scale), None, None, None


def gather_rows(x: torch.Tensor, group, size: int, grad_scale: float = 1.0) -> torch.Tensor:
    """All-gather of equal row blocks along dim 0 (rank order). Backward: the gradients of every
    rank's copy summed into the owner's block (reduce-scatter), times ``grad_scale``."""
    return _GatherRows.apply(x, group, size, grad_scale)


def gather_labels(y: torch.Tensor, group, size: int) -> torch.Tensor:
    out = y.new_empty((y.shape[0] * size,) + tuple(y.shape[1:]))
    _gather_single()(out, y.contiguous(), group=group)
    return out


def first_call(module: nn.Module, fn: Callable[[], None]) -> None:
    """Run ``fn()`` once, after the first forward of ``module`` (every rank's first step, in warm-up)."""
    state = {"done": False}

    def hook(mod, args, output):
        if not state["done"]:
            state["done"] = True
            fn()

    module.register_forward_hook(hook)
