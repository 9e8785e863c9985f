"""A case resolved once against this machine: what every launcher, search and spawner takes.

``resolve(cfg)`` runs every check of the case once (``config.validate_for_launch``: the registries,
the data set, the machine) and looks up what the launch needs once: the model as the strategy sizes
it, the strategy's registry entry, its degrees, the device type, the data set. Everything after it
(``launch.measure``, the batch-size search, a multi-node node, a sweep's case, a tune trial) reads
the ``ResolvedCase`` instead of looking the model, strategy or device up again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dlscale.case.config import RunConfig, validate_for_launch
from dlscale.inputs.spec import DataSpec, parse_data
from dlscale.strategies import StrategyInfo, get_strategy, resolve_spec
from dlscale.planner.layout import ParallelDims


@dataclass(frozen=True)
class ResolvedCase:
    """One checked case on this machine."""

    cfg: RunConfig
    device_type: str  # "cuda" or "cpu" (--device auto resolved)
    spec: Any  # the ModelSpec trained: its registered flavour, resized by the strategy where it says so
    strategy: StrategyInfo
    dims: ParallelDims  # the strategy's degrees, as it declares them
    data: DataSpec

    @property
    def framework(self) -> str:
        return self.cfg.framework

    def with_config(self, cfg: RunConfig) -> "ResolvedCase":
        """This resolution for a variant of the case that changes only how it is run (batch size,
        steps, repeats, seed: a batch-size probe, the batch found, a repeat's seed); the model,
        strategy, degrees, data set and machine stay those resolved."""
        if (cfg.model, cfg.flavor, cfg.strategy, cfg.strategy_options, cfg.world_size, cfg.data, cfg.device) != \
                (self.cfg.model, self.cfg.flavor, self.cfg.strategy, self.cfg.strategy_options,
                 self.cfg.world_size, self.cfg.data, self.cfg.device):
            raise ValueError("with_config keeps the model, strategy, world and data of the resolved case")
        return dataclasses.replace(self, cfg=cfg)


def resolve(cfg: RunConfig) -> ResolvedCase:
    """Check ``cfg`` for this machine (one-line ConfigError) and resolve it, once."""
    device_type = validate_for_launch(cfg)
    strategy = get_strategy(cfg.strategy)
    return ResolvedCase(cfg, device_type, resolve_spec(cfg), strategy, strategy.parallel_dims(cfg),
                        parse_data(cfg.data))
