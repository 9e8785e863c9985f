"""Typed run configuration: the one source of the CLI, suites, serialisation and case identity.

Every field of ``RunConfig`` carries an ``Opt`` in its metadata (help, CLI name, type, range,
choices, suite axis, whether it is a filter key, part of the case identity, a procedure field or a
late field). From these alone come: the ``dlscale run`` options (``add_case_arguments``), the
config of parsed options (``config_from_args``), its inverse (``to_cli_args``, round-trip tested
for every field), the suite's axes, settings and filter keys (dlscale/case/suite.py), and the case key.
Adding a field with an ``axis`` is adding a suite axis: nothing else changes.

Validation happens in one place: ``check_value`` (one field's type, range and choices, used by
``__post_init__`` and by the suite loader for every axis value) and ``__post_init__`` (across
fields); ``validate_case``/``validate_for_launch`` add what needs the registries or the machine.
Every failure raises ConfigError with one line naming the bad value and what is allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from dlscale import MAX_BATCH, MAX_SEED, ConfigError
from dlscale import frameworks, inputs
from dlscale.train import checkpoint_timing, checkpointing, compiling
from dlscale.train.checkpoint_timing import MODES as CHECKPOINT_MODES
from dlscale.train.checkpointing import MODES as CHECKPOINTING_MODES
from dlscale.train.compiling import COMPILE_MODES
from dlscale.frameworks import FRAMEWORKS
from dlscale.inputs.spec import DECODE_DEVICES, DECODE_PRIORITIES, GPU_DECODERS, SPEC_HELP, check_fields, parse_data
from dlscale.train.precision import PRECISIONS
from dlscale.results.envinfo import TUNING_NAMES, TUNING_PREFIXES, affinity_count
from dlscale.quality import target as quality
from dlscale.quality.target import DEFAULTS as QDEF, LR_SCALES, LR_SCHEDULES, parse_target

DEVICES = ("auto", "cuda", "cpu")
BATCH_MAX = "max"  # batch_size: the largest batch that fits, found by a search (dlscale/case/batchsearch.py)
AUTO_STRATEGY = "auto"  # single on one device, ddp on more
_NO_LATE = object()
S = TypeVar("S")
# Upper bounds of numbers (docs/sweeps.md "Limits"): a value past one is a typo, refused before anything starts.
MAX_SECONDS = 7 * 24 * 3600.0  # a week: anything longer is a typo, not a benchmark
CPU_OVERSUBSCRIBE = 4  # a CPU run may start up to this many processes per core it may run on


INJECTIONS = ("crash", "oom", "hang", "oom-above", "slow")
# kinds whose number is not a step
_NOT_A_STEP = ("oom-above", "slow")


def parse_injection(spec: str) -> tuple[str, int, int | None]:
    """Parse "kind@step[:rank]" (kind: crash, oom, hang) used by tests to simulate failures.

    For kind "oom-above" the number is a batch size, not a step: "oom-above@N" makes the worker
    run out of memory at step 0 whenever the per-device batch size is larger than N. For kind
    "slow" it is milliseconds: "slow@MS:RANK" sleeps that long before every step of the rank.
    """
    try:
        kind, rest = spec.split("@", 1)
        step_s, _, rank_s = rest.partition(":")
        step = int(step_s)
        rank = int(rank_s) if rank_s else None
    except ValueError:
        raise ConfigError(f"inject-failure must look like crash@STEP[:RANK], got {spec!r}") from None
    if kind not in INJECTIONS:
        raise ConfigError(f"inject-failure kind must be one of {', '.join(INJECTIONS)}, got {kind!r}")
    if step < 0 or (rank is not None and rank < 0):
        raise ConfigError(f"inject-failure step and rank must be >= 0, got {spec!r}")
    return kind, step, rank


_ENV_NAME_DENY = ("PLUGIN", "PATH", "DIR", "FILE", "LIB", "PRELOAD", "CMD", "EXEC", "SHELL")


def check_case_env(env: dict[str, Any]) -> None:
    """A case's environment variables: only the tuning variables a record keeps (NCCL_*,
    TORCH_NCCL_*, the allocator, ...), never one that names a plugin, path, library or command,
    and plain values (no path, no shell syntax): a suite file must not be able to load code."""
    for k, v in env.items():
        name = str(k)
        if not (name.startswith(TUNING_PREFIXES) or name in TUNING_NAMES):
            raise ConfigError(f"env {name}: not a tuning variable dlscale sets for a case; allowed: "
                              f"{', '.join(p + '*' for p in TUNING_PREFIXES)}, {', '.join(TUNING_NAMES)}")
        if any(bad in name.upper() for bad in _ENV_NAME_DENY):
            raise ConfigError(f"env {name}: variables that name a plugin, path, library or command are refused "
                              f"(they can make a process load code)")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise ConfigError(f"env {name}: the value must be a string or a number, got {v!r}")
        text = str(v)
        if not text or any(c in text for c in "/\\$`;|&<>\n\r\0 '\"") or len(text) > 256:
            raise ConfigError(f"env {name}: the value must be a plain word or number (no path, spaces or shell "
                              f"syntax), got {text!r}")


@dataclass(frozen=True)
class Opt:
    """What a RunConfig field is, for the CLI, suites and the case identity."""

    help: str
    type: type = str  # int, float, str, bool or dict
    kind: str = "value"  # value | flag (store_true) | negflag (--no-NAME) | options (KEY=VALUE, repeatable) | batch
    cli: str | None = None  # the option; default --field-name; "" for no option of its own
    short: str | None = None
    metavar: str | None = None
    choices: tuple | str | None = None  # a tuple, or a registry: "models" | "strategies" | "flavors"
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    optional: bool = False  # None is allowed (and is the default)
    axis: str | None = None  # suite matrix axis (plural); explicit cases use the field's name
    match: bool = False  # an exclude/--filter key
    procedure: bool = False  # how a case is run, not what is measured: left out of case_key
    late: Any = _NO_LATE  # added after records were first stored: left out of case_key at this value
    setting: bool = False  # may be set once for a whole suite (top level of a suite file)
    unit: str | None = None  # what a number counts (for messages): "seconds"
    limit: str | None = None  # why the maximum is what it is (for messages): "a week"
    validator: Any = None  # value -> anything; raises ConfigError for a value of the right type but bad form

    def option(self, name: str) -> str | None:
        if self.cli == "":
            return None
        return self.cli or "--" + name.replace("_", "-")


def _f(default: Any, **kw: Any) -> Any:
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"opt": Opt(**kw)})
    return field(default=default, metadata={"opt": Opt(**kw)})


@dataclass
class ModelSection:
    """What is trained: the model, its framework and numerics, the compiler, the step's size."""

    title: ClassVar[str] = "model"
    model: str = _f("gpt2", choices="models", axis="models", match=True,
                    help="registered model name (see `dlscale run --list`)")
    framework: str = _f("torch", choices=FRAMEWORKS, axis="frameworks", match=True, late="torch",
                        help="training framework: torch, or jax (XLA; pip install -e '.[jax]'; docs/frameworks.md)")
    flavor: str = _f("full", choices="flavors", axis="flavors", match=True,
                     help="the model's size: full (its standard size), tiny (a few layers; trains on a CPU in well "
                          "under a second a step), or a size of its family (gpt2: medium, large, xl; llama: 1b, 3b, "
                          "8b; `dlscale run --list` shows each model's)")
    precision: str = _f("amp-bf16", choices=PRECISIONS, axis="precisions", match=True,
                        help="fp32 uses TF32 tensor cores on GPUs (recorded as such); amp-*: autocast with "
                             "fp32 master weights")
    compile: bool = _f(False, type=bool, kind="flag", axis="compile", match=True,
                       help="torch.compile the model (the analogue of XLA)")
    # torch.compile's mode and inductor settings over it (dlscale/train/compiling.py); need compile
    compile_mode: str = _f("default", choices=COMPILE_MODES, axis="compile_modes", match=True, late="default",
                           help="with --compile: torch.compile's mode (reduce-overhead: CUDA graphs; "
                                "max-autotune: also autotuned matmul/convolution templates and coordinate-descent "
                                "tuning, a long compile); CUDA graphs with strategies single and ddp only")
    inductor_options: dict = _f({}, type=dict, kind="options", cli="--inductor-option", metavar="KEY=VALUE",
                                axis="inductor_options", late={},
                                help="with --compile: a torch._inductor.config setting over the mode's, "
                                     "repeatable (e.g. coordinate_descent_tuning=true); scalar values only")
    activation_checkpointing: str = _f("none", choices=CHECKPOINTING_MODES, axis="activation_checkpointing",
                                       match=True, late="none",
                                       help="recompute activations in the backward, per block: selective "
                                            "(torchtitan's op-level policy: keep attention and every other matmul "
                                            "output) or full (keep only each block's input); docs/models.md")
    batch_size: int | str = _f(16, type=int, kind="batch", minimum=1, maximum=MAX_BATCH, axis="batch_sizes",
                               match=True, limit="samples per device; no device holds more",
                               help="per-device micro-batch size, or max: the largest that fits (docs/sweeps.md)")
    grad_accum: int = _f(1, type=int, minimum=1, maximum=65536, axis="grad_accum", match=True,
                         help="micro-batches accumulated per optimizer step")
    threads: int | None = _f(None, type=int, minimum=1, maximum=4096, optional=True, axis="threads", match=True,
                             late=None, setting=True,
                             help="CPU threads per rank (OMP_NUM_THREADS and torch's intra-op threads); "
                                  "default: the cores divided among the node's ranks")


