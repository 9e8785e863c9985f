"""Input-pipeline throughput: decode + augment images/s and token batches/s, per worker and for N.

Each row runs the loader ``dlscale run --data`` uses (dlscale/inputs: the same datasets, sampler,
DataLoader settings and device finish) with no model: batches are taken as fast as they come for
``--seconds`` after a warm-up, and

* samples/s = samples taken / wall seconds (on a GPU, after a final synchronisation);
* loader cores = CPU seconds of the loader's processes and threads / wall seconds (psutil);
* samples/s per core = samples / loader CPU seconds: how many cores a training run that consumes S
  samples/s needs, S divided by it (the training process's own core not counted).

Pipelines: ``image-cpu`` (Pillow decode + random-resized crop + flip in DataLoader workers, the
copy and normalisation on the GPU when there is one), ``image-gpu`` (workers read bytes,
nvJPEG decodes on the GPU; needs CUDA and torchvision), ``gpt`` and ``bert`` (token windows,
BERT's masking and next-sentence pairs) from a token file.

Without ``--data`` a temporary ImageNet-like set and token file are generated (and deleted).
"""
from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from dlscale import ConfigError
from dlscale.case.config import DataSection
from dlscale.fmt import fmt_cell
from dlscale.inputs.spec import parse_data
from dlscale.micro import common, diskwrite

PIPELINES = ("image-cpu", "image-gpu", "gpt", "bert")
MODEL = {"image-cpu": "resnet50", "image-gpu": "resnet50", "gpt": "gpt2", "bert": "bert-base"}
BATCH = {"image-cpu": 256, "image-gpu": 256, "gpt": 16, "bert": 128}  # the GPU benchmark batches


def _cpus() -> int:
    from dlscale.inputs.source import _cpus as cpus  # torch: keeps start-up light

    return cpus()


@dataclass(frozen=True)
class PipelineCase:
    """One row of ``micro io``: the loader of ``pipeline`` over the data spec ``data`` with ``workers``
    DataLoader workers, ``batch`` samples a batch, at the model shapes of ``flavor``."""

    pipeline: str
    data: str
    workers: int
    batch: int
    flavor: str = "full"
    seed: int = 0


def measure_pipeline(case: PipelineCase, seconds: float, device: str) -> dict[str, Any]:
    """One row: batches taken as fast as they come for ``seconds`` after every worker has made one."""
    row: dict[str, Any] = {"pipeline": case.pipeline, "workers": case.workers, "batch": case.batch, "status": "ok",
                           "reason": None, "samples_per_s": None, "samples_per_s_per_worker": None,
                           "loader_cpu_cores": None, "samples_per_core_s": None, "read_mb_s": None,
                           "decoder": None, "seconds": None}
    dev = common.torch_device(device)
    decode = "gpu" if case.pipeline == "image-gpu" else "cpu"
    if decode == "gpu" and dev.type != "cuda":
        row.update(status="unsupported", reason="image-gpu decodes on a CUDA device; none here")
        return row
    if decode == "gpu":
        from dlscale.inputs.images import torchvision_decoder  # torch: keeps start-up light

        try:
            torchvision_decoder(dev)
        except ConfigError as e:  # no torchvision: this row cannot run, the others can
            row.update(status="unsupported", reason=str(e))
            return row
    src = None
    try:
        src = _start(case, decode, dev)
        row.update(_take(src, case.batch, seconds, dev))
        row["samples_per_s_per_worker"] = row["samples_per_s"] / case.workers if case.workers else None
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - one pipeline that fails never ends the sweep
        row.update(status=common.classify_error(e), reason=common.error_reason(e))
    finally:
        if src is not None:
            src.close()
    return row


def _start(case: PipelineCase, decode: str, dev):
    """The input source ``dlscale run --data`` would start for this case, its workers warmed up."""
    from dlscale.inputs.sampler import GlobalBatchSampler  # numpy: keeps start-up light
    from dlscale.inputs.source import make_reader, start_source  # torch: keeps start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    spec = parse_data(case.data)
    section = DataSection(data=case.data, data_decode=decode)
    reader = make_reader(get_model(MODEL[case.pipeline], case.flavor), dev, section, case.seed)
    sampler = GlobalBatchSampler(len(reader.dataset), case.batch, 0, case.batch, case.seed,
                                 what=f"{spec.kind} {spec.path}")
    src = start_source(reader, sampler, section, dev, case.workers)
    try:
        for _ in range(max(2, 2 * case.workers)):  # every worker has produced a batch
            src.next()
    except BaseException:
        src.close()
        raise
    return src


