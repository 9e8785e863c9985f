"""A/B comparison of the same cases in two stores (or two labels of one store).

Cases are matched on ``case_key`` (and resolved device type); on each side the newest ok record of
a case is used. For each pair: ratio = median B / median A of samples/s, a percentile-bootstrap
confidence interval of that ratio (each side's repeats resampled independently, fixed seed) and
an exact two-sided Mann-Whitney U test on the repeats. A case is "faster" or "slower" only when the
CI excludes 1 AND p < 1 - confidence (AND the change is at least --min-change %); otherwise
"no change (within noise)". When the repeat counts cannot reach that p-value at all (e.g. 3 vs 3),
the verdict is "inconclusive (too few repeats)".

With ``ignore`` (``--ignore FIELD``) cases are paired on their case fields without those, so that
variants meet their reference: B's ``TORCH_NCCL_HIGH_PRIORITY=1`` case against A's plain one
(``--ignore env``), every strategy against ``ddp`` (``--filter-a strategy=ddp --ignore
strategy,strategy_options,nproc_per_node``). A must then hold one case per pairing key; B may hold
several, each paired with the same A. ``case_filters`` (``--filter-a``/``--filter-b``) narrow
each side with the keys of `dlscale sweep --filter`.
"""
from __future__ import annotations

import csv
import io
import json
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence

from dlscale import ConfigError, inputs
from dlscale.case.config import DEFAULTS, FIELDS, MAX_SEED, PROCEDURE_FIELDS, workload_fields
from dlscale.case.suite import matches
from dlscale.fmt import MISSING, md_code, md_safe
from dlscale.report import datacols, sources
from dlscale.report.data import (
    Filters, Loaded, Row, case_key_of, freeze, rec_config, rec_device_type, rec_label,
    repeat_samples, select_cases,
)
from dlscale.report.stats import bootstrap_ratio_ci, mann_whitney, min_two_sided_p, repeats_for
from dlscale.report.table import Cell, Column, Table, md_table, verdict_cell
from dlscale.results import validity

# fields --ignore may leave out of the pairing: those of the case identity
IGNORABLE = tuple(n for n in FIELDS if n not in PROCEDURE_FIELDS)
FASTER, SLOWER, SAME, FEW = "faster", "slower", "no change (within noise)", "inconclusive (too few repeats)"
# what a pair compares: samples/s of every ok repeat, or the seconds to the quality target of every
# repeat of a run --until that reached it (docs/quality.md)
THROUGHPUT, TTQ = "throughput", "time-to-quality"
METRICS = (THROUGHPUT, TTQ)


@dataclass
class Side:
    name: str  # "A" or "B"
    loaded: Loaded
    label: str | None
    rows: dict[tuple[str, str], Row]

    def describe(self) -> str:
        s = md_code(self.loaded.store)
        if self.label is not None:
            s += f" label {md_code(self.label)}"
        return s + f" ({len(self.rows)} case(s))"


MAX_RESAMPLES = 1_000_000  # the bootstrap holds resamples x repeats numbers per side: more is a typo


@dataclass
class Options:
    resamples: int = 2000
    confidence: float = 0.95
    seed: int = 0
    min_change_pct: float = 0.0
    metric: str = THROUGHPUT