@dataclass
class DataSection:
    """Input data (dlscale/inputs, docs/data.md): synthetic batches made once on the device, or files."""

    title: ClassVar[str] = "data"
    data: str = _f("synthetic", axis="data", match=True, late="synthetic", validator=parse_data,
                   help=f"input data: {SPEC_HELP} (docs/data.md)")
    data_workers: int | None = _f(None, type=int, minimum=0, maximum=1024, optional=True, late=None, setting=True,
                                  help="DataLoader worker processes per rank with --data from files (0: load in "
                                       "the training process); auto: CPU decode every core of the rank's share "
                                       "but one, GPU decode up to 4, tokens 1 or 2")
    data_decode: str = _f("cpu", choices=DECODE_DEVICES, axis="data_decodes", match=True, late="cpu",
                          help="where images from files are decoded: cpu (DataLoader workers) or gpu (nvJPEG)")
    data_decoder: str = _f("auto", choices=GPU_DECODERS, axis="data_decoders", match=True, late="auto",
                           help="with --data-decode gpu, what decodes the JPEGs: nvimgcodec (nvImageCodec: the "
                                "GPU's hardware JPEG decoders, CUDA nvJPEG for what they cannot take; "
                                "pip install 'dlscale[nvimgcodec]'), torchvision (io.decode_jpeg: nvJPEG, its "
                                "hardware backend where the GPU has one), dali (NVIDIA DALI's pipeline: hardware "
                                "and CUDA nvJPEG, several batches in flight; pip install nvidia-dali-cuda130, or "
                                "-cuda120 for a CUDA 12 torch), or auto: torchvision where it imports, else "
                                "nvimgcodec (the record says which ran)")
    data_cpu_share: float = _f(0.0, type=float, minimum=0, maximum=1, axis="data_cpu_shares", match=True, late=0.0,
                               help="with --data-decode gpu: the share of each batch's images the DataLoader "
                                    "workers decode and crop on the host (Pillow), the rest decoded on the GPU; "
                                    "takes work off a GPU decoder that holds one batch at a time (0: all on the "
                                    "GPU; docs/data.md)")
    data_decode_process: bool = _f(False, type=bool, kind="flag", axis="data_decode_process", match=True, late=False,
                                   help="with --data-decode gpu: decode in a process of its own per rank, on the "
                                        "same GPU, that hands each finished batch over in shared GPU memory, "
                                        "instead of on a thread of the training process, whose kernel launches "
                                        "it would share the interpreter and the CUDA driver with (docs/data.md)")
    data_decode_sm_share: float = _f(0.0, type=float, minimum=0, maximum=1, axis="data_decode_sm_shares", match=True,
                                     late=0.0,
                                     help="with --data-decode-process under NVIDIA MPS: the share of the GPU's SMs "
                                          "the decode process may use (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in its "
                                          "environment only), so the training keeps the rest; the JPEG engines "
                                          "decode either way (0: no cap; docs/data.md)")
    data_decode_priority: str = _f("normal", choices=DECODE_PRIORITIES, axis="data_decode_priorities", match=True,
                                   late="normal",
                                   help="with --data-decode-process under NVIDIA MPS: the decode process's "
                                        "scheduling priority against the training's kernels: low (MPS client "
                                        "priority below normal, CUDA_MPS_CLIENT_PRIORITY=1 in its environment only: "
                                        "a hint to schedule the training's waiting work first) or normal "
                                        "(docs/data.md)")
    data_cold_read: bool = _f(False, type=bool, kind="flag", late=False, setting=True,
                              help="evict the data set from the page cache before each repeat (posix_fadvise), "
                                   "so the first epoch reads from disk")
    data_prefetch: int | None = _f(None, type=int, minimum=1, maximum=64, optional=True, late=None, setting=True,
                                   metavar="N",
                                   help="batches each DataLoader worker loads ahead (torch's prefetch_factor) with "
                                        "--data from files and one or more --data-workers (default: torch's 2)")


