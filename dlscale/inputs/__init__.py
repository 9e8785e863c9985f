"""Real input pipelines: image folders and token files read from disk (docs/data.md).

What the rest of dlscale calls:

* ``check_case(cfg)`` (from config.validate_case): the data set exists, has the right shape and
  fits the model; ConfigError naming the file otherwise, before anything starts;
* ``check_machine(cfg, device_type)`` (from config.validate_for_launch): GPU decode has a GPU and
  the decoder ``--data-decoder`` asks for (torchvision, nvImageCodec, DALI, or one of the first two
  for auto); a decode process without MPS is warned of;
* ``case_words(data, decode, decoder, cpu_share, process, sm_share, priority)``, ``config_words(cfg)`` (sweep lines,
  compare tables): the data part of a case's name;
* ``describe(cfg)`` (launcher): the data set's identity for the record, None for synthetic data;
* ``open_source(...)`` (worker): the rank's batch source;
* ``merge_ranks(ranks)`` (launcher): one repeat's data record from its ranks'.
"""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterable, Iterator

from dlscale import ConfigError
from dlscale.inputs.spec import INPUT_BOUND_SHARE, DataSpec, check_fields, input_verdict, parse_data
from dlscale.results import envinfo

__all__ = ["INPUT_BOUND_SHARE", "DataSpec", "case_words", "check_case", "check_fields", "check_machine", "describe",
           "merge_ranks", "open_source", "parse_data"]


def case_words(data: str, decode: str | None = "cpu", decoder: str | None = "auto", cpu_share: float | None = 0.0,
               process: bool | None = False, sm_share: float | None = 0.0, priority: str | None = "normal") -> str:
    """How a case's input reads in a sweep line or a compare table: "" for synthetic data, else the
    data set, and for images where (and, on the GPU, by what, when asked for; in what process, with
    what share of the SMs and at what priority; what share on the host) they are decoded."""
    if not data or data == "synthetic":
        return ""
    if not str(data).startswith("imagefolder:"):
        return f"data {data}"
    decode = decode or "cpu"
    by = f" by {decoder}" if decode == "gpu" and decoder not in (None, "auto") else ""
    host = f", {cpu_share:g} of it on the host" if decode == "gpu" and cpu_share else ""
    sms = f" on {sm_share:g} of the SMs" if decode == "gpu" and process and sm_share else ""
    low = f" at {priority} priority" if decode == "gpu" and process and priority not in (None, "normal") else ""
    proc = f" in its own process{sms}{low}" if decode == "gpu" and process else ""
    return f"data {data} ({decode} decode{by}{proc}{host})"


def config_words(cfg: dict) -> str:
    """``case_words`` of a case's configuration (RunConfig.to_dict, or a record's ``config``)."""
    return case_words(cfg.get("data", "synthetic"), cfg.get("data_decode"), cfg.get("data_decoder"),
                      cfg.get("data_cpu_share"), cfg.get("data_decode_process"), cfg.get("data_decode_sm_share"),
                      cfg.get("data_decode_priority"))


def open_source(*args, **kwargs):
    """The rank's batch source (dlscale.inputs.source.open_source; imported here on first use,
    so that parsing a config does not import torch)."""
    from dlscale.inputs.source import open_source as _open  # torch: keeps start-up light

    return _open(*args, **kwargs)


_PENDING: list[str] = []  # data sets a benchmark suite's before commands are yet to make (benchmarks/run.py)


@contextlib.contextmanager
def files_pending(paths: Iterable[str]) -> Iterator[None]:
    """Within: a data set at (or holding) one of ``paths`` is checked against the model's kind only,
    not for its files, so that a benchmark suite validates before its before command makes the set."""
    added = [os.path.abspath(p) for p in paths]
    _PENDING.extend(added)
    try:
        yield
    finally:
        for p in added:
            _PENDING.remove(p)


def _pending(path: str | None) -> bool:
    root = os.path.abspath(path or "")
    return any(p == root or p.startswith(root + os.sep) for p in _PENDING)


def _need_samples(cfg) -> int:
    """One global batch at the largest data-parallel size the case could have (every process)."""
    return cfg.batch_size * cfg.world_size


