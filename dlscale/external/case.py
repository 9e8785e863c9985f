"""An external case: any training command, the parser that reads its output, the user's workload.

The command is an argv list (``shlex.split`` of what the user typed), run without a shell. The
workload (model, per-device batch, precision, devices) is the user's description of what the
command trains: dlscale cannot check it, but it is what groups the run with native records of
the same workload in reports (docs/external.md).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from typing import Any

from dlscale import ConfigError
from dlscale.case.config import DEVICES, PRECISIONS
from dlscale.external.parsers import UNITS, ParseOptions, get_parser
from dlscale.importers.records import check_int

# fields that say how the case was run, not what it measures (left out of case_key)
PROCEDURE_FIELDS = ("repeats", "time_limit", "label", "monitor", "sample_interval")
# what the report groups tables on: the command line and its directory change with the process
# count (torchrun --nproc-per-node N inside the command), so a table spans them
NOT_TABLE_FIELDS = ("command", "cwd")


def split_command(text: str | list[str]) -> list[str]:
    """The argv of ``--command``: shlex rules, never a shell (pipes, globs, $VARS are not expanded)."""
    if isinstance(text, list):
        argv = list(text)
    else:
        try:
            argv = shlex.split(text)
        except ValueError as e:
            raise ConfigError(f"--command {text!r} cannot be split into arguments: {e}") from None
    if not argv or not argv[0]:
        raise ConfigError("--command is empty: give the training command, e.g. --command 'torchrun --nproc-per-node 2 "
                          "train.py'")
    return argv


@dataclass
class ExternalCase:
    """One external case: a command, its parser, and the workload the user says it trains."""

    command: list[str]
    parser: str
    model: str
    batch_size: int  # per device
    precision: str
    nproc_per_node: int = 1
    nnodes: int = 1
    grad_accum: int = 1
    cwd: str | None = None
    framework: str | None = None  # the stack, free text (default: the parser's name)
    strategy: str = "ddp"  # what the command does, as the user says
    compile: bool = False
    seq_len: int | None = None
    unit: str | None = None  # img | seq | tok: what one sample is (regex: what the value counts)
    metric: str | None = None  # the regex parser's expression
    parser_options: dict[str, Any] = field(default_factory=dict)
    warmup: int = 20
    steps: int | None = 100
    repeats: int = 5
    time_limit: float = 1200.0
    device: str = "auto"
    label: str | None = None
    monitor: bool = True
    sample_interval: float = 0.1

    def __post_init__(self) -> None:
        from dlscale.monitor import validate_interval  # keeps the CLI start-up light

        def _positive_int(name, value, minimum=1):
            return check_int(value, name, minimum)

        self.command = split_command(self.command)
        for name in ("nproc_per_node", "nnodes", "batch_size", "grad_accum", "repeats"):
            _positive_int(name.replace("_", "-"), getattr(self, name))
        _positive_int("warmup", self.warmup, minimum=0)
        if self.steps is not None:
            _positive_int("steps", self.steps)
        if self.seq_len is not None:
            _positive_int("seq-len", self.seq_len)
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.device not in DEVICES:
            raise ConfigError(f"unknown device {self.device!r}; choose one of: {', '.join(DEVICES)}")
        if not self.time_limit > 0:
            raise ConfigError(f"time-limit must be > 0 seconds, got {self.time_limit}")
        if self.unit is not None and self.unit not in UNITS:
            raise ConfigError(f"unknown unit {self.unit!r}; choose one of: {', '.join(UNITS)}")
        if self.metric is not None and self.parser != "regex":
            raise ConfigError(f"--metric is the regex parser's; parser {self.parser} reads its own lines "
                              f"(use --parser regex)")
        validate_interval(self.sample_interval)
        parser = get_parser(self.parser)
        parser.check(self.parse_options())
        if self.framework is None:
            self.framework = self.parser

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.world_size * self.grad_accum

    def parse_options(self) -> ParseOptions:
        return ParseOptions(warmup=self.warmup, steps=self.steps, global_batch=self.global_batch,
                            world_size=self.world_size, seq_len=self.workload_seq_len(), metric=self.metric,
                            unit=self.unit, options=dict(self.parser_options))

    def registered_spec(self):
        """dlscale's ModelSpec when ``model`` names a registered model with a ``full`` flavour (its
        unit, sequence, FLOPs). A model whose flavours are sizes (llama: 1b, 3b, 8b) names no one
        shape, so it is free text here: the command may train any of them."""
        from dlscale.models import get_model, model_flavors, model_names  # torch: keeps start-up light

        if self.model not in model_names() or "full" not in model_flavors(self.model):
            return None
        return get_model(self.model, "full")

    def seq_len_for(self, logged: int | None) -> tuple[int | None, str | None]:
        """(tokens per sample, where it comes from): --seq-len ("option"), else what the log states
        ("log"), else the registered model's ("assumed": the command may train another length,
        so no tokens/s is derived from it), else (None, None)."""
        if self.seq_len is not None:
            return self.seq_len, "option"
        if logged:
            return logged, "log"
        spec = self.registered_spec()
        return (spec.seq_len, "assumed") if spec is not None and spec.seq_len else (None, None)

    def workload_seq_len(self) -> int | None:
        if self.seq_len is not None:
            return self.seq_len
        spec = self.registered_spec()
        return spec.seq_len if spec is not None else None

    def workload_unit(self, parsed_unit: str = "sample") -> str:
        """What one sample of the record is: --unit, else the registered model's, else per parser."""
        if self.unit in ("img", "seq"):
            return self.unit
        spec = self.registered_spec()
        if spec is not None:
            return spec.unit
        if parsed_unit == "tok" or self.unit == "tok":
            return "seq" if self.workload_seq_len() else "tok"
        return "seq" if self.parser in ("hf-trainer", "megatron", "torchtitan") else "sample"

    def check_launchable(self) -> None:
        """Checks that need this machine: the program exists, the directory exists."""
        if self.cwd is not None and not os.path.isdir(self.cwd):
            raise ConfigError(f"--cwd {self.cwd} is not a directory")
        prog = self.command[0]
        if os.sep in prog:
            path = prog if os.path.isabs(prog) or self.cwd is None else os.path.join(self.cwd, prog)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise ConfigError(f"--command program {prog} is not an executable file")
        elif shutil.which(prog) is None:
            raise ConfigError(f"--command program {prog!r} is not on PATH")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["global_batch"] = self.global_batch
        return d

    def case_key(self) -> str:
        """Identity of what is measured: everything but how it was run (repeats, limits, label)."""
        d = {k: v for k, v in self.to_dict().items() if k not in PROCEDURE_FIELDS}
        d["kind"] = "external"
        return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