@dataclass
class ParallelSection:
    """How the work is spread: the strategy, its options, the processes and the communication tuning."""

    title: ClassVar[str] = "parallel"
    env: dict = _f({}, type=dict, kind="options", cli="--env", metavar="NAME=VALUE", axis="env", late={},
                   validator=check_case_env,
                   help="an environment variable for the case's processes, repeatable (tuning variables only: "
                        "NCCL_*, TORCH_NCCL_*, CUDA_DEVICE_MAX_CONNECTIONS, the allocator...); part of the case")
    strategy_options: dict = _f({}, type=dict, kind="options", cli="--option", short="-o", metavar="KEY=VALUE",
                                axis="strategy_options",
                                help="strategy option, repeatable (e.g. -o bucket_cap_mb=50)")
    strategy: str = _f(AUTO_STRATEGY, choices="strategies", axis="strategies", match=True,
                       help="registered parallel strategy; auto: single on one device, ddp on more")
    nproc_per_node: int = _f(1, type=int, minimum=1, maximum=4096, axis="nproc_per_node", match=True,
                             help="processes (devices) per machine; a CPU run takes at most "
                                  f"{CPU_OVERSUBSCRIBE} per core it may run on")
    nnodes: int = _f(1, type=int, minimum=1, maximum=65536, axis="nodes", match=True,
                     help="machines in the job (world = nnodes x nproc-per-node; docs/multinode.md)")


