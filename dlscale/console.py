"""Console output of a run: parameter header, one line per rank, result table (nccl-tests style)."""
from __future__ import annotations

from typing import Any, Callable

from dlscale.config import RunConfig, resolve_device


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_num(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def print_header(cfg: RunConfig) -> None:
    d = cfg.to_dict()
    device = resolve_device(cfg.device)
    print(f"# dlscale run: {cfg.model} ({cfg.flavor}) / {cfg.strategy} on {cfg.world_size} x {device}")
    keys = list(d)
    width = max(len(k) for k in keys)
    for k in keys:
        print(f"#   {k:<{width}} : {d[k]}")


def progress_printer(cfg: RunConfig) -> Callable[[str, Any], None]:
    def on_event(kind: str, payload: Any) -> None:
        if kind == "ranks":
            for r in payload:
                print(f"#   rank {r.get('rank')}/{cfg.world_size}  local {r.get('local_rank')}  host "
                      f"{r.get('host')}  device {r.get('device')} ({r.get('device_name') or '?'})  pid {r.get('pid')}")
        elif kind == "repeat":
            e = payload
            if e["status"] == "ok":
                ph = e.get("phases_s") or {}
                where = ", ".join(f"{k} {v:.1f}" for k, v in ph.items() if k != "window")
                print(f"#   repeat {e['repeat'] + 1}/{cfg.repeats}: {e['samples_per_s']:,.2f} samples/s "
                      f"(window {e['window_s']:.3f} s, warm-up {e.get('warmup_s') or 0:.1f} s, "
                      f"process {e['process_s']:.1f} s{': ' + where if where else ''})", flush=True)
                if e.get("data"):
                    print(f"#     {data_line(e['data'])}", flush=True)
            else:
                print(f"#   repeat {e['repeat'] + 1}/{cfg.repeats}: {e['status'].upper()}: {e['error']}", flush=True)

    return on_event


COLUMNS = [
    ("model", 12, lambda r, s: r["config"]["model"]),
    ("strategy", 9, lambda r, s: r["config"]["strategy"]),
    ("precision", 9, lambda r, s: r["config"]["precision"] + ("+c" if r["config"]["compile"] else "")),
    ("devices", 7, lambda r, s: str(r["world_size"])),
    ("batch/dev", 9, lambda r, s: str(r["config"]["batch_size"])),
    ("samples/s", 11, lambda r, s: fmt_num(s["samples_per_s"]["median"])),
    ("stdev", 8, lambda r, s: fmt_num(s["samples_per_s"]["stdev"])),
    ("n", 3, lambda r, s: str(s["samples_per_s"]["n"])),
    ("tokens/s", 11, lambda r, s: fmt_num(s.get("tokens_per_s"), 0)),
    ("p50 ms", 8, lambda r, s: fmt_num(s.get("step_ms_p50"), 2)),
    ("p90 ms", 8, lambda r, s: fmt_num(s.get("step_ms_p90"), 2)),
    ("MFU %", 6, lambda r, s: fmt_num(s["mfu"] * 100 if s.get("mfu") is not None else None)),
    ("mem/dev", 10, lambda r, s: fmt_bytes(s.get("peak_mem_allocated_bytes") or s.get("peak_rss_bytes"))),
]


def result_table(records: list[dict[str, Any]]) -> str:
    head = "  ".join(f"{name:>{w}}" for name, w, _ in COLUMNS) + "  status"
    lines = [head, "-" * len(head)]
    for r in records:
        s = r.get("summary")
        if s:
            cells = "  ".join(f"{fn(r, s):>{w}}" for _, w, fn in COLUMNS)
        else:
            cells = "  ".join(f"{(fn(r, None) if i < 5 else '-'):>{w}}" for i, (_, w, fn) in enumerate(COLUMNS))
        lines.append(f"{cells}  {r['status']}")
    return "\n".join(lines)


def data_line(d: dict[str, Any]) -> str:
    """One line on a repeat's real-data loading (dlscale/inputs)."""
    share = d.get("data_wait_share_max")
    wait = "-" if share is None else f"{share * 100:.1f} %"
    verdict = {True: "input-bound", False: "not input-bound", None: "no verdict"}[d.get("input_bound")]
    cores = d.get("loader_cpu_cores_total")
    mbs = d.get("read_mb_s_total")
    loader = d.get("loader") or {}
    bad = f", {d['bad_files_total']} unreadable file(s) skipped" if d.get("bad_files_total") else ""
    if d.get("wait_may_be_understated"):
        from dlscale.inputs.spec import BUFFER_MARGIN

        bad += (f"; the window took {d.get('window_batches')} batches, under {BUFFER_MARGIN}x the "
                f"{d.get('prefetch_buffer_batches')} the loader held ready: the wait may be understated (more --steps)")
    return (f"data: waited {wait} of the window ({verdict}); loader {loader.get('workers')} worker(s)/rank, "
            f"{'-' if cores is None else f'{cores:.2f}'} cores, {'-' if mbs is None else f'{mbs:.1f}'} MB/s read, "
            f"{loader.get('decoder')}{bad}")


def print_result(rec: dict[str, Any]) -> None:
    print(result_table([rec]))
    s = rec.get("summary") or {}
    if s.get("mfu") is None and rec.get("status") == "ok":
        print("# MFU: no peak FLOP/s known for this device and dtype (CPUs have none in the table)")
    if s.get("peak_mem_allocated_bytes") is None and s.get("peak_rss_bytes"):
        print("# mem/dev on the CPU is the peak resident set of a worker process")
