"""Device time per training step by kind of kernel, from the profiler traces of stored records.

    python benchmarks/kernels.py STORE [--filter KEY=VALUE[,VALUE]]... [--label LABEL] [--format md|json] [-o FILE]

The records are the newest ok run record of each case of STORE that has a profiler trace
(``profile: true``; torch.profiler's or JAX's, both Chrome JSON) and matches the filters (the keys
of `dlscale sweep --filter`), in the store's order. For each: milliseconds and kernels per step
by kind (attention, convolution, matmul, communication, memcpy/memset, other:
dlscale.frameworks.jax.profile.kind_of), the total, and its largest kernels; with exactly two
records also B − A per kind, the kinds sorted by the size of the difference, which names where
the two frameworks (or settings) spend their time differently. A suite runs it as a ``table``
command (benchmarks/suites/jax.yaml). A CPU trace has no device timeline: the table then says so.
Exit 2 when no record matches.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dlscale import ConfigError  # noqa: E402
from dlscale.frameworks.jax.profile import PROFILE_STEPS, by_kind, top_ops  # noqa: E402
from dlscale.report.data import load_records, open_text, rec_config, rec_created, resolve_store_path  # noqa: E402

TOP = 8


def profiled_steps(framework: str) -> int:
    """How many steps the worker's profiler traces: the torch worker's default, or JAX's."""
    if framework == "jax":
        return PROFILE_STEPS
    from dlscale.train.breakdown import profile_steps

    return int(inspect.signature(profile_steps).parameters["active"].default)


def describe(cfg: dict[str, Any]) -> str:
    fw = str(cfg.get("framework") or "torch")
    how = "jax" if fw == "jax" else ("torch compiled" if cfg.get("compile") else "torch eager")
    flavor = "" if cfg.get("flavor") in (None, "full") else f" ({cfg.get('flavor')})"
    return (f"{cfg.get('model')}{flavor} b{cfg.get('batch_size')} {cfg.get('precision')} {how} "
            f"{cfg.get('strategy')} x{cfg.get('nproc_per_node')}")


def select(store: str, filters: list[str], label: str | None) -> tuple[str, list[dict[str, Any]]]:
    """(store directory, the newest ok record with a trace of each matching case, in store order)."""
    from dlscale.case.suite import matches, parse_filters

    loaded = load_records(store)
    wanted = parse_filters(filters)
    newest: dict[str, tuple[float, int, dict]] = {}
    for i, r in enumerate(loaded.records):
        if r.get("kind") != "run" or r.get("status") != "ok" or not r.get("trace"):
            continue
        if (label is not None and r.get("label") != label) or not matches(rec_config(r), wanted):
            continue
        key = str(r.get("case_key"))
        if key not in newest or rec_created(r) >= newest[key][0]:
            newest[key] = (rec_created(r), newest.get(key, (0, i))[1], r)
    recs = [r for _, _, r in sorted(newest.values(), key=lambda t: t[1])]
    if not recs:
        raise ConfigError(f"no ok run record with a profiler trace in {store} matches"
                          + (f" {' '.join(filters)}" if filters else "") + " (run the cases with profile: true)")
    return loaded.store_dir, recs


def summarise(store_dir: str, rec: dict[str, Any]) -> dict[str, Any]:
    cfg = rec_config(rec)
    path = resolve_store_path(store_dir, rec["trace"])  # or its .gz copy in an archived store
    try:
        with open_text(path) as f:
            trace = json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise ConfigError(f"record {rec.get('id')}: cannot read its trace {path}: {e}") from None
    steps = profiled_steps(str(cfg.get("framework") or "torch"))
    kinds = by_kind(trace, steps)
    return {"record_id": rec.get("id"), "case": describe(cfg), "trace": rec["trace"], "profiled_steps": steps,
            "by_kind": kinds, "total_ms_per_step": sum(v["ms_per_step"] for v in kinds.values()),
            "step_ms_p50": (rec.get("summary") or {}).get("step_ms_p50"),
            "top": top_ops(trace, steps, TOP) if kinds else []}


