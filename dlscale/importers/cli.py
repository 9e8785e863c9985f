"""``dlscale import FILE_OR_DIR --format NAME``: results made elsewhere into the store."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
from collections import defaultdict
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.case.caseargs import parse_options
from dlscale.importers import ImportOptions, import_path, importer_names
from dlscale.importers.records import MAX_BATCH, MAX_COUNT, MAX_PARAMS, check_int
from dlscale.results.store import ResultStore


def register(sub) -> None:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = sub.add_parser("import", formatter_class=fmt,
                       help="bring results made elsewhere (published tables, other tools' logs) into the store",
                       description="Read a file or folder with the named importer and append its cases to the store as "
                       "records of kind imported, with their provenance. Every record is validated first: bad input "
                       "stores nothing (exit 2). Formats and what each needs: docs/external.md.")
    p.add_argument("path", metavar="FILE_OR_DIR", help="the file or folder to import")
    p.add_argument("--format", required=True, choices=importer_names(), help="importer to read it with (required)")
    p.add_argument("--store", default="results", help="result store directory (JSONL files)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the cases, store nothing")
    p.add_argument("--json", action="store_true", help="print the records as JSON lines instead of the table")
    g = p.add_argument_group("provenance (as stated by the source)")
    g.add_argument("--source", default=None, help="citation or URL of the figures (default: the path given)")
    g.add_argument("--tool", default=None, help="the stack as stated, e.g. 'MXNet 1.6.0, Horovod 0.19.5'")
    g.add_argument("--date", default=None, help="date as stated by the source (free text)")
    g.add_argument("--label", default=None, help="free-form label stored with the records")
    g.add_argument("--gpu", default=None, help="GPU model as stated, e.g. 'Tesla V100-SXM2-16GB'")
    g.add_argument("--gpus-per-node", type=int, default=None, help="GPUs in one server of that cluster")
    g.add_argument("--interconnect", default=None, help="network between nodes as stated (free text)")
    w = p.add_argument_group("workload (where the file does not say it)")
    w.add_argument("--model", default=None, help="a dlscale model name where the workload matches, else free text")
    w.add_argument("--framework", default=None, help="the training stack, lower case (free text; the stack column "
                   "of reports)")
    w.add_argument("--precision", default=None, help="fp32 | amp-fp16 | amp-bf16 (dlscale's names)")
    w.add_argument("--batch-size", type=int, default=None, help="per-device batch size")
    w.add_argument("--nproc-per-node", type=int, default=None, help="GPUs per node used by the run (default 1)")
    w.add_argument("--nnodes", type=int, default=None, help="nodes used by the run (default 1)")
    w.add_argument("--strategy", default=None, help="parallel strategy as stated (default ddp)")
    w.add_argument("--compile", action="store_const", const=True, default=None,
                   help="the source compiled the model (XLA, torch.compile)")
    w.add_argument("--unit", default=None, choices=("img", "seq", "tok"),
                   help="what one sample is (default: the registered model's)")
    w.add_argument("--seq-len", type=int, default=None, help="tokens per sample (default: the registered model's)")
    w.add_argument("--params", type=int, default=None, help="model parameters (prediction input)")
    r = p.add_argument_group("log reduction (the warm-up rule; docs/external.md)")
    r.add_argument("--warmup", type=int, default=20, help="steps skipped at the start of each log")
    r.add_argument("--steps", type=int, default=100, help="steps in the window after the warm-up (0: all the rest)")
    r.add_argument("--option", "-o", action="append", metavar="KEY=VALUE", help="parser option, repeatable")
    p.set_defaults(func=cmd_import)


def options_from_args(args: argparse.Namespace):
    for name in ("batch_size", "nproc_per_node", "nnodes", "gpus_per_node", "seq_len", "params"):
        v = getattr(args, name)
        if v is not None:
            check_int(v, f"--{name.replace('_', '-')}", maximum={"batch_size": MAX_BATCH, "params": MAX_PARAMS}.get(
                name, MAX_COUNT))
    if args.warmup < 0 or args.steps < 0:
        raise ConfigError("--warmup and --steps must be >= 0")
    return ImportOptions(source=args.source, tool=args.tool, date=args.date, label=args.label, model=args.model,
                         framework=args.framework, precision=args.precision, batch_size=args.batch_size,
                         nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, strategy=args.strategy,
                         compile=args.compile, gpu=args.gpu, gpus_per_node=args.gpus_per_node,
                         interconnect=args.interconnect, unit=args.unit, seq_len=args.seq_len, params=args.params,
                         warmup=args.warmup, steps=args.steps or None, options=parse_options(args.option))


def summary_rows(records: list[dict[str, Any]]) -> list[list[str]]:
    """Per case: workload, nodes x GPUs, runs, median, mean, speedup over the 1-GPU case of its table."""
    base: dict[tuple, float] = {}
    for r in records:
        c = r["config"]
        if r["status"] == "ok" and c["nnodes"] * c["nproc_per_node"] == 1:
            base[_table_key(r)] = r["summary"]["samples_per_s"]["median"]
    out = []
    for r in records:
        c = r["config"]
        s = (r.get("summary") or {}).get("samples_per_s") or {}
        med = s.get("median")
        b = base.get(_table_key(r))
        out.append([f"{c['model']} {c['precision']} b{c['batch_size']}", f"{c['nnodes']}n{c['nproc_per_node']}g",
                    str(s.get("n") if s.get("n") is not None else "-"),
                    f"{med:,.2f}" if med else r["status"].upper(),
                    f"{s['mean']:,.2f}" if s.get("mean") else "-",
                    f"{med / b:.2f}" if med and b else "-"])
    return out


def _table_key(r: dict[str, Any]) -> tuple:
    c = r["config"]
    return (c["model"], c["precision"], c["batch_size"], c["strategy"], c["compile"], c.get("framework"))


def path_checksum(path: str) -> str | None:
    """sha256 of a regular file, or of a folder's regular files (relative names and contents, in
    name order); None for anything else (nothing is read twice from a pipe)."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    h = hashlib.sha256()
    for f in files:
        try:
            if not stat.S_ISREG(os.stat(f).st_mode):
                return None
            h.update(str(f.relative_to(root) if f != root else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
        except OSError:
            return None
    return h.hexdigest() if files else None


def split_imported(records: list[dict[str, Any]], stored: list[dict[str, Any]]) -> tuple[list, list]:
    """(records to store, records already in the store): the same case (case_key) imported from the
    same source with the same checksum is not stored twice."""
    def key(r: dict[str, Any]) -> tuple:
        prov = r.get("provenance") or {}
        return (r.get("case_key"), prov.get("source"), prov.get("checksum"))

    seen = {key(r) for r in stored if r.get("kind") == "imported" and (r.get("provenance") or {}).get("checksum")}
    new = [r for r in records if r["provenance"].get("checksum") is None or key(r) not in seen]
    return new, [r for r in records if r not in new]


def cmd_import(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    store = ResultStore(args.store)
    records = import_path(args.path, args.format, opts)  # validates every record; raises before storing
    digest = path_checksum(args.path)
    for rec in records:
        rec["provenance"]["checksum"] = digest
    records, skipped = split_imported(records, store.load().records)
    if skipped:
        print(f"# {len(skipped)} case(s) already imported from this source with the same checksum: skipped"
              + ("" if records else "; nothing new to store"))
    if not records:
        return 0
    if not args.dry_run:
        store.check_writable()
        for rec in records:
            store.append_or_recover(rec)
    if args.json:
        for rec in records:
            print(json.dumps(rec, sort_keys=True))
        return 0
    unit = records[0].get("model", {}).get("unit", "sample")
    head = ["case", "nodes x GPUs", "runs", f"median ({unit}/s)", f"mean ({unit}/s)", "speedup"]
    rows = summary_rows(records)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    warns = defaultdict(int)
    for rec in records:
        for w in rec.get("warnings") or []:
            warns[w] += 1
    for w, n in warns.items():
        print(f"# warning{f' ({n} cases)' if n > 1 else ''}: {w}")
    prov = records[0]["provenance"]
    print(f"# {len(records)} case(s) from {prov['file']} ({args.format}; source: {prov['source']})"
          + ("; dry run, nothing stored" if args.dry_run else f"; kind imported, appended to {store.file}"))
    return 0
