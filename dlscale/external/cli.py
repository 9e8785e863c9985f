"""``dlscale run --command "..."``: an external training command under dlscale's machinery.

Two hooks in dlscale/commands/run.py: ``add_external_arguments(p)`` adds the options, and
``cmd_run`` hands over to ``cmd_run_external(args)`` when ``--command`` is given. The case
options that describe a workload (--model, --batch-size, --precision, --nproc-per-node, --nnodes,
--grad-accum, --strategy, --compile) describe what the command trains; those that tell dlscale
how to train (--flavor, --breakdown, --profile, --compile-mode, ...) do not apply and are refused.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dlscale import ConfigError
from dlscale.case.caseargs import parse_options
from dlscale.cli import STATUS_EXIT
from dlscale.external.case import ExternalCase, split_command
from dlscale.external.parsers import UNITS, parser_names
from dlscale.results.store import ResultStore

# run options that drive dlscale's own worker: meaningless for another program's command
NATIVE_ONLY = (("flavor", "full", "--flavor"), ("compile_mode", "default", "--compile-mode"),
               ("inductor_options", None, "--inductor-option"), ("threads", None, "--threads"),
               ("env", None, "--env"), ("data", "synthetic", "--data"), ("data_workers", None, "--data-workers"),
               ("data_decode", "cpu", "--data-decode"),
               ("data_decoder", "auto", "--data-decoder"), ("data_cold_read", False, "--data-cold-read"),
               ("framework", "torch", "--framework"), ("clip_grad_norm", None, "--clip-grad-norm"),
               ("breakdown", False, "--breakdown"), ("profile", False, "--profile"),
               ("inject_failure", None, "--inject-failure"), ("max_batch_start", None, "--max-batch-start"),
               ("max_batch_cap", None, "--max-batch-cap"), ("node_rank", None, "--node-rank"),
               ("master_addr", None, "--master-addr"), ("rdzv_endpoint", None, "--rdzv-endpoint"),
               ("max_restarts", 0, "--max-restarts"), ("list", False, "--list"))


def add_external_arguments(p: argparse.ArgumentParser) -> None:
    """The --command options of `dlscale run` (docs/external.md)."""
    g = p.add_argument_group("external command (--command: any training program; docs/external.md)")
    # dest: "command" is the CLI's subcommand name (dlscale/cli.py)
    g.add_argument("--command", dest="external_command", default=None, metavar="CMD",
                   help="run this training command instead of a dlscale model: split like a shell line (shlex) but "
                        "never run by a shell; --model/--batch-size/--precision/--nproc-per-node/--nnodes describe "
                        "what it trains, --warmup/--steps the window its log is reduced over")
    g.add_argument("--parser", default=None, choices=parser_names(),
                   help="how to read the command's throughput from its output (required with --command); its options "
                        "with -o KEY=VALUE (docs/external.md)")
    g.add_argument("--metric", default=None, metavar="REGEX",
                   help="regex parser: a regular expression with a named group value, e.g. "
                        "'samples/sec: (?P<value>[0-9.]+)' (compiled and matched, never run)")
    g.add_argument("--unit", default=None, choices=UNITS,
                   help="what one sample is (regex parser: what the value counts per second); default: the "
                        "registered model's unit, else the parser's")
    g.add_argument("--seq-len", type=int, default=None,
                   help="tokens per sample of the command's workload, for tokens/s from sequences/s and back (default: "
                        "what the log states; else the registered model's, assumed: then no tokens/s is derived)")
    g.add_argument("--cwd", default=None, metavar="DIR", help="working directory of the command (default: here)")
    g.add_argument("--stack", default=None, metavar="NAME",
                   help="name of the training stack in reports, free text (default: the parser's name)")


def _check_native_only(args: argparse.Namespace) -> None:
    for dest, default, flag in NATIVE_ONLY:
        if getattr(args, dest, default) not in (default, None):
            raise ConfigError(f"{flag} does not apply to --command runs (dlscale does not train there; it runs "
                              f"the command and reads its log)")
    if args.batch_size == "max":
        raise ConfigError("--batch-size max does not apply to --command runs: give the command's per-device batch")


def case_from_args(args: argparse.Namespace):
    _check_native_only(args)

    split_command(args.external_command)  # an empty or unsplittable command first: nothing else matters then
    if args.parser is None:
        raise ConfigError("--command needs --parser NAME (how to read its throughput); see dlscale run --help")
    if args.precision is None:  # a description, not a machine default
        raise ConfigError("--command needs --precision (what the command trains in: fp32, amp-bf16, amp-fp16)")
    return ExternalCase(command=args.external_command, parser=args.parser, model=args.model, batch_size=args.batch_size,
                        precision=args.precision, nproc_per_node=args.nproc_per_node, nnodes=args.nnodes,
                        grad_accum=args.grad_accum, cwd=args.cwd, framework=args.stack,
                        strategy=args.strategy if args.strategy != "auto" else (
                            "single" if args.nproc_per_node * args.nnodes == 1 else "ddp"),
                        compile=args.compile, seq_len=args.seq_len, unit=args.unit, metric=args.metric,
                        parser_options=parse_options(args.strategy_options), warmup=args.warmup, steps=args.steps,
                        repeats=args.repeats, time_limit=args.time_limit, device=args.device, label=args.label,
                        monitor=args.monitor, sample_interval=args.sample_interval)


def check_external_only(args: argparse.Namespace) -> None:
    """Without --command, the external options mean nothing: refuse them."""
    for dest, flag in (("parser", "--parser"), ("metric", "--metric"), ("unit", "--unit"), ("seq_len", "--seq-len"),
                       ("cwd", "--cwd"), ("stack", "--stack")):
        if getattr(args, dest, None) is not None:
            raise ConfigError(f"{flag} applies to --command runs only")


def print_header(case) -> None:
    d = case.to_dict()
    print(f"# dlscale run --command: {case.model} ({case.framework}, parser {case.parser}) on {case.world_size} "
          f"device(s)")
    width = max(len(k) for k in d)
    for k, v in d.items():
        print(f"#   {k:<{width}} : {v}")


def progress_printer(case):
    def on_event(kind: str, e: Any) -> None:
        if kind != "repeat":
            return
        if e["status"] == "ok":
            p = e.get("parse") or {}
            print(f"#   repeat {e['repeat'] + 1}/{case.repeats}: {e['samples_per_s']:,.2f} samples/s (steps "
                  f"{p.get('skipped_steps', 0) + 1}-{p.get('skipped_steps', 0) + p.get('window_steps', 0)} of "
                  f"{p.get('steps_seen')}, process {e['process_s']:.1f} s)", flush=True)
            for w in p.get("warnings") or []:
                print(f"#     warning: {w}", flush=True)
            if e.get("warning"):
                print(f"#     warning: {e['warning']}", flush=True)
        else:
            print(f"#   repeat {e['repeat'] + 1}/{case.repeats}: {e['status'].upper()}: {e['error']}", flush=True)

    return on_event


def cmd_run_external(args: argparse.Namespace) -> int:
    from dlscale import console  # keeps the CLI start-up light
    from dlscale.external.measure import measure_external  # importlib: keeps the CLI start-up light

    case = case_from_args(args)
    store = ResultStore(args.store)
    quiet = args.json
    if not quiet:
        print_header(case)
    rec = measure_external(case, store, verbose=args.verbose, on_event=None if quiet else progress_printer(case))
    store.append_or_recover(rec)  # StoreError (exit 7) names the file that keeps the record
    if quiet:
        print(json.dumps(rec, indent=1, default=str))
    else:
        console.print_result(rec)
        ok = [r for r in rec["repeats"] if r["status"] == "ok"]
        if ok:
            print(f"# method ({case.parser}): {ok[0]['parse']['method']}")
        print(f"record {rec['id'][:12]} (kind external) appended to {store.file}")
    if rec["status"] != "ok":
        print(f"dlscale: case {rec['status']}: {rec['error']}", file=sys.stderr)
    return STATUS_EXIT[rec["status"]]
