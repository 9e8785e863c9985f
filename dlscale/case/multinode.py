"""Multi-node runs: rendezvous options, every node's hosts in one record, failure attribution.

One ``dlscale run`` per node, as with torchrun itself::

    # static: node 0 hosts the store on MASTER_ADDR:MASTER_PORT
    dlscale run ... --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --master-port 29500   # node 0
    dlscale run ... --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --master-port 29500   # node 1
    # dynamic (c10d): any node may host the endpoint, torchrun assigns node ranks
    dlscale run ... --nnodes 2 --rdzv-endpoint head:29500                                 # every node

Each node's launcher only sees the rank files of its own workers. So that the record still
holds the whole job:

* right after ``init_process_group`` every worker contributes ``{rank, node_rank, host, addr,
  device, ...}`` to an ``all_gather_object``; global rank 0 writes the list to ``world.json``
  in a node-local directory the launcher passed in ``DLSCALE_NODE_DIR``;
* a worker that fails publishes ``{rank, host, addr, error}`` in the job's c10d store (the
  first failure gets sequence number 1), and notes the first failure it can see, so the node
  that writes the record can say which rank on which node failed first, even when it was a
  rank of another node;
* exactly one node appends the record: the one whose workers include global rank 0 (the
  *lead*, ``recorded_by.role == "lead"``). Other nodes print their outcome and exit with the
  same status code, writing nothing (no duplicate records), whichever node hosts the c10d
  endpoint. Only when no worker of a node reported a rank (the rendezvous never completed) does
  the node that hosts the rendezvous (static: node rank 0; c10d: the machine owning the
  endpoint address) record (``is_lead``).

Hosts are told apart by ``host`` (hostname), ``addr`` (the address this node uses to reach
the master/rendezvous host) and ``node_rank``: nodes sharing a hostname (containers, network
namespaces) still differ by address and node rank.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from dlscale import ConfigError
from dlscale.case import procs
from dlscale.case.procs import Rendezvous

NODE_DIR_ENV = "DLSCALE_NODE_DIR"
SLURM_MARK_ENV = "DLSCALE_SLURM"  # set by the job scripts of `dlscale slurm`
WORLD_FILE = "world.json"
STORE_PREFIX = "dlscale/"
DEFAULT_MASTER_PORT = 29500


# ---------------------------------------------------------------- CLI options (dlscale run)

def add_rendezvous_arguments(p: argparse.ArgumentParser) -> None:
    """torchrun's multi-node options, as `dlscale run` takes them (one command per node); --nnodes
    is a case option (dlscale/case/config.py)."""
    g = p.add_argument_group("multi-node (one `dlscale run` per node; see docs/multinode.md)")
    g.add_argument("--node-rank", type=int, default=None,
                   help="this machine's rank, 0..nnodes-1 (static rendezvous with --master-addr)")
    g.add_argument("--master-addr", default=None, help="address of node rank 0 (static rendezvous)")
    g.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT,
                   help="port on the master for the rendezvous store (static rendezvous)")
    g.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="c10d rendezvous endpoint (dynamic: torchrun assigns node ranks)")
    g.add_argument("--max-restarts", type=int, default=0,
                   help="restarts of the worker group by torchrun's elastic agent before the repeat fails")


def _endpoint(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"rdzv-endpoint must look like HOST:PORT (port 1-65535), got {value!r}")
    return host, int(port)


def rendezvous_from_args(args: argparse.Namespace, nproc_per_node: int = 1) -> Rendezvous | None:
    """Validated Rendezvous for the options, or None for a single-node (standalone) run.

    Bad input raises ConfigError (one line, exit 2) before anything starts.
    """
    nnodes = args.nnodes
    if nnodes is None or nnodes < 1:
        raise ConfigError(f"nnodes must be >= 1, got {nnodes}")
    node_rank = args.node_rank
    if node_rank is not None and not 0 <= node_rank < nnodes:
        raise ConfigError(f"node-rank {node_rank} is out of range for --nnodes {nnodes} "
                          f"(allowed: 0..{nnodes - 1})")
    if args.max_restarts is None or args.max_restarts < 0:
        raise ConfigError(f"max-restarts must be >= 0, got {args.max_restarts}")
    if args.master_addr and args.rdzv_endpoint:
        raise ConfigError("give either --master-addr (static, with --node-rank) or --rdzv-endpoint (c10d), not both")
    port = args.master_port
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"master-port must be 1-65535, got {port}")
    if args.master_addr is not None and not args.master_addr.strip():
        raise ConfigError("master-addr is empty")
    if args.rdzv_endpoint is not None:
        _endpoint(args.rdzv_endpoint)
    if nnodes > 1 and not args.master_addr and not args.rdzv_endpoint:
        raise ConfigError(f"a multi-node run (--nnodes {nnodes}) needs --master-addr ADDR with --node-rank R, "
                          f"or --rdzv-endpoint HOST:PORT")
    if nnodes > 1 and args.master_addr and node_rank is None:
        raise ConfigError(f"a static multi-node run (--nnodes {nnodes} --master-addr) needs --node-rank "
                          f"(0..{nnodes - 1})")
    check_slurm_allocation(nnodes, nproc_per_node)
    if nnodes == 1 and not args.master_addr and not args.rdzv_endpoint and not args.max_restarts:
        return None
    return Rendezvous(nnodes=nnodes, node_rank=node_rank or 0, master_addr=args.master_addr,
                      master_port=port if args.master_addr else None, rdzv_endpoint=args.rdzv_endpoint,
                      max_restarts=args.max_restarts,
                      join_timeout=getattr(args, "collective_timeout", None) if nnodes > 1 else None)


def is_multinode(rdzv: Rendezvous | None) -> bool:
    return rdzv is not None and rdzv.nnodes > 1


# ------------------------------------------------------------------------------ Slurm

def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm host list -> host names (``scontrol show hostnames``; a pure-Python fallback).

    The fallback understands ``a[1-3,7],b05`` and zero-padded ranges.
    """
    if not nodelist:
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()
    except (OSError, subprocess.SubprocessError):
        pass
    hosts: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = m.group(1), m.group(2)
        if not ranges:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                hosts.append(prefix + lo)
                continue
            for i in range(int(lo), int(hi) + 1):
                hosts.append(f"{prefix}{i:0{len(lo)}d}")
    return hosts


