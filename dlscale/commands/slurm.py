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

import datetime as _dt
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from dlscale import ConfigError, DlscaleError
from dlscale.caseargs import add_case_arguments, check_round_trip, config_from_args, to_cli_args
from dlscale.config import RunConfig
from dlscale.procs import ProcResult, spawn

MODES = ("torchrun", "srun")


def register(sub) -> None:
    from dlscale.cli import deprecated_alias

    p = sub.add_parser("slurm", help="write an sbatch job for a case or a suite, and submit it",
                       description="Write an sbatch script that runs the case (or every case of SUITE) on an "
                       "allocation of --nnodes x --nproc-per-node processes (one per GPU) and submit it with "
                       "sbatch (or print it with --dry-run). Records from every job land in --store (use a "
                       "shared file system).")
    p.add_argument("suite", nargs="?", default=None, metavar="SUITE",
                   help="suite name or YAML file (each case runs on the allocation); "
                   "without it, the case options below describe one case")
    # --nnodes and --nproc-per-node are the allocation (sbatch --nodes, --gpus-per-node unless
    # --device cpu) and the case's layout; a suite's cases keep their own layouts within it
    add_case_arguments(p)
    deprecated_alias(p, "--nodes", "--nnodes", dest="nnodes", type=int)
    deprecated_alias(p, "--gpus-per-node", "--nproc-per-node", dest="nproc_per_node", type=int)
    g = p.add_argument_group("allocation")
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
    t = sub.add_parser("slurm-task",
                       description="Inside a job step: run this task's rank of the case (dlscale slurm --mode srun).")
    add_case_arguments(t)
    t.add_argument("--store", default="results", help="result store directory")
    t.add_argument("--port", type=int, default=None, help="MASTER_PORT base (default: 20000 + job id %% 10000)")
    t.add_argument("--verbose", "-v", action="store_true", help="stream the worker's output")
    t.set_defaults(func=cmd_task)


# ------------------------------------------------------------------------------ cases

def cases_from_args(args) -> list[RunConfig]:
    """The job's cases, each run on its own layout within the allocation of nnodes x nproc_per_node.

    Without a suite, the case options describe one case on the whole allocation. With one, its
    cases keep their layouts (each must fit the allocation); ``--device`` and ``--max-batch-cap``,
    where given, apply to every case.
    """
    if not args.suite:
        return [config_from_args(args)]
    from dlscale.suite import load_suite

    loaded = load_suite(args.suite)
    loaded = loaded.with_overrides(device=args.device if args.device != "auto" else None,
                                   max_batch_cap=args.max_batch_cap)
    cases = []
    for c in loaded.cases:
        if c.nnodes > args.nnodes or c.nproc_per_node > args.nproc_per_node:
            raise ConfigError(f"suite case {c.model}/{c.strategy} on {c.nnodes} node(s) x {c.nproc_per_node} "
                              f"does not fit the allocation of {args.nnodes} x {args.nproc_per_node}; raise "
                              f"--nnodes or --nproc-per-node")
        cases.append(c)
    return cases


def checked_cases(args) -> list[RunConfig]:
    """cases_from_args, each checked as a login node can (no GPU needed) and for the job's mode."""
    from dlscale.config import validate_case

    cases = cases_from_args(args)
    for c in cases:
        if c.batch_search and args.mode != "torchrun":
            raise ConfigError("batch size max (the largest that fits) runs only in torchrun mode; give a batch size")
        validate_case(c)
        check_round_trip(c)
    return cases


# ------------------------------------------------------------------------------ script

def render_script(cases: list[RunConfig], *, nodes: int, per_node: int,
                  store: str, mode: str = "torchrun",
                  python: str = sys.executable, job_name: str = "dlscale", partition: str | None = None,
                  time: str | None = None, account: str | None = None, port: int | None = None,
                  sbatch_options: list[str] | None = None, output_dir: str | None = None,
                  command: str | None = None, cpus_per_task: int | None = None) -> str:
    """The sbatch script (bash) for ``cases`` on ``nodes`` x ``per_node`` processes."""
    q = shlex.quote
    gpu = any(c.device != "cpu" for c in cases)
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
    for i, cfg in enumerate(cases):
        n, g = cfg.nnodes, cfg.nproc_per_node
        srun = f"srun --nodes={n} --kill-on-bad-exit=0 --wait=0"
        if gpu:  # every task of a node sees all its GPUs; the worker picks cuda:LOCAL_RANK
            srun += f" --gpus-per-node={g}"
        args = " ".join(q(a) for a in to_cli_args(cfg))
        lines.append(f"# case {i + 1}/{len(cases)}: {cfg.model}/{cfg.strategy} on {n} x {g}, {cfg.case_key()}")
        if mode == "torchrun":
            rdzv = f' --rdzv-endpoint "$head:$((port + {i}))"' if n > 1 else ""
            lines.append(f"step {srun} --ntasks={n} --ntasks-per-node=1 {q(python)} -m dlscale run "
                         f"--store {q(store)} {args}{rdzv}")
        else:
            lines.append(f"step {srun} --ntasks={n * g} --ntasks-per-node={g} {q(python)} "
                         f"-m dlscale slurm-task --store {q(store)} {args} "
                         f"--port $((port + {i * 100}))")
    lines += ['echo "dlscale slurm: done, exit $status"', "exit $status", ""]
    return "\n".join(lines)