def _take(src, batch: int, seconds: float, dev) -> dict[str, Any]:
    """Batches from ``src`` for ``seconds``: the row's rates and the loader's cost."""
    common.synchronize(dev)
    waits = []
    src.window_start()
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < seconds:
        ta = time.perf_counter()
        src.next()
        waits.append(time.perf_counter() - ta)
        n += 1
    common.synchronize(dev)
    elapsed = time.perf_counter() - t0
    src.window_end()
    s = src.summary(waits, elapsed)
    return {"samples_per_s": n * batch / elapsed, "loader_cpu_cores": s["loader_cpu_cores"],
            "samples_per_core_s": s["samples_per_loader_core_s"], "read_mb_s": s["read_mb_s"],
            "decoder": s["loader"]["decoder"], "seconds": elapsed, "batches": n}


def _generated(tmp: str, pipelines: list[str], images: int, tokens: int, flavor: str) -> dict[str, str]:
    """Data specs of a temporary ImageNet-like set and token file for the pipelines asked for."""
    from dlscale.inputs.make import make_imagenet_like, make_tokens  # numpy: keeps start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    out: dict[str, str] = {}
    if any(p.startswith("image") for p in pipelines):
        classes = min(1000, int(get_model("resnet50", flavor).arch.classes))
        make_imagenet_like(f"{tmp}/images", images, classes=classes)
        out["image"] = f"imagefolder:{tmp}/images"
    if any(p in ("gpt", "bert") for p in pipelines):
        vocab = min(int(get_model(m, flavor).arch.vocab) for m in ("gpt2", "bert-base"))
        make_tokens(f"{tmp}/tokens", tokens, "uint16", vocab)
        out["tokens"] = f"tokens:{tmp}/tokens/tokens.bin:uint16"
    return out


