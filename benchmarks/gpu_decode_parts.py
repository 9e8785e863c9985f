"""Where the GPU-decode path spends its time, with no model beside it: images/s of
each GPU decoder's batched decode alone (torchvision's nvJPEG CUDA kernels; nvImageCodec on the
hardware JPEG decoders, or its CUDA backend where the GPU has none), of dlscale's crop + resize +
flip alone on decoded images, and of the whole ``GpuDecoder`` (both, plus normalisation), on
batches of one image folder. Each part is timed over whole batches with a device synchronisation at
both ends.

    python benchmarks/gpu_decode_parts.py /tmp/dlscale-data/imgs --batches 20 [--decoder all]

``--decoder``: torchvision, nvimgcodec, or all (default: each that imports here; the lines before
the table name each decoder and the backend nvImageCodec found). NVJPG busy: the JPEG engines'
utilisation (NVML) while the part ran, the evidence that nvImageCodec decoded on them. On the CPU
(no CUDA) the same parts run with Pillow standing in for the GPU decoders, to check the script.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dlscale import ConfigError  # noqa: E402
from dlscale.inputs import crop_kernel, dataset_info, images  # noqa: E402


# normalised pixels (unit ~1/58 per grey level): float32 rounding differs by ~1e-7, a wrong tap by > 1e-2
KERNEL_TOLERANCE = 1e-4


class KernelMismatch(RuntimeError):
    """The Triton crop kernel did not compute the torch version's batch."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class JpgBusy:
    """NVML's utilisation of the GPU's JPEG engines (NVJPG, %), read every 20 ms while a part runs:
    whether the hardware decoders did the work (NVML averages over its own sampling period, so a
    short part reads low; 0 throughout means they did not). None where NVML cannot say."""

    def __init__(self, device: torch.device):
        self.nvml = self.handle = None
        if device.type != "cuda":
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            index = device.index if device.index is not None else torch.cuda.current_device()
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)  # NVML's index: CUDA_VISIBLE_DEVICES unset
            pynvml.nvmlDeviceGetJpgUtilization(handle)
            self.nvml, self.handle = pynvml, handle
        except Exception as e:  # noqa: BLE001 - an older driver or NVML: the column stays empty
            print(f"# NVJPG utilisation not readable here: {type(e).__name__}: {e}")

    @contextlib.contextmanager
    def during(self):
        samples: list[float] = []
        if self.handle is None:
            yield samples
            return
        stop = threading.Event()

        def read() -> None:
            while not stop.wait(0.02):
                try:
                    samples.append(float(self.nvml.nvmlDeviceGetJpgUtilization(self.handle)[0]))
                except Exception:  # noqa: BLE001
                    return

        t = threading.Thread(target=read, daemon=True)
        t.start()
        try:
            yield samples
        finally:
            stop.set()
            t.join()


def _timed(fn, batches: list, device: torch.device, busy: JpgBusy | None = None) -> tuple[float, float | None]:
    """Images per second of ``fn`` over ``batches`` (after one untimed batch), and the JPEG engines'
    mean utilisation (%) meanwhile (None: not read)."""
    fn(batches[0])
    _sync(device)
    with busy.during() if busy is not None else contextlib.nullcontext([]) as samples:
        t0 = time.perf_counter()
        n = 0
        for b in batches:
            fn(b)
            n += len(b[1])
        _sync(device)
        seconds = time.perf_counter() - t0
    return n / seconds, (sum(samples) / len(samples) if samples else None)


def _decoders(device: torch.device, which: str) -> list[tuple[str, images.DecodeFn, str]]:
    """(label, decode, name) of each decoder asked for; ``all`` skips one that does not import
    (printed), a named one that does not is an error."""
    if device.type != "cuda":
        return [("Pillow", lambda ds_: [images._pil_chw(d) for d in ds_], "Pillow (CPU stand-in)")]
    out = []
    for label in (("torchvision", "nvimgcodec") if which == "all" else (which,)):
        try:
            if label == "torchvision":
                decode, name = images.torchvision_decoder(device)
            else:
                decode, name, _backend = images.nvimgcodec_decoder(device)
        except ConfigError as e:
            if which != "all":
                raise
            print(f"# {label} skipped: {e}")
            continue
        out.append((label, decode, name))
    return out


