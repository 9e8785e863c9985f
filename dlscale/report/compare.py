"""A/B comparison of the same cases in two stores (or two labels of one store).

Cases are matched on ``case_key`` (and resolved device type); on each side the newest ok record of
a case is used. For each pair: ratio = median B / median A of samples/s, a percentile-bootstrap
confidence interval of that ratio (each side's repeats resampled independently, fixed seed) and
an exact two-sided Mann-Whitney U test on the repeats. A case is "faster" or "slower" only when the
CI excludes 1 AND p < 1 - confidence (AND the change is at least --min-change %); otherwise
"no change (within noise)". When the repeat counts cannot reach that p-value at all (e.g. 3 vs 3),
the verdict is "inconclusive (too few repeats)".
"""
from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from dlscale import ConfigError, validity
from dlscale.fmt import MISSING, md_table
from dlscale.fmt import fmt_num as fmt
from dlscale.report.data import (Filters, Loaded, Row, case_key_of, rec_config, rec_device_type, rec_label,
                                 repeat_samples, select_cases)
from dlscale.report.stats import bootstrap_ratio_ci, mann_whitney, min_two_sided_p

FASTER, SLOWER, SAME, FEW = "faster", "slower", "no change (within noise)", "inconclusive (too few repeats)"


@dataclass
class Side:
    name: str  # "A" or "B"
    loaded: Loaded
    label: str | None
    rows: dict[tuple[str, str], Row]

    def describe(self) -> str:
        s = f"`{self.loaded.store}`"
        if self.label is not None:
            s += f" label `{self.label}`"
        return s + f" ({len(self.rows)} case(s))"


@dataclass
class Options:
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    min_change_pct: float = 0.0


@dataclass
class Pair:
    a: Row | None
    b: Row | None
    samples_a: list[float]
    samples_b: list[float]
    median_a: float | None = None
    median_b: float | None = None
    ratio: float | None = None
    ci: tuple[float, float] | None = None
    p: float | None = None
    p_method: str | None = None
    verdict: str = SAME

    @property
    def row(self) -> Row:
        return self.a or self.b  # type: ignore[return-value]

    @property
    def case(self) -> str:
        cfg = rec_config(self.row.record)
        parts = [str(cfg.get("model"))]
        if cfg.get("flavor") not in (None, "full"):
            parts[0] += f" ({cfg.get('flavor')})"
        parts += [str(cfg.get("precision")), "compiled" if cfg.get("compile") else "eager",
                  str(cfg.get("strategy")), f"b{cfg.get('batch_size')}"]
        if (cfg.get("grad_accum") or 1) != 1:
            parts.append(f"accum {cfg.get('grad_accum')}")
        return " ".join(parts)

    @property
    def change_pct(self) -> float | None:
        return None if self.ratio is None else (self.ratio - 1.0) * 100.0

    @property
    def flags(self) -> list[validity.Flag]:
        """Why the ratio may not be sound: either side's own warnings, and B run differently from
        A (thread budget, window, sampling)."""
        if self.a is None or self.b is None or not (self.a.ok and self.b.ok):
            return []
        own = [validity.Flag(f.check, f"{side}: {f.reason}", f.severity, f.value, f.limit)
               for side, row in (("A", self.a), ("B", self.b)) for f in row.validity.warnings]
        between = [f for f in validity.compare_flags(self.b.record, self.a.record, None, what="ratio B/A")
                   if f.check != "baseline_flagged"]  # A's own flags are listed above
        return own + between


def _side(name: str, loaded: Loaded, label: str | None, filters: Filters) -> Side:
    recs = [r for r in loaded.records if r.get("kind") == "run" and filters.match_run(r)
            and (not filters.strategies or rec_config(r).get("strategy") in filters.strategies)
            and (label is None or str(rec_label(r)) == label)]
    rows = {(case_key_of(r.record), rec_device_type(r.record)): r for r in select_cases(recs, by_label=False)}
    if not rows:
        what = f" with label {label!r}" if label is not None else ""
        extra = f" matching {filters.describe()}" if filters.describe() else ""
        raise ConfigError(f"side {name}: no run records{what}{extra} in {loaded.store}")
    return Side(name, loaded, label, rows)


