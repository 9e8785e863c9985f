"""`dlscale slurm`: an sbatch job for a case (or a suite's cases), submitted or printed.

Two ways to start the ranks inside the allocation (``--mode``):

torchrun (default)
    one job step per case, ``srun --ntasks-per-node=1`` starting one ``dlscale run`` per node;
    each starts torchrun for the node's processes. Several nodes meet at a c10d rendezvous on
    the allocation's first node (port ``--port``, default 20000 + job id % 10000, plus the
    case's index); one node runs standalone. The node running global rank 0 appends the record.
srun
    one job step per case, ``srun --ntasks-per-node=G`` starting ``dlscale slurm-task`` once per
    process: each task takes rank, local rank and world size from Slurm's variables, runs the
    worker for each repeat under the case's time limit, and task 0 appends the record.

Every step of the script runs whatever the previous one did; the job's exit code is the first
non-zero case exit code (0 when every case was ok). The job's output (every node's console)
goes to ``STORE/slurm/<job name>-<job id>.out``; records go to the (shared) store.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from dlscale import ConfigError, DlscaleError
from dlscale.commands.run import add_case_arguments, config_from_args, option_args
from dlscale.config import RunConfig

MODES = ("torchrun", "srun")


def register(sub) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("slurm", help="write an sbatch job for a case or a suite, and submit it",
                       formatter_class=fmt,
                       description="Write an sbatch script that runs the case (or every case of SUITE) on "
                       "--nodes x --gpus-per-node processes and submit it with sbatch (or print it with "
                       "--dry-run). Records from every job land in --store (use a shared file system).")
    p.add_argument("suite", nargs="?", default=None, metavar="SUITE",
                   help="suite name or YAML file (each case runs on the allocation); "
                   "without it, the case options below describe one case")
    add_case_arguments(p)
    p.add_argument("--max-batch-start", type=int, default=None,
                   help="--batch-size max: first probe (default 8; a suite's cases start at their batch)")
    p.add_argument("--max-batch-cap", type=int, default=None,
                   help="--batch-size max: largest batch tried (default: the suite's max_batch_cap, else "
                        "4096 on GPUs, 64 on the CPU)")
    g = p.add_argument_group("allocation")
    g.add_argument("--nodes", type=int, default=1, help="nodes (sbatch --nodes)")
    g.add_argument("--gpus-per-node", type=int, default=None,
                   help="processes per node, one per GPU (sbatch --gpus-per-node unless --device cpu); "
                   "default: --nproc-per-node")
    g.add_argument("--partition", default=None, help="sbatch --partition")
    g.add_argument("--time", default=None, help="sbatch --time (e.g. 01:00:00); default: the partition's")
    g.add_argument("--account", default=None, help="sbatch --account")
    g.add_argument("--job-name", default="dlscale", help="sbatch --job-name")
    g.add_argument("--cpus-per-task", type=int, default=None,
                   help="sbatch --cpus-per-task (torchrun mode: CPUs for all of a node's processes)")
    g.add_argument("--sbatch-option", action="append", default=[], metavar="OPTION",
                   help="extra sbatch option written as an #SBATCH line, repeatable "
                   "(e.g. --sbatch-option=--exclusive)")
    p.add_argument("--store", default="results", help="result store directory, shared by every node")
    p.add_argument("--mode", default="torchrun", choices=MODES,
                   help="torchrun: one dlscale run (torchrun) per node; srun: one Slurm task per process")
    p.add_argument("--port", type=int, default=None,
                   help="rendezvous port on the first node (default: 20000 + job id %% 10000)")
    p.add_argument("--python", default=sys.executable, help="python on the compute nodes that has dlscale")
    p.add_argument("--script", default=None, help="where to write the job script (default STORE/slurm/)")
    p.add_argument("--dry-run", action="store_true", help="print the job script; write and submit nothing")
    p.set_defaults(func=cmd_slurm)

    # one Slurm task per process (--mode srun); started by the job script, not by users
    t = sub.add_parser("slurm-task", formatter_class=fmt,
                       description="Inside a job step: run this task's rank of the case (dlscale slurm --mode srun).")
    add_case_arguments(t)
    t.add_argument("--nnodes", type=int, default=1, help="nodes of the case")
    t.add_argument("--store", default="results", help="result store directory")
    t.add_argument("--port", type=int, default=None, help="MASTER_PORT base (default: 20000 + job id %% 10000)")
    t.add_argument("--verbose", "-v", action="store_true", help="stream the worker's output")
    t.set_defaults(func=cmd_task)


# ------------------------------------------------------------------------------ cases

def static_check(cfg: RunConfig) -> None:
    """What can be checked on a login node (no GPU needed): names, degrees, world size."""
    from dlscale.config import validate_case

    validate_case(cfg)


def cases_from_args(args) -> tuple[list[tuple[RunConfig, bool]], int | None]:
    """The job's cases as (config, batch_max) pairs, each run on nodes x per_node processes, and
    the cap of the largest-batch search (``--max-batch-cap``, else the suite's ``max_batch_cap``).

    ``batch_max``: the case asks for the largest batch that fits (``--batch-size max``, or a
    suite case with ``batch_size: max``); its config's batch size is the search start.
    """
    cap = args.max_batch_cap
    if cap is not None and cap < 1:
        raise ConfigError(f"--max-batch-cap must be >= 1, got {cap}")
    if args.nodes is None or args.nodes < 1:
        raise ConfigError(f"nodes must be >= 1, got {args.nodes}")
    per_node = args.gpus_per_node if args.gpus_per_node is not None else args.nproc_per_node
    if per_node is None or per_node < 1:
        raise ConfigError(f"gpus-per-node must be >= 1, got {per_node}")
    layout = {"nnodes": args.nodes, "nproc_per_node": per_node}
    if args.suite:
        try:
            from dlscale.suite import load_suite
        except ModuleNotFoundError as e:
            if e.name != "dlscale.suite":
                raise
            raise ConfigError(f"suites are not available in this build (no dlscale.suite); give the case "
                              f"options instead of {args.suite!r}") from None
        loaded = load_suite(args.suite)
        if cap is None:
            cap = (getattr(loaded, "settings", None) or {}).get("max_batch_cap")
        cfgs = list(loaded.cases) if hasattr(loaded, "cases") else list(loaded[1])
        flags = list(getattr(loaded, "batch_max", None) or [False] * len(cfgs))
        seen, cases = set(), []
        device = {"device": args.device} if args.device != "auto" else {}  # --device cpu|cuda: every case
        for c, batch_max in zip(cfgs, flags):  # each case keeps its layout; it must fit the allocation
            c = RunConfig.from_dict({**c.to_dict(), **device})
            if c.nnodes > args.nodes or c.nproc_per_node > per_node:
                raise ConfigError(f"suite case {c.model}/{c.strategy} on {c.nnodes} node(s) x {c.nproc_per_node} "
                                  f"does not fit the allocation of {args.nodes} x {per_node}; raise --nodes or "
                                  f"--gpus-per-node")
            if (c.case_key(), batch_max) not in seen:
                seen.add((c.case_key(), batch_max))
                cases.append((c, bool(batch_max)))
    else:
        batch_max = args.batch_size == "max"
        over = {"batch_size": getattr(args, "max_batch_start", None) or 8} if batch_max else {}
        cases = [(config_from_args(args, **layout, **over), batch_max)]
    if not cases:
        raise ConfigError(f"suite {args.suite!r} has no cases")
    for c, batch_max in cases:
        if batch_max and (c.nnodes > 1 or args.mode != "torchrun"):
            raise ConfigError("batch size max (the largest that fits) runs only on one node in torchrun mode; "
                              "give a batch size")
        static_check(c)
        check_round_trip(c, batch_max)
    return cases, cap


def case_cli_args(cfg: RunConfig, batch_max: bool = False) -> list[str]:
    """`dlscale run` options that rebuild ``cfg`` exactly (checked by ``check_round_trip``)."""
    a = ["--model", cfg.model, "--flavor", cfg.flavor, "--strategy", cfg.strategy,
         "--nproc-per-node", str(cfg.nproc_per_node), "--batch-size", "max" if batch_max else str(cfg.batch_size),
         "--precision", cfg.precision, "--grad-accum", str(cfg.grad_accum), "--warmup", str(cfg.warmup),
         "--steps", str(cfg.steps), "--repeats", str(cfg.repeats), "--device", cfg.device,
         "--seed", str(cfg.seed), "--time-limit", repr(float(cfg.time_limit)),
         "--collective-timeout", repr(float(cfg.collective_timeout))]
    if cfg.compile:
        a += ["--compile", "--compile-mode", cfg.compile_mode]
        a += option_args("--inductor-option", cfg.inductor_options)
    if cfg.clip_grad_norm is not None:
        a += ["--clip-grad-norm", repr(float(cfg.clip_grad_norm))]
    if cfg.activation_checkpointing != "none":
        a += ["--activation-checkpointing", cfg.activation_checkpointing]
    a += option_args("--option", cfg.strategy_options)
    if cfg.label is not None:
        a += ["--label", cfg.label]
    # fields added to RunConfig after the core (getattr: older configs lack them)
    if getattr(cfg, "monitor", True) is False:
        a.append("--no-monitor")
    if hasattr(cfg, "sample_interval"):
        a += ["--sample-interval", repr(float(cfg.sample_interval))]
    if getattr(cfg, "breakdown", False):
        a.append("--breakdown")
    if getattr(cfg, "profile", False):
        a.append("--profile")
    if cfg.inject_failure is not None:
        a += ["--inject-failure", cfg.inject_failure]
    if batch_max:
        a += ["--max-batch-start", str(cfg.batch_size)]
    return a


def check_round_trip(cfg: RunConfig, batch_max: bool = False) -> None:
    """The job must measure exactly ``cfg``: parse the options it will pass and compare.

    A RunConfig field that ``case_cli_args`` does not know yet fails here, before submission,
    instead of silently running another case on the cluster.
    """
    from dlscale.cli import build_parser

    argv = case_cli_args(cfg, batch_max)
    ns = build_parser().parse_args(["run", *argv])
    over = {"batch_size": ns.max_batch_start} if batch_max else {}
    got = config_from_args(ns, nnodes=cfg.nnodes, **over).to_dict()
    want = cfg.to_dict()
    diff = sorted(k for k in want if got.get(k) != want[k])
    if diff:
        raise DlscaleError(f"dlscale slurm cannot pass {', '.join(diff)} to the job's `dlscale run` "
                           f"(extend commands/slurm.py case_cli_args)")


# ------------------------------------------------------------------------------ script

def render_script(cases: list[tuple[RunConfig, bool]] | list[RunConfig], *, nodes: int, per_node: int,
                  store: str, mode: str = "torchrun",
                  python: str = sys.executable, job_name: str = "dlscale", partition: str | None = None,
                  time: str | None = None, account: str | None = None, port: int | None = None,
                  sbatch_options: list[str] | None = None, output_dir: str | None = None,
                  command: str | None = None, cpus_per_task: int | None = None,
                  max_batch_cap: int | None = None) -> str:
    """The sbatch script (bash) for ``cases`` on ``nodes`` x ``per_node`` processes.

    ``max_batch_cap``: passed to every ``--batch-size max`` case (the suite's or the user's cap).
    """
    q = shlex.quote
    cases = [c if isinstance(c, tuple) else (c, False) for c in cases]
    gpu = any(c.device != "cpu" for c, _ in cases)
    out_dir = output_dir or str(Path(store) / "slurm")
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={nodes}",
             f"#SBATCH --ntasks-per-node={1 if mode == 'torchrun' else per_node}"]
    if gpu:
        lines.append(f"#SBATCH --gpus-per-node={per_node}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if time:
        lines.append(f"#SBATCH --time={time}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    if cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={int(cpus_per_task)}")
    lines.append(f"#SBATCH --output={out_dir}/%x-%j.out")
    for opt in sbatch_options or []:
        lines.append(f"#SBATCH {opt}")
    lines += [
        f"# dlscale slurm job: {len(cases)} case(s) on {nodes} node(s) x {per_node} process(es), "
        f"mode {mode}",
    ]
    if command:
        lines.append(f"# generated by: {command}")
    lines += [
        "set -u",
        "export DLSCALE_SLURM=1 PYTHONUNBUFFERED=1",
        "unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK  # from the submitting shell, if any",
        'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"port={int(port)}" if port else "port=$((20000 + SLURM_JOB_ID % 10000))",
        'echo "dlscale slurm: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (first node $head)"',
        "status=0",
        "step() {  # one case = one job step; a failed case does not stop the next",
        '    "$@"',
        "    rc=$?",
        '    echo "dlscale slurm: case exit code $rc"',
        '    if [ "$status" -eq 0 ] && [ "$rc" -ne 0 ]; then status=$rc; fi',
        "}",
    ]
    # --kill-on-bad-exit=0: a node that fails first must not take the node that records with it;
    # --wait=0: no Slurm limit after the first task ends (each dlscale bounds itself in time).
    # Each case runs on its own layout (cfg.nnodes x cfg.nproc_per_node, within the allocation).
    for i, (cfg, batch_max) in enumerate(cases):
        n, g = cfg.nnodes, cfg.nproc_per_node
        srun = f"srun --nodes={n} --kill-on-bad-exit=0 --wait=0"
        if gpu:  # every task of a node sees all its GPUs; the worker picks cuda:LOCAL_RANK
            srun += f" --gpus-per-node={g}"
        cap = ["--max-batch-cap", str(max_batch_cap)] if (batch_max and max_batch_cap) else []
        args = " ".join(q(a) for a in case_cli_args(cfg, batch_max) + cap)
        lines.append(f"# case {i + 1}/{len(cases)}: {cfg.model}/{cfg.strategy} on {n} x {g}, {cfg.case_key()}")
        if mode == "torchrun":
            rdzv = f' --nnodes {n} --rdzv-endpoint "$head:$((port + {i}))"' if n > 1 else " --nnodes 1"
            lines.append(f"step {srun} --ntasks={n} --ntasks-per-node=1 {q(python)} -m dlscale run "
                         f"--store {q(store)} {args}{rdzv}")
        else:
            lines.append(f"step {srun} --ntasks={n * g} --ntasks-per-node={g} {q(python)} "
                         f"-m dlscale slurm-task --store {q(store)} {args} --nnodes {n} "
                         f"--port $((port + {i * 100}))")
    lines += ['echo "dlscale slurm: done, exit $status"', "exit $status", ""]
    return "\n".join(lines)


def cmd_slurm(args) -> int:
    from dlscale.store import ResultStore

    cases, cap = cases_from_args(args)
    per_node = args.gpus_per_node if args.gpus_per_node is not None else args.nproc_per_node
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"port must be 1-65535, got {args.port}")
    store = str(Path(args.store).expanduser().resolve())
    command = "dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else None
    out_dir = str(Path(store) / "slurm")
    script = render_script(cases, nodes=args.nodes, per_node=per_node, store=store, mode=args.mode,
                           python=args.python, job_name=args.job_name, partition=args.partition,
                           time=args.time, account=args.account, port=args.port,
                           sbatch_options=args.sbatch_option, output_dir=out_dir, command=command,
                           cpus_per_task=args.cpus_per_task, max_batch_cap=cap)
    if args.dry_run:
        print(script, end="")
        return 0
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        raise ConfigError("sbatch not found on PATH: run on a Slurm login node, or use --dry-run to print the script")
    ResultStore(store).check_writable()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(args.script) if args.script else Path(out_dir) / f"{args.job_name}-{stamp}-{os.getpid()}.sbatch"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    r = subprocess.run([sbatch, "--parsable", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        msg = (r.stderr.strip() or r.stdout.strip() or f"exit {r.returncode}").splitlines()[-1]
        raise DlscaleError(f"sbatch refused the job ({path}): {msg}")
    job = r.stdout.strip().split(";")[0]
    print(f"submitted job {job}: {len(cases)} case(s) on {args.nodes} node(s) x {per_node}, mode {args.mode}")
    print(f"script {path}")
    print(f"output {out_dir}/{args.job_name}-{job}.out")
    print(f"records -> {ResultStore(store).file}")
    return 0


# ------------------------------------------------------------------ srun mode: one task per rank

def slurm_task_env(cfg: RunConfig, port: int, env: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """torch.distributed's variables for this Slurm task (rank = SLURM_PROCID ...)."""
    from dlscale import multinode

    if "SLURM_PROCID" not in env:
        raise ConfigError("slurm-task runs inside a Slurm job step (srun); use `dlscale slurm --mode srun`")
    multinode.check_slurm_allocation(cfg.nnodes, cfg.nproc_per_node, mode="srun",
                                     env={**env, multinode.SLURM_MARK_ENV: "1"})
    world = int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or 1)
    if world != cfg.world_size:
        raise ConfigError(f"the Slurm step has {world} task(s) but the case needs {cfg.world_size}")
    probe = {k: v for k, v in env.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}  # never a stale one
    multinode.slurm_rendezvous_env(probe)
    return {"RANK": env["SLURM_PROCID"], "WORLD_SIZE": str(world),
            "LOCAL_RANK": env.get("SLURM_LOCALID", "0"), "LOCAL_WORLD_SIZE": str(cfg.nproc_per_node),
            "GROUP_RANK": env.get("SLURM_NODEID", "0"), "MASTER_ADDR": probe["MASTER_ADDR"],
            "MASTER_PORT": str(port)}


