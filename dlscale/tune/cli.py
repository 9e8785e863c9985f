"""`dlscale tune`: candidates, memory pruning, ranking, measurement, result (dlscale/tune/, docs/tune.md)."""
from __future__ import annotations

import argparse
import os
import re
import sys

from dlscale import ConfigError
from dlscale.case.caseargs import add_case_arguments, command_line, config_from_args
from dlscale.case.config import FIELDS, check_cpu_processes, resolve_device
from dlscale.case.procs import EXIT_INTERRUPTED
from dlscale.commands.perf_args import positive_float, positive_int, shapes_type
from dlscale.commands.plan import memory_size
from dlscale.fmt import fmt_bytes, fmt_hms, fmt_num
from dlscale.report.data import rec_label
from dlscale.results import metrics
from dlscale.results.store import LoadResult, ResultStore
from dlscale.tune.space import AXIS_FIELDS, Axes, parse_axis

DEFAULT_BUDGET = "20m"
DEFAULT_TOP = 3
# short windows: what a choice between configurations needs, not a benchmark table's
TUNE_DEFAULTS = {"warmup": 10, "steps": 30, "repeats": 2, "flavor": None}
_EXCLUDE = AXIS_FIELDS + ("label", "max_batch_start", "max_batch_cap", "breakdown", "profile")
_UNITS = {"s": 1, "m": 60, "h": 3600}


def duration(text: str) -> float:
    """'20m', '90s', '1h30m', '600' (seconds) -> seconds, > 0."""
    t = str(text).strip().lower()
    parts = re.findall(r"([0-9]*\.?[0-9]+)\s*([smh]?)", t)
    if not t or not parts or re.sub(r"[0-9.]+\s*[smh]?", "", t).strip():
        raise argparse.ArgumentTypeError(f"expected a duration such as 20m, 90s or 1h30m, got {text!r}")
    seconds = sum(float(n) * _UNITS[u or "s"] for n, u in parts)
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"the budget must be more than 0 seconds, got {text!r}")
    return seconds


def _add_axes(p: argparse.ArgumentParser) -> None:
    """The searched fields, with `dlscale run`'s option names: a comma list or repeated; each
    restricts its axis (one value pins it)."""
    g = p.add_argument_group("axes (as `dlscale run` names them; a comma list or repeated; default: searched)")
    for name in AXIS_FIELDS:
        o = FIELDS[name]
        kw = {"nargs": "?", "const": "on"} if name == "compile" else {}
        g.add_argument(o.option(name), dest=f"axis_{name}", action="append", metavar="V[,V...]", default=None,
                       help=f"{o.help}" + ("; on, off or on,off" if name == "compile" else "")
                       + " (default: searched; docs/tune.md)", **kw)
    g.add_argument("--global-batch", type=positive_int, default=None, metavar="B",
                   help="keep this global batch: per-device batch x gradient accumulation x data-parallel degree")


def register(sub) -> None:
    p = sub.add_parser("tune", help="find the fastest configuration that fits, by measurement",
                       description="Search strategies and degrees, per-device batch and gradient accumulation, "
                       "activation checkpointing, compile and precision: prune with the memory plan, rank with the "
                       "performance model, measure the top candidates (short windows, fresh processes, repeats) "
                       "while they could still win and the budget allows. Every measurement is a record labelled "
                       "tune:<id> in --store, so the same command resumes. docs/tune.md.")
    add_case_arguments(p, defaults=TUNE_DEFAULTS, exclude=_EXCLUDE,
                       default_notes={"flavor": "the model's first with a GPU, tiny without one"})
    _add_axes(p)
    p.add_argument("--budget", type=duration, default=duration(DEFAULT_BUDGET), metavar="DURATION",
                   help=f"time for the measurements, e.g. 20m, 90s, 1h (default: {DEFAULT_BUDGET})")
    p.add_argument("--top", type=positive_int, default=DEFAULT_TOP, metavar="K",
                   help="candidates measured whatever the model says; after them, only those that could still win")
    p.add_argument("--gpu-memory", type=memory_size, default=None, metavar="SIZE",
                   help="memory of one device, e.g. 80GiB (default: the GPU's; on the CPU the RAM divided among "
                        "the processes)")
    p.add_argument("--headroom", type=float, default=0.10,
                   help="fraction of the device memory the plan keeps free; widened by measured peaks and OOMs")
    p.add_argument("--target-shapes", type=shapes_type(), default=None, metavar="LIST",
                   help="predict the finalists at these cluster shapes NODESxGPUS, e.g. 8x8,64x8 (dlscale predict)")
    p.add_argument("--intra-busbw", type=positive_float, default=None, metavar="GBPS",
                   help="with --target-shapes: intra-node all-reduce bus bandwidth (default: a micro comm record)")
    p.add_argument("--inter-busbw", type=positive_float, default=None, metavar="GBPS",
                   help="with --target-shapes: inter-node bus bandwidth per node (needed for shapes of >1 node)")
    p.add_argument("--price-per-gpu-hour", type=positive_float, default=None, metavar="PRICE",
                   help="with --target-shapes: each shape's cost per million samples at this price (dlscale cost)")
    p.add_argument("--store", default="results", help="result store directory (JSONL files)")
    p.add_argument("--format", choices=("md", "json"), default="md", help="result as a table or JSON")
    p.add_argument("--dry-run", action="store_true",
                   help="list the candidates, what is pruned and the model's order; measure nothing")
    p.add_argument("--verbose", "-v", action="store_true", help="stream the workers' output to stderr")
    p.set_defaults(func=cmd_tune)


