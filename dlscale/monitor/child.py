"""The sampler process's loop: one sample every interval appended to the series file, until the parent
writes ``stop``, closes the pipe or disappears (dlscale/monitor/__init__.py: the protocol)."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

from dlscale.monitor.host import Collector

# The sampler gives up (exit 1, reason on stderr) after this many failed samples in a row.
MAX_CONSECUTIVE_FAILURES = 20

def run_worker(args) -> int:
    """The sampler process: sample every interval until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent; it stops us
    parent = os.getppid()
    out = open(args.series, "a", encoding="utf-8")
    col = Collector(args.interval, args.gpus, args.pid, use_nvml=not args.no_nvml)
    meta = dict(col.meta)
    meta["started_t"] = time.time()
    sys.stdout.write(json.dumps(meta) + "\n")
    sys.stdout.flush()
    stdin_fd = sys.stdin.fileno()
    interval = args.interval
    next_t = time.monotonic() + interval
    failures = 0
    orphaned = False
    while True:
        timeout = next_t - time.monotonic()
        if timeout > 0:
            r, _, _ = select.select([stdin_fd], [], [], timeout)
            if r:
                data = os.read(stdin_fd, 4096)
                if b"stop" in data:
                    break
                if not data:  # EOF without "stop": the caller is gone
                    orphaned = True
                    break
            continue
        if os.getppid() != parent:  # parent gone: do not outlive it
            orphaned = True
            break
        try:
            sample = col.sample()
        except Exception as e:  # a transient failure costs one sample, a persistent one ends the run
            failures += 1
            if failures == 1 or failures >= MAX_CONSECUTIVE_FAILURES:
                print(f"sample failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            if failures >= MAX_CONSECUTIVE_FAILURES:
                raise
        else:
            failures = 0
            out.write(json.dumps(sample, separators=(",", ":")) + "\n")
            out.flush()
        next_t += interval
        now = time.monotonic()
        if next_t <= now:  # fell behind (machine overloaded, slow NVML): skip, do not burst
            next_t = now + interval
    out.close()
    if orphaned:  # nobody will read or delete the caller's temporary files
        for path in args.orphan_cleanup:
            try:
                os.unlink(path)
            except OSError:
                pass
    return 0