def judge(pair: Pair, opts: Options) -> Pair:
    a, b = pair.a, pair.b
    if a is None or b is None:
        only = b if a is None else a
        pair.verdict = "only in B" if a is None else "only in A"
        if only.status != "ok":
            pair.verdict += f" ({only.status})"
        return pair
    pair.median_a, pair.median_b = a.median, b.median
    if not (a.ok and b.ok):
        pair.verdict = f"n/a ({a.status} → {b.status})"
        return pair
    pair.ratio = pair.median_b / pair.median_a
    xa, xb = pair.samples_a, pair.samples_b
    if not xa or not xb:
        pair.verdict = FEW
        return pair
    pair.ci = bootstrap_ratio_ci(xa, xb, opts.resamples, opts.confidence, opts.seed)
    _, pair.p, pair.p_method = mann_whitney(xa, xb)
    alpha = 1.0 - opts.confidence
    if len(xa) < 2 or len(xb) < 2 or min_two_sided_p(len(xa), len(xb)) >= alpha:
        pair.verdict = FEW
    elif (pair.ci[0] > 1.0 or pair.ci[1] < 1.0) and pair.p < alpha \
            and abs(pair.ratio - 1.0) * 100.0 >= opts.min_change_pct:
        pair.verdict = FASTER if pair.ratio > 1.0 else SLOWER
    else:
        pair.verdict = SAME
    return pair