def axes_from_args(args):
    values = {name: parse_axis(name, getattr(args, f"axis_{name}")) for name in AXIS_FIELDS}
    return Axes(**values, global_batch=args.global_batch)


def base_config(args):
    """The case every candidate varies: `dlscale run`'s options without the axes."""
    from dlscale.models import default_flavor, get_model, model_flavors  # torch: keeps start-up light

    get_model(args.model, default_flavor(args.model))  # an unknown model: one line naming the registered ones
    if args.flavor is None:
        cpu = resolve_device(args.device) == "cpu"
        args.flavor = "tiny" if cpu and "tiny" in model_flavors(args.model) else default_flavor(args.model)
    cfg = config_from_args(args)
    if cfg.repeats < 2:
        raise ConfigError(f"--repeats must be >= 2 for a tune (compare's verdicts need a spread), got {cfg.repeats}")
    if cfg.nnodes > 1 and not args.dry_run:
        raise ConfigError("tune measures on this machine (one node); --nnodes > 1 works with --dry-run only")
    if not 0 <= args.headroom < 1:
        raise ConfigError(f"--headroom must be in [0, 1), got {args.headroom}")
    return cfg


def machine_of(args, cfg, device_type: str, precision: str):
    """The devices as the plan and the ranking see them."""
    from dlscale.tune.rank import TuneMachine  # keeps the CLI start-up light

    memory, peak, bandwidth = args.gpu_memory, None, 0.0
    if device_type == "cuda":
        import torch  # torch: keeps start-up light

        if not torch.cuda.is_available():
            raise ConfigError("device cuda requested but no CUDA GPU is visible; use --device cpu")
        memory = memory or float(torch.cuda.get_device_properties(0).total_memory)
        from dlscale.micro.peaks import bandwidth_bps  # keeps the CLI start-up light

        name = torch.cuda.get_device_name(0)
        peak, _ = metrics.peak_flops(name, metrics.precision_dtype(precision, "cuda"))
        bandwidth = bandwidth_bps(name)
    elif memory is None:
        import psutil  # psutil: keeps the CLI start-up light

        memory = psutil.virtual_memory().total / cfg.nproc_per_node  # the processes share the RAM
    return TuneMachine(device_type, cfg.world_size, cfg.nnodes, float(memory), peak, mem_bw_bps=bandwidth)


def plan_candidates(args, stored: list | None = None):
    """Everything before a measurement: axes, candidates, pruning, ranking (ConfigError: bad input)."""
    from dlscale.tune import prune, space  # keeps the CLI start-up light
    from dlscale.tune.rank import evidence_for, rank  # keeps the CLI start-up light

    given = axes_from_args(args)
    base = base_config(args)
    device_type = resolve_device(base.device)
    if device_type == "cpu":
        check_cpu_processes(base.nproc_per_node)
    axes = space.default_axes(given, device_type, base.world_size)
    label = space.LABEL_PREFIX + space.tune_id(base, given)  # the inputs as given name the tune
    cands = space.generate(base, axes, device_type, prune.default_batches(device_type, _has_plan(base)), label)
    space.check_given(cands, given)
    machine = machine_of(args, base, device_type, axes.precision[0])
    headroom = prune.Headroom(machine.memory_bytes, args.headroom)
    prune.prune_memory(cands, headroom)
    prune.keep_largest_batches(cands, bool(given.batch_size or given.global_batch))
    if not any(c.pruned is None for c in cands):
        first = next((c.pruned for c in cands if c.pruned_by == "memory"), None) or cands[0].pruned
        raise ConfigError(f"no configuration fits: {first} (see --gpu-memory, --headroom, --batch-size)")
    # the model ranks from what was measured before: its ranking against the measured one would mean
    # nothing if it read this tune's own results
    others = [r for r in (stored if stored is not None else _stored(args.store).records)
              if rec_label(r) != label]
    evidence = evidence_for(others, base, machine)
    return label, cands, rank([c for c in cands if c.pruned is None], machine, evidence), headroom, given


