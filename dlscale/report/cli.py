"""`dlscale report` and `dlscale compare`: read-only views of a result store."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from dlscale import ConfigError
from dlscale.case.suite import parse_filters
from dlscale.report.data import Filters, Loaded, build_report, load_records
from dlscale.results.store import ResultStore
from dlscale.results.storeargs import add_store_arguments, add_two_store_arguments

FORMATS = ("md", "csv", "json", "html")
COMPARE_FORMATS = ("md", "csv", "json")
DEFAULT_STORE = "results"
DEFAULT_HTML = "report.html"


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows '(default: X)' except where the default is None: those help texts say it in words."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None:
            return action.help or ""
        return super()._get_help_string(action)


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", action="append", metavar="NAME",
                   help="only these models; repeat or comma-separate (default: all models)")
    p.add_argument("--label", action="append", metavar="LABEL",
                   help="only records with these labels; repeat or comma-separate (default: all labels)")
    p.add_argument("--precision", action="append", metavar="P",
                   help="only these precisions (fp32, amp-bf16, amp-fp16) (default: all)")
    p.add_argument("--strategy", action="append", metavar="NAME",
                   help="only tables of these strategies; baselines of other strategies are still used "
                        "(default: all)")


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_report(subparsers)
    _register_compare(subparsers)


def _register_report(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", formatter_class=_Help,
        help="DLPerf-style scaling tables, plots and HTML from a result store",
        description="Report a result store: per model, precision, compile flag, strategy and per-device "
                    "batch, the DLPerf table (node_num, gpu_num, median samples/s, speedup, scaling "
                    "efficiency, MFU, peak memory, spread over repeats). Each row is the newest ok record of "
                    "its case. Speedup is computed here against the 1-device ok record of the same workload; "
                    "without one it is shown as missing. Reads the store only; never writes to it. "
                    "Unreadable lines are skipped with a warning on stderr. An empty or missing store, or "
                    "filters matching nothing, exit with code 2.")
    add_store_arguments(p, DEFAULT_STORE)
    p.add_argument("--format", choices=FORMATS, default="md",
                   help="md: Markdown tables; csv: one row per case; json: DLPerf-shaped "
                        "{dlperf, groups, records, skipped_lines}; html: one self-contained page with plots")
    p.add_argument("--output", "-o", metavar="FILE",
                   help=f"write the report to FILE, '-' for stdout (default: stdout; for --format html "
                        f"{DEFAULT_HTML} in the current directory)")
    p.add_argument("--plots-dir", metavar="DIR",
                   help="also write every plot as PNG and SVG into DIR, created if needed (default: none; "
                        "the HTML report inlines its plots anyway)")
    p.add_argument("--no-plots", action="store_true", help="leave the plots out of the HTML report")
    p.add_argument("--group-by", choices=("workload", "label"), default="workload",
                   help="workload: the DLPerf tables, one per workload and label; label: one table per label, a row "
                        "per case, the fields that differ between its cases as columns (md and json only)")
    _add_filters(p)
    p.set_defaults(func=cmd_report)


def _register_compare(subparsers: argparse._SubParsersAction) -> None:
    c = subparsers.add_parser(
        "compare", formatter_class=_Help,
        help="compare the same cases in two stores (or two labels of one store), with noise tests",
        description="Side by side, the cases (matched on case_key) of A and B: median A, median B, ratio "
                    "B/A, a bootstrap confidence interval of the ratio of medians over the repeats, and an "
                    "exact Mann-Whitney U test. Verdict per case: faster, slower, or no change (within "
                    "noise); inconclusive when there are too few repeats to tell. Exit 0, or 1 with "
                    "--fail-on-regression when a significant slowdown exceeds the given percentage.")
    add_two_store_arguments(c)
    c.add_argument("--label-a", metavar="LABEL", help="only records of A with this label (default: any label)")
    c.add_argument("--label-b", metavar="LABEL", help="only records of B with this label (default: any label)")
    c.add_argument("--framework-a", metavar="FW", choices=FRAMEWORK_SIDES,
                   help="only A's cases of this framework (torch, torch-compiled, jax), paired with B's on the "
                        "workload without the framework (the same as --filter-a framework=... --ignore framework,"
                        "compile,...; default: any framework)")
    c.add_argument("--framework-b", metavar="FW", choices=FRAMEWORK_SIDES,
                   help="only B's cases of this framework (default: any)")
    c.add_argument("--metric", choices=("throughput", "time-to-quality"), default="throughput",
                   help="what is compared: samples/s, or the seconds to the target of the records of run --until "
                        "(the repeats that reached it; ratio = A's time over B's: above 1, B is faster)")
    c.add_argument("--format", choices=COMPARE_FORMATS, default="md", help="output format")
    c.add_argument("--output", "-o", metavar="FILE", help="write to FILE, '-' for stdout (default: stdout)")
    c.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples (100 to 1000000)")
    c.add_argument("--confidence", type=float, default=95.0,
                   help="confidence level in percent, for the CI and (as 1 - level) the test's p threshold")
    c.add_argument("--seed", type=int, default=0, help="bootstrap random seed (0 to 2^32-1)")
    c.add_argument("--min-change", type=float, default=0.0, metavar="PCT",
                   help="changes smaller than PCT %% count as no change even when significant")
    c.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="exit 1 when a case is significantly slower by more than PCT %% (0 <= PCT < 100; default: off)")
    for side in ("a", "b"):
        c.add_argument(f"--filter-{side}", action="append", metavar="KEY=VALUE[,VALUE]",
                       help=f"only cases of {side.upper()} matching, with the keys of `dlscale sweep --filter` "
                            f"(repeatable; default: all)")
    c.add_argument("--ignore", action="append", metavar="FIELD[,FIELD]",
                   help="pair A's cases with B's on their case fields without these (e.g. env; "
                        "strategy,strategy_options,nproc_per_node against one strategy), one A case per pairing; "
                        "default: pair on case_key")
    c.add_argument("--match", choices=("case", "workload"), default="case",
                   help="pair cases on case_key, or on the workload only (model, precision, per-device batch, "
                        "nodes x devices, device type): dlscale's model against an external stack or an imported "
                        "table, each side holding one case per workload (docs/external.md)")
    _add_filters(c)
    c.set_defaults(func=cmd_compare)


def _store_files(loaded: Loaded) -> set[str]:
    return {os.path.realpath(f) for f in ResultStore(loaded.store).files()}


def _write(output: str, text: str, loaded: list[Loaded]) -> None:
    if output == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    real = os.path.realpath(output)
    for ld in loaded:
        if real in _store_files(ld):
            raise ConfigError(f"refusing to write the report over result store file {output}")
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot write {output}: {e.strerror or e}") from None
    print(f"dlscale: wrote {output}", file=sys.stderr)


def _warn(lines: list[str]) -> None:
    for w in lines:
        print(f"dlscale: warning: {w}", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from dlscale.report import render  # numpy: keeps start-up light

    if args.group_by == "label" and args.format not in ("md", "json"):
        raise ConfigError(f"--group-by label renders md or json, not {args.format}")
    loaded = load_records(args.store)
    _warn(loaded.warnings())
    report = build_report(loaded, Filters.from_args(args))
    if args.group_by == "label":
        from dlscale.report import bylabel  # numpy: keeps start-up light

        text = bylabel.to_markdown(report) if args.format == "md" else bylabel.to_json(report)
        _write(args.output or "-", text, [loaded])
        return 0
    output = args.output or (DEFAULT_HTML if args.format == "html" else "-")
    plots, links = [], {}
    if args.plots_dir or (args.format == "html" and not args.no_plots):
        from dlscale.report.plots import render_plots, write_plots  # numpy: keeps start-up light

        plots = render_plots(report, ("png", "svg") if args.plots_dir else ("png",))
        if args.plots_dir:
            links = write_plots(plots, args.plots_dir)
    if args.format == "md":
        links = {k: [(t, render.relpath_for(p, output)) for t, p in v] for k, v in links.items()}
        text = render.to_markdown(report, links)
    elif args.format == "csv":
        text = render.to_csv(report)
    elif args.format == "json":
        text = render.to_json(report)
    else:
        from dlscale.report.html import to_html  # numpy: keeps start-up light

        text = to_html(report, [] if args.no_plots else plots, output=output)
    _write(output, text, [loaded])
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from dlscale.report import compare as cmp  # numpy: keeps start-up light

    if args.store_b is None and (args.label_a is None or args.label_b is None) \
            and not (args.filter_a or args.filter_b or (args.framework_a and args.framework_b)):
        raise ConfigError("compare needs two stores (A B), or one store with --label-a and --label-b "
                          "(or --filter-a/--filter-b, or --framework-a and --framework-b)")
    cmp.check_options(args.resamples, args.confidence, args.seed, args.min_change, args.fail_on_regression)
    case_filters, ignore = _pairing(args)
    loaded_a = load_records(args.store_a)
    same = args.store_b is None or os.path.realpath(args.store_b) == os.path.realpath(args.store_a)
    loaded_b = loaded_a if same else load_records(args.store_b)
    opts = cmp.Options(args.resamples, args.confidence / 100.0, args.seed, args.min_change, args.metric)
    pairing = cmp.Pairing(args.label_a, args.label_b, case_filters, ignore, args.match)
    result = cmp.compare(loaded_a, loaded_b, Filters.from_args(args), opts, pairing)
    _warn(result.warnings())
    _write(args.output or "-", cmp.render(result, args.format), [loaded_a, loaded_b])
    if args.fail_on_regression is not None:
        bad = result.regressions(args.fail_on_regression)
        if bad:
            print(f"dlscale: regression: {cmp.describe_regressions(bad, args.fail_on_regression)}",
                  file=sys.stderr)
            return 1
    return 0


# compare --framework-a/-b: the side's filter (torch-compiled: torch with --compile)
FRAMEWORK_SIDES = {"torch": {"framework": ["torch"], "compile": [False]},
                   "torch-compiled": {"framework": ["torch"], "compile": [True]},
                   "jax": {"framework": ["jax"]}}


def _pairing(args: argparse.Namespace) -> tuple[tuple[list, list], tuple[str, ...]]:
    """--filter-a/--filter-b (as `dlscale sweep --filter`) and --ignore, checked."""
    from dlscale.report.compare import IGNORABLE  # numpy: keeps start-up light

    sides = []
    for side in ("a", "b"):
        try:
            sides.append(parse_filters(getattr(args, f"filter_{side}", None)))
        except ConfigError as e:
            raise ConfigError(str(e).replace("--filter", f"--filter-{side}", 1)) from None
    ignore = tuple(dict.fromkeys(f.strip() for item in args.ignore or [] for f in item.split(",") if f.strip()))
    for i, side in enumerate(("a", "b")):  # --framework-X: a side filter, paired across frameworks
        fw = getattr(args, f"framework_{side}", None)
        if fw is not None:
            sides[i] = [{**(sides[i][0] if sides[i] else {}), **FRAMEWORK_SIDES[fw]}]
            ignore += tuple(f for f in ("framework", "compile", "compile_mode", "inductor_options") if f not in ignore)
    for f in ignore:
        if f not in IGNORABLE:
            raise ConfigError(f"--ignore {f}: not a field of the case identity; allowed: {', '.join(IGNORABLE)}")
    return (sides[0], sides[1]), ignore