def cmd_slurm(args) -> int:
    from dlscale.store import ResultStore

    cases = checked_cases(args)
    per_node = args.nproc_per_node
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError(f"port must be 1-65535, got {args.port}")
    store = str(Path(args.store).expanduser().resolve())
    command = "dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:] else None
    out_dir = str(Path(store) / "slurm")
    script = render_script(cases, nodes=args.nnodes, per_node=per_node, store=store, mode=args.mode,
                           python=args.python, job_name=args.job_name, partition=args.partition,
                           time=args.time, account=args.account, port=args.port,
                           sbatch_options=args.sbatch_option, output_dir=out_dir, command=command,
                           cpus_per_task=args.cpus_per_task)
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
    print(f"submitted job {job}: {len(cases)} case(s) on {args.nnodes} node(s) x {per_node}, mode {args.mode}")
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


class SrunTaskSpawner:
    """One Slurm task = one rank: the worker itself, with torch.distributed's variables from Slurm's
    (a fresh MASTER_PORT each repeat, so a repeat never meets the last one's store)."""

    def __init__(self, task_env: dict[str, str], base_port: int, node_dir: str, verbose: bool = False):
        from dlscale import multinode

        self.env = {**task_env, multinode.NODE_DIR_ENV: node_dir}
        self.base_port, self.verbose, self.repeat = base_port, verbose, 0

    def local_world(self, cfg: RunConfig) -> int:
        return 1

    def start(self, cfg: RunConfig, workdir: Path, env: dict[str, str]) -> ProcResult:
        from dlscale import frameworks

        for p in Path(self.env["DLSCALE_NODE_DIR"]).glob("failure*.json"):
            p.unlink()  # the last repeat's failure reports
        run_env = {**self.env, **env, "MASTER_PORT": str(self.base_port + self.repeat)}
        self.repeat += 1
        proc = spawn([sys.executable, "-m", frameworks.worker_module(cfg.framework), "--config",
                      str(workdir / "config.json"),
                      "--out", str(workdir)], cfg.time_limit, env=run_env,
                     on_line=(lambda line: print(line, file=sys.stderr)) if self.verbose else None)
        if proc.returncode != 0 and not self.verbose and proc.output_tail:  # the job's output file says why
            print("\n".join(proc.output_tail.splitlines()[-30:]), file=sys.stderr, flush=True)
        return proc


def cmd_task(args) -> int:
    from dlscale import launch, multinode
    from dlscale.cli import STATUS_EXIT
    from dlscale.store import ResultStore

    cfg = config_from_args(args)
    base_port = args.port or multinode.slurm_master_port()
    task_env = slurm_task_env(cfg, base_port)
    rank = int(task_env["RANK"])
    store = ResultStore(args.store)
    if rank == 0:
        store.check_writable()

    def event(kind: str, entry) -> None:
        if kind == "repeat":
            err = entry.get("error")
            print(f"dlscale slurm-task rank {rank}: repeat {entry['repeat'] + 1}/{cfg.repeats} {entry['status']}"
                  + (f": {err}" if err else ""), file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="dlscale-task-") as node_dir:
        spawner = SrunTaskSpawner(task_env, base_port, node_dir, args.verbose)
        rec = launch.measure(cfg, spawner, files_root=store.root if rank == 0 else None,
                             command="dlscale " + " ".join(shlex.quote(a) for a in sys.argv[1:]), on_event=event)
        if rank != 0:
            return STATUS_EXIT[rec.status]
        if rec.status not in ("ok", "unsupported") and rec.repeats and not rec.ranks:
            rec.repeats[-1]["error"] = rec.error = f"rank {rank}: {rec.error}"
        multinode.complete_record(rec, Path(node_dir))
    rec.rendezvous = {"backend": "slurm-srun", "nnodes": cfg.nnodes, "master_addr": task_env["MASTER_ADDR"],
                      "master_port": base_port, "job_id": os.environ.get("SLURM_JOB_ID")}
    rec.recorded_by = {"host": socket.gethostname(), "addr": multinode.local_addr(task_env["MASTER_ADDR"]),
                       "node_rank": int(task_env["GROUP_RANK"]), "role": "lead"}
    store.append(rec.to_dict())
    print(f"dlscale slurm-task: case {rec.status}; record {rec.id[:12]} appended to {store.file}"
          + (f"; {rec.error}" if rec.error else ""), flush=True)
    return STATUS_EXIT[rec.status]
