"""`dlscale run` (one case, repeated) and `dlscale env` (a paste-ready environment report)."""
from __future__ import annotations

import json
import sys

from dlscale.case.caseargs import add_case_arguments, config_from_args
from dlscale.case.config import DEFAULTS, resolve_device
from dlscale.case.multinode import (
    add_rendezvous_arguments, is_multinode, measure_node, rendezvous_from_args, was_recorded,
)
from dlscale.case.procs import EXIT_INTERRUPTED
from dlscale.cli import STATUS_EXIT
from dlscale.external.cli import add_external_arguments, check_external_only, cmd_run_external
from dlscale.results import envinfo
from dlscale.results.store import ResultStore, StoreError


def register(sub) -> None:
    p = sub.add_parser("run", help="measure one training case (repeated) and store the record",
                       description="Train a model under a parallel strategy with synthetic data (or a data set "
                       "from disk: --data): W warm-up steps, N timed steps, R repeats; report the median.")
    # without a GPU the defaults are the tiny flavour in fp32 (a note says so); --flavor/--precision ask
    add_case_arguments(p, defaults={"flavor": None, "precision": None},
                       default_notes={"flavor": "the model's first (full; llama: 1b) with a GPU, tiny without one",
                                      "precision": "amp-bf16 with a GPU, fp32 without one"})
    p.add_argument("--store", default="results", help="result store directory (JSONL files)")
    p.add_argument("--json", action="store_true", help="print the record as JSON instead of the table")
    p.add_argument("--verbose", "-v", action="store_true", help="stream the workers' output")
    p.add_argument("--list", action="store_true", help="list models and strategies, then exit")
    add_rendezvous_arguments(p)  # --node-rank --master-addr/-port --rdzv-endpoint --max-restarts
    add_external_arguments(p)  # --command --parser --metric --unit --seq-len --cwd --stack
    p.set_defaults(func=cmd_run)

    e = sub.add_parser("env", help="print a paste-ready environment report")
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    e.set_defaults(func=cmd_env)


def cmd_env(args) -> int:
    env = envinfo.capture()
    print(json.dumps(env, indent=2) if args.json else envinfo.format_env(env))
    return 0


def _list() -> int:
    # torch: keeps start-up light
    from dlscale.models import default_flavor, get_model, model_flavors, model_names
    from dlscale.strategies import get_strategy, strategy_names  # torch: keeps start-up light

    for m in model_names():
        spec = get_model(m, default_flavor(m))
        print(f"model     {m:15s} unit {spec.unit:6s} seq {spec.seq_len or '-':<6} flavors {', '.join(model_flavors(m))}")
    for s in strategy_names():
        print(f"strategy  {s:15s} {get_strategy(s).description}")
    return 0


def _machine_defaults(args) -> str | None:
    """Flavour and precision when not given: the full model in amp-bf16 on a GPU; on a machine
    without one the tiny flavour in fp32 (a full model, or bf16 emulated on a CPU, runs for many
    minutes a case). Returns the note that says so, or None."""
    cpu = resolve_device(args.device) == "cpu"
    chosen = []
    if args.flavor is None:
        from dlscale.models import default_flavor, model_flavors  # torch: keeps start-up light

        args.flavor = "tiny" if cpu and "tiny" in model_flavors(args.model) else default_flavor(args.model)
        if args.flavor == "tiny":
            chosen.append("the tiny flavour (--flavor full runs the real model, minutes a step on a CPU)")
    if args.precision is None:
        args.precision = "fp32" if cpu else DEFAULTS["precision"]
        chosen += ["fp32 (--precision amp-bf16 asks for bf16 autocast)"] if cpu else []
    return f"# note: no GPU here, so this runs {' and '.join(chosen)}" if chosen else None


def cmd_run(args) -> int:
    from dlscale import console  # keeps the CLI start-up light
    from dlscale.case import launch  # torch: keeps start-up light
    from dlscale.case.resolve import resolve  # torch: keeps start-up light

    if args.list:
        return _list()
    # SIGTERM/SIGHUP arrive here as KeyboardInterrupt: cli.main holds the one signal guard of the command
    if args.external_command is not None:  # an external training command (dlscale/external/)
        try:
            return cmd_run_external(args)
        except KeyboardInterrupt as e:
            by = f" by {e.args[0]}" if e.args else ""
            print(f"dlscale: run of the external command interrupted{by}: its processes were ended; "
                  f"{launch.keep_interrupted(e, ResultStore(args.store))} (the repeats' logs stay in its logs/)",
                  file=sys.stderr, flush=True)
            return EXIT_INTERRUPTED
    check_external_only(args)
    note = _machine_defaults(args)
    cfg = config_from_args(args)
    rdzv = rendezvous_from_args(args, cfg.nproc_per_node)
    case = resolve(cfg)  # every check, once; bad input: one line, before the header
    store = ResultStore(args.store)
    store.check_writable()
    quiet = args.json
    if not quiet:
        if note:
            print(note)
        console.print_header(cfg)
    spawner = launch.TorchrunSpawner(rdzv=rdzv, on_line=None if quiet else console.phase_printer(args.verbose))
    if quiet and args.verbose:
        spawner.on_line = lambda line: print(line, file=sys.stderr)
    events = None if quiet else console.progress_printer(cfg)
    done: list[int] = []

    def on_event(kind, payload) -> None:
        if kind == "repeat":
            done.append(1)
        if events is not None:
            events(kind, payload)

    try:
        return _measure_and_store(args, case, rdzv, spawner, store, quiet, on_event)
    except KeyboardInterrupt as e:
        by = f" by {e.args[0]}" if e.args else ""
        print(f"dlscale: run interrupted{by} during repeat {min(len(done) + 1, cfg.repeats)}/{cfg.repeats} of "
              f"{cfg.model} {cfg.strategy} batch {cfg.batch_size}: its processes and temp files were removed; "
              f"{launch.keep_interrupted(e, store)}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def _measure_and_store(args, case, rdzv, spawner, store, quiet: bool, events) -> int:
    from dlscale import console  # keeps the CLI start-up light
    from dlscale.case import launch  # torch: keeps start-up light
    from dlscale.case.batchsearch import measure_max_batch  # keeps the CLI start-up light

    if case.cfg.batch_search:
        rec = measure_max_batch(case, spawner, files_root=store.root, on_event=events,
                                on_probe=None if quiet else lambda e: print(
                                    f"#   probe batch {e['batch_size']}: {e['status']} ({e['seconds']:.1f} s)",
                                    flush=True))
    elif is_multinode(rdzv):
        rec = measure_node(case, spawner, files_root=store.root, on_event=events)
    else:
        rec = launch.measure(case, spawner, files_root=store.root, on_event=events)
    if was_recorded(rec):
        try:
            store.append_uninterrupted(rec.to_dict())
        except StoreError as e:  # the measurement is kept in the recovery file the line names
            if not quiet:
                console.print_result(rec.to_dict())  # the numbers, shown although not stored
            print(f"dlscale: error: {e}", file=sys.stderr, flush=True)
            return e.exit_code
    if quiet:
        print(json.dumps(rec.to_dict(), indent=1, default=str))
    else:
        console.print_result(rec.to_dict(), store.root)
        if was_recorded(rec):
            print(f"record {rec.id[:12]} appended to {store.file}")
    if rec.status != "ok":
        print(f"dlscale: case {rec.status}: {rec.error}", file=sys.stderr)
    return STATUS_EXIT[rec.status]
