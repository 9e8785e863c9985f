"""Strategies under JAX: the same names as the torch registry, mapped onto one device mesh.

* ``single``: a mesh of one device.
* ``ddp``: a 1-D mesh ``("data",)`` over every process's device; the batch is sharded over
  ``data``, parameters and optimizer state are replicated, and XLA's SPMD partitioner inserts the
  gradient all-reduce (one replica per device, as DistributedDataParallel).
* ``fsdp``: the same mesh, with every parameter and optimizer-state array sharded over ``data``
  along its largest dimension that the device count divides (replicated when none does); XLA
  all-gathers parameters where they are used and reduce-scatters gradients onto the shards (the
  ZeRO-3 layout of the state; when a gathered parameter is freed is XLA's choice, not an option).

Every other strategy (pipeline, tensor, hybrid, ...) is recorded ``unsupported`` under JAX with
the reason from :func:`jax_strategy_check`. This module does not import JAX.
"""
from __future__ import annotations

from typing import Any

from dlscale import ConfigError

STRATEGIES = {
    "single": "one device",
    "ddp": "batch sharded over a ('data',) mesh, parameters replicated, gradients all-reduced by XLA",
    "fsdp": "batch, parameters and optimizer state sharded over a ('data',) mesh (XLA all-gathers "
            "parameters, reduce-scatters gradients)",
}
# strategy options JAX honours (name -> default); torch's options do not apply
OPTIONS: dict[str, dict[str, Any]] = {"single": {}, "ddp": {}, "fsdp": {}}


def jax_strategy_check(cfg) -> str | None:
    """Why ``cfg`` cannot run under JAX (the case is recorded unsupported), or None."""
    from dlscale.frameworks.jax.models import _MODULES  # torch: keeps start-up light

    if cfg.strategy not in STRATEGIES:
        return (f"strategy {cfg.strategy} has no JAX implementation in dlscale "
                f"(JAX runs {', '.join(STRATEGIES)})")
    if cfg.model not in _MODULES:
        return f"model {cfg.model} has no JAX implementation in dlscale (JAX models: {', '.join(sorted(_MODULES))})"
    if cfg.compile:
        return ("compile (torch.compile) does not apply to JAX, whose step is always compiled by XLA: "
                "the JAX case is the one without --compile")
    return None


def validate(cfg) -> None:
    """ConfigError for strategy options JAX does not take (before anything starts)."""
    allowed = OPTIONS.get(cfg.strategy)
    if allowed is None:
        return  # recorded unsupported by jax_strategy_check
    unknown = sorted(set(cfg.strategy_options) - set(allowed))
    if unknown:
        raise ConfigError(f"strategy {cfg.strategy} under framework jax takes "
                          f"{'no options' if not allowed else 'options ' + ', '.join(allowed)}, "
                          f"got {', '.join(unknown)}")


def fsdp_spec(shape: tuple[int, ...], n: int):
    """PartitionSpec sharding the largest dimension of ``shape`` that ``n`` divides over ``data``."""
    from jax.sharding import PartitionSpec as P  # optional: jax

    dims = sorted((d for d in range(len(shape)) if shape[d] % n == 0 and shape[d] >= n),
                  key=lambda d: -shape[d])
    if n == 1 or not dims:
        return P()
    spec: list[Any] = [None] * len(shape)
    spec[dims[0]] = "data"
    return P(*spec)
