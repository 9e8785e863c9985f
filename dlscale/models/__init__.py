"""Model registry.

A model file defines a factory ``make_spec(flavor) -> ModelSpec`` and registers it with
``@register_model("name")``. Models know nothing of parallel strategies: a strategy sees the
module, its list of repeated blocks (``spec.blocks``) and, for tensor parallel, ``spec.tp_plan``.

Every model's ``forward(*batch)`` returns the scalar training loss, so DDP, FSDP and
torch.compile see the loss computation too (the way small fast trainers are written).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from dlscale import ConfigError

FLAVORS = ("full", "tiny")


@dataclass
class ModelSpec:
    """What the worker needs to train a model, independent of any strategy."""

    name: str
    flavor: str
    build: Callable[[], nn.Module]
    # make_batch(batch_size, device, generator) -> tuple of tensors passed as model(*batch)
    make_batch: Callable[[int, torch.device, torch.Generator], tuple]
    # analytic training FLOPs per sample (forward + backward, no recomputation)
    flops_per_sample: float
    unit: str  # what one sample is: "img" or "seq"
    seq_len: int | None = None  # tokens per sample for language models
    optimizer: str = "adamw"  # "adamw" or "sgd"
    lr: float = 1e-4
    weight_decay: float = 0.01
    channels_last: bool = False  # convnets run faster in NHWC on GPUs
    # the batch a real-data reader must make for it (dlscale/inputs): image | causal-lm | mlm-nsp
    data_kind: str | None = None
    # blocks(module) -> list of the repeated blocks (transformer layers, residual stages);
    # strategies use it for FSDP wrapping, pipeline stage splits and activation checkpointing.
    blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # a model with size knobs (a face head's class count, a CTR model's vocabulary):
    # resize(**knobs) -> this spec resized; ConfigError naming its knobs for an unknown one
    resize: Callable[..., "ModelSpec"] | None = None

    @property
    def tokens_per_sample(self) -> int | None:
        return self.seq_len


_REGISTRY: dict[str, Callable[[str], ModelSpec]] = {}
_LOADED = False


def register_model(name: str):
    """Decorator: register ``factory(flavor) -> ModelSpec`` under ``name``."""

    def deco(factory: Callable[[str], ModelSpec]):
        if name in _REGISTRY:
            raise RuntimeError(f"model {name!r} registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def _load_all() -> None:
    global _LOADED
    if _LOADED:
        return
    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True


def model_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_model(name: str, flavor: str = "full") -> ModelSpec:
    """Return the spec of a registered model; ConfigError naming the choices otherwise."""
    _load_all()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown model {name!r}; choose one of: {', '.join(sorted(_REGISTRY))}")
    if flavor not in FLAVORS:
        raise ConfigError(f"unknown flavor {flavor!r}; choose one of: {', '.join(FLAVORS)}")
    return _REGISTRY[name](flavor)


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    seen = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def transformer_flops_per_sample(n_params: int, n_layers: int, hidden: int, seq: int) -> float:
    """Training FLOPs per sequence: 6*N*T + 12*L*H*T^2 (PaLM appendix B, as in nanoGPT).

    N excludes position embeddings (they do no matmul work); T is the sequence length.
    """
    return 6.0 * n_params * seq + 12.0 * n_layers * hidden * seq * seq
