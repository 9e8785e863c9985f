"""Multi-node runs: rendezvous options, bad input, and two real "hosts" (network namespaces).

The two-host tests run one `dlscale run` per namespace (2 gloo processes each) across a veth
pair; they need root and `ip netns` and are skipped with the reason otherwise.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlscale import cli
from dlscale.case import multinode
from dlscale.case.procs import Rendezvous
from dlscale.results.store import ResultStore

sys.path.insert(0, str(Path(__file__).parent))
import helpers_netns  # noqa: E402

CASE = ["--model", "gpt2", "--flavor", "tiny", "--nproc-per-node", "2", "--device", "cpu", "--precision", "fp32",
        "--batch-size", "8", "--warmup", "1", "--repeats", "1", "--time-limit", "90", "--collective-timeout", "30"]


def run_args(*argv: str):
    return cli.build_parser().parse_args(["run", *argv])


# ---------------------------------------------------------------------------- options

def test_single_node_stays_standalone():
    assert multinode.rendezvous_from_args(run_args()) is None


def test_static_rendezvous_torchrun_args():
    rdzv = multinode.rendezvous_from_args(run_args("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                                                   "--master-port", "29555", "--max-restarts", "2"))
    # the join timeout is the collective timeout (default 300 s): a peer that never joins is reported then
    assert rdzv == Rendezvous(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29555, max_restarts=2,
                              join_timeout=300.0)
    assert rdzv.torchrun_args() == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                                    "--master-port", "29555", "--max-restarts", "2", "--rdzv-conf", "timeout=300"]


def test_c10d_rendezvous_torchrun_args():
    rdzv = multinode.rendezvous_from_args(run_args("--nnodes", "3", "--rdzv-endpoint", "head:29400"))
    assert rdzv.torchrun_args() == ["--nnodes", "3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "head:29400",
                                    "--rdzv-conf", "join_timeout=300"]
    assert multinode.is_multinode(rdzv)


@pytest.mark.parametrize("argv, words", [
    (["--nnodes", "2"], ["--master-addr", "--rdzv-endpoint"]),
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "10.0.0.1"], ["node-rank 2", "0..1"]),
    (["--nnodes", "2", "--node-rank", "-1", "--master-addr", "10.0.0.1"], ["node-rank -1"]),
    (["--nnodes", "2", "--master-addr", "10.0.0.1"], ["--node-rank"]),
    (["--nnodes", "2", "--node-rank", "0", "--master-addr", "a", "--rdzv-endpoint", "a:1"], ["not both"]),
    (["--nnodes", "2", "--rdzv-endpoint", "head"], ["HOST:PORT"]),
    (["--nnodes", "2", "--rdzv-endpoint", "head:99999"], ["HOST:PORT"]),
    (["--nnodes", "0"], ["nnodes"]),
    (["--nnodes", "2", "--node-rank", "1", "--master-addr", "a", "--max-restarts", "-1"], ["max-restarts"]),
    (["--nnodes", "2", "--rdzv-endpoint", "h:1", "--batch-size", "max"], ["runs on one node"]),
])
def test_bad_multinode_input_exits_2_before_training(argv, words, capsys, monkeypatch, tmp_path):
    def no_training(*a, **k):
        raise AssertionError("a process was started for bad input")

    monkeypatch.setattr("dlscale.case.launch.spawn_torchrun", no_training)
    code = cli.main(["run", *CASE, "--store", str(tmp_path), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("dlscale: error:"), err
    for w in words:
        assert w in err
    assert not (tmp_path / "results.jsonl").exists()


def test_slurm_allocation_mismatch_exits_2(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("dlscale.case.launch.spawn_torchrun", lambda *a, **k: pytest.fail("started"))
    for k, v in {"DLSCALE_SLURM": "1", "SLURM_JOB_ID": "7", "SLURM_STEP_NUM_NODES": "1",
                 "SLURM_STEP_NUM_TASKS": "1"}.items():
        monkeypatch.setenv(k, v)
    code = cli.main(["run", *CASE, "--store", str(tmp_path), "--nnodes", "2", "--rdzv-endpoint", "h:29400"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "1 node" in err and "2" in err, err  # the allocation's nodes and the case's, named
    monkeypatch.setenv("SLURM_STEP_NUM_NODES", "2")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")  # torchrun mode wants one task per node
    assert cli.main(["run", *CASE, "--store", str(tmp_path), "--nnodes", "2", "--rdzv-endpoint", "h:1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "4 task" in err, err  # the allocation's task count named



# ------------------------------------------------------------------------- Slurm helpers

def test_expand_hostlist_fallback(monkeypatch):
    def no_scontrol(*a, **k):
        raise FileNotFoundError("scontrol")

    monkeypatch.setattr(multinode.subprocess, "run", no_scontrol)
    assert multinode.expand_hostlist("gpu[01-03,07],login5") == ["gpu01", "gpu02", "gpu03", "gpu07", "login5"]
    assert multinode.expand_hostlist("n1") == ["n1"]


def test_slurm_rendezvous_env(monkeypatch):
    monkeypatch.setattr(multinode, "expand_hostlist", lambda s: {"a[3-4]": ["a3", "a4"]}[s])
    env = {"SLURM_STEP_NODELIST": "a[3-4]", "SLURM_JOB_ID": "123456"}
    multinode.slurm_rendezvous_env(env)
    assert env["MASTER_ADDR"] == "a3" and env["MASTER_PORT"] == str(20000 + 123456 % 10000)
    env = {"SLURM_STEP_NODELIST": "a[3-4]", "MASTER_ADDR": "x", "MASTER_PORT": "1"}
    multinode.slurm_rendezvous_env(env)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("x", "1")


def test_worker_takes_slurm_layout(monkeypatch):
    from dlscale.train import worker

    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(k, "x")  # recorded, so the values the worker sets are undone afterwards
        monkeypatch.delenv(k)
    for k, v in {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "2(x2)",
                 "SLURM_STEP_NODELIST": "nodeA", "SLURM_JOB_ID": "42"}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(multinode, "expand_hostlist", lambda s: [s])
    d = worker.dist_env_from_environ("cpu")
    assert (d.rank, d.world_size, d.local_rank, d.local_world_size) == (3, 4, 1, 2)
    assert os.environ["MASTER_ADDR"] == "nodeA" and os.environ["MASTER_PORT"] == "20042"


# ------------------------------------------------------------------- record assembly

WORLD = [{"rank": r, "local_rank": r % 2, "node_rank": r // 2, "host": "h0" if r < 2 else "h1",
          "addr": "10.0.0.1" if r < 2 else "10.0.0.2", "device": "cpu", "device_name": "cpu", "pid": 100 + r}
         for r in range(4)]


def _fail(rank: int, error: str, first=None, seen=()):
    me = {"rank": rank, "node_rank": rank // 2, "host": WORLD[rank]["host"], "addr": WORLD[rank]["addr"],
          "status": "failed", "error": error}
    return {"self": me, "first": first or me, "seen": [me, *seen]}


def test_describe_failure_names_first_rank_and_lost_ranks():
    crash = _fail(3, "RuntimeError: injected crash")["self"]
    reports = [_fail(0, "conn closed", first=crash, seen=[crash]), _fail(1, "conn closed", first=crash)]
    why = multinode.describe_failure(WORLD, reports)
    # first the rank that failed first (its node, host, address, error), then the ranks never heard from
    first, silent = why.split("; ")
    assert first.startswith("rank 3 ") and all(t in first for t in ("node 1", "h1", "10.0.0.2", "injected crash")), why
    assert re.search(r"\[([\d, ]*)\]", silent)[1] == "2" and "node 1" in silent and "h1" in silent, why
    lost = multinode.describe_failure(WORLD, [_fail(0, "Connection closed by peer"), _fail(1, "closed")])
    first, silent = lost.split("; ")
    assert first.startswith("rank 0 ") and "h0" in first and "10.0.0.1" in first, lost
    assert re.search(r"\[([\d, ]*)\]", silent)[1] == "2, 3" and "node 1" in silent, lost
    assert multinode.describe_failure(WORLD, []) is None


def test_finish_record_lead_and_follower(tmp_path):
    static0 = Rendezvous(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=29500)
    static1 = Rendezvous(nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=29500)
    from dlscale.results.record import Record

    def rec():
        return Record(status="ok", error=None, config={}, case_key="k", label=None, command="x",
                      device_type="cpu", world_size=4, env={}, repeats=[{"status": "ok", "error": None}])

    (tmp_path / "world.json").write_text(json.dumps(WORLD))
    assert multinode.finish_record(rec(), tmp_path, static1) is True  # rank 0 ran here
    done = rec()
    multinode.finish_record(done, tmp_path, static0)
    assert [n["host"] for n in done.nodes] == ["h0", "h1"] and done.nodes[1]["ranks"] == [2, 3]
    assert done.rendezvous["backend"] == "static" and done.recorded_by["role"] == "lead"
    (tmp_path / "world.json").unlink()  # no worker got that far: the rendezvous host records
    assert multinode.finish_record(rec(), tmp_path, static0) is True
    assert multinode.finish_record(rec(), tmp_path, static1) is False
    assert multinode.finish_record(rec(), tmp_path, Rendezvous(nnodes=2, rdzv_endpoint="127.0.0.1:1")) is True
    assert multinode.finish_record(rec(), tmp_path, Rendezvous(nnodes=2, rdzv_endpoint="192.0.2.1:1")) is False


def test_follower_does_not_write(tmp_path, monkeypatch):
    """Only the node with global rank 0 stores; a follower's Record comes back marked follower."""
    from dlscale.case import launch
    from dlscale.results.record import Record

    def fake_measure(cfg, spawner, **kw):
        return Record(status="ok", error=None, config={}, case_key="k", label=None, command="x",
                      device_type="cpu", world_size=4, env={})

    monkeypatch.setattr(launch, "measure", fake_measure)
    spawner = launch.TorchrunSpawner(rdzv=Rendezvous(nnodes=2, node_rank=1, master_addr="127.0.0.1"))
    rec = multinode.measure_node(None, spawner, files_root=tmp_path)
    assert rec.recorded_by["role"] == "follower" and not multinode.was_recorded(rec)