def check_case(cfg) -> None:
    """The files behind ``cfg.data`` against the model; ConfigError (one line) naming the file."""
    spec = parse_data(cfg.data)
    if spec.synthetic:
        return
    from dlscale.inputs import dataset_info, images  # torch: keeps start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    model = get_model(cfg.model, cfg.flavor)
    kind = model.data_kind
    if kind is None:
        raise ConfigError(f"model {cfg.model} has no real-data reader; use --data synthetic")
    if spec.kind == "imagefolder":
        if kind != "image":
            raise ConfigError(f"model {cfg.model} trains on token sequences; --data {cfg.data} is an image "
                              f"folder (use tokens:PATH)")
        images.pil()
        if _pending(spec.path):
            return
        listing = dataset_info.list_imagefolder(spec.path)
        classes = int(model.arch.classes)
        if len(listing.classes) > classes:
            raise ConfigError(f"imagefolder {spec.path} has {len(listing.classes)} class folders; model "
                              f"{cfg.model} ({cfg.flavor}) has {classes} outputs")
        need = _need_samples(cfg)
        if len(listing.files) < need:
            raise ConfigError(f"imagefolder {spec.path}: {len(listing.files)} images, fewer than one global "
                              f"batch of {need} (batch-size x processes)")
    else:
        if kind == "image":
            raise ConfigError(f"model {cfg.model} trains on images; --data {cfg.data} is a token file "
                              f"(use imagefolder:PATH)")
        if _pending(spec.path):
            return
        seq = int(model.seq_len)
        dataset_info.check_tokens(spec, int(model.arch.vocab), _need_samples(cfg) * seq + 1)


def check_machine(cfg, device_type: str) -> None:
    """Checks that need this machine: GPU decode needs a GPU and its decoder (imported, no CUDA
    context made: which backend it gets is settled in the worker, docs/data.md)."""
    if cfg.data_decode != "gpu":
        return
    if device_type != "cuda":
        raise ConfigError("data-decode gpu needs a CUDA device; use --data-decode cpu")
    if cfg.data_decoder == "dali":
        from dlscale.inputs import dali  # torch: keeps start-up light

        dali.check_launcher()
    else:
        from dlscale.inputs.images import check_gpu_decoder  # torch: keeps start-up light

        check_gpu_decoder(cfg.data_decoder)
    if cfg.data_decode_process:
        if envinfo.mps_daemon() is False:  # a warning, not a refusal: measuring the time-sliced case is legitimate
            mps_only = [o for o, on in (("--data-decode-sm-share", cfg.data_decode_sm_share),
                                        ("--data-decode-priority", cfg.data_decode_priority != "normal")) if on]
            capped = f" ({', '.join(mps_only)}: no effect)" if mps_only else ""
            print("dlscale: warning: data-decode-process without NVIDIA's MPS daemon: the decode process and the "
                  f"training share the GPU by time slices{capped} (start nvidia-cuda-mps-control -d first; "
                  "docs/data.md)", file=sys.stderr, flush=True)


def describe(cfg) -> dict[str, Any] | None:
    """The record's ``data_set``: identity of the data read (None for synthetic batches)."""
    spec = parse_data(cfg.data)
    if spec.synthetic:
        return None
    from dlscale.inputs import dataset_info  # ctypes: keeps the CLI start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    return dataset_info.identity(spec, get_model(cfg.model, cfg.flavor).seq_len).to_dict()


def merge_ranks(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One repeat's data record: rank 0's, with every rank's wait share and the loader totals.

    The slowest rank defines the window, so the case's verdict uses the largest share: of GPU idle
    time waiting for data where every rank measured it (GPUs), else of the host's wait.
    """
    datas = [(r.get("rank"), r["data"]) for r in ranks if isinstance(r.get("data"), dict)]
    if not datas:
        return None
    out = dict(next((d for rank, d in datas if rank == 0), datas[0][1]))
    shares = [d.get("data_wait_share") for _, d in datas]
    known = [s for s in shares if s is not None]
    idles = [d.get("data_gpu_idle_share") for _, d in datas]
    out["per_rank_data_wait_share"] = shares
    out["data_wait_share_max"] = max(known) if known else None
    out["per_rank_data_gpu_idle_share"] = idles
    out["data_gpu_idle_share_max"] = max(idles) if idles and None not in idles else None
    out["input_bound"], out["input_bound_basis"] = input_verdict(out["data_gpu_idle_share_max"],
                                                                 out["data_wait_share_max"])
    for key in ("loader_cpu_cores", "storage_read_mb_s", "read_mb_s", "bad_files"):
        vals = [d.get(key) for _, d in datas]
        out[key + "_total"] = sum(vals) if vals and all(v is not None for v in vals) else None
    return out