@dataclass
class OptimizerSection:
    """The optimizer step."""

    title: ClassVar[str] = "optimizer"
    optimizer_graph: bool = _f(False, type=bool, kind="flag", axis="optimizer_graph", match=True, late=False,
                               help="capture the optimizer step (clipping and update) once as a CUDA graph and "
                                    "replay it every step: microseconds of host time where the optimizer's Python "
                                    "took about a millisecond; strategy ddp (one GPU: --nproc-per-node 1), amp-bf16 or "
                                    "fp32, CUDA (docs/strategies.md)")
    clip_grad_norm: float | None = _f(None, type=float, minimum=0, exclusive_minimum=True, optional=True,
                                      help="clip gradients to this global norm")


@dataclass
class QualitySection:
    """Time to quality (dlscale/quality, docs/quality.md): train until a validation target."""

    title: ClassVar[str] = "quality"
    until: str | None = _f(None, optional=True, late=None, metavar="METRIC<=X", validator=parse_target,
                           help="train until a validation target is reached: val_loss<=X (or val_acc>=Y for a model "
                                "that reports accuracy), evaluating every --eval-every steps outside the timed steps; "
                                "needs --data tokens:PATH and a validation split (docs/quality.md)")
    eval_every: int = _f(QDEF["eval_every"], type=int, minimum=1, maximum=10**7, late=QDEF["eval_every"],
                         help="with --until: optimizer steps between evaluations")
    eval_batches: int = _f(QDEF["eval_batches"], type=int, minimum=1, maximum=10**6, late=QDEF["eval_batches"],
                           help="with --until: global batches of the validation split each evaluation averages")
    eval_data: str | None = _f(None, optional=True, late=None, metavar="tokens:PATH",
                               help="with --until: the validation split (default: val.bin beside the --data file)")
    max_steps: int | None = _f(None, type=int, minimum=1, maximum=10**8, optional=True, late=None,
                               help="with --until: optimizer steps after the warm-up before giving up (default "
                                    "--steps); not reached is a result (exit 0)")
    lr: float | None = _f(None, type=float, minimum=0, exclusive_minimum=True, maximum=10.0, optional=True, late=None,
                          help="with --until: the peak learning rate (default: the model's, docs/quality.md)")
    lr_schedule: str = _f(QDEF["lr_schedule"], choices=LR_SCHEDULES, late=QDEF["lr_schedule"],
                          help="with --until: constant, or cosine/linear decay to a tenth of the peak at the last step")
    lr_warmup: int = _f(QDEF["lr_warmup"], type=int, minimum=0, maximum=10**7, late=QDEF["lr_warmup"],
                        help="with --until: steps of linear learning-rate warm-up from 0 to the peak")
    lr_scale: str = _f(QDEF["lr_scale"], choices=LR_SCALES, axis="lr_scales", late=QDEF["lr_scale"],
                       help="with --until: scale the rate by the global batch over --lr-ref-batch: linear, sqrt "
                            "(square root) or none")
    lr_ref_batch: int | None = _f(None, type=int, minimum=1, maximum=MAX_BATCH * 65536, optional=True, late=None,
                                  help="with --lr-scale: the global batch --lr is for (default: one device's, "
                                       "per-device batch x grad-accum)")


