"""Collective bandwidth in nccl-tests conventions, measured by ``comm_worker`` under torchrun.

Size S of a row is the nccl-tests "size": the bytes of the whole array the collective works on
(all_reduce, broadcast, reduce: the buffer; all_gather: the gathered output, n x the per-rank
input; reduce_scatter: the input, n x the per-rank output; all_to_all: each rank's send
buffer, n chunks). algbw = S / time, busbw = algbw x factor (see ``busbw_factor``).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from dlscale import ConfigError
from dlscale.case.procs import spawn_torchrun
from dlscale.cli import deprecated_alias
from dlscale.micro import common

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")
SPLIT_OPS = ("all_gather", "reduce_scatter", "all_to_all")  # S = n x per-rank chunk
IN_PLACE_OPS = ("all_reduce", "broadcast", "reduce")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
GPU_MAX, CPU_MAX = "1G", "64M"
WORKER_MODULE = "dlscale.micro.comm_worker"


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor (doc/PERFORMANCE.md): busbw = algbw x factor.

    all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1.
    With n = 1 the first two kinds give 0: there is no bus traffic.
    """
    if op not in OPS:
        raise ConfigError(f"unknown op {op!r}; choose from: {', '.join(OPS)}")
    if n < 1:
        raise ConfigError(f"world size must be >= 1, got {n}")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in SPLIT_OPS:
        return (n - 1) / n
    return 1.0


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """min, min*factor, ... up to max (as nccl-tests -b/-e/-f); max itself is always included."""
    if min_bytes < 1:
        raise ConfigError(f"min-bytes must be >= 1, got {min_bytes}")
    if min_bytes > max_bytes:
        raise ConfigError(f"min-bytes {min_bytes} is larger than max-bytes {max_bytes}")
    if not factor > 1:
        raise ConfigError(f"factor must be > 1, got {factor}")
    sizes, s = [], min_bytes
    while s <= max_bytes:
        sizes.append(s)
        s = max(s + 1, int(s * factor))
    if sizes[-1] != max_bytes:
        sizes.append(max_bytes)
    return sizes