@pytest.mark.parametrize("node_rank", [0, 1], ids=["lead", "follower"])
def test_an_interrupted_case_is_kept_by_the_lead_only(tmp_path, monkeypatch, node_rank):
    """A signal after some repeats finished: the lead node passes the record of the finished repeats
    on (launch.Interrupted, to be stored); a follower, which never stores, ends without one."""
    from dlscale.case import launch
    from dlscale.results.record import Record

    def interrupted(cfg, spawner, **kw):
        raise launch.Interrupted(Record(status="interrupted", error="i", config={}, case_key="k", label=None,
                                        command="x", device_type="cpu", world_size=4, env={}), "SIGTERM")

    monkeypatch.setattr(launch, "measure", interrupted)
    spawner = launch.TorchrunSpawner(rdzv=Rendezvous(nnodes=2, node_rank=node_rank, master_addr="127.0.0.1"))
    with pytest.raises(KeyboardInterrupt) as e:
        multinode.measure_node(None, spawner, files_root=tmp_path)
    if node_rank == 0:
        assert e.value.record.recorded_by["role"] == "lead" and e.value.args == ("SIGTERM",)
    else:
        assert not hasattr(e.value, "record") and e.value.args == ("SIGTERM",)


# ------------------------------------------------------------------ two hosts (namespaces)