def add_parser(sub) -> None:
    p = sub.add_parser(
        "io", help="input pipeline: decode+augment images/s and token batches/s, per worker and for N",
        description="Run the loaders of `dlscale run --data` with no model and measure samples/s, the CPU "
                    "cores the loader keeps busy and samples/s per core (how many cores a GPU needs: its "
                    "training samples/s divided by that). Without --data a temporary ImageNet-like set "
                    "and token file are generated. docs/data.md.")
    p.add_argument("--data", action="append", default=None, metavar="SPEC",
                   help="imagefolder:PATH and/or tokens:PATH[:uint16|uint32], repeatable (default: generated)")
    p.add_argument("--pipeline", action="append", default=None, metavar="P[,P...]",
                   help=f"from {', '.join(PIPELINES)} (default: those the data allows; image-gpu where "
                        "CUDA and torchvision are)")
    p.add_argument("--workers", action="append", default=None, metavar="N[,N...]",
                   help="DataLoader workers per row; 0 loads in the main process, as run --data-workers 0 "
                        "(default: 1 and every core)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="samples per batch (default: the GPU benchmark's: images 256, gpt 16, bert 128)")
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per row")
    p.add_argument("--flavor", default="full", choices=("full", "tiny"),
                   help="model shapes (image size, sequence length, vocabulary); tiny for quick checks")
    p.add_argument("--images", type=int, default=512, help="size of the generated image set")
    p.add_argument("--tokens", type=int, default=2_000_000, help="size of the generated token file")
    p.add_argument("--device", default="auto", choices=common.DEVICES,
                   help="where batches are finished (copied, normalised, GPU-decoded)")
    p.add_argument("--write-dir", default=None, metavar="DIR",
                   help="also time a durable write of --write-mb MB into DIR (fsynced, then removed): the disk "
                        "bandwidth a checkpoint gets; alone unless --pipeline or --data asks for loaders")
    p.add_argument("--write-mb", type=float, default=1024.0, help="MB written by the --write-dir test")
    p.add_argument("--store", default="results", metavar="DIR", help="result store directory")
    p.set_defaults(func=main)


def parse_workers(values) -> list[int]:
    """--workers: counts >= 0 (0: the main process loads, as `run --data-workers 0` allows)."""
    out = []
    for v in common.split_list(values):
        if not v.isdigit():
            raise ConfigError(f"bad workers {v!r}; expected an integer >= 0")
        out.append(int(v))
    return out


def _data_kind(pipeline: str) -> str:
    return "image" if pipeline.startswith("image") else "tokens"


def _pipelines(chosen: list[str] | None, by_kind: dict[str, str], device: str, alone: bool) -> list[str]:
    """The pipelines asked for, else those the data given allows (every one without data, image-gpu only on
    CUDA); none when ``alone`` (the write test by itself)."""
    if alone:
        return []
    out = chosen or [p for p in PIPELINES if not by_kind or _data_kind(p) in by_kind]
    return out if chosen is not None or device == "cuda" else [p for p in out if p != "image-gpu"]


def _measure_all(args, pipelines: list[str], by_kind: dict[str, str], workers: list[int],
                 device: str) -> list[dict[str, Any]]:
    """A row per pipeline and worker count, then the write test's where asked; a line on each."""
    rows = []
    for p in pipelines:
        for w in workers:
            case = PipelineCase(p, by_kind[_data_kind(p)], w, args.batch_size or BATCH[p], args.flavor)
            rows.append(measure_pipeline(case, args.seconds, device))
            r = rows[-1]
            print(f"# {p} workers {w}: {fmt_cell(r['samples_per_s'])} samples/s ({r['status']})", flush=True)
    if args.write_dir is not None:
        rows.append(diskwrite.measure_write(args.write_dir, int(args.write_mb * 1e6)))
        print(f"# write {args.write_mb:g} MB into {args.write_dir}: {fmt_cell(rows[-1]['write_mb_s'])} MB/s",
              flush=True)
    return rows


def main(args) -> int:
    device = common.resolve_device(args.device)
    if not args.seconds > 0:
        raise ConfigError(f"--seconds must be > 0, got {args.seconds}")
    workers = parse_workers(args.workers) if args.workers else sorted({1, _cpus()})
    if args.batch_size is not None and args.batch_size < 1:
        raise ConfigError(f"--batch-size must be >= 1, got {args.batch_size}")
    specs = [parse_data(d) for d in common.split_list(args.data)]
    if any(s.synthetic for s in specs):
        raise ConfigError("micro io measures real data: give imagefolder:PATH or tokens:PATH")
    chosen = common.parse_choices(args.pipeline, PIPELINES, "pipeline") if args.pipeline else None
    diskwrite.check(args.write_dir, args.write_mb)
    common.check_store(args.store)
    by_kind = {("image" if s.kind == "imagefolder" else "tokens"): f"{s.kind}:{s.path}" + (
        f":{s.dtype}" if s.dtype else "") for s in specs}
    pipelines = _pipelines(chosen, by_kind, device, alone=args.write_dir is not None and chosen is None and not specs)
    missing = [p for p in pipelines if _data_kind(p) not in by_kind]
    if missing and specs:
        raise ConfigError(f"pipeline(s) {', '.join(missing)} need a matching --data")
    tmp = None
    try:
        if missing:
            tmp = tempfile.mkdtemp(prefix="dlscale-io-")
            print(f"# generating a temporary data set in {tmp} ({args.images} images, {args.tokens} tokens)")
            by_kind.update(_generated(tmp, pipelines, args.images, args.tokens, args.flavor))
        rows = _measure_all(args, pipelines, by_kind, workers, device)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    status = common.record_status(rows)
    config = common.args_config(args)
    config.update(resolved={"device": device, "workers": workers, "pipelines": pipelines, "data": by_kind,
                            "generated": tmp is not None, "cpus": _cpus()})
    plot = {"x": "workers", "y": "samples_per_s", "series": "pipeline", "xlabel": "DataLoader workers",
            "ylabel": "samples/s", "logx": False}
    dev_name = common.device_name(common.torch_device(device))
    error = common.failed_reasons(rows, lambda r: f"{r['pipeline']} x{r['workers']}")
    record = common.make_record(common.Outcome("io", status, config, rows, plot, device, dev_name, error))
    common.print_table(f"input pipelines on {_cpus()} CPU cores, finishing on {dev_name} ({device}), "
                       f"{args.seconds:g} s per row",
                       [("pipeline", "pipeline"), ("workers", "workers"), ("batch", "batch"),
                        ("samples_per_s", "samples/s"), ("samples_per_s_per_worker", "per worker"),
                        ("loader_cpu_cores", "loader cores"), ("samples_per_core_s", "samples/s per core"),
                        ("read_mb_s", "read MB/s"), ("write_mb_s", "write MB/s")], rows)
    path = common.append_record(args.store, record)
    common.print_done(record, path)
    return common.exit_code(status)