def cmd_task(args) -> int:
    from dlscale import envinfo, launch, multinode
    from dlscale.cli import STATUS_EXIT
    from dlscale.config import validate_for_launch
    from dlscale.models import get_model
    from dlscale.procs import spawn
    from dlscale.store import ResultStore, new_record
    from dlscale.strategies import get_strategy

    cfg = config_from_args(args, nnodes=args.nnodes)
    base_port = args.port or multinode.slurm_master_port()
    task_env = slurm_task_env(cfg, base_port)
    rank = int(task_env["RANK"])
    device_type = validate_for_launch(cfg)
    store = ResultStore(args.store)
    if rank == 0:
        store.check_writable()
    spec = get_model(cfg.model, cfg.flavor)
    reason = get_strategy(cfg.strategy).check
    reason = reason(cfg, {"device_type": device_type}) if reason else None
    base = dict(kind="run", case_key=cfg.case_key(), label=cfg.label,
                command="dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
                config=cfg.to_dict(), device_type=device_type, world_size=cfg.world_size)
    if reason:
        if rank == 0:
            store.append(new_record(status="unsupported", error=reason, ranks=[], repeats=[], summary=None,
                                    env=envinfo.capture(), **base))
        return STATUS_EXIT["unsupported"]
    env_info = envinfo.capture() if rank == 0 else None
    repeats: list[dict] = []
    status, error = "ok", None
    rank_results: list[dict] = []
    ranks_ok: list[dict] = []
    world = None
    with tempfile.TemporaryDirectory(prefix="dlscale-task-") as keep:
        node_dir = Path(keep)
        for i in range(cfg.repeats):
            for p in node_dir.glob("*.json"):
                p.unlink()
            with tempfile.TemporaryDirectory(prefix="dlscale-case-") as tmp:
                (Path(tmp) / "config.json").write_text(json.dumps(cfg.to_dict()))
                env = {**task_env, "MASTER_PORT": str(base_port + i), multinode.NODE_DIR_ENV: keep}
                proc = spawn([sys.executable, "-m", launch.WORKER_MODULE, "--config", str(Path(tmp) / "config.json"),
                              "--out", tmp], cfg.time_limit, env=env,
                             on_line=(lambda line: print(line, file=sys.stderr)) if args.verbose else None)
                rank_results = launch.read_rank_files(Path(tmp))
            # every rank's own outcome (the window ends in collectives: one failed rank fails all)
            status_i, error_i = launch.classify(proc.returncode, proc.timed_out, rank_results, 1, proc.output_tail)
            if status_i != "ok" and error_i and not rank_results:
                error_i = f"rank {rank}: " + error_i
            entry = launch.repeat_entry(i, cfg, rank_results, status_i, error_i, proc.seconds, proc.started)
            repeats.append(entry)
            print(f"dlscale slurm-task rank {rank}: repeat {i + 1}/{cfg.repeats} {status_i}"
                  + (f": {error_i}" if error_i else ""), file=sys.stderr, flush=True)
            world = multinode._read_json(node_dir / multinode.WORLD_FILE) or world
            if status_i != "ok":
                if not args.verbose and proc.output_tail:  # the job's output file says why
                    print("\n".join(proc.output_tail.splitlines()[-30:]), file=sys.stderr, flush=True)
                status, error = status_i, error_i
                if proc.output_tail and status_i == "failed":
                    entry["output_tail"] = proc.output_tail[-4000:]
                break
            ranks_ok = rank_results
        if rank != 0:
            return STATUS_EXIT[status]
        ok_ranks = ranks_ok if status == "ok" else rank_results
        dp_size = next((r.get("dp_size") for r in rank_results if r.get("dp_size")), None)
        rec = new_record(
            status=status, error=error, env=env_info,
            ranks=[{k: r.get(k) for k in ("rank", "local_rank", "host", "device", "device_name", "pid")}
                   for r in rank_results],
            model={"params": next((r.get("params") for r in rank_results if r.get("params")), None),
                   "flops_per_sample": spec.flops_per_sample, "unit": spec.unit, "seq_len": spec.seq_len},
            global_batch=cfg.batch_size * cfg.grad_accum * dp_size if dp_size else None,
            tf32=next((r.get("tf32") for r in ok_ranks if "tf32" in r), None),
            strategy_info=next((r.get("strategy_info") for r in ok_ranks if r.get("strategy_info")), None),
            repeats=repeats,
            summary=launch.summarize_case(cfg, spec, repeats, ok_ranks, device_type)
            if any(r["status"] == "ok" for r in repeats) else None,
            **base)
        multinode.complete_record(rec, node_dir)
        rec["rendezvous"] = {"backend": "slurm-srun", "nnodes": cfg.nnodes, "master_addr": task_env["MASTER_ADDR"],
                             "master_port": base_port, "job_id": os.environ.get("SLURM_JOB_ID")}
        rec["recorded_by"] = {"host": socket.gethostname(), "addr": multinode.local_addr(task_env["MASTER_ADDR"]),
                              "node_rank": int(task_env["GROUP_RANK"]), "role": "lead"}
    store.append(rec)
    print(f"dlscale slurm-task: case {status}; record {rec['id'][:12]} appended to {store.file}"
          + (f"; {rec['error']}" if rec["error"] else ""), flush=True)
    return STATUS_EXIT[status]