def check_options(resamples: int, confidence_pct: float, seed: int, min_change_pct: float,
                  fail_on_regression_pct: float | None) -> None:
    """compare's numbers, as given on its command line; ConfigError naming the option.

    A regression gate must never be silently off: NaN compares false with everything (the gate
    would never fire), and a slowdown is at most 100 % (B's throughput falls to 0), so a gate or a
    --min-change of 100 % or more with the gate could never flag one.
    """
    if isinstance(resamples, bool) or not 100 <= resamples <= MAX_RESAMPLES:
        raise ConfigError(f"--resamples must be from 100 to {MAX_RESAMPLES}, got {resamples}")
    if not 50.0 <= confidence_pct < 100.0:  # false for NaN too
        raise ConfigError(f"--confidence must be a percentage in [50, 100), got {confidence_pct:g}")
    if not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"--seed must be from 0 to {MAX_SEED}, got {seed}")
    if not 0.0 <= min_change_pct < float("inf"):  # false for NaN
        raise ConfigError(f"--min-change must be a finite percentage >= 0, got {min_change_pct:g}")
    if fail_on_regression_pct is None:
        return
    if not 0.0 <= fail_on_regression_pct < 100.0:
        raise ConfigError(f"--fail-on-regression must be a percentage in [0, 100) (a slowdown is at most 100 %), "
                          f"got {fail_on_regression_pct:g}")
    if min_change_pct >= 100.0:
        raise ConfigError(f"--min-change {min_change_pct:g} with --fail-on-regression: no slowdown reaches 100 %, "
                          f"so the gate could never fire; give a --min-change below 100")


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
    needs: str | None = None  # inconclusive: what it would take to decide

    @property
    def row(self) -> Row:
        """The row that names the pair: B's (the variant when pairing ignores fields), else A's."""
        return self.b or self.a  # type: ignore[return-value]

    @property
    def case(self) -> str:
        cfg = rec_config(self.row.record)
        parts = [str(cfg.get("model"))]
        if cfg.get("flavor") not in (None, "full"):
            parts[0] += f" ({cfg.get('flavor')})"
        parts += [str(cfg.get("precision")), sources.run_mode(cfg), str(cfg.get("strategy")), f"b{cfg.get('batch_size')}"]
        if (cfg.get("grad_accum") or 1) != 1:
            parts.append(f"accum {cfg.get('grad_accum')}")
        kinds = [sources.describe(r.record) for r in (self.a, self.b) if r is not None]
        if any(k != "measured" for k in kinds):  # say which side is external or imported
            parts.append("[" + " vs ".join(kinds) + "]")
        return " ".join(parts + variant_details(cfg))

    @property
    def change_pct(self) -> float | None:
        return None if self.ratio is None else (self.ratio - 1.0) * 100.0

    @property
    def flags(self) -> list[validity.Flag]:
        """Why the ratio may not be sound: either side's own warnings (and a side's interruption: its
        figures are of fewer repeats than asked for), and B run differently from A (thread budget,
        window, sampling)."""
        if self.a is None or self.b is None or not (self.a.ok and self.b.ok):
            return []
        own = [validity.Flag(f.check, f"{side}: {f.reason}", f.severity, f.value, f.limit)
               for side, row in (("A", self.a), ("B", self.b)) for f in row.validity.flags
               if f.severity == validity.WARN or f.check == "interrupted"]
        between = [f for f in validity.compare_flags(self.b.record, self.a.record, None, what="ratio B/A")
                   if f.check != "baseline_flagged"]  # A's own flags are listed above
        return own + between


def variant_details(cfg: dict[str, Any]) -> list[str]:
    """What tells variants of one case apart, where set: strategy options, compile mode and
    inductor options, environment variables."""
    out = [",".join(f"{k}={v}" for k, v in sorted((cfg.get("strategy_options") or {}).items()))]
    if cfg.get("compile") and cfg.get("compile_mode") not in (None, "default"):
        out.append(str(cfg.get("compile_mode")))
    out.append(",".join(f"{k}={v}" for k, v in sorted((cfg.get("inductor_options") or {}).items())))
    out.append(" ".join(f"{k}={v}" for k, v in sorted((cfg.get("env") or {}).items())))
    out.append(inputs.config_words(cfg))
    out.append(f"until {cfg['until']}" if cfg.get("until") else "")  # time to quality (docs/quality.md)
    return [x for x in out if x]


def match_key(rec: dict[str, Any], ignore: Sequence[str] = ()) -> str:
    """What pairs a case of A with one of B: its case_key, or with ``ignore`` its case fields
    without those."""
    if not ignore:
        return case_key_of(rec)
    return freeze({k: v for k, v in workload_fields(rec_config(rec)).items() if k not in ignore})


def _rows_by_case(name: str, selected: list[Row], ignore: Sequence[str]) -> dict[tuple, Row]:
    """(match key, device type) -> row; with ``ignore``, one A case per key, and B keys carry
    their own case key too (several B variants may pair with one A case)."""
    rows: dict[tuple, Row] = {}
    for r in selected:
        key = (match_key(r.record, ignore), rec_device_type(r.record))
        if key in rows and name == "A":
            first, second = (f"{Pair(x, None, [], []).case} {x.node_gpu}" for x in (rows[key], r))
            raise ConfigError(f"side A: two cases are the same once {', '.join(ignore)} are left out "
                              f"({first} and {second}); narrow side A with --label-a or --filter-a")
        rows[key if name == "A" or not ignore else key + (case_key_of(r.record),)] = r
    return rows


