"""``python -m dlscale.monitor``: a live table of GPU and host utilisation, and the hidden ``--worker``
entry point of the sampler process."""

from __future__ import annotations

import argparse
import json
import sys
import time

from dlscale import ConfigError
from dlscale.fmt import fmt_si
from dlscale.monitor.child import run_worker
from dlscale.monitor.host import Collector
from dlscale.monitor.sampler import validate_interval


def _fmt_bytes(x, per_s=False):
    return fmt_si(x, "B/s" if per_s else "B", missing="-")


def _live(args) -> int:
    col = Collector(args.interval, args.gpus, pid=None, use_nvml=not args.no_nvml)
    meta = col.meta
    print(f"# {meta['n_cpus']} CPUs; NVML: {'yes, %d GPU(s)' % len(meta['gpus']) if meta['nvml'] else 'no (%s)' % meta['nvml_error']}")
    head = f"{'time':>8} {'cpu%':>6} {'mem':>8} {'disk r':>10} {'disk w':>10} {'net tx':>10} {'net rx':>10}"
    for g in meta["gpus"]:
        head += f" | gpu{g['index']} {'util%':>5} {'mem':>8} {'W':>6} {'MHz':>5}"
    print(head)
    out = open(args.series, "w") if args.series else None
    t_end = time.monotonic() + args.duration if args.duration else None
    next_t = time.monotonic() + args.interval
    try:
        while t_end is None or time.monotonic() < t_end:
            time.sleep(max(0.0, next_t - time.monotonic()))
            next_t += args.interval
            s = col.sample()
            if out:
                out.write(json.dumps(s, separators=(",", ":")) + "\n")
                out.flush()
            row = (f"{time.strftime('%H:%M:%S', time.localtime(s['t'])):>8} {s['cpu_util_pct'] or 0:6.1f} "
                   f"{_fmt_bytes(s['host_mem_used_bytes']):>8} {_fmt_bytes(s['disk_read_bps'], 1):>10} "
                   f"{_fmt_bytes(s['disk_write_bps'], 1):>10} {_fmt_bytes(s['net_sent_bps'], 1):>10} "
                   f"{_fmt_bytes(s['net_recv_bps'], 1):>10}")
            for g in s["gpus"]:
                u = "-" if g["util_pct"] is None else f"{g['util_pct']:.0f}"
                w = "-" if g["power_w"] is None else f"{g['power_w']:.0f}"
                c = "-" if g["sm_clock_mhz"] is None else f"{g['sm_clock_mhz']:.0f}"
                row += f" | gpu{g['index']} {u:>5} {_fmt_bytes(g['mem_used_bytes']):>8} {w:>6} {c:>5}"
            print(row, flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if out:
            out.close()
    return 0


def parse_gpus(text):
    """'all' -> None; else a list of NVML indices (ints) and/or GPU UUIDs (strings starting 'GPU-')."""
    if text in (None, "", "all"):
        return None
    out: list[int | str] = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        if x.upper().startswith(("GPU-", "MIG-")):
            out.append(x)
            continue
        try:
            out.append(int(x))
        except ValueError:
            raise ConfigError(f"--gpus must be 'all' or comma-separated NVML indices or GPU UUIDs (GPU-...), "
                              f"got {text!r}") from None
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dlscale.monitor",
                                 description="Print a live table of GPU and host utilisation.")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (0.01..10)")
    ap.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: Ctrl-C)")
    ap.add_argument("--gpus", default="all", help="comma-separated NVML indices, or 'all'")
    ap.add_argument("--series", default=None, help="also write the samples to this JSON-lines file")
    ap.add_argument("--no-nvml", action="store_true", help="do not query GPUs")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pid", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--orphan-cleanup", action="append", default=[], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.interval = validate_interval(args.interval)
        args.gpus = parse_gpus(args.gpus)
    except ConfigError as e:
        print(f"dlscale.monitor: error: {e}", file=sys.stderr)
        return 2
    if args.worker:
        if not args.series:
            print("dlscale.monitor: error: --worker needs --series", file=sys.stderr)
            return 2
        return run_worker(args)
    return _live(args)