@pytest.fixture(scope="module")
def netns_ok():
    reason = helpers_netns.unavailable_reason()
    if reason:
        pytest.skip(f"two-host tests need network namespaces: {reason}")


@pytest.fixture
def net(netns_ok):
    with helpers_netns.NetnsPair() as pair:
        yield pair


def _start_nodes(net, store: Path, extra: list[str], port: int, tmp: Path, c10d: bool = False):
    procs = []
    for i in (0, 1):
        # c10d: the endpoint on the second host, which torchrun (ranking nodes by host name) does not
        # give global rank 0: the record must still come from the node that runs it
        rdzv = (["--rdzv-endpoint", f"{net.addrs[1]}:{port}"] if c10d else
                ["--node-rank", str(i), "--master-addr", net.addrs[0], "--master-port", str(port)])
        argv = [sys.executable, "-m", "dlscale", "run", *CASE, "--store", str(store), "--nnodes", "2", *rdzv, *extra]
        env = net.env(i)
        (tmp / f"tmp{i}").mkdir(exist_ok=True)
        env["TMPDIR"] = str(tmp / f"tmp{i}")  # node-local temp dirs (world.json of node 0)
        log = open(tmp / f"node{i}.log", "w")
        procs.append(subprocess.Popen(net.command(i, argv), env=env, stdout=log, stderr=subprocess.STDOUT))
    return procs