@dataclass
class ProcedureSection:
    """How each case is run: steps, repeats, limits, the device, the batch search, test hooks."""

    title: ClassVar[str] = "procedure"
    warmup: int = _f(20, type=int, minimum=0, maximum=10**7, setting=True, help="untimed steps before the window")
    steps: int = _f(100, type=int, minimum=1, maximum=10**7, setting=True, help="timed optimizer steps per repeat")
    # sized by time: a fixed step count gives a short window on a fast machine (flagged short_window)
    min_window_s: float | None = _f(None, type=float, minimum=0, maximum=3600.0, exclusive_minimum=True,
                                    optional=True, procedure=True, setting=True, late=None, cli="--min-window",
                                    metavar="S", unit="seconds", limit="an hour",
                                    help="time the warm-up's steps and run as many timed steps as make a window of "
                                         "at least S seconds (--steps is then the fewest); default: exactly --steps")
    device: str = _f("auto", choices=DEVICES, setting=True,
                     help="auto picks CUDA when a GPU is visible, else the CPU with gloo")
    seed: int = _f(0, type=int, minimum=0, maximum=MAX_SEED, setting=True, limit="numpy's and torch's seed range",
                   help="seed of weights and synthetic data")
    repeats: int = _f(5, type=int, minimum=1, maximum=1000, procedure=True, setting=True,
                      help="independent runs (fresh processes) of the case; the median is reported")
    time_limit: float = _f(1200.0, type=float, minimum=0, maximum=MAX_SECONDS, exclusive_minimum=True,
                           procedure=True, setting=True, unit="seconds", limit="a week",
                           help="wall-clock seconds for each repeat; a case past it is killed and recorded timeout")
    collective_timeout: float = _f(300.0, type=float, minimum=0, maximum=MAX_SECONDS, exclusive_minimum=True,
                                   procedure=True, setting=True, unit="seconds", limit="a week",
                                   help="seconds before a stalled collective raises in the workers; also how "
                                        "long a multi-node rendezvous waits for every node to join")
    label: str | None = _f(None, optional=True, procedure=True, setting=True,
                           help="free-form label stored with the record (for compare)")
    # the largest-batch search (batch_size max): first probe and largest batch tried
    max_batch_start: int | None = _f(None, type=int, minimum=1, maximum=MAX_BATCH, optional=True, procedure=True,
                                     setting=True, limit="samples per device; no device holds more",
                                     help="with --batch-size max: the first probe (default 8)")
    max_batch_cap: int | None = _f(None, type=int, minimum=1, maximum=MAX_BATCH, optional=True, procedure=True,
                                   setting=True, limit="samples per device; no device holds more",
                                   help="with --batch-size max: the largest batch tried (default 4096 on GPUs, "
                                        "64 on the CPU)")
    # testing hook: "crash@STEP[:RANK]", "oom@STEP[:RANK]", "hang@STEP[:RANK]";
    # "oom-above@N[:RANK]": out of memory at step 0 when batch_size > N (batch-size search tests)
    inject_failure: str | None = _f(None, optional=True, procedure=True, metavar="KIND@STEP[:RANK]",
                                    validator=parse_injection,
                                    help="testing: make a rank crash, oom or hang at a step (crash|oom|hang), "
                                         "oom-above@N: run out of memory whenever the batch size exceeds N, or "
                                         "slow@MS:RANK: sleep MS ms before every step of a rank (a straggler)")


@dataclass
class DiagnosticsSection:
    """What is recorded beside the window: utilisation samples, breakdown, profile, checkpoints."""

    title: ClassVar[str] = "diagnostics"
    # hardware sampler (NVML + psutil) during each repeat, and its interval in seconds
    monitor: bool = _f(True, type=bool, kind="negflag", procedure=True, setting=True,
                       help="sample GPU/CPU/memory/disk/network utilisation during the repeats")
    sample_interval: float = _f(0.1, type=float, minimum=0.01, maximum=10.0, procedure=True, setting=True,
                                unit="seconds",
                                help="seconds between utilisation samples")
    # after the window: per-phase step breakdown (with a no_sync comparison) / a profiler trace
    breakdown: bool = _f(False, type=bool, kind="flag", procedure=True,
                         help="after the window, time data/forward/backward/optimizer and exposed communication "
                              "(a no_sync comparison run); see docs/metrics.md")
    profile: bool = _f(False, type=bool, kind="flag", procedure=True,
                       help="record a torch.profiler trace (Chrome/Perfetto JSON) of a few steps after the window; "
                            "the median repeat's trace is kept in STORE/traces/")
    # after the window: a checkpoint phase (dlscale/train/checkpoint_timing.py); procedure fields, out of the case key
    checkpoint_every: int | None = _f(None, type=int, minimum=1, maximum=10**7, optional=True, procedure=True,
                                      setting=True, metavar="N",
                                      help="after the window, time saving the model and optimizer state with "
                                           "torch.distributed.checkpoint: N steps, a save, N steps, a save, N steps "
                                           "(default: no checkpoint phase; docs/metrics.md)")
    checkpoint_mode: str = _f("sync", choices=CHECKPOINT_MODES, procedure=True, setting=True,
                              help="with --checkpoint-every: sync (dcp.save: training waits for the write) or "
                                   "async (dcp.async_save: it waits for the staging only)")
    checkpoint_dir: str | None = _f(None, optional=True, procedure=True, setting=True, metavar="DIR",
                                    help="with --checkpoint-every: an existing folder the saves are written to "
                                         "and removed from (default: the case's temporary folder)")


