"""GPU decode beside a training model, part by part, in one process: what costs the step.

dlscale's GPU-decode path (``Prefetcher`` + ``GpuDecoder``: a thread decoding each next batch on
its own CUDA stream while the training thread trains on the current one) reached 0.87 (eager) and
0.75 (compiled) of synthetic throughput for ResNet-50 on one H200 (before the Triton crop kernel),
with the decoder alone 2-3x faster than the model consumes. This runs the same model
and loop under variants that each take one part away or change one thing, so the cost can be
split:

* ``synthetic``: no input thread, one device batch (the reference);
* ``dlscale``: the input thread as dlscale runs it (decode, crop, normalise; the batch trained on);
* ``loader``: dlscale's whole input path as its worker opens it (``source.start_source``:
  DataLoader workers reading the files, the pin-memory thread, the input thread's decode and crop
  by the same ``GpuDecoder``): what ``dlscale`` leaves out (it cycles host batches read before
  the window);
* ``torch-crop``: the same as ``dlscale`` with the crop and normalisation as torch ops (``images._crop_resize_flip``)
  instead of the Triton kernel (``crop_kernel``; the same where Triton is missing);
* ``high-priority``: the same, the input thread's stream at the device's highest priority (the
  crop and normalisation; the decoder's own streams are its library's);
* ``decode-only``: the thread decodes each batch and drops it; the model trains on the synthetic
  batch (the decode's cost to the training, without waiting for its output);
* ``crop-only``: the thread crops, resizes and normalises batches decoded beforehand (no JPEG
  decode in the window);
* ``switch-5ms``: ``dlscale`` with CPython's default switch interval (dlscale lowers it to 0.5 ms
  while its input thread runs);
* ``split-F`` (e.g. ``split-0.3``): ``loader`` with ``--data-cpu-share F``: the DataLoader workers
  (as many as dlscale's auto gives a split) decode and crop that share of each batch on the host,
  the GPU the rest.

Each variant: ``--warmup`` steps, then ``--steps`` timed between two synchronisations; the list of
variants runs ``--rounds`` times (the median is reported), the order reversed every other round.
The time the training thread waited for its next batch is summed per window (the data-wait share).

    python benchmarks/decode_beside.py /tmp/dlscale-data/imgs [--compile] [--decoder torchvision]

On the CPU (no CUDA) Pillow stands in for the GPU decoder and the tiny flavour for the model, to
check the script. Prints the table and one JSON line.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent.parent)]
import bare_mp  # noqa: E402
import gpu_decode_parts  # noqa: E402
from dlscale.case.config import DataSection  # noqa: E402
from dlscale.inputs import dataset_info, images  # noqa: E402
from dlscale.inputs.sampler import GlobalBatchSampler  # noqa: E402
from dlscale.inputs.source import Prefetcher, gpu_reader, resolve_workers, start_source  # noqa: E402
from dlscale.models import get_model  # noqa: E402

VARIANTS = ("synthetic", "dlscale", "loader", "torch-crop", "high-priority", "decode-only", "crop-only", "switch-5ms")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("folder", help="an image folder (class subfolders of JPEGs)")
    p.add_argument("--model", default="resnet50")
    p.add_argument("--flavor", default=None, help="default: full on CUDA, tiny on the CPU")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--batches", type=int, default=8, help="host batches read once and cycled")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    p.add_argument("--decoder", choices=("torchvision", "nvimgcodec"), default="torchvision")
    p.add_argument("--warmup", type=int, default=15)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    bad = [v for v in args.variants if v not in VARIANTS and split_share(v) is None]
    if bad or not args.variants:
        p.error(f"--variants: unknown {', '.join(bad) or '(none given)'}; allowed: {', '.join(VARIANTS)}, "
                f"split-F (F a share from 0 to 1)")
    for name in ("batch_size", "batches", "steps", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def split_share(variant: str) -> float | None:
    """F of a ``split-F`` variant (0 <= F <= 1), else None."""
    head, _, tail = variant.partition("-")
    if head != "split":
        return None
    try:
        share = float(tail)
    except ValueError:
        return None
    return share if 0.0 <= share <= 1.0 else None


def host_batches(folder: str, n: int, batch_size: int, size: int) -> list[tuple]:
    """``n`` batches of file bytes as dlscale's loader workers hand them over (pinned on CUDA)."""
    listing = dataset_info.list_imagefolder(folder)
    ds = images.ImageBytesData(listing.root, listing.files, listing.labels, size, seed=0)
    if len(ds) < batch_size:
        raise SystemExit(f"decode_beside.py: error: {folder} holds {len(ds)} images, fewer than one batch "
                         f"of {batch_size}")
    n = min(n, len(ds) // batch_size)
    out = []
    for b in range(n):
        flat, lengths, labels, boxes, flips, meta = images.collate_bytes(
            [ds[(0, i)] for i in range(b * batch_size, (b + 1) * batch_size)])
        if torch.cuda.is_available():
            flat, labels = flat.pin_memory(), labels.pin_memory()
        out.append((flat, lengths, labels, boxes, flips, meta))
    return out


class Finish:
    """What the input thread does to each host batch, per variant: ``dlscale`` (the GpuDecoder),
    ``decode-only`` (decode, dropped: returns the labels only) or ``crop-only`` (the GpuDecoder's
    crop and normalisation of images decoded before the window)."""

    def __init__(self, kind: str, gpu: images.GpuDecoder, decoded: dict[int, list] | None = None):
        self.kind, self.gpu, self.decoded = kind, gpu, decoded

    def __call__(self, item):
        if self.kind == "dlscale":
            return self.gpu(item)
        flat, lengths, labels, boxes, flips, meta = item
        if self.kind == "decode-only":
            self.gpu._decode_all(flat, lengths)
            return (labels.to(self.gpu.device, non_blocking=True),), meta
        out = self.gpu.augment(self.decoded[flat.data_ptr()], boxes, flips)
        return (out, labels.to(self.gpu.device, non_blocking=True)), meta


def run_variant(kind: str, step, synthetic: tuple, hosts: list, gpu: images.GpuDecoder, decoded, device,
                warmup: int, steps: int, folder: str = "") -> dict:
    """img/s and data-wait share of one window of ``kind`` (``loader``: the files of ``folder``)."""
    pf = src = None
    switch = sys.getswitchinterval()
    share = split_share(kind)
    if kind == "loader" or share is not None:  # dlscale's source over the files, finished by the same GpuDecoder
        listing = dataset_info.list_imagefolder(folder)  # (one rank, seed 0)
        ds = images.ImageBytesData(listing.root, listing.files, listing.labels, gpu.size, seed=0)
        b = synthetic[0].shape[0]
        share = share or 0.0
        src = start_source(gpu_reader(ds, gpu, [], "image", round(share * b), b), GlobalBatchSampler(len(ds), b, 0, b, 0),
                           DataSection(data=f"imagefolder:{folder}", data_decode="gpu"), device,
                           resolve_workers(None, "image", "gpu", 1, share))
    elif kind != "synthetic":
        finish = Finish("dlscale" if kind in ("dlscale", "torch-crop", "high-priority", "switch-5ms") else kind, gpu,
                        decoded)
        gpu.crop_kernel = kind != "torch-crop"
        pf = Prefetcher(itertools.cycle(hosts), finish, device)
        if kind == "high-priority" and device.type == "cuda":
            lo, hi = torch.cuda.Stream.priority_range()
            pf.stream = torch.cuda.Stream(device, priority=min(lo, hi))  # read by the thread per batch
        if kind == "switch-5ms":
            sys.setswitchinterval(0.005)
    # the next batch from the variant's input (None: the synthetic batch, nothing to wait for)
    fetch = (lambda: src.next()[0]) if src is not None else (lambda: pf.get()[0]) if pf is not None else None
    waited = 0.0
    try:
        def one() -> None:
            nonlocal waited
            if fetch is None:
                step(*synthetic)
                return
            t = time.perf_counter()
            out = fetch()
            waited += time.perf_counter() - t
            step(*(synthetic if kind == "decode-only" else out))

        for _ in range(warmup):
            one()
        gpu_decode_parts._sync(device)
        waited = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            one()
        gpu_decode_parts._sync(device)
        seconds = time.perf_counter() - t0
    finally:
        if src is not None:
            src.close()
        if pf is not None:
            pf.close()  # restores the switch interval dlscale found
        sys.setswitchinterval(switch)
        gpu.crop_kernel = True
    return {"images_per_s": steps * synthetic[0].shape[0] / seconds, "data_wait_share": waited / seconds}


def main(argv=None) -> dict:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cudnn.benchmark = True
    spec = get_model(args.model, args.flavor or ("full" if cuda else "tiny"))
    size = getattr(spec.arch, "image_size", None)
    if spec.data_kind != "image" or size is None:
        raise SystemExit(f"decode_beside.py: error: {args.model} does not train on images")
    hosts = host_batches(args.folder, args.batches, args.batch_size, size)
    _label, decode, name = gpu_decode_parts._decoders(device, args.decoder)[0]
    gpu = images.GpuDecoder(device, size, channels_last=cuda, decode=decode, name=name)
    decoded = None
    if "crop-only" in args.variants:  # each host batch decoded once, before any window
        decoded = {h[0].data_ptr(): gpu._decode_all(h[0], h[1])[0] for h in hosts}
        decoded = {k: [im if im is not None else v[0] for im in v] for k, v in decoded.items()}

    model, opt = bare_mp.build(spec, device, seed=0)
    fwd = torch.compile(model) if args.compile else model
    dtype = torch.bfloat16 if cuda else None

    def step(x, y):
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    synthetic = spec.make_batch(args.batch_size, torch.device("cpu"), torch.Generator().manual_seed(12345))
    synthetic = tuple(t.to(device) for t in synthetic)
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    for r in range(args.rounds):
        order = args.variants if r % 2 == 0 else list(reversed(args.variants))
        for kind in order:
            res = run_variant(kind, step, synthetic, hosts, gpu, decoded, device, args.warmup, args.steps,
                              args.folder)
            results[kind].append(res)
            print(f"round {r} {kind:>13}: {res['images_per_s']:>10,.1f} img/s, data wait "
                  f"{100 * res['data_wait_share']:.1f} %", flush=True)
    med = {k: statistics.median(x["images_per_s"] for x in v) for k, v in results.items()}
    ref = med.get("synthetic")
    print(f"\n# {args.model} b{args.batch_size} {'compiled' if args.compile else 'eager'}; decoder {name}; "
          f"{device}; {args.rounds} round(s) of {args.steps} steps")
    print("| variant | images/s (median) | / synthetic | data wait (median) |\n|---|---:|---:|---:|")
    for k in args.variants:
        wait = statistics.median(x["data_wait_share"] for x in results[k])
        print(f"| {k} | {med[k]:,.1f} | {'—' if not ref else f'{med[k] / ref:.3f}'} | {100 * wait:.1f} % |")
    out = {"bench": "decode_beside", "model": args.model, "batch_size": args.batch_size, "compile": args.compile,
           "decoder": name, "device": torch.cuda.get_device_name(0) if cuda else "cpu", "steps": args.steps,
           "median_images_per_s": med, "rounds": results}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