@dataclass
class Comparison:
    a: Side
    b: Side
    opts: Options
    pairs: list[Pair]

    def counts(self) -> Counter:
        return Counter(p.verdict for p in self.pairs)

    def regressions(self, pct: float) -> list[Pair]:
        return [p for p in self.pairs if p.verdict == SLOWER and p.change_pct is not None and -p.change_pct > pct]

    def warnings(self) -> list[str]:
        out = []
        for side in (self.a, self.b):
            out += [f"{side.name} ({side.loaded.store}): {w}" for w in side.loaded.warnings()]
        if self.a.loaded is self.b.loaded:
            out = out[: len(out) // 2]  # one store: say it once
        if not any(p.a is not None and p.b is not None for p in self.pairs):
            out.append("no case is in both A and B")
        return out

    def method(self) -> str:
        c = self.opts.confidence * 100
        s = (f"ratio = median B ÷ median A of samples/s over the repeats. A case is faster/slower when the "
             f"{c:g} % bootstrap CI of the ratio ({self.opts.resamples} resamples of each side's repeats, "
             f"seed {self.opts.seed}) excludes 1 and the exact two-sided Mann-Whitney U test gives "
             f"p < {1 - self.opts.confidence:.2g}")
        if self.opts.min_change_pct:
            s += f" and the change is at least {self.opts.min_change_pct:g} %"
        return s + "; otherwise no change (within noise). Each side uses the newest ok record of a case."


def compare(a: Loaded, b: Loaded, label_a: str | None, label_b: str | None, filters: Filters,
            opts: Options) -> Comparison:
    side_a = _side("A", a, label_a, filters)
    side_b = _side("B", b, label_b, filters)
    keys = list(side_a.rows) + [k for k in side_b.rows if k not in side_a.rows]
    pairs = []
    for k in keys:
        ra, rb = side_a.rows.get(k), side_b.rows.get(k)
        pairs.append(judge(Pair(ra, rb, repeat_samples(ra.record) if ra else [],
                                repeat_samples(rb.record) if rb else []), opts))

    def order(p: Pair) -> tuple:
        cfg = rec_config(p.row.record)
        return (p.a is None or p.b is None, p.case, p.row.devices, p.row.nnodes, str(cfg))

    pairs.sort(key=order)
    return Comparison(side_a, side_b, opts, pairs)


def _pair_dict(p: Pair) -> dict[str, Any]:
    cfg = rec_config(p.row.record)
    unit = (p.row.record.get("model") or {}).get("unit") if isinstance(p.row.record.get("model"), dict) else None
    return {
        "case": p.case, "case_key": p.row.record.get("case_key"), "model": cfg.get("model"),
        "precision": cfg.get("precision"), "compile": cfg.get("compile"), "strategy": cfg.get("strategy"),
        "batch_size_per_device": cfg.get("batch_size"), "nnodes": p.row.nnodes,
        "nproc_per_node": p.row.nproc_per_node, "devices": p.row.devices, "unit": f"{unit or 'sample'}/s",
        "status_a": p.a.status if p.a else None, "status_b": p.b.status if p.b else None,
        "median_a": p.median_a, "median_b": p.median_b, "ratio": p.ratio, "change_pct": p.change_pct,
        "ci_low": p.ci[0] if p.ci else None, "ci_high": p.ci[1] if p.ci else None,
        "p_value": p.p, "p_method": p.p_method, "n_a": len(p.samples_a), "n_b": len(p.samples_b),
        "verdict": p.verdict, "record_a": p.a.record.get("id") if p.a else None,
        "record_b": p.b.record.get("id") if p.b else None,
        "flags": "; ".join(f"{f.check}: {f.reason}" for f in p.flags) or None,
    }


def to_markdown(c: Comparison) -> str:
    conf = f"{c.opts.confidence * 100:g} %"
    out = ["# dlscale compare", "", f"- A: {c.a.describe()}", f"- B: {c.b.describe()}", "",
           c.method()[0].upper() + c.method()[1:], ""]
    for w in c.warnings():
        out += [f"> **Warning:** {w}", ""]
    headers = ["case", "node_num", "gpu_num", "median A (samples/s)", "median B (samples/s)", "ratio B/A",
               "change (%)", f"{conf} CI of ratio", "p (Mann-Whitney)", "n A / n B", "verdict"]
    rows = []
    for p in c.pairs:
        ci = MISSING if p.ci is None else f"{p.ci[0]:.3f}–{p.ci[1]:.3f}"
        chg = MISSING if p.change_pct is None else f"{p.change_pct:+.1f}"
        rows.append([p.case, p.row.nnodes, p.row.devices, fmt(p.median_a), fmt(p.median_b), fmt(p.ratio, 3),
                     chg, ci, MISSING if p.p is None else f"{p.p:.3g}",
                     f"{len(p.samples_a)} / {len(p.samples_b)}", p.verdict])
    out += [md_table(headers, rows, numeric_from=1, numeric_to=len(headers) - 1), ""]
    flagged = [(p, f) for p in c.pairs for f in p.flags]
    if flagged:
        out += ["Validity (docs/metrics.md): a ratio with a flag may not be sound:", ""]
        out += [f"- {p.case} {p.row.node_gpu}: ⚠ {f.check}: {f.reason}" for p, f in flagged] + [""]
    counts = c.counts()
    out.append("Summary: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    return "\n".join(out) + "\n"


def to_csv(c: Comparison) -> str:
    buf = io.StringIO()
    rows = [_pair_dict(p) for p in c.pairs]
    cols = list(rows[0]) if rows else ["case"]
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if v is None else v for k, v in r.items()})
    return buf.getvalue()


def to_json(c: Comparison) -> str:
    obj = {
        "a": {"store": c.a.loaded.store, "label": c.a.label, "cases": len(c.a.rows),
              "skipped_lines": c.a.loaded.skipped_lines},
        "b": {"store": c.b.loaded.store, "label": c.b.label, "cases": len(c.b.rows),
              "skipped_lines": c.b.loaded.skipped_lines},
        "method": {"statistic": "median B / median A of repeat samples/s", "ci": "percentile bootstrap",
                   "resamples": c.opts.resamples, "confidence": c.opts.confidence, "seed": c.opts.seed,
                   "test": "Mann-Whitney U, two-sided", "min_change_pct": c.opts.min_change_pct},
        "cases": [_pair_dict(p) for p in c.pairs],
        "summary": dict(c.counts()),
        "warnings": c.warnings(),
    }
    return json.dumps(obj, indent=2, default=str) + "\n"


def render(c: Comparison, fmt_name: str) -> str:
    return {"md": to_markdown, "csv": to_csv, "json": to_json}[fmt_name](c)


def describe_regressions(pairs: Sequence[Pair], pct: float) -> str:
    items = ", ".join(f"{p.case} {p.row.node_gpu} ({p.change_pct:+.1f} %)" for p in pairs)
    return f"{len(pairs)} case(s) significantly slower by more than {pct:g} %: {items}"