@dataclass
class RunConfig(DiagnosticsSection, ProcedureSection, QualitySection, OptimizerSection, ParallelSection,
                DataSection, ModelSection):
    """One benchmark case: the union of the sections, stored and keyed flat (one field, one record key).

    Suite axes expand in field order (device counts innermost). A consumer that needs one section
    takes that section's type: a RunConfig is an instance of each, ``section`` gives a copy alone.
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_value(f.name, getattr(self, f.name))
        if self.strategy == AUTO_STRATEGY:
            self.strategy = "single" if self.world_size == 1 else "ddp"
        if not self.compile and self.compile_mode != "default":
            raise ConfigError(f"compile-mode {self.compile_mode} needs --compile")
        if not self.compile and self.inductor_options:
            raise ConfigError(f"inductor-option {', '.join(self.inductor_options)} needs --compile")
        check_fields(self)  # the data section's fields together
        quality.check_fields(self)  # the --until fields together (docs/quality.md)
        if self.batch_size != BATCH_MAX:
            for name in ("max_batch_start", "max_batch_cap"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{_cli(name)} needs --batch-size max")
        elif (self.max_batch_start and self.max_batch_cap and self.max_batch_cap < self.max_batch_start):
            raise ConfigError(f"max-batch-cap {self.max_batch_cap} is below max-batch-start {self.max_batch_start}")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def batch_search(self) -> bool:
        """The case asks for the largest batch that fits (batch_size max)."""
        return self.batch_size == BATCH_MAX

    def section(self, kind: type[S]) -> S:
        """The section ``kind`` of this case alone (a copy: changing it leaves the case as it is)."""
        return kind(**{f.name: getattr(self, f.name) for f in dataclasses.fields(kind)})  # type: ignore[call-arg]

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

        Procedure fields (repeats, time limits, labels, test hooks...) do not change what is
        measured, so they are left out; so are late fields at their defaults. A batch-search case
        has the key of "this case at the largest batch that fits", which never equals a real one.
        """
        if self.batch_search:
            base = dataclasses.replace(self, batch_size=1, max_batch_start=None, max_batch_cap=None).case_key()
            return "max-" + hashlib.sha1(f"batch_size=max;{base}".encode()).hexdigest()[:16]
        blob = json.dumps(workload_fields(self.to_dict()), sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


FIELDS: dict[str, Opt] = {f.name: f.metadata["opt"] for f in dataclasses.fields(RunConfig)}
# each field's default (as given: strategy "auto" resolves to single on one device)
DEFAULTS: dict[str, Any] = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                            for f in dataclasses.fields(RunConfig)}
PROCEDURE_FIELDS = tuple(n for n, o in FIELDS.items() if o.procedure)
LATE_FIELD_DEFAULTS = {n: o.late for n, o in FIELDS.items() if o.late is not _NO_LATE}
AXES = {o.axis: n for n, o in FIELDS.items() if o.axis}  # suite axis -> field
SETTINGS = tuple(n for n, o in FIELDS.items() if o.setting)  # suite-wide settings
# the sections in field order, and each field's (what --help groups the options by)
SECTIONS: tuple[type, ...] = (ModelSection, DataSection, ParallelSection, OptimizerSection, QualitySection,
                              ProcedureSection, DiagnosticsSection)
SECTION_OF: dict[str, type] = {f.name: sec for sec in SECTIONS for f in dataclasses.fields(sec)}


def _cli(name: str) -> str:
    return (FIELDS[name].option(name) or name).lstrip("-")


