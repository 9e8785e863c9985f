"""``dlscale predict``: the data-parallel scaling model over cluster shapes, ``--validate``, and
``--strategy fsdp|hsdp|tensor|pipeline|hybrid``: the strategy model (``perfmodel.strategies``).

The model, its inputs and the validation are in :mod:`dlscale.perfmodel`; docs/perfmodel.md has the
usage and docs/metrics.md ("Performance model") the formulas. This module only parses and prints.
"""
from __future__ import annotations

import argparse
import json

from dlscale import ConfigError
from dlscale.case.caseargs import parse_options
from dlscale.commands.perf_args import (
    DeprecatedAlias, add_workload_args, int_list, options_from_args, query_from_args, shapes_type,
)
from dlscale.perfmodel.predict import predict_workload
from dlscale.perfmodel.predict_strategy import SHARDED, predict_strategy, render_strategy
from dlscale.perfmodel.render import (
    plot_prediction, plot_validation, render_prediction, render_validation,
)
from dlscale.perfmodel.strategies import FAMILIES
from dlscale.perfmodel.validate import validate
from dlscale.report.data import load_records


def register(sub) -> None:
    p = sub.add_parser(
        "predict", formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        help="predict scaling over cluster shapes from measured records and link bandwidths (data parallel; "
             "--strategy fsdp|hsdp|tensor|pipeline|hybrid: any sharded configuration)",
        description="t(N) = the measured 1-device step + the part of the gradient all-reduce not hidden behind "
                    "backward + an overhead that grows with log(GPUs per node) and sqrt(log(nodes)), fitted on the "
                    "workload's measured multi-device points where there are any (never negative, never above "
                    "ideal). Without a 1-device record, the 1-device step is inferred from a measured node's. "
                    "Every row carries a band. --validate STORE predicts every multi-device case of a "
                    "store from its 1-device record (and multi-node ones from their node, and from fewer nodes). "
                    "With --strategy fsdp|hsdp|tensor|pipeline|hybrid and -o KEY=VALUE: the strategy model (compute at a rate "
                    "inferred from the workload's measured records, each strategy's collectives on the links, "
                    "the pipeline bubble; each row with its basis). See docs/perfmodel.md.")
    add_workload_args(p, store_optional=True)
    p.add_argument("--strategy", default="ddp",
                   help="ddp (and zero1): the data-parallel scaling model fitted on the measured records of that "
                        "strategy; fsdp, hsdp, tensor, pipeline, hybrid: the strategy model (docs/perfmodel.md), "
                        "its configuration from -o, compute from the workload's measured records")
    p.add_argument("-o", "--option", dest="options", action="append", default=None, metavar="KEY=VALUE",
                   help="with --strategy fsdp|hsdp|tensor|pipeline|hybrid: the strategy's options as dlscale run "
                        "takes them (-o tp=2 -o pp=2 -o dp_shard=fsdp, -o shard=zero2, -o microbatches=8); "
                        "default: the strategy's defaults")
    p.add_argument("--shapes", dest="shapes", type=shapes_type(), default=None, metavar="LIST",
                   help="cluster shapes NODESxGPUS (or N: one node of N GPUs), comma list, e.g. 1x2,1x8,4x8,125x8; "
                        "default: powers of two up to the node (--nproc-per-node), then --nnodes of that node")
    p.add_argument("--devices", dest="shapes", type=shapes_type(), action=DeprecatedAlias, new="--shapes",
                   help=argparse.SUPPRESS)
    p.add_argument("--nnodes", type=int_list, default=None, metavar="LIST",
                   help="node counts of the default shapes (with an inter-node link: 2,4,...,128)")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="write predicted (with its band) vs ideal speedup, or with --validate predicted vs measured")
    p.add_argument("--validate", default=None, metavar="STORE",
                   help="predict every multi-device ok record of STORE (run or imported) from its 1-device record, "
                        "every multi-node one from its node and from its measured shapes of fewer nodes "
                        "(protocols from-1-gpu, from-node, from-multinode), and print the errors")
    p.set_defaults(func=cmd_predict)


def _predict_strategy(args, query, opts) -> int:
    """--strategy fsdp|hsdp|tensor|pipeline|hybrid: the strategy model over the shapes."""
    if args.plot:
        raise ConfigError(f"--plot draws the data-parallel model; not with --strategy {args.strategy}")
    if not args.shapes:
        raise ConfigError(f"--strategy {args.strategy} needs --shapes (e.g. --shapes 1x2,1x8,4x8)")
    options = parse_options(args.options, "-o")
    loaded = load_records(args.store)
    pred = predict_strategy(loaded.records, query, opts, options, args.shapes, str(loaded.store))
    print(json.dumps(pred.to_dict(), indent=2, sort_keys=True) if args.format == "json" else render_strategy(pred))
    return 0


def cmd_predict(args) -> int:
    query, opts = query_from_args(args), options_from_args(args, args.strategy)
    if args.validate is not None:
        if args.store is not None:
            raise ConfigError("give the store once: either STORE or --validate STORE")
        loaded = load_records(args.validate)
        val = validate(loaded.records, query, opts)
        if not val.rows:  # nothing was predicted: a table of skips would read as a pass
            why = val.skipped[0].split(": ", 1)[-1].removesuffix("; skipped") if val.skipped else \
                "no multi-device case with its 1-device record"
            raise ConfigError(f"--validate {args.validate}: nothing validated ({len(val.skipped)} point(s) "
                              f"skipped): {why}")
        if args.plot:
            plot_validation(val, args.plot)
        print(json.dumps(val.to_dict(), indent=2, sort_keys=True) if args.format == "json"
              else render_validation(val, str(loaded.store)))
        return 0
    if args.store is None or args.model is None:
        raise ConfigError("predict needs STORE and --model (or --validate STORE)")
    if args.strategy in SHARDED:
        return _predict_strategy(args, query, opts)
    if args.options:
        raise ConfigError(f"-o applies to --strategy {', '.join(SHARDED)}; {args.strategy} takes none here")
    if args.strategy not in FAMILIES:
        raise ConfigError(f"the performance model has no strategy {args.strategy!r}; it models {', '.join(FAMILIES)}")
    loaded = load_records(args.store)
    pred = predict_workload(loaded.records, query, opts, args.shapes, args.nnodes, str(loaded.store))
    out = pred.to_dict()
    if args.plot:
        plot_prediction(pred, args.plot)
        out["plot"] = args.plot
    print(json.dumps(out, indent=2, sort_keys=True) if args.format == "json" else render_prediction(pred))
    return 0
