"""Validate (and fit) the performance model on the published tables and the project's own 2-GPU records.

    python benchmarks/perfmodel_validate.py [--out DIR] [--fit] [--forms] [--frameworks] [--node-sizes] [--points]
                                            [--strategies-only]

Inputs: every table in tests/fixtures/tables (format dlscale-table/1), and the H200 pair stores
of docs/results/stores that its manifest.json lists under "fit" (with their micro comm record). Runs on
the CPU (seconds; --forms a few minutes); no GPU, nothing measured.

What it prints (markdown, for docs/perfmodel.md):
* ``--forms``: the candidate overhead laws compared by their held-out errors;
* the default law's held-out validation (each table predicted with the law refitted without every table
  of its source page, each store without itself): per protocol (from-1-gpu, from-node, from-multinode) the
  mean and max |error|, over / under counts and the share inside the band, by subset, per table, and every point;
* ``--frameworks``: the same with every table of one framework held out together;
* ``--node-sizes``: each single-node point predicted from the other node sizes of its series;
* the project's own 2-GPU records predicted from their 1-GPU records (law fitted without them);
* ``--fit``: the law fitted on everything, with its band, as the Python literal of ``DEFAULT_LAW``;
* the strategy model (fsdp, hsdp, tensor, pipeline, hybrid; dlscale/perfmodel/validate_strategies.py) on the
  published sharded-training tables (those with ``x-model``/``x-parallel``) and the project's own multi-GPU records:
  errors by source, strategy family and protocol, every point, and the ranking of configurations
  (``--strategies-only``: this section alone).

Published tables are read by the importer of ``dlscale import --format table`` (the same records it stores).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlscale import ConfigError  # noqa: E402
from dlscale.importers.table import yaml_table_records  # noqa: E402
from dlscale.perfmodel.fit import (CANDIDATE_FORMS, band_from, datasets_by_source, fit_law,  # noqa: E402
                                   framework_folds, leave_one_out)
from dlscale.perfmodel.inputs import ModelOptions, Query, build_model, group_workloads, usable  # noqa: E402
from dlscale.perfmodel.law import DEFAULT_LAW, PROTOCOLS  # noqa: E402
from dlscale.perfmodel.render import fmt, md_table, plot_validation, summary_table  # noqa: E402
from dlscale.perfmodel.validate import Validation, series_flags, summarize_rows  # noqa: E402
from dlscale.report.data import load_records  # noqa: E402
from dlscale.perfmodel import validate_strategies as vs  # noqa: E402

TABLES = [ROOT / "tests/fixtures/tables"]  # each published page once
STORES = ROOT / "docs/results/stores"
# the H200 stores the fit rests on, as the manifest lists them (COMM is an H200 pair's); a store without
# a 1-GPU and a 2-GPU record of one workload adds no pair
OWN = [STORES / p for p in json.loads((STORES / "manifest.json").read_text())["fit"]]
COMM = STORES / "h200x2-2026-11-22/micro-comm.jsonl"


def published_records() -> list[dict]:
    """The published tables, read by the importer of `dlscale import --format table`."""
    return yaml_table_records(TABLES)


def own_stores() -> dict[str, list[dict]]:
    comm = load_records(COMM).records
    out = {}
    for p in OWN:
        try:
            out[p.relative_to(STORES).as_posix()] = load_records(p).records + comm
        except ConfigError:  # a file of bare-loop lines, not dlscale records
            continue
    return out


def per_table(val: Validation) -> str:
    body = []
    for g in sorted({r.group for r in val.rows}):
        cells = [g]
        for p in PROTOCOLS:
            s = val.summary(p, [g])
            cells += ([str(s.n), fmt(s.mean_abs_error_pct, 1, " %"), fmt(s.max_abs_error_pct, 1, " %"),
                       f"{s.over}/{s.under}"] if s.n else ["0", "-", "-", "-"])
        body.append(cells + [str(len(val.select(groups=[g], flagged=True)))])
    head = [h for p in PROTOCOLS for h in (f"{p.removeprefix('from-')} n", "MAE", "max", "over/under")]
    return md_table(["table"] + head + ["flagged (left out)"], body)


SUBSETS = {  # name -> row filter, for the subset table of docs/perfmodel.md
    "all published points": lambda r: True,
    "FP32 / TF32 series": lambda r: " fp32 " in f" {r.series} ",
    "mixed-precision series": lambda r: " fp32 " not in f" {r.series} ",
    "multi-node points": lambda r: not r.shape.startswith("1x"),
    "single-node points": lambda r: r.shape.startswith("1x"),
    # Paddle ResNet-50 FP16 (no DALI, says its page) and EfficientNet-B0 ("CPU-bound Auto-augmentation", its
    # README's known issues)
    "all but the tables whose pages say they are input-bound":
        lambda r: not any(k in r.group for k in ("paddle-resnet50-fp16", "efficientnet-b0")),
}


def cell(s) -> str:
    if not s.n:
        return "-"
    return (f"{s.mean_abs_error_pct:.1f} % / {s.max_abs_error_pct:.1f} % ({s.n}), "
            f"over/under {s.over}/{s.under}")


def subsets(val: Validation, pub: set[str]) -> str:
    body = []
    for name, keep in SUBSETS.items():
        rows = [r for r in val.select(groups=pub) if keep(r)]
        body.append([name] + [cell(summarize_rows([r for r in rows if r.protocol == p])) for p in PROTOCOLS])
    return md_table(["subset"] + [f"{p}: MAE / max (n)" for p in PROTOCOLS], body)


def points(val: Validation) -> str:
    body = [[r.series, r.shape, r.protocol, fmt(r.measured, 1), fmt(r.predicted, 1),
             f"{fmt(r.low, 0)}..{fmt(r.high, 0)}", fmt(r.error_pct, 1, " %"), r.limiting, r.flags or "-"]
            for r in sorted(val.rows, key=lambda r: (r.series, r.protocol, r.devices))]
    return md_table(["series", "shape", "protocol", "measured", "predicted", "band", "error", "limited by", "flag"],
                    body)


def forms(everything: dict, pub: dict, own: dict, opts: ModelOptions) -> str:
    body = []
    for nt, mt in CANDIDATE_FORMS:
        law = fit_law(everything, opts, nt, mt)
        v = leave_one_out(everything, opts, nt, mt)
        cells = [law.describe()]
        for s in [v.summary(p, pub) for p in PROTOCOLS] + [v.summary("from-1-gpu", own)]:
            cells += [fmt(s.mean_abs_error_pct, 1, " %"), fmt(s.max_abs_error_pct, 1, " %"), f"{s.over}/{s.under}"]
        body.append(cells)
    return md_table(["law (fitted on all)", "tables from 1 GPU: MAE", "max", "over/under", "from node: MAE", "max",
                     "over/under", "from multinode: MAE", "max", "over/under", "own 2-GPU: MAE", "max",
                     "over/under"], body)


def node_sizes(pub: dict, everything: dict, opts: ModelOptions) -> str:
    """Each single-node multi-GPU point of a published series predicted from the series' other node sizes
    (the law's growth scaled to the nearest measured one; law refitted without the table), beside the law
    alone on the same points: through build_model / predict, the code path of ``dlscale predict``."""
    node_terms, net_terms = tuple(DEFAULT_LAW.node), tuple(DEFAULT_LAW.net)
    scaled, alone = [], []
    for name, records in pub.items():
        law = fit_law(everything, opts, node_terms, net_terms, exclude=[name])
        o = replace(opts, law=law)
        for w in group_workloads(usable(records, Query())).values():
            single = {sh: r for sh, r in w.measured(o.strategy).items() if sh.nodes == 1}
            if w.baseline is None or len(single) < 2 or series_flags(w, o.strategy):
                continue  # a series above ideal scaling: no test of the model (validate.series_flags)
            for sh, row in single.items():
                others = [x for x in single if x != sh]
                meas = float(row.median)
                for out, calib in ((scaled, others), (alone, [])):
                    p = build_model(w, records, o, calibrate_on=calib, exclude=row).model.predict(sh)
                    out.append((p.samples_per_s - meas) / meas * 100.0)
    body = []
    for what, errs in (("scaled to the nearest measured node size", scaled), ("the law alone (from 1 GPU)", alone)):
        a = [abs(e) for e in errs]
        body.append([what, str(len(errs)), fmt(sum(a) / len(a), 1, " %"), fmt(max(a), 1, " %"),
                     f"{sum(e > 0 for e in errs)}/{sum(e < 0 for e in errs)}"])
    return md_table(["single-node point predicted from", "points", "MAE", "max", "over/under"], body)


def comm_links():
    """The intra-node link of the project's H200 pair (its micro comm record), for its own records."""
    from dlscale.perfmodel.core import Links
    from dlscale.perfmodel.inputs import _micro_link

    n, link, _ = _micro_link(load_records(COMM).records[0], None)
    return Links(intra={n: link})


def micro_layer_records(own: dict[str, list[dict]]) -> list[dict]:
    """The ``micro layer`` records of the fit stores (each once)."""
    seen = {}
    for recs in own.values():
        for r in recs:
            if r.get("kind") == "micro" and r.get("micro") == "layer":
                seen[r.get("id")] = r
    return list(seen.values())


def micro_layer_section(rows: list, skipped: list, eager_fp8: list = ()) -> str:
    """The published tables predicted from the project's micro layer rows: errors by source, family and
    precision, every point, the cases without a row."""
    out = ["### Compute from `micro layer` records (protocol micro-layer)\n",
           "Hardware: the block rows are one H200's; the tables are H100s'. Both have the same dense bf16 peak "
           "(989 TFLOP/s, the rate is a share of it), the H200 more HBM (141 GB at 4.8 TB/s against 80 GB at "
           "3.35 TB/s), so memory-bound kernels (norms, attention softmax, casts) run faster on it: the rows "
           "are, if anything, fast for an H100. Nothing of the table's own source is used.\n"]
    groups = sorted({(r.case.source, r.case.family, r.case.precision_class) for r in rows})
    body = []
    for g in groups:
        errs = [r.error_pct for r in rows if (r.case.source, r.case.family, r.case.precision_class) == g]
        body.append([*g, str(len(errs)), fmt(sum(map(abs, errs)) / len(errs), 1, " %"),
                     fmt(max(map(abs, errs)), 1, " %"), f"{sum(e > 0 for e in errs)}/{sum(e < 0 for e in errs)}"])
    out += [md_table(["source", "family", "precision", "n", "mean |error|", "max |error|", "over/under"], body), ""]
    errs = [abs(r.error_pct) for r in rows]
    if errs:
        out.append(f"- micro-layer: {len(errs)} point(s), mean |error| {sum(errs) / len(errs):.1f} %, "
                   f"max {max(errs):.1f} %\n")
    out += [md_table(["table", "configuration", "GPUs", "measured tok/s/GPU", "predicted", "error", "block row",
                      "limited by"],
                     [[r.case.table, r.case.candidate.label, str(r.case.candidate.devices), fmt(r.case.measured, 0),
                       fmt(r.predicted, 0), fmt(r.error_pct, 1, " %"), r.basis_ref.split("; ")[-1].rstrip(")"),
                       r.limited_by] for r in rows]), ""]
    by_why: dict[str, set[str]] = {}
    for c, why in skipped:
        by_why.setdefault(why, set()).add(c.table)
    out += [f"- not predicted, {why}: {', '.join(sorted(tables))}" for why, tables in sorted(by_why.items())]
    errs = [r.error_pct for r in eager_fp8]
    if errs:
        out.append(f"- for scale only (refused as evidence): the {len(errs)} float8 point(s) of the uncompiled "
                   f"(Transformer Engine) tables at the eager fp8 rows would be off by mean "
                   f"{sum(map(abs, errs)) / len(errs):.1f} % (from {min(errs):+.1f} % to {max(errs):+.1f} %)")
    return "\n".join(out)


def strategies_section(own: dict[str, list[dict]]) -> str:
    cases = vs.published_cases(TABLES)
    micro_rows, skipped = vs.from_micro_layer(cases, micro_layer_records(own))
    rows = vs.from_smaller(cases) + vs.held_out_by_source(cases) + micro_rows + vs.own_rows(
        vs.own_cases(own, comm_links()), vs.own_host_samples(own, comm_links()))
    out = ["## The strategy model: published sharded-training tables and the project's own records\n",
           md_table(["source", "family", "protocol", "n", "mean |error|", "max |error|"],
                    [[src, fam, proto, str(n), fmt(mae, 1, " %"), fmt(mx, 1, " %")]
                     for src, fam, proto, n, mae, mx in vs.summary(rows)]), ""]
    for proto in ("from-node", "from-multinode", "fitted-rate", "micro-layer", "from-1-gpu"):
        errs = [abs(r.error_pct) for r in rows if r.protocol == proto]
        if errs:
            out.append(f"- {proto}: {len(errs)} point(s), mean |error| {sum(errs) / len(errs):.1f} %, "
                       f"max {max(errs):.1f} %")
    out += ["", md_table(["table", "configuration", "GPUs", "protocol", "measured tok/s/GPU", "predicted", "error",
                          "limited by"],
                         [[r.case.table, r.case.candidate.label, str(r.case.candidate.devices), r.protocol,
                           fmt(r.case.measured, 0), fmt(r.predicted, 0), fmt(r.error_pct, 1, " %"), r.limited_by]
                          for r in rows]), ""]
    own_same = [r for r in rows if r.protocol == "from-1-gpu" and f"; {r.case.source} " in r.basis_ref]
    same = [abs(r.error_pct) for r in own_same]
    if same:
        fams: dict[str, list[float]] = {}
        for r in own_same:
            fams.setdefault(r.case.candidate.strategy, []).append(abs(r.error_pct))
        by = "; ".join(f"{f} {len(e)}: {sum(e) / len(e):.1f} % / {max(e):.1f} %" for f, e in sorted(fams.items()))
        out.append(f"- from-1-gpu with the 1-GPU record of the same store: {len(same)} point(s), mean |error| "
                   f"{sum(same) / len(same):.1f} %, max {max(same):.1f} % ({by})")
    repeats = vs.repeat_rows(vs.own_cases(own, comm_links()))
    if repeats:
        errs = [abs(r.error_pct) for r in repeats]
        out += [f"- the bound of the own records: {len(errs)} of them have the same configuration measured in another "
                f"store; that store's figure is off by mean {sum(errs) / len(errs):.1f} %, max {max(errs):.1f} %", ""]
    for what, ranked, ok in vs.ranking(cases):
        order = "; ".join(f"{label}: predicted {p:,.0f}, measured {m:,.0f}" for label, p, m in ranked)
        out.append(f"- ranking, {what}: {order} -> the fastest published {'is' if ok else 'is NOT'} in the top three")
    fp8 = [c for c, _ in skipped if c.precision_class == "float8"]
    out += ["", micro_layer_section(micro_rows, skipped, vs.from_micro_layer(fp8, micro_layer_records(own), False)[0])]
    return "\n".join(out)


def own_pairs(val: Validation, own: dict) -> str:
    """The project's own 2-GPU records predicted from their 1-GPU records, and their summary line."""
    body = [[r.group, r.series, r.shape, fmt(r.measured, 1), fmt(r.predicted, 1), fmt(r.error_pct, 1, " %")]
            for r in val.rows if r.group in own]
    out = ["The project's own 2-GPU records, predicted from their 1-GPU records (each store held out):\n",
           md_table(["store", "case", "shape", "measured", "predicted", "error"], body)]
    so = val.summary("from-1-gpu", own)
    if so.n:
        out.append(f"\n{so.n} pair(s): mean |error| {so.mean_abs_error_pct:.1f} %, max {so.max_abs_error_pct:.1f} %, "
                   f"over / under {so.over} / {so.under}")
    return "\n".join(out)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="directory for validation.json and validation.png")
    ap.add_argument("--fit", action="store_true", help="print the law fitted on everything (DEFAULT_LAW)")
    ap.add_argument("--forms", action="store_true", help="compare the candidate forms of the law")
    ap.add_argument("--frameworks", action="store_true",
                    help="also leave one framework out (every table of a framework held out together)")
    ap.add_argument("--points", action="store_true", help="print every predicted point")
    ap.add_argument("--node-sizes", action="store_true",
                    help="also predict each single-node point from the series' other node sizes")
    ap.add_argument("--strategies-only", action="store_true",
                    help="print only the strategy model's validation (fsdp, hsdp, tensor, pipeline, hybrid)")
    return ap.parse_args()