def choices_of(name: str) -> tuple:
    """The allowed values of a field with choices (registries resolved when asked: their modules
    import torch, which config and the CLI's start-up do not)."""
    c = FIELDS[name].choices
    if c == "models":
        from dlscale.models import model_names  # torch: keeps start-up light

        return tuple(model_names())
    if c == "strategies":
        from dlscale.strategies import strategy_names  # torch: keeps start-up light

        return (AUTO_STRATEGY, *strategy_names())
    if c == "flavors":
        from dlscale.models import all_flavors  # torch: keeps start-up light

        return tuple(all_flavors())
    return tuple(c or ())


def _is_choice(name: str, value) -> bool:
    """``value in choices_of(name)``, but a strategy is looked up by its own module: listing them all
    imports every strategy's torch modules (a second of each worker's start)."""
    if FIELDS[name].choices == "strategies":
        from dlscale.strategies import has_strategy  # torch: keeps start-up light

        return value == AUTO_STRATEGY or (isinstance(value, str) and has_strategy(value))
    return value in choices_of(name)


def _num(x: float) -> str:
    """A bound or value in a message: whole numbers in full (4294967295, not 4.29497e+09)."""
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}" if isinstance(x, float) else str(x)


def check_value(name: str, value: Any) -> Any:
    """One field's value checked for type, range and choices; ConfigError naming the option."""
    o = FIELDS[name]
    what = _cli(name)
    if value is None:
        if o.optional:
            return value
        raise ConfigError(f"{what} must be given, got null")
    if o.kind == "batch" and value == BATCH_MAX:
        return value
    if o.type is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{what} must be true or false, got {value!r}")
        return value
    if o.type is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) and k for k in value):
            raise ConfigError(f"{what} must be a mapping of option names to values, got {value!r}")
        if o.validator is not None:
            o.validator(value)
        return value
    if o.type is int:
        if isinstance(value, bool) or not isinstance(value, int):
            extra = " or 'max'" if o.kind == "batch" else ""
            raise ConfigError(f"{what} must be an integer{extra}, got {value!r}")
    elif o.type is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{what} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{what} must be a finite number, got {value!r}")
    elif not isinstance(value, str):
        raise ConfigError(f"{what} must be a string, got {value!r}")
    elif not value.strip() or "\n" in value or "\r" in value or "\0" in value:
        raise ConfigError(f"{what} must be a non-empty single line, got {value!r}")
    if o.minimum is not None:
        if o.exclusive_minimum and not value > o.minimum:
            raise ConfigError(f"{what} must be > {_num(o.minimum)}, got {_num(value)}")
        if not o.exclusive_minimum and value < o.minimum:
            raise ConfigError(f"{what} must be >= {_num(o.minimum)}, got {_num(value)}")
    if o.maximum is not None and value > o.maximum:
        why = f" ({o.limit})" if o.limit else ""
        raise ConfigError(f"{what} must be <= {_num(o.maximum)}{why}, got {_num(value)}")
    if o.validator is not None:
        o.validator(value)
    if o.choices is not None and not _is_choice(name, value):
        noun = {"models": "model", "strategies": "strategy", "flavors": "flavor"}.get(str(o.choices), what)
        raise ConfigError(f"unknown {noun} {value!r}; choose one of: {', '.join(choices_of(name))}")
    return value


def expected(name: str, many: bool = False, bounded: bool = False) -> str:
    """What a field takes, in words (suite messages): "a positive integer", "a list of true/false"...
    ``bounded``: with the maximum and why (for a value past it, or not finite)."""
    o = FIELDS[name]
    if o.type is bool:
        return "a list of true/false" if many else "true or false"
    if o.type is dict:
        return "a mapping of option names to values" + (", or a list of such mappings" if many else "")
    if o.type in (int, float):
        noun = "integer" if o.type is int else "number"
        if o.minimum == 0 and o.exclusive_minimum or o.minimum == 1 and o.type is int:
            noun = "positive " + noun
        elif o.minimum == 0:
            noun = noun + " >= 0"
        elif o.minimum is not None:
            noun = f"{noun} >= {o.minimum:g}"
        what = noun + (f" of {o.unit}" if o.unit else "")
        if bounded and o.maximum is not None:
            what += (" and <= " if ">=" in noun else " <= ") + _num(o.maximum) + (f" ({o.limit})" if o.limit else "")
    else:
        what = "string"
    if many:
        what = "a list of " + what.replace("integer", "integers").replace("number", "numbers").replace("string",
                                                                                                    "strings")
    else:
        what = ("an " if what[0] in "aeiou" else "a ") + what
    if o.kind == "batch":
        what += ' or "max"'
    return what


