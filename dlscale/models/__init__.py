"""Model registry.

A model file defines a factory ``make_spec(flavor) -> ModelSpec`` and registers it with
``@register_model("name", flavors=(...))`` (default: ``full`` and ``tiny``). Models know nothing
of parallel strategies: a strategy sees the module, its list of repeated blocks (``spec.blocks``),
how many leading batch tensors the embedding takes (``spec.embed_args``) and, for transformers,
the typed architecture ``spec.arch`` (shape and the block layout tensor parallelism splits).

Flavours belong to the model: every model has ``tiny`` (a few small layers, for the CPU); most
have ``full`` (their standard size); families add their sizes (``gpt2``: medium, large, xl;
``llama``: 1b, 3b, 8b).

Every model's ``forward(*batch)`` returns the scalar training loss, so DDP, FSDP and
torch.compile see the loss computation too (the way small fast trainers are written).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from dlscale import ConfigError
from dlscale.registry import Registry
from dlscale.models._arch import BlockLayout, TransformerArch, transformer_flops_per_sample  # noqa: F401

# the flavours a model has unless it registers its own
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
    # typed architecture (TransformerArch for the language models; None: no typed shape)
    arch: Any = None
    # how many leading batch tensors model.embed takes; the rest are the head's labels (pipelines)
    embed_args: int = 1
    # descriptive facts for the record only; no strategy reads them
    extra: dict[str, Any] = field(default_factory=dict)
    # a model with size knobs (a face head's class count, a CTR model's vocabulary):
    # resize(**knobs) -> this spec resized; ConfigError naming its knobs for an unknown one
    resize: Callable[..., "ModelSpec"] | None = None


# name -> (factory(flavor) -> ModelSpec, the flavours it accepts)
_MODELS: Registry[tuple[Callable[[str], ModelSpec], tuple[str, ...]]] = Registry("model", __name__)


def register_model(name: str, flavors: tuple[str, ...] = FLAVORS):
    """Decorator: register ``factory(flavor) -> ModelSpec`` under ``name``; ``flavors`` are the
    values the factory accepts (the first is the model's default size)."""

    def deco(factory: Callable[[str], ModelSpec]):
        _MODELS.add(name, (factory, tuple(flavors)))
        return factory

    return deco


def model_names() -> list[str]:
    return _MODELS.names()


def model_flavors(name: str) -> tuple[str, ...]:
    """The flavours of a registered model (its default first)."""
    return _MODELS.get(name)[1]


def all_flavors() -> tuple[str, ...]:
    """Every flavour some model has (full and tiny first): the CLI's and suites' choices; whether a
    model has the flavour is checked by ``get_model``."""
    rest = sorted({f for _, fl in _MODELS.entries().values() for f in fl} - set(FLAVORS))
    return FLAVORS + tuple(rest)


def default_flavor(name: str) -> str:
    return model_flavors(name)[0]


def get_model(name: str, flavor: str = "full") -> ModelSpec:
    """Return the spec of a registered model; ConfigError naming the choices otherwise."""
    flavors = model_flavors(name)
    if flavor not in flavors:
        raise ConfigError(f"unknown flavor {flavor!r} for model {name}; choose one of: {', '.join(flavors)}")
    return _MODELS.get(name)[0](flavor)


def count_parameters(module: nn.Module) -> int:
    """Unique parameters (tied weights counted once)."""
    seen = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total

