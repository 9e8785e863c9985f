"""``dlscale data make imagenet-like|tokens|text-corpus`` and ``dlscale data info``."""
from __future__ import annotations

import argparse
import json
import re

from dlscale import ConfigError
from dlscale.case.config import RunConfig
from dlscale.inputs import check_case
from dlscale.inputs.spec import parse_data

_COUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_MULT = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}


def parse_count(text: str, name: str = "size") -> int:
    """"20000", "20k", "1.5M", "1G" (decimal multiples) -> int >= 1; ConfigError otherwise."""
    m = _COUNT.match(str(text))
    if not m:
        raise ConfigError(f"bad {name} {text!r}; give a count with an optional k, M or G (e.g. 20000, 20k, 100M)")
    value = int(float(m.group(1)) * _MULT[m.group(2).lower()])
    if value < 1:
        raise ConfigError(f"{name} must be >= 1, got {text!r}")
    return value


def _jobs(text: str) -> int | None:
    if str(text).lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"--jobs must be a positive integer or all, got {text!r}")
    return n


def register(sub) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("data", help="make test data sets; describe a data set",
                       description="Generate data sets that behave like the real ones for the loader, or "
                       "print a data set's identity (what a record stores) and page-cache state. docs/data.md.",
                       formatter_class=fmt)
    s = p.add_subparsers(dest="data_command", metavar="ACTION")
    s.required = True
    mk = s.add_parser("make", help="generate an ImageNet-like image folder or a token file", formatter_class=fmt)
    ms = mk.add_subparsers(dest="make_kind", metavar="KIND")
    ms.required = True
    im = ms.add_parser("imagenet-like", formatter_class=fmt,
                       help="JPEGs in class folders with ImageNet's sizes (~110 KB, long side mostly 500 px)",
                       description="Write SIZE JPEGs into CLASSES folders of OUT (ImageNet layout). Sizes and "
                       "dimensions follow ImageNet's training set (see docs/data.md); OUT/dlscale-data.json holds "
                       "the achieved statistics. Use it with --data imagefolder:OUT.")
    im.add_argument("--out", required=True, help="new or empty folder")
    im.add_argument("--size", required=True, help="number of images (k, M suffixes: 20k)")
    im.add_argument("--classes", type=int, default=1000, help="class folders (at most the model's outputs)")
    im.add_argument("--seed", type=int, default=0, help="the set is a pure function of the seed")
    im.add_argument("--jobs", type=_jobs, default="all", help="processes generating images (all: one per core)")
    im.add_argument("--quality", type=int, default=90, help="JPEG quality")
    im.add_argument("--json", action="store_true", help="print the statistics as JSON")
    im.set_defaults(func=cmd_make_images)
    tk = ms.add_parser("tokens", formatter_class=fmt, help="a flat file of token ids",
                       description="Write OUT/tokens.bin: SIZE token ids drawn uniformly from [0, VOCAB). Use it "
                       "with --data tokens:OUT/tokens.bin:DTYPE.")
    tk.add_argument("--out", required=True, help="new or empty folder")
    tk.add_argument("--size", required=True, help="number of tokens (k, M, G suffixes: 100M)")
    tk.add_argument("--dtype", default="uint16", choices=("uint16", "uint32"), help="element type")
    tk.add_argument("--vocab", type=int, default=30522,
                    help="ids are drawn below this (30522 fits bert-base and gpt2; tiny flavours need their own: "
                         "bert-base tiny 1000, gpt2 tiny 500)")
    tk.add_argument("--seed", type=int, default=0, help="random seed")
    tk.add_argument("--json", action="store_true", help="print the statistics as JSON")
    tk.set_defaults(func=cmd_make_tokens)
    _add_text_corpus(ms, fmt)
    info = s.add_parser("info", formatter_class=fmt, help="identity, size and page-cache state of a data set",
                        description="Check a data set as `dlscale run` would (with --model) and print what a "
                        "record stores about it: path, size, files, fingerprint, whether it fits in memory, "
                        "and how much of it is in the page cache now.")
    info.add_argument("spec", metavar="SPEC", help="imagefolder:PATH or tokens:PATH[:uint16|uint32]")
    info.add_argument("--model", default=None, help="check against this model (vocabulary, classes)")
    info.add_argument("--flavor", default="full", choices=("full", "tiny"), help="the model's flavour")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_info)