def workload_fields(config: dict[str, Any]) -> dict[str, Any]:
    """A stored or live config without its procedure fields and its late fields at their defaults."""
    return {k: v for k, v in config.items()
            if not (k in FIELDS and FIELDS[k].procedure)
            and not (k in LATE_FIELD_DEFAULTS and v == LATE_FIELD_DEFAULTS[k])}


def resolve_device(requested: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu" (the embedded default)."""
    if requested != "auto":
        return requested
    import torch  # only when asked: config imports without torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def validate_case(cfg: RunConfig, device: str | None = None) -> None:
    """Checks that need the registries but not the machine: the model and strategy exist, the
    strategy gets enough processes, and its own degrees/options are possible (``device``: the
    resolved device type, where validate_for_launch knows it, for the checks that depend on it)."""
    from dlscale.models import get_model  # the registries import torch; config imports without it
    from dlscale.strategies import get_strategy  # torch: keeps start-up light

    model = get_model(cfg.model, cfg.flavor)
    strat = get_strategy(cfg.strategy)
    compiling.check_options(cfg.inductor_options)
    compiling.check_strategy(cfg)
    if cfg.world_size < strat.min_world:
        raise ConfigError(f"strategy {cfg.strategy} needs at least {strat.min_world} processes, "
                          f"got {cfg.world_size} ({cfg.nnodes} node(s) x {cfg.nproc_per_node})")
    if cfg.batch_search and cfg.nnodes > 1:
        raise ConfigError("batch size max (the largest that fits) runs on one node; search on one node, "
                          "then give the batch found")
    if cfg.inject_failure is not None:
        _, step, rank = parse_injection(cfg.inject_failure)
        if rank is not None and rank >= cfg.world_size:
            raise ConfigError(f"inject-failure rank {rank} does not exist (world size {cfg.world_size})")
        kind = cfg.inject_failure.split("@")[0]
        if kind not in _NOT_A_STEP and step >= cfg.warmup + cfg.steps:
            raise ConfigError(f"inject-failure step {step} is never reached (warm-up {cfg.warmup} + steps "
                              f"{cfg.steps}: steps 0..{cfg.warmup + cfg.steps - 1})")
    _check_min_window(cfg)
    if strat.validate is not None:
        strat.validate(cfg)
    from dlscale.train.step import check_optimizer_graph  # torch: config imports without it

    check_optimizer_graph(cfg, device)
    frameworks.validate(cfg)  # installed (one-line hint otherwise), and the options it takes
    checkpointing.check_case(cfg, model)
    checkpoint_timing.check_case(cfg)  # --checkpoint-every and its options
    inputs.check_case(cfg)  # the data set's files against the model
    quality.check_case(cfg)  # --until: the target against the model, the validation split against the evaluation


def _check_min_window(cfg: RunConfig) -> None:
    """--min-window times warm-up steps after the first (compilation, allocation): two at least."""
    if cfg.min_window_s is None:
        return
    if cfg.warmup < 2:
        raise ConfigError(f"--min-window needs --warmup 2 or more (the steps after the first are timed), "
                          f"got {cfg.warmup}")
    if cfg.framework != "torch":
        raise ConfigError(f"--min-window is calibrated by the torch worker; give --steps for framework "
                          f"{cfg.framework}")


def check_cpu_processes(nproc_per_node: int, cores: int | None = None) -> None:
    """A CPU run starts at most CPU_OVERSUBSCRIBE processes per core it may run on: more
    time-slices the ranks (what is measured is the scheduler) and stalls gloo's collectives."""
    if cores is None:
        cores = affinity_count() or os.cpu_count() or 1
    allowed = CPU_OVERSUBSCRIBE * cores
    if nproc_per_node > allowed:
        raise ConfigError(f"nproc-per-node {nproc_per_node} is more than {CPU_OVERSUBSCRIBE} processes per CPU core "
                          f"on this machine ({cores} core(s): at most {allowed}) for a CPU run")


def validate_for_launch(cfg: RunConfig) -> str:
    """validate_case plus the checks that need this machine, each once (dlscale/case/resolve.py calls it
    once per case). Returns the resolved device type."""
    import torch  # the machine's GPUs: config imports without torch

    device = resolve_device(cfg.device)
    validate_case(cfg, device)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device cuda requested but no CUDA GPU is visible; use --device cpu")
        n = torch.cuda.device_count()
        if cfg.nproc_per_node > n:
            raise ConfigError(f"nproc-per-node {cfg.nproc_per_node} exceeds the {n} GPU(s) on this machine")
    else:
        check_cpu_processes(cfg.nproc_per_node)
    inputs.check_machine(cfg, device)
    checkpoint_timing.check_machine(cfg)  # the checkpoint folder: writable, with room for the saves
    return device
