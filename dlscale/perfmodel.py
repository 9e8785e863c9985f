"""Data-parallel performance model (in the spirit of Shi & Chu, arXiv 1711.05979) and run cost.

Per optimizer step with N data-parallel devices (docs/perfmodel.md gives the full derivation)::

    t(N)        = t_compute + t_exposed(N)
    t_ar(N)     = G * 2(N-1)/N / busbw           ring all-reduce of G gradient bytes
    t_exposed   = (1 - overlap) * t_ar(N)
    samples/s   = N * batch * grad_accum / t(N)

``t_compute`` is the measured 1-device step time; ``busbw`` is the nccl-tests bus bandwidth, the
quantity for which the ring formula holds. The functions here are pure (no store access); the
``predict`` and ``cost`` verbs (dlscale/commands/predict.py) pick their inputs from a store.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping

from dlscale import ConfigError

GRAD_BYTES_PER_PARAM = 4  # fp32 gradients (DDP all-reduces the fp32 .grad even under AMP)


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def gradient_bytes(params: int | float, bytes_per_param: int = GRAD_BYTES_PER_PARAM) -> float:
    """Bytes all-reduced per step: parameters x 4 (fp32 gradients)."""
    return _positive("params", params) * bytes_per_param


def allreduce_time_s(nbytes: float, n: int, busbw_bps: float) -> float:
    """Ring all-reduce time in seconds of ``nbytes`` over ``n`` ranks at bus bandwidth ``busbw_bps`` (B/s).

    t = nbytes * 2(n-1)/n / busbw; 0 for a single rank (nothing to reduce).
    """
    nbytes = float(nbytes)
    if nbytes < 0:
        raise ConfigError(f"bytes must be >= 0, got {nbytes!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"device count must be a positive integer, got {n!r}")
    if n == 1 or nbytes == 0:
        return 0.0
    return nbytes * 2.0 * (n - 1) / n / _positive("busbw", busbw_bps)


def predict_scaling(step_ms_1: float, params: int | float, batch_size: int, devices: Iterable[int],
                    busbw_bps: float, overlap: float = 0.0, grad_accum: int = 1,
                    measured: Mapping[int, float] | None = None,
                    bytes_per_param: int = GRAD_BYTES_PER_PARAM) -> list[dict[str, Any]]:
    """One row per device count N: the predicted step time split and throughput.

    ``step_ms_1``: measured 1-device step time (ms, one optimizer step of ``batch_size x grad_accum``
    samples). ``overlap``: share of the all-reduce hidden behind backward (0..1), the same for
    every N. ``measured``: N -> measured samples/s, shown with the error of the prediction
    (error % = (predicted - measured) / measured x 100).
    Row keys: devices, compute_ms, allreduce_ms, exposed_ms, step_ms, samples_per_s, speedup,
    efficiency, comm_share (exposed / step), measured_samples_per_s, measured_efficiency (relative to
    ``measured[1]`` when given), error_pct.
    """
    t_c = _positive("1-device step time", step_ms_1) / 1000.0
    g = gradient_bytes(params, bytes_per_param)
    batch = _positive("batch size", batch_size)
    accum = _positive("grad_accum", grad_accum)
    busbw = _positive("busbw", busbw_bps)
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0.0 <= overlap <= 1.0:
        raise ConfigError(f"overlap must be between 0 and 1, got {overlap!r}")
    measured = dict(measured or {})
    sps_1 = batch * accum / t_c
    meas_1 = measured.get(1) or sps_1  # measured efficiency is relative to the measured 1-device throughput
    rows = []
    for n in devices:
        t_ar = allreduce_time_s(g, n, busbw)
        exposed = (1.0 - overlap) * t_ar
        t = t_c + exposed
        sps = n * batch * accum / t
        speedup = sps / sps_1
        meas = measured.get(n)
        rows.append({
            "devices": n,
            "compute_ms": t_c * 1000.0,
            "allreduce_ms": t_ar * 1000.0,
            "exposed_ms": exposed * 1000.0,
            "step_ms": t * 1000.0,
            "samples_per_s": sps,
            "speedup": speedup,
            "efficiency": speedup / n,
            "comm_share": exposed / t,
            "measured_samples_per_s": meas,
            "measured_efficiency": meas / (n * meas_1) if meas else None,
            "error_pct": (sps - meas) / meas * 100.0 if meas else None,
        })
    return rows


def training_cost(samples_per_s: float, devices: int, price_per_gpu_hour: float, *,
                  samples: float | None = None, tokens: float | None = None, seq_len: int | None = None,
                  epochs: float | None = None, dataset_size: float | None = None) -> dict[str, Any]:
    """Wall time, GPU-hours and money of a training run at ``samples_per_s`` on ``devices`` GPUs.

    Exactly one amount: ``samples``; ``tokens`` (samples = tokens / ``seq_len``); or ``epochs``
    with ``dataset_size`` (samples = epochs x dataset_size). hours = samples / samples_per_s / 3600,
    gpu_hours = hours x devices, cost = gpu_hours x price_per_gpu_hour.
    """
    sps = _positive("samples/s", samples_per_s)
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"device count must be a positive integer, got {devices!r}")
    price = _positive("price per GPU-hour", price_per_gpu_hour)
    given = [k for k, v in (("samples", samples), ("tokens", tokens), ("epochs", epochs)) if v is not None]
    if len(given) != 1:
        raise ConfigError("give exactly one of --samples, --tokens, --epochs (with --dataset-size)"
                          + (f"; got {', '.join('--' + k for k in given)}" if given else ""))
    if tokens is not None:
        tokens = _positive("tokens", tokens)
        if not seq_len:
            raise ConfigError("--tokens needs a language model with a sequence length; give --samples instead")
        n_samples = tokens / _positive("sequence length", seq_len)
    elif epochs is not None:
        if dataset_size is None:
            raise ConfigError("--epochs needs --dataset-size (samples per epoch)")
        n_samples = _positive("epochs", epochs) * _positive("dataset size", dataset_size)
    else:
        n_samples = _positive("samples", samples)
    hours = n_samples / sps / 3600.0
    gpu_hours = hours * devices
    return {"samples": n_samples, "tokens": tokens, "seq_len": seq_len, "samples_per_s": sps,
            "devices": devices, "hours": hours, "gpu_hours": gpu_hours,
            "price_per_gpu_hour": price, "cost": gpu_hours * price}