def _add_text_corpus(ms, fmt) -> None:
    tc = ms.add_parser("text-corpus", formatter_class=fmt, help="a real text corpus from files on this machine",
                       description="Tokenise text files already on this machine (default: the Python standard "
                       "library's sources and docs) into OUT/train.bin and OUT/val.bin (uint16 ids; a held-out "
                       "share of the files is the validation split), with OUT/dlscale-data.json recording every "
                       "file, its checksum, the seed and the tokenizer. Use it with --data tokens:OUT/train.bin "
                       "and --until (docs/quality.md).")
    tc.add_argument("--out", required=True, help="new or empty folder")
    tc.add_argument("--size", default="8M", help="bytes of text to take (k, M suffixes)")
    tc.add_argument("--seed", type=int, default=0, help="which files, in what order, and the split")
    tc.add_argument("--tokenizer", default="bytes", choices=("bytes", "bpe"),
                    help="bytes: ids 0..255; bpe: a byte-level BPE trained here on the training split "
                         "(Hugging Face tokenizers)")
    tc.add_argument("--vocab", type=int, default=500, help="with --tokenizer bpe: ids in the vocabulary "
                    "(500 fits gpt2 tiny; the full gpt2 takes up to 50257)")
    tc.add_argument("--val-share", type=float, default=0.05, help="share of the files held out for validation")
    tc.add_argument("--source", default=None, help="folder of text files to read instead of the standard library")
    tc.add_argument("--json", action="store_true", help="print the manifest as JSON")
    tc.set_defaults(func=cmd_make_corpus)


def cmd_make_corpus(args) -> int:
    from dlscale.inputs.corpus import CorpusOptions, make_text_corpus  # numpy: keeps start-up light

    opts = CorpusOptions(args.out, parse_count(args.size), args.seed, args.tokenizer, args.vocab, args.val_share,
                         args.source)
    st = make_text_corpus(opts)
    _print(st, args.json, [
        f"wrote {st['train_tokens']} training and {st['val_tokens']} validation tokens ({st['tokenizer']}, "
        f"vocabulary {st['vocab']}) from {st['train_files']} + {st['val_files']} files of {st['source']} "
        f"in {st['seconds']:.1f} s",
        f"  use: --data {st['spec']} --until val_loss<=X (validation: {st['eval_spec']})"])
    return 0


def _print(stats: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(stats, indent=1))
    else:
        print("\n".join(lines))


def cmd_make_images(args) -> int:
    from dlscale.inputs.make import make_imagenet_like  # numpy: keeps start-up light

    st = make_imagenet_like(args.out, parse_count(args.size), args.classes, args.seed, args.jobs, args.quality)
    _print(st, args.json, [
        f"wrote {st['images']} JPEGs in {st['classes']} class folders of {args.out} in {st['seconds']:.1f} s "
        f"({st['jobs']} processes)",
        f"  mean {st['mean_bytes'] / 1e3:.1f} KB, mean {st['mean_width']:.0f} x {st['mean_height']:.0f} px, "
        f"total {st['bytes'] / 1e9:.2f} GB",
        f"  use: --data imagefolder:{args.out}"])
    return 0


def cmd_make_tokens(args) -> int:
    from dlscale.inputs.make import make_tokens  # numpy: keeps start-up light

    st = make_tokens(args.out, parse_count(args.size), args.dtype, args.vocab, args.seed)
    _print(st, args.json, [f"wrote {st['tokens']} {st['dtype']} tokens (ids < {st['vocab']}) to {st['file']} "
                           f"in {st['seconds']:.1f} s", f"  use: --data {st['spec']}"])
    return 0


def cmd_info(args) -> int:
    from dlscale.inputs import dataset_info  # ctypes: keeps the CLI start-up light

    spec = parse_data(args.spec)
    if spec.synthetic:
        raise ConfigError("synthetic data has no files to describe; give imagefolder:PATH or tokens:PATH")
    seq = None
    if args.model:
        cfg = RunConfig(model=args.model, flavor=args.flavor, data=args.spec, batch_size=1)
        check_case(cfg)
        from dlscale.models import get_model  # torch: keeps start-up light

        seq = get_model(args.model, args.flavor).seq_len
    elif spec.kind == "tokens":
        dataset_info.token_count(spec)
    else:
        dataset_info.list_imagefolder(spec.path)
    ident = dataset_info.identity(spec, seq).to_dict()
    if spec.kind == "imagefolder":
        listing = dataset_info.list_imagefolder(spec.path)
        paths = [f"{listing.root}/{f}" for f in listing.files]
    else:
        paths = [ident["path"]]
    ident["resident_share_now"] = dataset_info.resident_share(dataset_info.sample_paths(paths))
    lines = [f"{k:24s} {v}" for k, v in ident.items()]
    _print(ident, args.json, lines)
    return 0
