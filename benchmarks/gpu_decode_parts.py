"""Where the GPU-decode path spends its time, with no model beside it (issue 23): images/s of
torchvision's batched nvJPEG decode alone, of dlscale's crop + resize + flip alone on decoded
images, and of the whole ``GpuDecoder`` (both, plus normalisation), on batches of one image folder.
Each part is timed over whole batches with a device synchronisation at both ends.

    python benchmarks/gpu_decode_parts.py /tmp/dlscale-data/imgs --batches 20

On the CPU (no CUDA) the same parts run with Pillow standing in for nvJPEG, to check the script.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dlscale.inputs import dataset_info, images  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, batches: list, device: torch.device) -> float:
    """Images per second of ``fn`` over ``batches`` (after one untimed batch)."""
    fn(batches[0])
    _sync(device)
    t0 = time.perf_counter()
    n = 0
    for b in batches:
        fn(b)
        n += len(b[1])
    _sync(device)
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("folder", help="an image folder (class subfolders of JPEGs)")
    p.add_argument("--batches", type=int, default=20, help="batches timed per part")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--size", type=int, default=224, help="output side (ResNet-50's)")
    args = p.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    listing = dataset_info.list_imagefolder(args.folder)
    ds = images.ImageBytesData(listing.root, listing.files, listing.labels, args.size, seed=0)
    n = min(len(ds), (args.batches + 1) * args.batch_size)
    items = [ds[(0, i)] for i in range(n)]
    batches = [images.collate_bytes(items[i:i + args.batch_size]) for i in range(0, n - args.batch_size + 1,
                                                                               args.batch_size)]
    if device.type == "cuda":
        decode, name = images.torchvision_decoder(device)
    else:
        decode, name = (lambda ds_: [images._pil_chw(d) for d in ds_]), "Pillow (CPU stand-in)"
    gpu = images.GpuDecoder(device, args.size, channels_last=True, decode=decode, name=name)

    def only_decode(b):
        flat, lengths = b[0], b[1]
        return decode(list(torch.split(flat, lengths)))

    decoded = [(only_decode(b), b[1], b[3], b[4]) for b in batches]  # decoded images, lengths, boxes, flips
    _sync(device)

    def only_crop(d):
        return images._crop_resize_flip(d[0], d[2], d[3], args.size, device)

    rows = [("decode (torchvision batched)", _timed(only_decode, batches, device)),
            ("crop + resize + flip (one grid_sample)", _timed(only_crop, decoded, device)),
            ("GpuDecoder: all of it", _timed(gpu, batches, device))]
    print(f"# {name}; {len(batches)} batches of {args.batch_size}; {device}; cores {os.cpu_count()}")
    print("| part | images/s | ms per batch |\n|---|---:|---:|")
    for what, ips in rows:
        print(f"| {what} | {ips:,.0f} | {args.batch_size / ips * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