def main() -> int:
    args = parse_args()
    if args.strategies_only:
        print(strategies_section(own_stores()))
        return 0
    opts = ModelOptions()
    pub = datasets_by_source(published_records())
    own = own_stores()
    everything = {**pub, **own}
    node_terms, net_terms = tuple(DEFAULT_LAW.node), tuple(DEFAULT_LAW.net)

    if args.forms:
        print("## Candidate laws (each table and store predicted with the law fitted without its page)\n")
        print(forms(everything, pub, own, opts))
        print()

    val = leave_one_out(everything, opts, node_terms, net_terms, band=DEFAULT_LAW.band)
    print(f"## Leave-one-page-out validation: {DEFAULT_LAW.describe()} (the form; refitted without each "
          f"table's source page, or each store)\n")
    print("Published tables:\n")
    print(summary_table(val, list(pub)))
    print()
    print(subsets(val, set(pub)))
    print()
    print(per_table(Validation([r for r in val.rows if r.group in pub])))
    print()
    if args.points:
        print(points(val))
        print()
    print(own_pairs(val, own))
    if args.node_sizes:
        print("\n## Single-node points from the other node sizes of their series (leave one node size out)\n")
        print(node_sizes(pub, everything, opts))
    if args.frameworks:
        folds = framework_folds(everything)
        vf = leave_one_out(everything, opts, node_terms, net_terms, band=DEFAULT_LAW.band, folds=folds)
        print(f"\n## Leave-one-framework-out ({len(set(folds.values()))} frameworks)\n")
        print(summary_table(vf, list(pub)))
        print()
        print(subsets(vf, set(pub)))
    if args.fit:
        held_out_published = Validation([r for r in val.rows if r.group in pub])
        law = fit_law(everything, opts, node_terms, net_terms, band=band_from(held_out_published),
                      source="benchmarks/perfmodel_validate.py --fit")
        print("\n## Fitted on everything (paste into dlscale/perfmodel/law.py)\n")
        print(f"node={law.node!r}, net={law.net!r}, band={law.band!r}")
    print()
    print(strategies_section(own))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "validation.json").write_text(json.dumps(val.to_dict(), indent=2, sort_keys=True))
        plot_validation(val, str(out / "validation.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