def _side(name: str, loaded: Loaded, label: str | None, filters: Filters, case_filters: Sequence = (),
          ignore: Sequence[str] = (), match: str = "case") -> Side:
    recs = [r for r in loaded.records if r.get("kind") in sources.CASE_KINDS and filters.match_run(r)
            and (not filters.strategies or rec_config(r).get("strategy") in filters.strategies)
            and (label is None or str(rec_label(r)) == label) and matches(rec_config(r), list(case_filters))]
    selected = select_cases(recs, by_label=False)
    if match == "workload":  # records of different kinds (external, imported) on one workload
        rows = sources.rows_by_workload(name, selected)
    else:
        rows = _rows_by_case(name, selected, ignore)
    if not rows:
        asked = ([f"label {label!r}"] if label is not None else []) + \
            ([filters.describe()] if filters.describe() else []) + \
            [f"--filter-{name.lower()} {k}={','.join(map(str, v))}" for f in case_filters for k, v in f.items()]
        raise ConfigError(f"side {name}: no run record in {loaded.store}"
                          + (f" matches {'; '.join(asked)}" if asked else ""))
    return Side(name, loaded, label, rows)


def needs_text(na: int, nb: int, alpha: float) -> str:
    """Why n A vs n B repeats cannot decide, and the repeats per side that can."""
    n = repeats_for(alpha, na, nb)
    take = f"{n} repeats per side can (--repeats {n} on both)" if n else "no practical repeat count can"
    return (f"{na} vs {nb} repeats cannot reach p < {alpha:g} (the smallest p they allow is "
            f"{min_two_sided_p(na, nb):.3g}): {take}, or a lower --confidence")


def repeat_values(rec: dict[str, Any], metric: str = THROUGHPUT) -> list[float]:
    """What compare resamples: samples/s of the ok repeats, or the seconds to the target of the
    repeats of a time-to-quality record that reached it."""
    if metric == THROUGHPUT:
        return repeat_samples(rec)
    out = []
    for r in rec.get("repeats") or []:
        q = r.get("quality") if isinstance(r, dict) and r.get("status", "ok") == "ok" else None
        v = q.get("time_to_target_s") if isinstance(q, dict) and q.get("reached") else None
        if isinstance(v, (int, float)) and v > 0:
            out.append(float(v))
    return out


def _medians(pair: Pair, opts: Options) -> None:
    """The pair's medians and ratio: of samples/s (B ÷ A), or of seconds to the target, as a
    speedup (A's time ÷ B's), so that above 1 is B faster either way."""
    if opts.metric == TTQ:
        xa, xb = pair.samples_a, pair.samples_b
        pair.median_a = statistics.median(xa) if xa else None
        pair.median_b = statistics.median(xb) if xb else None
        pair.ratio = pair.median_a / pair.median_b if xa and xb else None
    else:
        pair.ratio = pair.median_b / pair.median_a


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
    _medians(pair, opts)
    xa, xb = pair.samples_a, pair.samples_b
    if not xa or not xb:
        pair.verdict, pair.needs = FEW, "a side has no per-repeat figures to test"
        return pair
    num, den = (xb, xa) if opts.metric == TTQ else (xa, xb)  # the CI of the ratio as _medians defines it
    pair.ci = bootstrap_ratio_ci(num, den, opts.resamples, opts.confidence, opts.seed)
    _, pair.p, pair.p_method = mann_whitney(xa, xb)
    alpha = 1.0 - opts.confidence
    if len(xa) < 2 or len(xb) < 2 or min_two_sided_p(len(xa), len(xb)) >= alpha:
        pair.verdict, pair.needs = FEW, needs_text(len(xa), len(xb), alpha)
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
    ignore: tuple[str, ...] = ()

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
        what = ("time-to-quality speedup = median A ÷ median B of the seconds to the target over the repeats that "
                "reached it (docs/quality.md)" if self.opts.metric == TTQ else
                "ratio = median B ÷ median A of samples/s over the repeats")
        s = (f"{what}. A case is faster/slower when the "
             f"{c:g} % bootstrap CI of the ratio ({self.opts.resamples} resamples of each side's repeats, "
             f"seed {self.opts.seed}) excludes 1 and the exact two-sided Mann-Whitney U test gives "
             f"p < {1 - self.opts.confidence:.2g}")
        if self.opts.min_change_pct:
            s += f" and the change is at least {self.opts.min_change_pct:g} %"
        s += "; otherwise no change (within noise). Each side uses the newest ok record of a case."
        if self.ignore:
            s += (f" Cases are paired on their case fields without {', '.join(self.ignore)} (one A case per "
                  f"pairing, any number of B cases).")
        return s

    def a_differs(self, p: Pair) -> str:
        """The ignored fields in which the pair's A case differs from its B case."""
        if p.a is None or p.b is None:
            return MISSING
        ca, cb = rec_config(p.a.record), rec_config(p.b.record)
        value = lambda c, k: c.get(k, DEFAULTS.get(k))  # noqa: E731 - records older than a field lack it
        diff = [f"{k}={_compact(value(ca, k))}" for k in self.ignore if freeze(value(ca, k)) != freeze(value(cb, k))]
        return ", ".join(diff) or "same"