def _wait_all(procs, timeout: float) -> list[tuple[int | None, float]]:
    start = time.monotonic()
    out = []
    for p in procs:
        try:
            p.wait(timeout=max(0.1, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            pass
        out.append((p.returncode, time.monotonic() - start))
    for p in procs:
        if p.returncode is None:
            p.kill()
            p.wait()
    return out


def _logs(tmp: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("node*.log")))


def _records(store: Path) -> list[dict]:
    return ResultStore(store).load(kind="run").records


@pytest.mark.slow
def test_two_hosts_c10d_one_record_with_every_node(net, tmp_path):
    """c10d rendezvous, its endpoint on the host that ranks second: torchrun assigns node ranks; the node
    that got rank 0 writes the record."""
    store = tmp_path / "store"
    procs = _start_nodes(net, store, ["--steps", "3"], 29511, tmp_path, c10d=True)
    codes = _wait_all(procs, 120)
    assert [c for c, _ in codes] == [0, 0], _logs(tmp_path)
    recs = _records(store)
    assert len(recs) == 1, "the follower node must not write a second record"
    rec = recs[0]
    assert rec["status"] == "ok" and rec["world_size"] == 4 and rec["config"]["nnodes"] == 2
    nodes = [(n["node_rank"], n["ranks"], n["devices"]) for n in rec["nodes"]]
    assert nodes == [(0, [0, 1], ["cpu", "cpu"]), (1, [2, 3], ["cpu", "cpu"])]
    assert sorted((n["host"], n["addr"]) for n in rec["nodes"]) == sorted(zip(net.hostnames, net.addrs))
    assert [r["rank"] for r in rec["ranks"]] == [0, 1, 2, 3]
    assert rec["recorded_by"]["role"] == "lead" and rec["recorded_by"]["host"] == rec["nodes"][0]["host"]
    assert rec["rendezvous"] == {"backend": "c10d", "nnodes": 2, "endpoint": f"{net.addrs[1]}:29511",
                                 "max_restarts": 0}
    assert rec["global_batch"] == 8 * 4  # throughput counts the global batch of all nodes
    rep = rec["repeats"][0]
    assert rep["samples_per_s"] == pytest.approx(3 * 32 / rep["window_s"])
    follower = 1 if rec["nodes"][0]["host"] == net.hostnames[0] else 0
    # the follower says, in one line, its host, the case's status, and that rank 0's node writes the record
    said = [ln for ln in (tmp_path / f"node{follower}.log").read_text().splitlines() if ln.startswith("dlscale: node ")]
    assert len(said) == 1 and net.hostnames[follower] in said[0] and rec["status"] in said[0], said
    assert "rank 0" in said[0], said


@pytest.mark.slow
def test_two_hosts_node_lost_mid_run(net, tmp_path):
    """Every process of node B is SIGKILLed mid-run: node A ends well within its limit, failed. One
    rank per node (the rendezvous of two ranks per node: the c10d test above)."""
    store = tmp_path / "store"
    per_node = 1
    procs = _start_nodes(net, store, ["--steps", "400", "--nproc-per-node", str(per_node)], 29513, tmp_path)
    deadline = time.monotonic() + 90
    while not list((tmp_path / "tmp0").glob("dlscale-node-*/world.json")):  # training has begun
        assert time.monotonic() < deadline and procs[0].poll() is None, _logs(tmp_path)
        time.sleep(0.2)
    time.sleep(1.0)
    assert procs[0].poll() is None and procs[1].poll() is None, _logs(tmp_path)
    killed_at = time.monotonic()
    for pid in net.pids(1):  # node B vanishes: its launcher, torchrun agent and workers
        os.kill(pid, signal.SIGKILL)
    (code_a, _), = _wait_all(procs[:1], 60)
    took = time.monotonic() - killed_at
    _wait_all(procs[1:], 5)
    assert code_a == 5, _logs(tmp_path)
    assert took < 40, f"node A needed {took:.1f} s after node B was lost"
    rec, = _records(store)
    assert rec["status"] == "failed"
    # node B's ranks are named as lost, with the node's host and address
    lost = list(range(per_node, 2 * per_node))
    assert f"ranks {lost} on node 1, {net.hostnames[1]} {net.addrs[1]} (process killed or node lost)" in rec["error"]
    assert rec["repeats"][0]["process_s"] < 90


@pytest.mark.slow
def test_max_restarts_restarts_the_worker_group(tmp_path, capsys):
    """--max-restarts 1: torchrun's agent starts the group again (which reaches the crash again)."""
    code = cli.main(["run", *CASE, "--steps", "2", "--store", str(tmp_path), "--inject-failure", "crash@1:1",
                     "--max-restarts", "1", "--verbose"])
    assert code == 5
    out = capsys.readouterr().err
    # both attempts got through init_process_group (a restarted group gets a fresh store prefix)
    assert out.count("dlscale worker rank 1: failed: RuntimeError: injected crash") == 2, out[-3000:]
    assert "connectFullMesh" not in out
    rec, = _records(tmp_path)
    assert rec["status"] == "failed"
