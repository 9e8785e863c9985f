"""Device memory bandwidth: copy and elementwise kernels over large buffers.

GB/s = (bytes read + bytes written) / time / 1e9, per op on fp32 buffers of ``size`` bytes:

* copy:  ``dst.copy_(src)``          reads 1 buffer, writes 1: 2 x size
* scale: ``torch.mul(a, s, out=c)``  reads 1 buffer, writes 1: 2 x size
* add:   ``torch.add(a, b, out=c)``  reads 2 buffers, writes 1: 3 x size
"""
from __future__ import annotations

from typing import Any, Sequence

from dlscale import ConfigError
from dlscale.fmt import fmt_bytes
from dlscale.micro import common
from dlscale.micro.peaks import peak_bandwidth

OPS = ("copy", "scale", "add")
# buffers read and written per call, in units of the buffer size
OP_BUFFERS = {"copy": (1, 1), "scale": (1, 1), "add": (2, 1)}
GPU_SIZE = "1G"
CPU_SIZE = "64M"


def bandwidth_bytes(op: str, size: int) -> int:
    """Bytes moved by one call of ``op`` on buffers of ``size`` bytes (read + written)."""
    if op not in OP_BUFFERS:
        raise ConfigError(f"unknown op {op!r}; choose from: {', '.join(OPS)}")
    reads, writes = OP_BUFFERS[op]
    return (reads + writes) * size


def run_bandwidth(sizes: Sequence[int], ops: Sequence[str] = OPS, device: str = "auto",
                  warmup: int = 5, iters: int = 20, min_sample_s: float | None = None) -> list[dict[str, Any]]:
    """Time each op on fp32 buffers of each size (bytes); one row per (op, size).

    Rows: op, size_bytes, bytes_moved, time_us (median), gbps (1e9 B/s), peak_gbps and
    pct_of_peak against the datasheet table in dlscale.micro.peaks (null when unknown), status
    "ok" or "oom" (with reason).
    """
    import torch  # torch: keeps start-up light

    for op in ops:
        bandwidth_bytes(op, 1)
    dev = common.torch_device(common.resolve_device(device))
    timing = common.Timing(warmup, iters, min_sample_s)
    peak, peak_src = peak_bandwidth(common.device_name(dev))
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        size = max(4, size - size % 4)  # whole fp32 elements
        for op in ops:
            moved = bandwidth_bytes(op, size)
            row: dict[str, Any] = {"op": op, "size_bytes": size, "bytes_moved": moved, "dtype": "fp32",
                                   "status": "ok", "reason": None, "time_us": None, "gbps": None,
                                   "peak_gbps": peak / 1e9 if peak else None, "pct_of_peak": None,
                                   "peak_source": peak_src}
            try:
                row.update(_time_op(op, size, dev, gen, timing))
                gbps = moved / (row["time_us"] * 1e-6) / 1e9
                row.update(gbps=gbps, pct_of_peak=common.pct(gbps * 1e9, peak))
            except Exception as e:  # noqa: BLE001 - one size that does not fit never ends the sweep
                row.update(status=common.classify_error(e), reason=common.error_reason(e))
            if row["status"] == "oom":
                common.free_memory(dev)
            rows.append(row)
    return rows


def _time_op(op: str, size: int, dev, gen, timing: common.Timing) -> dict[str, Any]:
    import torch  # torch: keeps start-up light

    numel = size // 4
    a = torch.randn(numel, generator=gen, device=dev)
    c = torch.empty_like(a)
    if op == "copy":
        def step() -> None:
            c.copy_(a)
    elif op == "scale":
        def step() -> None:
            torch.mul(a, 1.0001, out=c)
    else:
        b = torch.randn(numel, generator=gen, device=dev)

        def step() -> None:
            torch.add(a, b, out=c)
    return common.timing_fields(timing.measure(step, dev))


# ---------------------------------------------------------------------------------------------
# CLI

def add_parser(sub) -> None:

    p = sub.add_parser(
        "bandwidth", help="device memory bandwidth (copy, scale, add) in GB/s",
        description="Time dst.copy_(src), c = a * s and c = a + b over fp32 buffers of each size; "
                    "GB/s = (bytes read + bytes written) / median time / 1e9 (copy and scale move 2x "
                    "the buffer size, add 3x), and percent of the datasheet memory bandwidth "
                    "(dlscale/micro/peaks.py; null for unknown devices and CPUs).")
    p.add_argument("--size", action="append", default=None, metavar="BYTES[,BYTES...]",
                   help=f"buffer sizes in bytes with binary suffixes (64M, 1G), comma-separated or "
                        f"repeated (default: auto = {GPU_SIZE} on GPU, {CPU_SIZE} on CPU)")
    p.add_argument("--op", action="append", default=None, metavar="OP[,OP...]",
                   help=f"ops from {', '.join(OPS)}, comma-separated or repeated (default: all = every op)")
    common.add_common_options(p, warmup_defaults=(5, 2), iters_defaults=(20, 10))
    p.set_defaults(func=main)


def main(args) -> int:
    device = common.resolve_device(args.device)
    common.check_nproc(args.nproc_per_node, "bandwidth")
    warmup = common.resolve_count(args.warmup, "warmup", 5, 2, device, 0)
    iters = common.resolve_count(args.iters, "iters", 20, 10, device, 1)
    op_args = common.split_list(args.op)
    ops = list(OPS) if not op_args or [o.lower() for o in op_args] == ["all"] else \
        common.parse_choices(op_args, OPS, "op")
    size_args = [s for s in common.split_list(args.size) if s.lower() != "auto"]
    sizes = [common.parse_bytes(s, "size") for s in size_args] or \
        [common.parse_bytes(GPU_SIZE if device == "cuda" else CPU_SIZE)]
    common.check_fits(max(sizes) * max(sum(OP_BUFFERS[o]) for o in ops), device, f"--size {max(sizes):,} bytes")
    common.check_store(args.store)

    rows = run_bandwidth(sizes, ops, device, warmup, iters)
    status = common.record_status(rows)
    config = common.args_config(args)
    config.update(resolved={"device": device, "sizes": sizes, "ops": ops, "warmup": warmup, "iters": iters})
    plot = {"x": "size_bytes", "y": "gbps", "series": "op", "xlabel": "buffer size (bytes)",
            "ylabel": "bandwidth (GB/s, read + written)", "logx": True}
    dev_name = common.device_name(common.torch_device(device))
    error = common.failed_reasons(rows, lambda r: f"{r['op']} {r['size_bytes']}")
    record = common.make_record(common.Outcome("bandwidth", status, config, rows, plot, device, dev_name, error))
    common.print_table(f"memory bandwidth on {dev_name} ({device}), median of {iters}",
                       [("op", "op"), ("size_bytes", "buffer"), ("bytes_moved", "moved (B)"),
                        ("time_us", "time (us)"), ("gbps", "GB/s"), ("peak_gbps", "peak (GB/s)"),
                        ("pct_of_peak", "% of peak")],
                       rows, formatters={"size_bytes": lambda n: fmt_bytes(n, missing="-")})
    path = common.append_record(args.store, record)
    common.print_done(record, path)
    return common.exit_code(status)