def _compact(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{x}" for k, x in sorted(v.items())) + "}"
    return str(v)


@dataclass(frozen=True)
class Pairing:
    """Which records of each side take part and how A's cases meet B's: the labels, the case filters
    (as `dlscale sweep --filter`), the case fields left out of the pairing, and ``match`` (case or
    workload)."""
    label_a: str | None = None
    label_b: str | None = None
    case_filters: tuple[Sequence, Sequence] = ((), ())
    ignore: tuple[str, ...] = ()
    match: str = "case"


def compare(a: Loaded, b: Loaded, filters: Filters, opts: Options, pairing: Pairing = Pairing()) -> Comparison:
    ignore, match = tuple(pairing.ignore), pairing.match
    side_a = _side("A", a, pairing.label_a, filters, pairing.case_filters[0], ignore, match)
    side_b = _side("B", b, pairing.label_b, filters, pairing.case_filters[1], ignore, match)
    paired: set[tuple] = set()
    pairs = []
    for kb, rb in side_b.rows.items():  # a B key starts with the A key it pairs with
        ra = side_a.rows.get(kb[:2])
        paired.add(kb[:2])
        pairs.append(judge(Pair(ra, rb, repeat_values(ra.record, opts.metric) if ra else [],
                                repeat_values(rb.record, opts.metric)), opts))
    for ka, ra in side_a.rows.items():
        if ka not in paired:
            pairs.append(judge(Pair(ra, None, repeat_values(ra.record, opts.metric), []), opts))
    if opts.metric == TTQ:  # only the cases trained to a target
        pairs = [p for p in pairs if any(r is not None and r.record.get("quality") for r in (p.a, p.b))]

    def order(p: Pair) -> tuple:
        cfg = rec_config(p.row.record)
        return (p.a is None or p.b is None, p.case, p.row.devices, p.row.nnodes, str(cfg))

    pairs.sort(key=order)
    return Comparison(side_a, side_b, opts, pairs, ignore)


def _pair_dict(p: Pair, c: Comparison | None = None) -> dict[str, Any]:
    cfg = rec_config(p.row.record)
    unit = (p.row.record.get("model") or {}).get("unit") if isinstance(p.row.record.get("model"), dict) else None
    return {
        "case": p.case, "case_key": p.row.record.get("case_key"), "model": cfg.get("model"),
        "precision": cfg.get("precision"), "compile": cfg.get("compile"), "strategy": cfg.get("strategy"),
        "batch_size_per_device": cfg.get("batch_size"), "nnodes": p.row.nnodes,
        "nproc_per_node": p.row.nproc_per_node, "devices": p.row.devices,
        "unit": "s to target" if c is not None and c.opts.metric == TTQ else f"{unit or 'sample'}/s",
        "status_a": p.a.status if p.a else None, "status_b": p.b.status if p.b else None,
        "median_a": p.median_a, "median_b": p.median_b, "ratio": p.ratio, "change_pct": p.change_pct,
        "ci_low": p.ci[0] if p.ci else None, "ci_high": p.ci[1] if p.ci else None,
        "p_value": p.p, "p_method": p.p_method, "n_a": len(p.samples_a), "n_b": len(p.samples_b),
        "verdict": p.verdict, "needs": p.needs, "record_a": p.a.record.get("id") if p.a else None,
        "record_b": p.b.record.get("id") if p.b else None,
        **({"a_differs": c.a_differs(p)} if c is not None and c.ignore else {}),
        "flags": "; ".join(f"{f.check}: {f.reason}" for f in p.flags) or None,
        **(datacols.as_dict(p) if c is not None and datacols.shown(c.pairs) else {}),
    }


def _datacol(header: str, nd: int) -> Column:
    return Column(header, format=lambda v: v if isinstance(v, str) else f"{v:.{nd}f}")