def slurm_master_port(env: dict[str, str] | os._Environ = os.environ) -> int:
    """A port for rank 0's store that differs between jobs sharing a node: 20000 + job id % 10000."""
    job = env.get("SLURM_JOB_ID", "")
    return 20000 + int(job) % 10000 if job.isdigit() else DEFAULT_MASTER_PORT


def slurm_rendezvous_env(env: dict[str, str] | os._Environ = os.environ) -> None:
    """For ranks started by srun (no torchrun): set MASTER_ADDR/MASTER_PORT when missing.

    MASTER_ADDR is the first host of the step's node list (where SLURM_PROCID 0 runs under the
    default block distribution); MASTER_PORT is ``slurm_master_port``. Values already in the
    environment win.
    """
    if not env.get("MASTER_ADDR"):
        nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
                                or env.get("SLURM_NODELIST") or "")
        env["MASTER_ADDR"] = nodes[0] if nodes else "127.0.0.1"
    if not env.get("MASTER_PORT"):
        env["MASTER_PORT"] = str(slurm_master_port(env))


def check_slurm_allocation(nnodes: int, nproc_per_node: int, mode: str = "torchrun",
                           env: dict[str, str] | os._Environ = os.environ) -> None:
    """Inside a job step of `dlscale slurm`: the step must match the requested world.

    torchrun mode: one task (one dlscale launcher) per node, ``nnodes`` nodes.
    srun mode: ``nnodes * nproc_per_node`` tasks over ``nnodes`` nodes.
    Only checked when the job script marked the step (``DLSCALE_SLURM=1``), so a plain
    `dlscale run` inside an interactive allocation is not second-guessed.
    """
    if env.get(SLURM_MARK_ENV) != "1" or "SLURM_JOB_ID" not in env:
        return
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    tasks = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS")
    want_tasks = nnodes if mode == "torchrun" else nnodes * nproc_per_node
    if nodes and nodes.isdigit() and int(nodes) != nnodes:
        raise ConfigError(f"the Slurm allocation has {nodes} node(s) but the case asks for {nnodes} "
                          f"(world {nnodes * nproc_per_node}); submit with --nodes {nnodes}")
    if tasks and tasks.isdigit() and int(tasks) != want_tasks:
        per = "one dlscale launcher per node" if mode == "torchrun" else "one task per process"
        raise ConfigError(f"the Slurm step has {tasks} task(s) but the case needs {want_tasks} ({per}; "
                          f"world {nnodes * nproc_per_node} = {nnodes} node(s) x {nproc_per_node})")