def _parts(label: str, decode, name: str, batches: list, size: int, device: torch.device,
           busy: JpgBusy) -> list[tuple[str, tuple[float, float | None]]]:
    """(images/s, NVJPG %) of the decode alone, the crop alone and the whole GpuDecoder with ``decode``."""
    gpu = images.GpuDecoder(device, size, channels_last=True, decode=decode, name=name)
    done = getattr(decode, "batch_done", lambda: None)  # nvImageCodec: release the batch's buffers

    def only_decode(b):
        flat, lengths = b[0], b[1]
        out = decode(list(torch.split(flat, lengths)))
        done()
        return out

    decoded = [(only_decode(b), b[1], b[3], b[4]) for b in batches]  # decoded images, lengths, boxes, flips
    _sync(device)
    if any(im is None for d in decoded for im in d[0]):
        print(f"# {label}: {sum(im is None for d in decoded for im in d[0])} image(s) not decoded (Pillow takes "
              f"them in GpuDecoder)")
        decoded = [([im if im is not None else images._pil_chw(x).to(device) for im, x in
                     zip(d[0], torch.split(b[0], b[1]))], *d[1:]) for d, b in zip(decoded, batches)]

    def only_crop(d):  # as GpuDecoder runs it (Triton's kernel where it runs)
        return images.crop_batch(d[0], d[2], d[3], size, device, channels_last=device.type == "cuda")

    def torch_crop(d):
        return images.crop_batch(d[0], d[2], d[3], size, device, channels_last=device.type == "cuda", kernel=False)

    runs = crop_kernel.usable(device)
    kernel = "one Triton kernel" if runs else "torch ops"
    if runs:  # the kernel computes the torch version's batch
        err = (only_crop(decoded[0]) - torch_crop(decoded[0])).abs().max().item()
        print(f"# {label}: crop kernel against the torch ops, largest difference {err:.3g}", flush=True)
        if not err <= KERNEL_TOLERANCE:
            raise KernelMismatch(f"{label}: the crop kernel differs from the torch ops by {err:.3g} "
                                 f"(allowed {KERNEL_TOLERANCE:g})")
    rows = [(f"{label}: decode (batched)", _timed(only_decode, batches, device, busy)),
            (f"{label}: crop + resize + flip + normalise ({kernel})", _timed(only_crop, decoded, device, busy)),
            (f"{label}: crop + resize + flip + normalise (torch ops)", _timed(torch_crop, decoded, device, busy)),
            (f"{label}: GpuDecoder, all of it", _timed(gpu, batches, device, busy))]
    del decoded
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="an image folder (class subfolders of JPEGs)")
    p.add_argument("--batches", type=int, default=20, help="batches timed per part")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224, help="output side (ResNet-50's)")
    p.add_argument("--decoder", choices=("all", "torchvision", "nvimgcodec"), default="all",
                   help="the GPU decoder(s) to time (default all: each that imports)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    listing = dataset_info.list_imagefolder(args.folder)
    ds = images.ImageBytesData(listing.root, listing.files, listing.labels, args.size, seed=0)
    n = min(len(ds), (args.batches + 1) * args.batch_size)
    items = [ds[(0, i)] for i in range(n)]
    batches = [images.collate_bytes(items[i:i + args.batch_size]) for i in range(0, n - args.batch_size + 1,
                                                                               args.batch_size)]
    try:
        decoders = _decoders(device, args.decoder)
    except ConfigError as e:
        print(f"gpu_decode_parts.py: error: {e}", file=sys.stderr)
        return 2
    if not decoders:
        print("gpu_decode_parts.py: error: no GPU decoder imports here", file=sys.stderr)
        return 2
    rows = []
    busy = JpgBusy(device)
    for label, decode, name in decoders:
        print(f"# {label}: {name}")
        try:
            rows += _parts(label, decode, name, batches, args.size, device, busy)
        except KernelMismatch as e:
            print(f"gpu_decode_parts.py: error: {e}", file=sys.stderr)
            return 1
    print(f"# {len(batches)} batches of {args.batch_size}; {device}; cores {os.cpu_count()}")
    print("| part | images/s | ms per batch | NVJPG busy (%) |\n|---|---:|---:|---:|")
    for what, (ips, jpg) in rows:
        print(f"| {what} | {ips:,.0f} | {args.batch_size / ips * 1e3:.2f} | "
              f"{'—' if jpg is None else f'{jpg:.0f}'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