def table(c: Comparison) -> Table:
    """One row per pair: the case, the medians, the ratio with its CI and p-value, the verdict; with
    --ignore the fields A's case differs in, with real data on B what its input pipeline cost."""
    unit, ratio = ("s to target", "speedup A/B") if c.opts.metric == TTQ else ("samples/s", "ratio B/A")
    cols = [Column("case", left=True), Column("node_num"), Column("gpu_num"), Column("median A", unit, 2),
            Column("median B", unit, 2), Column(ratio, decimals=3), Column("change", "%", format=lambda v: f"{v:+.1f}"),
            Column(f"{c.opts.confidence * 100:g} % CI of ratio"), Column("p (Mann-Whitney)", format=lambda v: f"{v:.3g}"),
            Column("n A / n B")]
    rows = []
    for p in c.pairs:
        ci = None if p.ci is None else Cell(f"{p.ci[0]:.3f}–{p.ci[1]:.3f}", list(p.ci))
        rows.append([p.case, p.row.nnodes, p.row.devices, p.median_a, p.median_b, p.ratio, p.change_pct, ci, p.p,
                     f"{len(p.samples_a)} / {len(p.samples_b)}"])
    if c.ignore:  # which A case each B case met
        cols.insert(1, Column("A differs in", left=True))
        for row, p in zip(rows, c.pairs):
            row.insert(1, c.a_differs(p))
    if datacols.shown(c.pairs):  # B reads real data: what its input pipeline cost, before the verdict
        cols += [_datacol(h, nd) for h, _, _, nd in datacols.COLUMNS]
        for row, p in zip(rows, c.pairs):
            row += [value(p.median_a, p.b) for _, _, value, _ in datacols.COLUMNS]
    cols.append(Column("verdict", left=True))
    for row, p in zip(rows, c.pairs):
        row.append(verdict_cell(p.verdict))
    return Table("dlscale compare", cols, rows)


def to_markdown(c: Comparison) -> str:
    out = ["# dlscale compare", "", f"- A: {c.a.describe()}", f"- B: {c.b.describe()}", "",
           c.method()[0].upper() + c.method()[1:], ""]
    for w in c.warnings():
        out += [f"> **Warning:** {w}", ""]
    out += [md_table(table(c)), ""]
    data = datacols.shown(c.pairs)
    flagged = [(p, f) for p in c.pairs for f in p.flags]
    if flagged:
        out += ["Validity (docs/metrics.md): a ratio with a flag may not be sound:", ""]
        out += [f"- {p.case} {p.row.node_gpu}: {'⚠' if f.severity == validity.WARN else '?'} {f.check}: {f.reason}"
                for p, f in flagged] + [""]
    needs = Counter(p.needs for p in c.pairs if p.needs)
    if needs:
        out += [f"Inconclusive ({n} case{'s' if n > 1 else ''}): {why}." for why, n in needs.items()] + [""]
    counts = c.counts()
    out.append("Summary: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items())))
    if data:
        out += ["", datacols.NOTE[0].upper() + datacols.NOTE[1:] + "."]
    return md_safe("\n".join(out) + "\n")


def to_csv(c: Comparison) -> str:
    buf = io.StringIO()
    rows = [_pair_dict(p, c) for p in c.pairs]
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
        "method": {"statistic": "median A / median B of repeat seconds to the target" if c.opts.metric == TTQ
                   else "median B / median A of repeat samples/s", "ci": "percentile bootstrap",
                   "resamples": c.opts.resamples, "confidence": c.opts.confidence, "seed": c.opts.seed,
                   "test": "Mann-Whitney U, two-sided", "min_change_pct": c.opts.min_change_pct,
                   "paired_on": "case_key" if not c.ignore else {"case fields without": list(c.ignore)}},
        "cases": [_pair_dict(p, c) for p in c.pairs],
        "summary": dict(c.counts()),
        "warnings": c.warnings(),
    }
    return json.dumps(obj, indent=2, default=str) + "\n"


def render(c: Comparison, fmt_name: str) -> str:
    return {"md": to_markdown, "csv": to_csv, "json": to_json}[fmt_name](c)


def describe_regressions(pairs: Sequence[Pair], pct: float) -> str:
    items = ", ".join(f"{p.case} {p.row.node_gpu} ({p.change_pct:+.1f} %)" for p in pairs)
    return f"{len(pairs)} case(s) significantly slower by more than {pct:g} %: {items}"