# ------------------------------------------------------------------------- worker hooks

def _node_rank_from_env() -> int:
    for key in ("GROUP_RANK", "SLURM_NODEID"):
        v = os.environ.get(key)
        if v and v.isdigit():
            return int(v)
    return 0


def local_addr(peer: str | None = None) -> str | None:
    """The local address used to reach ``peer`` (the master): tells apart nodes sharing a hostname."""
    peer = peer or os.environ.get("MASTER_ADDR")
    if peer:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((peer, 9))  # UDP: no packet is sent, only the route is looked up
                return s.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return None


def _device_name(device) -> str:
    if getattr(device, "type", None) == "cuda":
        import torch  # torch: keeps start-up light

        return torch.cuda.get_device_name(device)
    return "cpu"


def after_init(denv, result: dict[str, Any]) -> None:
    """Worker hook after init_process_group: who is where, gathered on every rank.

    Only when the launcher asked for it (``DLSCALE_NODE_DIR`` set: multi-node runs). Every rank
    adds its node rank and address to its own result; rank 0 writes the whole list to
    ``world.json`` at once (before training, so a time-out or crash later still has it).
    """
    node_dir = os.environ.get(NODE_DIR_ENV)
    if not node_dir:
        return
    import torch.distributed as dist  # torch: keeps start-up light

    mine = {"rank": denv.rank, "local_rank": denv.local_rank, "node_rank": _node_rank_from_env(),
            "host": socket.gethostname(), "addr": local_addr(), "device": str(denv.device),
            "device_name": _device_name(denv.device), "pid": os.getpid()}
    result["node_rank"], result["addr"] = mine["node_rank"], mine["addr"]
    world: list[Any] = [None] * denv.world_size
    dist.all_gather_object(world, mine)
    if denv.rank == 0:
        _write_json(Path(node_dir) / WORLD_FILE, sorted(world, key=lambda r: r["rank"]))


