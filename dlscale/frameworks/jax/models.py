"""JAX model registry: the PyTorch models of ``dlscale.models``, rewritten in plain JAX.

Each JAX model is built from its PyTorch ``ModelSpec`` (the same configuration object, so the
architecture cannot drift) and keeps what makes the two comparable: the parameter tree has the
torch module names and the same shapes up to layout (``convert.py`` maps one onto the other),
``flops_per_sample``, optimizer, learning rate and weight decay are the spec's own, and batches
are the spec's ``make_batch`` output converted to numpy (NCHW images become NHWC).

A model is ``init(ini) -> (params, stats)`` (``ini``: ``layers.HostInit(seed)`` for numpy arrays,
``layers.ShapeInit()`` for shapes only; ``stats``: BatchNorm running statistics, empty for the
transformers) and ``loss(params, stats, batch, ctx, key) -> (loss, new_stats)``: the loss is
inside the model, as in the torch models.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dlscale import ConfigError
from dlscale.models import ModelSpec, get_model

# torch registry name -> module in this package defining make(spec) -> JaxModel
_MODULES = {"resnet50": "resnet50", "bert-base": "bert", "gpt2": "gpt2", "gpt2-vpad": "gpt2"}


@dataclass(frozen=True)
class JaxModel:
    name: str
    flavor: str
    spec: ModelSpec  # the PyTorch spec: FLOPs, optimizer, lr, weight decay, make_batch
    init: Callable[[Any], tuple[dict, dict]]  # init(HostInit | ShapeInit) -> (params, stats)
    loss: Callable[..., tuple[Any, dict]]
    # torch batch (CPU tensors) -> tuple of numpy arrays in this model's layout
    to_numpy: Callable[[tuple], tuple[np.ndarray, ...]]
    uses_dropout: bool = False  # needs a fresh PRNG key per step in training


def jax_model_names() -> list[str]:
    return sorted(_MODULES)


def get_jax_model(name: str, flavor: str = "full") -> JaxModel:
    if name not in _MODULES:
        raise ConfigError(f"model {name!r} has no JAX implementation; JAX models: {', '.join(jax_model_names())}")
    spec = get_model(name, flavor)
    mod = importlib.import_module(f"{__package__}.{_MODULES[name]}")
    return mod.make(spec)


def tensors_to_numpy(batch: tuple) -> tuple[np.ndarray, ...]:
    return tuple(t.detach().cpu().numpy() for t in batch)


def count_params(params) -> int:
    """Parameters in a tree of arrays or ShapeDtypeStructs (tied weights are stored once)."""
    import jax  # optional: jax

    return int(sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)))