def difference(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    if len(rows) != 2:
        return None
    a, b = rows[0]["by_kind"], rows[1]["by_kind"]
    diff = {k: b.get(k, {}).get("ms_per_step", 0.0) - a.get(k, {}).get("ms_per_step", 0.0) for k in set(a) | set(b)}
    return dict(sorted(diff.items(), key=lambda kv: -abs(kv[1])))


def to_markdown(store: str, rows: list[dict[str, Any]]) -> str:
    out = ["# Device time per step by kind of kernel", "", f"- store: `{store}`"]
    out += [f"- {chr(65 + i)}: {r['case']} (record {str(r['record_id'])[:12]}, {r['profiled_steps']} profiled "
            f"steps, trace `{r['trace']}`)" for i, r in enumerate(rows)]
    if not any(r["by_kind"] for r in rows):
        return "\n".join(out + ["", "No device kernels in these traces (a CPU run has no device timeline)."]) + "\n"
    diff = difference(rows)
    kinds = list(diff) if diff else sorted({k for r in rows for k in r["by_kind"]},
                                           key=lambda k: -max(r["by_kind"].get(k, {}).get("ms_per_step", 0) for r in rows))
    head = ["kind"] + [h for i in range(len(rows)) for h in (f"{chr(65 + i)} (ms/step)", f"{chr(65 + i)} kernels/step")]
    head += ["B − A (ms/step)"] if diff else []
    out += ["", "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for k in kinds:
        cells = [k]
        for r in rows:
            v = r["by_kind"].get(k, {})
            cells += [f"{v.get('ms_per_step', 0.0):.2f}", f"{v.get('kernels_per_step', 0.0):.0f}"]
        out.append("| " + " | ".join(cells + ([f"{diff[k]:+.2f}"] if diff else [])) + " |")
    total = ["**total kernel time**"] + [c for r in rows for c in (f"{r['total_ms_per_step']:.2f}", "")]
    if diff:
        total.append(f"{rows[1]['total_ms_per_step'] - rows[0]['total_ms_per_step']:+.2f}")
    out.append("| " + " | ".join(total) + " |")
    steps = ["step p50 (ms, timed window)"] + [c for r in rows for c in (
        "—" if r["step_ms_p50"] is None else f"{r['step_ms_p50']:.2f}", "")] + ([""] if diff else [])
    out.append("| " + " | ".join(steps) + " |")
    if diff:
        k = next(iter(diff))
        out += ["", f"Largest difference: **{k}**, {diff[k]:+.2f} ms per step (B − A)."]
    for i, r in enumerate(rows):
        out += ["", f"{chr(65 + i)}, largest kernels (ms per step, kind, name):", ""]
        out += [f"- {op['ms_per_step']:.3f} {op['kind']}: `{op['name'][:110]}`" for op in r["top"]]
    out += ["", "Kinds by kernel name (dlscale.frameworks.jax.profile.KINDS); device time summed over the profiled "
                "steps after the timed window and divided by them. Kernel time is not step time: gaps between "
                "kernels (launch overhead, host work) are in the step but in no kernel."]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("store", metavar="STORE", help="result store (a directory of .jsonl files, or one file)")
    ap.add_argument("--filter", action="append", default=[], metavar="KEY=VALUE[,VALUE]",
                    help="only cases matching, as `dlscale sweep --filter` (repeatable; default: all)")
    ap.add_argument("--label", default=None, help="only records with this label (default: any)")
    ap.add_argument("--format", choices=("md", "json"), default="md")
    ap.add_argument("-o", "--output", default=None, metavar="FILE", help="write to FILE (default: stdout)")
    args = ap.parse_args(argv)
    try:
        store_dir, recs = select(args.store, args.filter, args.label)
        rows = [summarise(store_dir, r) for r in recs]
    except ConfigError as e:
        print(f"benchmarks/kernels.py: error: {e}", file=sys.stderr)
        return 2
    text = to_markdown(args.store, rows) if args.format == "md" else json.dumps(
        {"store": args.store, "records": rows, "difference_b_minus_a": difference(rows)}, indent=1) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