def restart_store(denv, timeout_s: float) -> dict[str, Any]:
    """init_process_group's ``store`` for a worker group torchrun restarted (--max-restarts).

    torchrun hands restarted workers the same store; without a per-attempt prefix they read
    the previous attempt's gloo/NCCL addresses and fail to connect (seen with torch 2.13; cf.
    pytorch/pytorch#167288). Empty (the default env:// init) on the first attempt.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if not attempt.isdigit() or int(attempt) == 0 or "MASTER_ADDR" not in os.environ:
        return {}
    import torch.distributed as dist  # torch: keeps start-up light

    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), denv.world_size,
                          is_master=denv.rank == 0 and not agent_hosts,
                          timeout=_dt.timedelta(seconds=timeout_s), multi_tenant=not agent_hosts)
    return {"store": dist.PrefixStore(f"{STORE_PREFIX}attempt{attempt}", store)}


def on_failure(denv, result: dict[str, Any], wait_s: float = 0.5) -> None:
    """Worker hook when a rank fails: publish the failure, note the first one of the job.

    The c10d store of the process group (hosted by the master/rendezvous agent) gives each
    failure a sequence number; the failing rank waits ``wait_s`` for peers' reports and writes
    ``failure<R>.json`` (its error, the job's first failure and every failure seen) into the
    node directory. Store operations use short time-outs: a lost store host costs seconds.
    """
    node_dir = os.environ.get(NODE_DIR_ENV)
    if not node_dir:
        return
    me = {"rank": denv.rank, "node_rank": result.get("node_rank", _node_rank_from_env()),
          "host": socket.gethostname(), "addr": result.get("addr") or local_addr(),
          "status": result.get("status"), "error": result.get("error"), "time": time.time()}
    report: dict[str, Any] = {"self": me, "first": None, "seen": []}
    try:
        import torch.distributed as dist  # optional: torch

        if dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            store.set_timeout(_dt.timedelta(seconds=3))
            n = store.add(STORE_PREFIX + "failures", 1)
            store.set(f"{STORE_PREFIX}failure/{n}", json.dumps(me))
            time.sleep(wait_s)
            total = store.add(STORE_PREFIX + "failures", 0)
            seen = []
            for i in range(1, total + 1):
                key = f"{STORE_PREFIX}failure/{i}"
                try:
                    store.wait([key], _dt.timedelta(seconds=1))
                    seen.append(json.loads(store.get(key)))
                except Exception:  # a peer that took its number and died before setting it
                    continue
            report["seen"] = seen
            report["first"] = seen[0] if seen else me
    except Exception as e:  # the store host may be the node that was lost
        report["store_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
    try:
        _write_json(Path(node_dir) / f"failure{denv.rank}.json", report)
    except OSError:
        pass


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, path)


# --------------------------------------------------------------------------- launcher side

def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _hosts_endpoint(host: str) -> bool:
    """Is ``host`` an address of this machine? (binding to it only works locally)"""
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return False
    for info in infos:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((info[4][0], 0))
                return True
        except OSError:
            continue
    return False


def _where(r: dict[str, Any]) -> str:
    return f"node {r.get('node_rank')}, {r.get('host')} {r.get('addr') or ''}".rstrip()


def describe_failure(world: list[dict] | None, reports: list[dict]) -> str | None:
    """One line: the job's first failing rank (and where), and ranks that never reported.

    ``reports`` are this node's ``failure<R>.json`` contents.
    """
    if not reports:
        return None
    first = next((r["first"] for r in reports if r.get("first")), None)
    reported = {r["self"]["rank"] for r in reports}
    for r in reports:
        reported |= {s.get("rank") for s in r.get("seen") or []}
    parts = []
    if first:
        parts.append(f"rank {first['rank']} ({_where(first)}) failed first: {first.get('error')}")
    if world:
        lost = [w for w in world if w["rank"] not in reported]
        if lost:
            by_node: dict[Any, list[dict]] = {}
            for w in lost:
                by_node.setdefault(w.get("node_rank"), []).append(w)
            where = "; ".join(f"ranks {[w['rank'] for w in ws]} on {_where(ws[0])}" for ws in by_node.values())
            parts.append(f"no failure report from {where} (process killed or node lost)")
    return "; ".join(parts) if parts else None


def nodes_of(world: list[dict]) -> list[dict[str, Any]]:
    nodes: dict[Any, dict[str, Any]] = {}
    for w in world:
        n = nodes.setdefault(w.get("node_rank"), {"node_rank": w.get("node_rank"), "host": w.get("host"),
                                                   "addr": w.get("addr"), "ranks": [], "devices": []})
        n["ranks"].append(w["rank"])
        n["devices"].append(w.get("device_name") or w.get("device"))
    return [nodes[k] for k in sorted(nodes, key=lambda k: (k is None, k))]


def _rdzv_info(rdzv: Rendezvous) -> dict[str, Any]:
    if rdzv.rdzv_endpoint:
        return {"backend": "c10d", "nnodes": rdzv.nnodes, "endpoint": rdzv.rdzv_endpoint,
                "max_restarts": rdzv.max_restarts}
    return {"backend": "static", "nnodes": rdzv.nnodes, "master_addr": rdzv.master_addr,
            "master_port": rdzv.master_port or DEFAULT_MASTER_PORT, "node_rank": rdzv.node_rank,
            "max_restarts": rdzv.max_restarts}


def complete_record(rec, node_dir: Path) -> list[dict] | None:
    """Add the whole job's ranks and nodes (``world.json``) and, for a failed case, which rank
    failed first and where (``failure<R>.json``) to the Record; returns the world list or None."""
    world = _read_json(node_dir / WORLD_FILE)
    if world:
        rec.ranks = [{k: w.get(k) for k in ("rank", "local_rank", "node_rank", "host", "addr", "device",
                                            "device_name", "pid", "threads")} for w in world]
        rec.nodes = nodes_of(world)
    if rec.status not in ("ok", "unsupported"):
        reports = [r for r in (_read_json(p) for p in sorted(node_dir.glob("failure*.json"))) if r]
        why = describe_failure(world, reports)
        if why:
            last = rec.repeats[-1] if rec.repeats else {}
            if rec.status == "timeout":  # keep the time-out's own wording first
                why = f"{rec.error}; {why}"
            last["local_error"] = last.get("error")
            last["error"] = rec.error = why
    return world


def is_lead(world_written: bool, local_ranks: list[Any], rdzv: Rendezvous,
            hosts_endpoint: Callable[[str], bool] = lambda host: _hosts_endpoint(host)) -> bool:
    """Whether this node writes the case's record: exactly one node of the job does.

    ``local_ranks``: the global ranks this node's workers reported. torchrun hands out global
    ranks only once the rendezvous completed, so a node whose workers reported any knows: it
    leads iff it ran global rank 0 (whose worker writes world.json), whoever hosts the endpoint.
    Only when no worker reported (the rendezvous never completed) does the rendezvous host
    record: node rank 0 (static), or the machine owning the c10d endpoint address.
    """
    if world_written:
        return True  # only global rank 0 writes world.json
    ranks = [r for r in local_ranks if isinstance(r, int) and not isinstance(r, bool)]
    if ranks:
        return 0 in ranks
    if rdzv.rdzv_endpoint:
        return hosts_endpoint(_endpoint(rdzv.rdzv_endpoint)[0])
    return rdzv.node_rank == 0


def finish_record(rec, node_dir: Path, rdzv: Rendezvous) -> bool:
    """Complete a node's record with the whole job; True when this node is the one to write it."""
    local_ranks = [r.get("rank") for r in rec.ranks or [] if isinstance(r, dict)]  # this node's rank files
    world = complete_record(rec, node_dir)
    lead = is_lead(bool(world), local_ranks, rdzv)
    rec.rendezvous = _rdzv_info(rdzv)
    me_addr = local_addr(rdzv.master_addr or (_endpoint(rdzv.rdzv_endpoint)[0] if rdzv.rdzv_endpoint else None))
    node_rank = world[0].get("node_rank") if world else (None if rdzv.rdzv_endpoint else rdzv.node_rank)
    rec.recorded_by = {"host": socket.gethostname(), "addr": me_addr, "node_rank": node_rank,
                       "role": "lead" if lead else "follower"}
    return lead


def measure_node(case, spawner, *, files_root=None, command: str | None = None,
                 on_event: Callable[[str, Any], None] | None = None):
    """launch.measure for one node of a multi-node job (``spawner.rdzv`` spans several nodes);
    ``case``: resolved (dlscale/case/resolve.py), or a RunConfig launch.measure resolves.

    The Record gets every node's ranks (``ranks``, ``nodes``), the rendezvous and who recorded
    it (``recorded_by.role``: "lead" on the node running global rank 0, which stores it;
    "follower" elsewhere, whose series files are removed since its record is not stored).
    """
    from dlscale.case import launch  # torch: keeps start-up light

    rdzv = spawner.rdzv
    with tempfile.TemporaryDirectory(prefix=procs.temp_prefix("node")) as tmp:  # a SIGKILL's: procs.clean_stale_tempdirs
        node_dir = Path(tmp)
        spawner.env = {**(spawner.env or {}), NODE_DIR_ENV: tmp}

        def event(kind: str, payload: Any) -> None:
            if kind == "ranks":  # the whole job's ranks, not only this node's
                world = _read_json(node_dir / WORLD_FILE)
                if world:
                    payload = world
            if on_event:
                on_event(kind, payload)

        try:
            rec = launch.measure(case, spawner, files_root=files_root, command=command, on_event=event)
        except launch.Interrupted as e:  # the lead node stores the finished repeats; a follower drops them
            if not finish_record(e.record, node_dir, rdzv):
                _drop_follower_artifacts(e.record, files_root)
                raise KeyboardInterrupt(*e.args) from None
            raise
        lead = finish_record(rec, node_dir, rdzv)
    if not lead:
        _drop_follower_artifacts(rec, files_root)
        print(f"dlscale: node {socket.gethostname()}: case {rec.status}; the record is written by the "
              f"node running global rank 0", file=sys.stderr)
    return rec


def _drop_follower_artifacts(rec, root) -> None:
    """A follower's record is not stored, so its series/trace files would be orphans: remove them.

    (Per-node utilisation of followers is therefore not kept; the lead node's is.)
    """
    paths = [p for r in rec.repeats for p in (r.get("series") or [])]
    if rec.trace:
        paths.append(rec.trace)
    for rel in paths:
        try:
            (Path(root) / rel).unlink()
        except (OSError, TypeError):
            pass


def was_recorded(rec) -> bool:
    """Whether this node stores the Record (single-node runs always do)."""
    return (rec.recorded_by or {}).get("role", "lead") == "lead"
