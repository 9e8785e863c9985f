"""Low-overhead hardware sampler: GPU (NVML) and host (psutil) utilisation over time.

The sampling loop runs in a separate *process* (``python -m dlscale.monitor --worker``,
started with :mod:`subprocess`, so nothing is forked from a parent that holds CUDA
state or threads, and the parent's ``__main__`` is never re-imported).  The parent
side (:class:`HardwareSampler`) starts no thread: the sampler appends one JSON line
per sample to the series file and flushes it, and the parent reads that file when
asked for :meth:`~HardwareSampler.summary` or :meth:`~HardwareSampler.series`.
A crash therefore leaves every sample taken so far on disk.

Protocol between the two processes:

* child stdin (pipe): the parent writes ``stop`` and closes it; EOF also stops the
  child, and the child exits by itself when its parent process disappears;
* child stdout (pipe): exactly one JSON line, the sampler's metadata (NVML present
  or not and why, the GPUs, the PCIe source, the child's pid), written before the
  first sample;
* child stderr: a temporary file, read back only to explain a failure;
* the series file: JSON lines, one sample per line, each with ``"t"`` = ``time.time()``.

One module per job: ``nvml`` (the NVML reader of one GPU), ``host`` (the collector of one sample of
the machine, the watched process tree and the GPUs), ``child`` (the sampler process's loop),
``sampler`` (``HardwareSampler``, the parent side, and the window summary), ``cli`` (the live table
and the worker's entry point).

Field definitions, units and caveats: docs/utilisation.md.
"""

from __future__ import annotations

from dlscale.monitor.cli import main, parse_gpus
from dlscale.monitor.host import MPS_SERVER, Collector
from dlscale.monitor.nvml import CLOCK_REASONS, POWER_CAP_MASK, SLOWDOWN_MASK, clock_reason_names
from dlscale.monitor.sampler import (GPU_METRICS, HOST_METRICS, MAX_INTERVAL_S, MIN_INTERVAL_S, STOP_TIMEOUT_S,
                                     HardwareSampler, validate_interval)

__all__ = ["CLOCK_REASONS", "GPU_METRICS", "HOST_METRICS", "MAX_INTERVAL_S", "MIN_INTERVAL_S", "MPS_SERVER",
           "POWER_CAP_MASK", "SLOWDOWN_MASK", "STOP_TIMEOUT_S", "Collector", "HardwareSampler", "clock_reason_names",
           "main", "parse_gpus", "validate_interval"]
