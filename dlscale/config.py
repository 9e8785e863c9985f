"""Typed run configuration, validated in one place.

``RunConfig`` describes one benchmark case. Validation happens in ``__post_init__`` (cheap,
static checks) and in ``validate_for_launch`` (checks that need the registries or the machine).
Every failure raises ConfigError with one line naming the bad value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from dlscale import ConfigError
from dlscale import compiling
from dlscale.compiling import COMPILE_MODES

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "fp8")
# fields that say how a case is run, not what is measured: case_key (and the report) leave them out
PROCEDURE_FIELDS = ("repeats", "time_limit", "collective_timeout", "label", "inject_failure", "monitor",
                    "sample_interval", "breakdown", "profile")
# fields added after records were first stored, with what a record without them means: left out
# of case_key (and the report's grouping) at that value, so earlier records keep their keys
LATE_FIELD_DEFAULTS = {"compile_mode": "default", "inductor_options": {}, "activation_checkpointing": "none"}
DEVICES = ("auto", "cuda", "cpu")


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")
    return value


@dataclass
class RunConfig:
    """One benchmark case: a model, a strategy, a precision, a batch size and a device count."""

    model: str = "gpt2"
    flavor: str = "full"
    strategy: str = "ddp"
    nproc_per_node: int = 1
    nnodes: int = 1
    batch_size: int = 16  # per device, per micro-batch
    precision: str = "amp-bf16"
    compile: bool = False
    # torch.compile's mode and inductor settings over it (dlscale/compiling.py); need compile
    compile_mode: str = "default"
    inductor_options: dict[str, Any] = field(default_factory=dict)
    clip_grad_norm: float | None = None
    activation_checkpointing: str = "none"  # none | selective | full, per block (dlscale/checkpointing.py)
    grad_accum: int = 1
    warmup: int = 20
    steps: int = 100
    repeats: int = 5
    device: str = "auto"
    seed: int = 0
    time_limit: float = 1200.0  # wall-clock seconds for each repeat's processes
    collective_timeout: float = 300.0  # seconds before a stalled collective raises
    # strategy-specific knobs (bucket size, shard mode, microbatches, degrees...)
    strategy_options: dict[str, Any] = field(default_factory=dict)
    label: str | None = None
    # hardware sampler (NVML + psutil) during each repeat, and its interval in seconds
    monitor: bool = True
    sample_interval: float = 0.1
    # after the window: per-phase step breakdown (with a no_sync comparison) / a profiler trace
    breakdown: bool = False
    profile: bool = False
    # testing hook: "crash@STEP[:RANK]", "oom@STEP[:RANK]", "hang@STEP[:RANK]";
    # "oom-above@N[:RANK]": out of memory at step 0 when batch_size > N (batch-size search tests)
    inject_failure: str | None = None

    def __post_init__(self) -> None:
        for name in ("nproc_per_node", "nnodes", "batch_size", "grad_accum", "steps", "repeats"):
            _positive_int(name.replace("_", "-"), getattr(self, name))
        _positive_int("warmup", self.warmup, minimum=0)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}; choose one of: {', '.join(DEVICES)}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ConfigError(f"clip-grad-norm must be > 0, got {self.clip_grad_norm}")
        if not self.time_limit > 0:
            raise ConfigError(f"time-limit must be > 0 seconds, got {self.time_limit}")
        if not self.collective_timeout > 0:
            raise ConfigError(f"collective-timeout must be > 0 seconds, got {self.collective_timeout}")
        if not isinstance(self.inductor_options, dict):
            raise ConfigError(f"inductor_options must be a mapping of KEY: VALUE, got {self.inductor_options!r}")
        from dlscale.checkpointing import check_mode

        check_mode(self.activation_checkpointing)
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"unknown compile-mode {self.compile_mode!r}; choose one of: {', '.join(COMPILE_MODES)}")
        if not self.compile and self.compile_mode != "default":
            raise ConfigError(f"compile-mode {self.compile_mode} needs --compile")
        if not self.compile and self.inductor_options:
            raise ConfigError(f"inductor-option {', '.join(self.inductor_options)} needs --compile")
        if self.inject_failure is not None:
            parse_injection(self.inject_failure)
        from dlscale.monitor import validate_interval

        validate_interval(self.sample_interval)

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**data)

    def case_key(self) -> str:
        """Stable identity of the measured case: what a sweep resumes on and a report groups by.

        Repeats, time limits, labels and test hooks do not change what is measured, so they are
        left out.
        """
        d = workload_fields(self.to_dict())
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


def workload_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A stored or live config without its procedure fields and its late fields at their defaults."""
    return {k: v for k, v in config.items()
            if k not in PROCEDURE_FIELDS and not (k in LATE_FIELD_DEFAULTS and v == LATE_FIELD_DEFAULTS[k])}


def parse_injection(spec: str) -> tuple[str, int, int | None]:
    """Parse "kind@step[:rank]" (kind: crash, oom, hang) used by tests to simulate failures.

    For kind "oom-above" the number is a batch size, not a step: "oom-above@N" makes the worker
    run out of memory at step 0 whenever the per-device batch size is larger than N.
    """
    try:
        kind, rest = spec.split("@", 1)
        step_s, _, rank_s = rest.partition(":")
        step = int(step_s)
        rank = int(rank_s) if rank_s else None
    except ValueError:
        raise ConfigError(f"inject-failure must look like crash@STEP[:RANK], got {spec!r}") from None
    if kind not in ("crash", "oom", "hang", "oom-above"):
        raise ConfigError(f"inject-failure kind must be crash, oom, hang or oom-above, got {kind!r}")
    return kind, step, rank


def resolve_device(requested: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu" (the embedded default)."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def validate_case(cfg: RunConfig) -> None:
    """Checks that need the registries but not the machine: the model and strategy exist, the
    strategy gets enough processes, and its own degrees/options are possible."""
    from dlscale.models import get_model
    from dlscale.strategies import get_strategy

    get_model(cfg.model, cfg.flavor)
    strat = get_strategy(cfg.strategy)
    compiling.check_options(cfg.inductor_options)
    compiling.check_strategy(cfg)
    if cfg.world_size < strat.min_world:
        raise ConfigError(f"strategy {cfg.strategy} needs at least {strat.min_world} processes, "
                          f"got {cfg.world_size} ({cfg.nnodes} node(s) x {cfg.nproc_per_node})")
    if strat.validate is not None:
        strat.validate(cfg)
    from dlscale.checkpointing import check_case

    check_case(cfg, get_model(cfg.model, cfg.flavor))


def validate_for_launch(cfg: RunConfig) -> str:
    """validate_case plus the checks that need this machine. Returns the resolved device type."""
    import torch

    validate_case(cfg)
    device = resolve_device(cfg.device)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device cuda requested but no CUDA GPU is visible; use --device cpu")
        n = torch.cuda.device_count()
        if cfg.nproc_per_node > n:
            raise ConfigError(f"nproc-per-node {cfg.nproc_per_node} exceeds the {n} GPU(s) on this machine")
    return device