def _stored(store_dir):
    """The store's records, read once for the ranking and the resume (an empty load where the
    store does not exist yet)."""
    if not store_dir or not os.path.isdir(store_dir):
        return LoadResult()
    return ResultStore(store_dir).load()


def _has_plan(cfg) -> bool:
    from dlscale.tune.prune import workload_of  # keeps the CLI start-up light

    try:
        workload_of(cfg)
    except ConfigError:
        return False
    return True


def _dry_run(label: str, cands, ranked) -> int:
    print(f"# dlscale tune {label}: {len(cands)} candidate(s), {len(ranked)} to rank (--dry-run: nothing measured)")
    for r in ranked:
        c = r.candidate
        print(f"{r.rank:>4}  {c.describe()}  predicted {fmt_num(r.predicted_samples_per_s, 1, group=True)} "
              f"samples/s  planned {fmt_bytes(c.planned_peak)}")
    from dlscale.tune.result import pruned_groups  # keeps the CLI start-up light

    for g in pruned_groups(cands):
        cases = g["cases"]
        more = f" and {len(cases) - 3} more" if len(cases) > 3 else ""
        print(f"   -  pruned ({g['by']}): {g['reason']}: {', '.join(cases[:3])}{more}")
    return 0


def cmd_tune(args) -> int:
    from dlscale.case import launch  # torch: keeps start-up light
    from dlscale.case.progress import PhasePrinter  # keeps the CLI start-up light
    from dlscale.tune import result, search  # keeps the CLI start-up light

    targets = _targets(args)
    loaded = _stored(args.store)
    label, cands, ranked, headroom, given = plan_candidates(args, loaded.records)
    if args.dry_run:
        return _dry_run(label, cands, ranked)
    store = ResultStore(args.store)
    store.check_writable()
    if loaded.warning():
        print(f"dlscale: warning: {loaded.warning()}", file=sys.stderr)
    done = search.resumable(loaded.records, label)
    passthrough = (lambda line: print(line, file=sys.stderr)) if args.verbose else None
    spawner = launch.TorchrunSpawner(on_line=PhasePrinter(out=sys.stderr, passthrough=passthrough))

    def measure_case(cfg) -> dict:
        rec = launch.measure(cfg, spawner, files_root=store.root, command=command_line(cfg)).to_dict()
        store.append_uninterrupted(rec)
        return rec

    s = search.Search(label, ranked, headroom, args.top, args.budget, global_batch=given.global_batch)
    search.stderr_say(f"# tune {label}: {len(cands)} candidate(s), {len(ranked)} runnable, "
                      f"{sum(r.candidate.key in done for r in ranked)} already in {store.file}; "
                      f"budget {fmt_hms(args.budget)}")
    search.run(s, done, measure_case, search.stderr_say)
    if s.interrupt is not None:
        search.stderr_say(f"dlscale: tune interrupted: {launch.keep_interrupted(s.interrupt, store)}; "
                          f"the same command carries on (best so far below)")
    records = store.load().records
    if s.interrupt is not None:
        search.adopt_stored(s, records)
    res = result.build(s, cands, records, targets)
    print(result.to_json(res) if args.format == "json" else result.to_markdown(res), end="")
    if s.interrupt is not None:
        return EXIT_INTERRUPTED
    return 0 if res.best is not None else 5


def _targets(args):
    from dlscale.tune.result import Targets  # keeps the CLI start-up light

    if not args.target_shapes:
        if args.intra_busbw or args.inter_busbw or args.price_per_gpu_hour:
            raise ConfigError("--intra-busbw, --inter-busbw and --price-per-gpu-hour describe --target-shapes; "
                              "give the shapes too")
        return None
    return Targets(list(args.target_shapes), args.intra_busbw, args.inter_busbw, args.price_per_gpu_hour)