def op_layout(op: str, requested_bytes: int, n: int, elt: int) -> tuple[int, int]:
    """(elements per chunk, S bytes) for a requested size: split ops round S down to a multiple of
    n elements (at least one element per rank), the others to whole elements (at least one)."""
    if op in SPLIT_OPS:
        chunk = max(1, requested_bytes // (elt * n))
        return chunk, chunk * n * elt
    count = max(1, requested_bytes // elt)
    return count, count * elt


def algbw_busbw(op: str, nbytes: int, seconds: float, n: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 B/s) for S = ``nbytes`` moved in ``seconds`` by ``n`` ranks."""
    alg = nbytes / seconds / 1e9
    return alg, alg * busbw_factor(op, n)


def parse_ops(values: str | Sequence[str] | None) -> list[str]:
    items = common.split_list(values)
    if not items:
        return ["all_reduce"]
    if [i.lower() for i in items] == ["all"]:
        return list(OPS)
    return common.parse_choices([i.replace("-", "_") for i in items], OPS, "op")


@dataclass(frozen=True)
class CommSweep:
    """The collectives ``micro comm`` runs, each at the sizes min, min*factor, ..., max (bytes S, as
    nccl-tests' -b/-e/-f), in one element type."""

    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    factor: float = 2.0
    dtype: str = "fp32"

    def check(self) -> None:
        """ConfigError (one line) for an unknown op or dtype, or a sweep that is empty or does not grow."""
        for op in self.ops:
            busbw_factor(op, 1)
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"unknown dtype {self.dtype!r}; choose from: {', '.join(DTYPE_BYTES)}")
        self.sizes()

    def sizes(self) -> list[int]:
        return size_sweep(self.min_bytes, self.max_bytes, self.factor)

    def worker_args(self) -> list[str]:
        return ["--ops", ",".join(self.ops), "--min-bytes", str(self.min_bytes), "--max-bytes", str(self.max_bytes),
                "--factor", str(self.factor), "--dtype", self.dtype]


@dataclass(frozen=True)
class CommLimits:
    """How long a collective may stall (the process-group timeout) and the whole torchrun run may last."""

    timeout: float = 300.0
    time_limit: float = 1800.0


def run_comm(sweep: CommSweep, nproc: int, device: str = "auto", timing: common.Timing = common.Timing(5, 20),
             limits: CommLimits = CommLimits(), on_line: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the collectives on ``nproc`` local ranks through torchrun; rank 0's rows come back.

    Returns {"status": ok|oom|failed|timeout, "error": str|None, "rows": [...], "meta": {...},
    "returncode": int|None}. Rows written before a failure are kept.
    """
    sweep.check()
    if nproc < 1:
        raise ConfigError(f"nproc-per-node must be >= 1, got {nproc}")
    device = common.resolve_device(device)
    if device == "cuda":
        import torch  # torch: keeps start-up light

        if nproc > torch.cuda.device_count():
            raise ConfigError(f"nproc-per-node {nproc} exceeds the {torch.cuda.device_count()} GPU(s) "
                              f"on this machine")
    worker_args = sweep.worker_args() + ["--device", device, "--warmup", str(timing.warmup), "--iters",
                                         str(timing.iters), "--timeout", str(limits.timeout)]
    proc, data, errors = _spawn_workers(worker_args, nproc, limits.time_limit, on_line)
    rows = data.get("rows", [])
    tail = "\n".join(proc.output_tail.splitlines()[-40:])
    first = f" ({'; '.join(errors[:4])})" if errors else ""
    if proc.timed_out:
        status = "timeout"
        error = f"comm worker killed after the {limits.time_limit:g} s time limit{first}; output tail:\n{tail}"
    elif proc.returncode != 0 or not data.get("done"):
        status = "failed"
        error = f"comm worker exited with code {proc.returncode}{first}; output tail:\n{tail}"
    else:
        wrong = [f"{r['op']} {r['bytes']} B" for r in rows if r.get("status") == "ok" and not r.get("correct")]
        if wrong:
            status, error = "failed", f"wrong results: {', '.join(wrong)}"
        else:
            status, error = common.record_status(rows), None
    return {"status": status, "error": error, "rows": rows, "meta": data.get("meta", {}),
            "returncode": proc.returncode}


def _spawn_workers(worker_args: list[str], nproc: int, time_limit: float,
                   on_line: Callable[[str], None] | None) -> tuple[Any, dict[str, Any], list[str]]:
    """torchrun of the worker module: its process result, what rank 0 wrote (empty: nothing) and the
    ranks' ``[comm-error]`` lines."""
    fd, out_path = tempfile.mkstemp(prefix="dlscale-comm-", suffix=".json")
    os.close(fd)
    os.unlink(out_path)  # the worker creates it; absent = the worker wrote nothing
    errors: list[str] = []

    def watch(line: str) -> None:
        at = line.find("[comm-error] ")  # anywhere: a peer's partial line may precede it
        if at >= 0:
            errors.append(line[at + len("[comm-error] "):])
        if on_line:
            on_line(line)

    try:
        proc = spawn_torchrun(WORKER_MODULE, worker_args + ["--out", out_path], nproc, time_limit, on_line=watch)
        data: dict[str, Any] = {}
        if os.path.exists(out_path):
            try:
                with open(out_path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError):
                data = {}
    finally:
        if os.path.exists(out_path):
            os.unlink(out_path)
    return proc, data, errors


# ---------------------------------------------------------------------------------------------
# CLI

def add_parser(sub) -> None:

    p = sub.add_parser(
        "comm", help="collective time, algbw and busbw per message size (nccl-tests conventions)",
        description="Run collectives on --nproc-per-node local ranks under torchrun (NCCL on GPU, gloo "
                    "on CPU) for sizes min, min*factor, ..., max; check every result and report time "
                    "per op, algbw = S / time and busbw = algbw x factor with the nccl-tests "
                    "definitions (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; "
                    "broadcast, reduce 1). S follows nccl-tests: the whole array (for all_gather the "
                    "gathered output, for reduce_scatter the input). One process is allowed: busbw is "
                    "then 0 for all_reduce/all_gather/reduce_scatter/all_to_all, per the formula.")
    p.add_argument("--op", action="append", default=None, metavar="OP[,OP...]",
                   help=f"collectives from {', '.join(OPS)}, comma-separated or repeated; all = every "
                        "one (default: all_reduce)")
    p.add_argument("--min-bytes", default="8", metavar="BYTES", help="smallest size S (K, M, G suffixes)")
    p.add_argument("--max-bytes", default="auto", metavar="BYTES",
                   help=f"largest size S; auto = {GPU_MAX} on GPU, {CPU_MAX} on CPU")
    p.add_argument("--factor", type=float, default=2.0, help="size multiplication factor between steps")
    p.add_argument("--dtype", default="fp32", help=f"element type: {', '.join(DTYPE_BYTES)}")
    p.add_argument("--collective-timeout", dest="timeout", type=float, default=300.0, metavar="SECONDS",
                   help="process-group timeout: a collective stalled this long fails")
    deprecated_alias(p, "--timeout", "--collective-timeout", dest="timeout", type=float)
    p.add_argument("--time-limit", type=float, default=1800.0, metavar="SECONDS",
                   help="wall-clock limit of the whole torchrun run; the process tree is killed after it")
    common.add_common_options(p, warmup_defaults=(5, 2), iters_defaults=(20, 10),
                       nproc_help="ranks (processes) on this machine, one GPU each on CUDA; the world "
                                  "size. 1 is allowed (busbw 0 where the factor is 0)")
    p.set_defaults(func=main)


def main(args) -> int:
    ops = parse_ops(args.op)
    dtype = args.dtype.lower()
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"unknown dtype {args.dtype!r}; choose from: {', '.join(DTYPE_BYTES)}")
    if args.nproc_per_node < 1:
        raise ConfigError(f"nproc-per-node must be >= 1, got {args.nproc_per_node}")
    if not args.timeout > 0:
        raise ConfigError(f"timeout must be > 0 seconds, got {args.timeout}")
    if not args.time_limit > 0:
        raise ConfigError(f"time-limit must be > 0 seconds, got {args.time_limit}")
    device = common.resolve_device(args.device)
    warmup = common.resolve_count(args.warmup, "warmup", 5, 2, device, 0)
    iters = common.resolve_count(args.iters, "iters", 20, 10, device, 1)
    min_bytes = common.parse_bytes(args.min_bytes, "min-bytes")
    max_arg = args.max_bytes if str(args.max_bytes).lower() != "auto" else (GPU_MAX if device == "cuda" else CPU_MAX)
    max_bytes = common.parse_bytes(max_arg, "max-bytes")
    size_sweep(min_bytes, max_bytes, args.factor)
    if device == "cuda":
        import torch  # torch: keeps start-up light

        if args.nproc_per_node > torch.cuda.device_count():
            raise ConfigError(f"nproc-per-node {args.nproc_per_node} exceeds the "
                              f"{torch.cuda.device_count()} GPU(s) on this machine")
    common.check_store(args.store)

    def progress(line: str) -> None:
        if line.startswith("[comm] "):
            print(line[7:], file=sys.stderr, flush=True)

    sweep = CommSweep(tuple(ops), min_bytes, max_bytes, args.factor, dtype)
    res = run_comm(sweep, args.nproc_per_node, device, common.Timing(warmup, iters),
                   CommLimits(args.timeout, args.time_limit), on_line=progress)
    rows, meta = res["rows"], res["meta"]
    config = common.args_config(args)
    config.update(resolved={"device": device, "ops": ops, "dtype": dtype, "min_bytes": min_bytes,
                            "max_bytes": max_bytes, "factor": args.factor, "warmup": warmup, "iters": iters,
                            "sizes": sweep.sizes()})
    plot = {"x": "bytes", "y": "busbw_gbps", "series": "op",
            "xlabel": "size S (bytes, nccl-tests convention)", "ylabel": "bus bandwidth (GB/s)", "logx": True}
    dev_name = meta.get("device_name") or common.device_name(common.torch_device(device))
    record = common.make_record(common.Outcome("comm", res["status"], config, rows, plot, device, dev_name,
                                               res["error"]),
                                nranks=meta.get("world_size", args.nproc_per_node), backend=meta.get("backend"))
    n = meta.get("world_size", args.nproc_per_node)
    if rows:
        common.print_table(f"collectives on {n} rank(s), {meta.get('backend', '?')} on {dev_name}, "
                           f"{dtype}, median of {iters} (slowest rank)",
                           [("op", "op"), ("bytes", "size (B)"), ("count", "count (elts)"),
                            ("time_us", "time (us)"), ("algbw_gbps", "algbw (GB/s)"),
                            ("busbw_gbps", "busbw (GB/s)"), ("correct", "correct")],
                           rows)
    if res["error"]:
        print(f"dlscale: micro comm {res['status']}: {res['error'].splitlines()[0]} "
              f"(full output tail in the record)", file=sys.stderr)
    path = common.append_record(args.store, record)
    common.print_done(record, path)
    return common.exit_code(res["status"])
