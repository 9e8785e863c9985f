"""`dlscale parity STORE`: every strategy's loss trajectory beside `single`'s, with tolerance and verdict."""
from __future__ import annotations

import argparse
import sys

from dlscale import ConfigError
from dlscale.report.cli import DEFAULT_STORE, _add_filters, _Help, _warn, _write
from dlscale.report.data import Filters, load_records
from dlscale.results.storeargs import add_store_arguments

FORMATS = ("md", "json")


def register(sub) -> None:
    p = sub.add_parser("parity", formatter_class=_Help,
                       help="loss parity: every strategy's losses beside single's on the same global batch",
                       description="For each workload (model, flavor, precision, device type, seed, global batch, "
                       "accumulation, clipping, label), every strategy's loss per warm-up step and after training "
                       "beside the newest ok `single` record's, with the largest relative difference, the "
                       "tolerance and pass/FAIL (docs/parity.md). Reads the store only. Exit 0 when nothing "
                       "fails, 1 when a case is outside its tolerance, 2 on bad input.")
    add_store_arguments(p, DEFAULT_STORE)
    p.add_argument("--format", choices=FORMATS, default="md", help="md: a table per workload; json: the same data")
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE, '-' for stdout (default: stdout)")
    p.add_argument("--tolerance", type=float, metavar="REL",
                   help="relative tolerance for every workload (default: by device and precision, "
                        "dlscale/results/parity.py TOLERANCES)")
    _add_filters(p)
    p.set_defaults(func=cmd_parity)


def cmd_parity(args: argparse.Namespace) -> int:
    from dlscale.report import parity as view  # keeps the CLI start-up light

    if args.tolerance is not None and not args.tolerance > 0:
        raise ConfigError(f"--tolerance must be a relative difference > 0, got {args.tolerance:g}")
    loaded = load_records(args.store)
    _warn(loaded.warnings())
    rep = view.build(loaded, Filters.from_args(args), args.tolerance)
    text = view.to_json(rep) if args.format == "json" else view.to_markdown(rep)
    _write(args.output or "-", text, [loaded])
    if rep.failed:
        names = ", ".join(f"{e.name} x{e.row.devices} ({e.max_rel_diff:.1e})" for e in rep.failed)
        print(f"dlscale: parity: {len(rep.failed)} case(s) outside tolerance: {names}", file=sys.stderr)
        return 1
    return 0
