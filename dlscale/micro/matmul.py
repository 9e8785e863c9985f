"""Dense matmul throughput: C[m, n] = A[m, k] @ B[k, n], TFLOPS = 2mnk / time."""
from __future__ import annotations

import contextlib
import itertools
import math
import re
from typing import Any, Iterable, Sequence

from dlscale import ConfigError
from dlscale.micro import common
from dlscale.results.metrics import peak_flops

DTYPES = ("fp32", "tf32", "fp16", "bf16")
GPU_SIZES = (1024, 2048, 4096, 8192)
CPU_SIZES = (256, 512, 1024)
MAX_BUFFER_SETS = 16
_SHAPE_RE = re.compile(r"^(\d+)[xX](\d+)[xX](\d+)$")


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of one [m, k] @ [k, n] matmul: 2·m·n·k (one multiply and one add per term)."""
    return 2 * m * n * k


def parse_shape(text: str) -> tuple[int, int, int]:
    """"MxNxK" -> (m, n, k): A is m x k, B is k x n, C is m x n."""
    mt = _SHAPE_RE.match(text.strip())
    if not mt or min(int(g) for g in mt.groups()) < 1:
        raise ConfigError(f"bad shape {text!r}; use MxNxK with positive integers, e.g. 4096x4096x4096")
    return int(mt.group(1)), int(mt.group(2)), int(mt.group(3))


def default_dtypes(device: str) -> list[str]:
    return list(DTYPES) if device == "cuda" else ["fp32", "fp16", "bf16"]


def dtype_support(dtype: str, dev) -> str | None:
    """Why ``dtype`` cannot run on ``dev`` (None when it can or must be tried)."""
    import torch  # torch: keeps start-up light

    if dev.type != "cuda":
        if dtype == "tf32":
            return "tf32 is a CUDA tensor-core mode; there is no tf32 matmul on CPU"
        return None
    major, minor = torch.cuda.get_device_capability(dev)
    if dtype in ("tf32", "bf16") and major < 8:
        return f"{dtype} needs compute capability >= 8.0 (Ampere), device has {major}.{minor}"
    return None


@contextlib.contextmanager
def float32_precision(dtype: str):
    """TF32 on for "tf32", off (IEEE fp32) for "fp32"; restored afterwards."""
    import torch  # torch: keeps start-up light

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def torch_dtype(dtype: str):
    import torch  # torch: keeps start-up light

    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16,
            "bf16": torch.bfloat16}[dtype]


def _random(shape: tuple[int, int], dtype, dev, gen):
    import torch  # torch: keeps start-up light

    # random normal data (never zeros: some kernels and power states shortcut on them)
    return torch.randn(shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)


def run_matmul(shapes: Iterable[tuple[int, int, int]], dtypes: Sequence[str], device: str = "auto",
               warmup: int = 10, iters: int = 50, min_sample_s: float | None = None) -> list[dict[str, Any]]:
    """Time ``torch.matmul`` for every (shape, dtype); one row per pair.

    ``device`` is "auto", "cuda" or "cpu". Inputs are random normal; when one A, B pair fits in
    the last-level cache (GPU L2), several pairs are allocated and rotated so that each call
    reads its inputs from memory the way a large model's layers do. Rows carry ``status``
    "ok", "unsupported" (with ``reason``), "oom" or "failed".
    """
    import torch  # torch: keeps start-up light

    for d in dtypes:
        if d not in DTYPES:
            raise ConfigError(f"unknown dtype {d!r}; choose from: {', '.join(DTYPES)}")
    dev = common.torch_device(common.resolve_device(device))
    timing = common.Timing(warmup, iters, min_sample_s)
    name = common.device_name(dev)
    cache = common.cache_bytes(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    shapes = list(shapes)
    rows: list[dict[str, Any]] = []

    for dtype in dtypes:
        peak, peak_src = peak_flops(name, dtype)
        unsupported = dtype_support(dtype, dev)
        if unsupported is None:
            # try a tiny matmul first: a CPU build without a kernel for this dtype says so here
            try:
                with float32_precision(dtype):
                    a = _random((8, 8), torch_dtype(dtype), dev, gen)
                    torch.matmul(a, a)
                    common.synchronize(dev)
            except (RuntimeError, NotImplementedError, TypeError) as e:
                unsupported = f"{dtype} matmul not available on {dev.type}: {common.error_reason(e)}"
        for m, n, k in shapes:
            flops = matmul_flops(m, n, k)
            row: dict[str, Any] = {"shape": f"{m}x{n}x{k}", "m": m, "n": n, "k": k, "dtype": dtype,
                                   "flops": flops, "status": "ok", "reason": None, "time_us": None,
                                   "tflops": None, "peak_tflops": peak / 1e12 if peak else None,
                                   "pct_of_peak": None, "peak_source": peak_src, "buffer_sets": None}
            if unsupported:
                row.update(status="unsupported", reason=unsupported)
                rows.append(row)
                continue
            try:
                row.update(_time_shape((m, n, k), dtype, dev, gen, cache, timing))
                row["tflops"] = flops / (row["time_us"] * 1e-6) / 1e12
                row["pct_of_peak"] = common.pct(row["tflops"] * 1e12, peak)
            except Exception as e:  # noqa: BLE001 - one bad shape never ends the sweep
                row.update(status=common.classify_error(e), reason=common.error_reason(e))
            if row["status"] == "oom":
                common.free_memory(dev)
            rows.append(row)
    return rows


def _time_shape(shape: tuple[int, int, int], dtype: str, dev, gen, cache: int,
                timing: common.Timing) -> dict[str, Any]:
    """Allocate the buffers (freed on return, also on an exception) and time one (M, N, K) shape."""
    import torch  # torch: keeps start-up light

    m, n, k = shape
    with float32_precision(dtype):
        tdt = torch_dtype(dtype)
        elt = torch.empty((), dtype=tdt).element_size()
        pair_bytes = (m * k + k * n) * elt
        nsets = 1 if pair_bytes >= cache else min(MAX_BUFFER_SETS, math.ceil(2 * cache / pair_bytes))
        bufs = [(_random((m, k), tdt, dev, gen), _random((k, n), tdt, dev, gen)) for _ in range(nsets)]
        out = torch.empty((m, n), dtype=tdt, device=dev)
        order = itertools.cycle(range(nsets))

        def step() -> None:
            a, b = bufs[next(order)]
            torch.matmul(a, b, out=out)

        t = timing.measure(step, dev)
    return {**common.timing_fields(t), "buffer_sets": nsets}


# ---------------------------------------------------------------------------------------------
# CLI

def add_parser(sub) -> None:

    p = sub.add_parser(
        "matmul", help="dense matmul TFLOPS per shape and dtype",
        description="Time C = A @ B (A: M x K, B: K x N) for square sizes and/or given shapes in each "
                    "dtype; TFLOPS = 2*M*N*K / median time, and percent of the datasheet peak "
                    "(dlscale.results.metrics.PEAK_FLOPS). Inputs are random; small inputs rotate among "
                    "several buffer pairs so that they do not stay in L2.")
    p.add_argument("--sizes", action="append", metavar="N[,N...]",
                   help="square sizes N (M=N=K), comma-separated or repeated (default: auto = "
                        f"{','.join(map(str, GPU_SIZES))} on GPU, {','.join(map(str, CPU_SIZES))} on CPU, "
                        "used when no --shape is given)", default=None)
    p.add_argument("--shape", action="append", metavar="MxNxK[,MxNxK...]", default=None,
                   help="matmul shapes, comma-separated or repeated (A is M x K, B is K x N); with --shape "
                        "alone only these run, add --sizes auto to run the square sizes too (default: none)")
    p.add_argument("--dtype", action="append", metavar="DTYPE[,DTYPE...]", default=None,
                   help=f"dtypes from {', '.join(DTYPES)}, comma-separated or repeated (default: auto = all "
                        "four on GPU, fp32,fp16,bf16 on CPU; tf32 asked for on CPU is recorded unsupported)")
    common.add_common_options(p, warmup_defaults=(10, 2), iters_defaults=(50, 10))
    p.set_defaults(func=main)


def main(args) -> int:
    device = common.resolve_device(args.device)
    common.check_nproc(args.nproc_per_node, "matmul")
    warmup = common.resolve_count(args.warmup, "warmup", 10, 2, device, 0)
    iters = common.resolve_count(args.iters, "iters", 50, 10, device, 1)
    dtype_args = [d for d in common.split_list(args.dtype) if d.lower() != "auto"]
    dtypes = common.parse_choices(dtype_args, DTYPES, "dtype") or default_dtypes(device)
    shapes = [parse_shape(s) for s in common.split_list(args.shape)]
    size_args = [s for s in common.split_list(args.sizes) if s.lower() != "auto"]
    sizes = common.parse_positive_ints(size_args, "size")
    if not sizes and (not shapes or args.sizes):
        sizes = list(GPU_SIZES if device == "cuda" else CPU_SIZES)
    all_shapes = [(s, s, s) for s in sizes] + [sh for sh in shapes if sh not in [(s, s, s) for s in sizes]]
    elt = 4 if {"fp32", "tf32"} & set(dtypes) else 2
    big = max(all_shapes, key=lambda s: s[0] * s[2] + s[2] * s[1] + s[0] * s[1])
    common.check_fits((big[0] * big[2] + big[2] * big[1] + big[0] * big[1]) * elt, device,
                      f"--sizes/--shape {big[0]}x{big[1]}x{big[2]}")
    common.check_store(args.store)

    rows = run_matmul(all_shapes, dtypes, device, warmup, iters)
    status = common.record_status(rows)
    config = common.args_config(args)
    config.update(resolved={"device": device, "dtypes": dtypes, "shapes": [f"{m}x{n}x{k}" for m, n, k in all_shapes],
                            "warmup": warmup, "iters": iters})
    square = all(r["m"] == r["n"] == r["k"] for r in rows)
    plot = {"x": "m" if square else "flops", "y": "tflops", "series": "dtype",
            "xlabel": "matrix size N (N x N x N)" if square else "FLOPs per matmul (2*M*N*K)",
            "ylabel": "TFLOPS", "logx": True}
    dev = common.torch_device(device)
    dev_name = common.device_name(dev)
    error = common.failed_reasons(rows, lambda r: f"{r['shape']} {r['dtype']}")
    record = common.make_record(common.Outcome("matmul", status, config, rows, plot, device, dev_name, error))
    common.print_table(f"matmul on {dev_name} ({device}), median of {iters}",
                       [("shape", "M x N x K"), ("dtype", "dtype"), ("time_us", "time (us)"),
                        ("tflops", "TFLOPS"), ("peak_tflops", "peak (TFLOPS)"), ("pct_of_peak", "% of peak")],
                       rows)
    path = common.append_record(args.store, record)
    common.print_done(record, path)
    return common.exit_code(status)
