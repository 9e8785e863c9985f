"""What a tune found: the winner with the command that runs it, the runners-up with compare's
noise-aware verdict, what was pruned and why, the model's ranking against the measured one, and
the finalists predicted at the target shapes. A table (Markdown) and JSON."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from dlscale import ConfigError, DlscaleError
from dlscale.case.caseargs import command_line
from dlscale.fmt import fmt_bytes, fmt_num, md_table
from dlscale.perfmodel.cost import Amount, training_cost
from dlscale.perfmodel.inputs import ModelOptions, Query
from dlscale.perfmodel.predict import predict_workload
from dlscale.report.data import Row, baseline_fields, freeze, rec_label, repeat_samples
from dlscale.results import validity

FINALISTS = 3  # the winner and two runners-up are predicted at the target shapes
DDP_LIKE = ("ddp", "single")  # what dlscale/perfmodel's predict path models (one data-parallel rank per device)


@dataclass
class Targets:
    """--target-shapes and the link figures they are predicted with."""

    shapes: list = field(default_factory=list)  # perfmodel.core.Shape
    intra_busbw_gbps: float | None = None
    inter_busbw_gbps: float | None = None
    price_per_gpu_hour: float | None = None  # dlscale cost's figure: each shape's cost per million samples


@dataclass
class TuneResult:
    label: str
    search: Any  # search.Search
    candidates: list  # space.Candidate, all of them
    rows: list[dict[str, Any]] = field(default_factory=list)  # measured, best first
    targets: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best(self) -> dict[str, Any] | None:
        return next((r for r in self.rows if r["valid"]), None)


def _summary(rec: dict[str, Any]) -> dict[str, Any]:
    return rec.get("summary") if isinstance(rec.get("summary"), dict) else {}


def measured_row(m, best=None) -> dict[str, Any]:
    """One measured candidate as the result shows it (``best``: the winner's Measurement, for the verdict)."""
    row, summ = Row(m.record), _summary(m.record)
    c = m.ranked.candidate
    out = {"case": c.describe(), "case_key": m.record.get("case_key"), "record": m.record.get("id"),
           "status": m.record.get("status"), "valid": m.invalid is None, "invalid": m.invalid,
           "resumed": m.resumed, "unit": f"{row.unit or 'sample'}/s", "median": row.median,
           "n": (row.stats or {}).get("n"), "min": row.stat("min"), "max": row.stat("max"), "mfu": row.mfu,
           "peak_bytes": row.peak_mem, "peak_kind": "allocated" if m.record.get("device_type") == "cuda" else "RSS",
           "planned_peak_bytes": c.planned_peak, "predicted": m.ranked.predicted_samples_per_s,
           "model_rank": m.ranked.rank, "command": command_line(_plain(c.cfg)),
           "flags": [f"{f.check}: {f.reason}" for f in validity.assess(m.record).flags],
           "tokens_per_s": (summ.get("tokens_per_s") or {}).get("median")
           if isinstance(summ.get("tokens_per_s"), dict) else summ.get("tokens_per_s")}
    if best is not None and best is not m:
        out.update(_verdict(best, m))
    return out


def _plain(cfg):
    """The case as a user would run it alone: without the tune's label (the case key is the same)."""
    return dataclasses.replace(cfg, label=None)


def _verdict(best, other) -> dict[str, Any]:
    """compare's test of this candidate (B) against the winner (A)."""
    from dlscale.report.compare import Options, Pair, judge  # numpy: keeps start-up light

    a, b = Row(best.record), Row(other.record)
    p = judge(Pair(a, b, repeat_samples(a.record), repeat_samples(b.record)), Options())
    return {"gap_pct": p.change_pct, "verdict": p.verdict, "ci": list(p.ci) if p.ci else None, "p_value": p.p}


def average_ranks(values: list[float]) -> list[float]:
    """1 = the largest; tied values share the mean of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0.0] * len(values)
    pos = 0
    while pos < len(order):
        end = pos
        while end + 1 < len(order) and values[order[end + 1]] == values[order[pos]]:
            end += 1
        for k in range(pos, end + 1):
            out[order[k]] = (pos + end) / 2 + 1
        pos = end + 1
    return out


def spearman(pairs: list[tuple[float, float]]) -> float | None:
    """Rank correlation of (predicted, measured) pairs (1: the same order), ties at their mean rank; None
    under 3 pairs or where either side does not order them (all predictions equal, say)."""
    n = len(pairs)
    if n < 3:
        return None
    rp, rm = average_ranks([p for p, _ in pairs]), average_ranks([m for _, m in pairs])
    mp, mm = sum(rp) / n, sum(rm) / n
    cov = sum((x - mp) * (y - mm) for x, y in zip(rp, rm))
    var = (sum((x - mp) ** 2 for x in rp) * sum((y - mm) ** 2 for y in rm)) ** 0.5
    return cov / var if var > 0 else None


def build(search, candidates: list, records: list[dict[str, Any]], targets: Targets | None) -> TuneResult:
    """The result of a search (``records``: the store's, for the predictions at the target shapes)."""
    valid = search.valid()
    best = valid[0] if valid else None
    order = valid + [m for m in search.measured if m not in valid]
    res = TuneResult(search.label, search, candidates, [measured_row(m, best) for m in order])
    ranked = [r for r in res.rows if r["valid"] and r["predicted"]]
    for r, rank in zip(ranked, average_ranks([r["predicted"] for r in ranked])):
        r["model_rank_measured"] = rank  # the model's rank among the measured (ties share their mean rank)
    for i, r in enumerate(ranked, 1):
        r["measured_rank"] = i
    if targets and targets.shapes:
        mine = [r for r in records if rec_label(r) == search.label]
        res.targets = [predict_targets(m, mine, targets) for m in valid[:FINALISTS]]
    return res


def predict_targets(m, records: list[dict[str, Any]], targets: Targets) -> dict[str, Any]:
    """One finalist at the target shapes: dlscale/perfmodel's data-parallel prediction (band and
    basis) from this tune's records of its workload. Other strategies: a note, and this function is
    where a model of them plugs in."""
    c = m.ranked.candidate
    out: dict[str, Any] = {"case": c.describe(), "record": m.record.get("id"), "rows": [], "note": None}
    if c.cfg.strategy not in DDP_LIKE:
        out["note"] = (f"no prediction: the performance model predicts data-parallel scaling (ddp); "
                       f"{c.cfg.strategy} is not modelled at other shapes yet")
        return out
    key = freeze(baseline_fields(m.record))
    same = [r for r in records if r.get("status") == "ok" and freeze(baseline_fields(r)) == key]
    opts = ModelOptions(intra_busbw_gbps=targets.intra_busbw_gbps, inter_busbw_gbps=targets.inter_busbw_gbps,
                        strategy="ddp")
    try:
        pred = predict_workload(same, Query(), opts, targets.shapes, None, "this tune's records")
    except (ConfigError, DlscaleError) as e:
        out["note"] = f"no prediction: {e}"
        return out
    for row in pred.to_dict()["rows"]:
        cell = {k: row.get(k) for k in ("shape", "devices", "samples_per_s", "samples_per_s_low",
                                        "samples_per_s_high", "efficiency", "basis")}
        if targets.price_per_gpu_hour and row.get("samples_per_s"):
            cell["cost_per_million_samples"] = training_cost(row["samples_per_s"], int(row["devices"]),
                                                             targets.price_per_gpu_hour,
                                                             Amount(samples=1e6))["cost_per_million_samples"]
        out["rows"].append(cell)
    return out


def pruned_groups(candidates: list) -> list[dict[str, Any]]:
    """Pruned candidates grouped by their reason (a strategy that cannot run here, once)."""
    groups: dict[tuple, list[str]] = {}
    for c in candidates:
        if c.pruned is not None:
            groups.setdefault((c.pruned_by or "invalid", c.pruned), []).append(c.describe())
    return [{"by": by, "reason": why, "cases": cases} for (by, why), cases in groups.items()]


def pruned_summary(candidates: list) -> dict[str, int]:
    """How many candidates each kind of pruning took."""
    out: dict[str, int] = {}
    for c in candidates:
        if c.pruned is not None:
            out[c.pruned_by or "invalid"] = out.get(c.pruned_by or "invalid", 0) + 1
    return out


def _ranked_pairs(res: TuneResult) -> list[tuple[float, float]]:
    """(predicted, measured median) of the valid measured rows the model predicted."""
    return [(r["predicted"], r["median"]) for r in res.rows if r["valid"] and r["predicted"]]


def to_dict(res: TuneResult) -> dict[str, Any]:
    s = res.search
    pairs = _ranked_pairs(res)
    return {"label": res.label, "best": res.best, "measured": res.rows, "stopped": s.stopped,
            "budget_s": s.budget_s, "spent_s": s.spent_s, "top": s.top,
            "candidates": len(res.candidates), "runnable": sum(c.pruned is None for c in res.candidates),
            "pruned": [{"case": c.describe(), "by": c.pruned_by, "reason": c.pruned} for c in res.candidates
                       if c.pruned is not None],
            "pruned_counts": pruned_summary(res.candidates),
            "not_measured": [{"case": r.candidate.describe(), "reason": s.skipped[r.candidate.key]}
                             for r in s.ranked if r.candidate.key in s.skipped],
            "headroom": {"fraction": s.headroom.fraction, "scale": s.headroom.scale, "events": s.headroom.events},
            "rank_correlation": spearman(pairs), "rank_basis": next((r.basis for r in s.ranked), None),
            "targets": res.targets}


def to_json(res: TuneResult) -> str:
    return json.dumps(to_dict(res), indent=1, default=str) + "\n"


def _correlation(res: TuneResult, d: dict[str, Any]) -> str:
    if d["rank_correlation"] is not None:
        return _num(d["rank_correlation"], 2)
    predicted = [p for p, _ in _ranked_pairs(res)]
    if len(predicted) < 3:
        return "n/a (under 3 valid)"
    return "n/a (the model ordered nothing: equal predictions)" if len(set(predicted)) == 1 else "n/a (equal measurements)"


def _workload(res: TuneResult) -> str:
    cfg = res.candidates[0].cfg if res.candidates else None
    return f"{cfg.model} ({cfg.flavor})" if cfg is not None else "the model"


def _num(v: Any, digits: int = 1) -> str:
    return fmt_num(v, digits, group=True)


def _best_lines(res: TuneResult) -> list[str]:
    b = res.best
    if b is None:
        return ["No valid configuration was measured" + (f" ({res.search.stopped})" if res.search.stopped else "")
                + ".", ""]
    mfu = f", MFU {100 * b['mfu']:.1f} %" if b.get("mfu") else ""
    spread = f" (n={b['n']}, {_num(b['min'])}–{_num(b['max'])})" if b.get("n") else ""
    return [f"**Fastest:** {b['case']}: {_num(b['median'])} {b['unit']}{spread}{mfu}, peak "
            f"{fmt_bytes(b['peak_bytes'])} per device ({b['peak_kind']}; planned {fmt_bytes(b['planned_peak_bytes'])})",
            "", "```", b["command"], "```", ""] + [f"- ⚠ {f}" for f in b["flags"]] + ([""] if b["flags"] else [])


def _measured_table(res: TuneResult) -> str:
    headers = ["case", "measured", "n", "gap vs best (%)", "verdict", "MFU %", "peak", "planned", "predicted",
               "model rank", "measured rank", "note"]
    rows = []
    for r in res.rows:
        note = r["invalid"] or ("; ".join(f.split(":")[0] for f in r["flags"]) or "")
        note = ("resumed; " if r["resumed"] else "") + note
        rows.append([r["case"], _num(r["median"]), r["n"] or "-",
                     "best" if r is res.best else (f"{r['gap_pct']:+.1f}" if r.get("gap_pct") is not None else "-"),
                     "-" if r is res.best else r.get("verdict", "-"), _num(100 * r["mfu"]) if r.get("mfu") else "-",
                     fmt_bytes(r["peak_bytes"]), fmt_bytes(r["planned_peak_bytes"]), _num(r["predicted"]),
                     r.get("model_rank_measured", "-"), r.get("measured_rank", "-"), note.strip("; ") or "-"])
    return md_table(headers, rows, numeric_from=1, numeric_to=len(headers) - 1)


def _target_lines(res: TuneResult) -> list[str]:
    out = ["## At the target shapes", ""]
    for t in res.targets:
        if t["note"]:
            out += [f"- {t['case']}: {t['note']}", ""]
            continue
        cells = [[x["shape"], _num(x["samples_per_s"]), f"{_num(x['samples_per_s_low'])}–{_num(x['samples_per_s_high'])}",
                  _num(100 * x["efficiency"]) if x.get("efficiency") is not None else "-",
                  _num(x.get("cost_per_million_samples"), 2), x["basis"]] for x in t["rows"]]
        out += [f"{t['case']} (record {str(t['record'])[:12]}):", "",
                md_table(["shape", "predicted samples/s", "band", "efficiency %", "cost per 1e6 samples", "basis"],
                         cells, numeric_from=1, numeric_to=5), ""]
    return out


def to_markdown(res: TuneResult) -> str:
    d = to_dict(res)
    s = res.search
    stop = {"budget": "stopped: the budget was spent", "interrupted": "stopped: interrupted"}.get(s.stopped or "",
                                                                                               "every contender measured")
    out = [f"# dlscale tune {res.label}", "",
           f"{d['candidates']} candidate(s), {d['runnable']} runnable, {len(res.rows)} measured "
           f"({sum(r['resumed'] for r in res.rows)} read back from the store); {stop}; spent "
           f"{s.spent_s:.0f} s of a {s.budget_s:.0f} s budget.", ""]
    out += _best_lines(res)
    if res.rows:
        out += ["## Measured", "", _measured_table(res), "",
                "gap: median ÷ the best's − 1; verdict: compare's test against the best (docs/reports.md); "
                f"predicted: {d['rank_basis']} (samples/s); rank correlation (Spearman) of the model's order and the "
                f"measured one: {_correlation(res, d)}.", ""]
        if "assumed-mfu" in (d["rank_basis"] or ""):
            out += [f"⚠ The model ranked on an assumed MFU: the store holds no measurement of {_workload(res)}, so "
                    "it predicts the same rate for every batch and precision. `dlscale micro layer` records of its "
                    "block at its sequence length (each precision; --compile as the candidates) in the store give "
                    "it measured rates (docs/tune.md).", ""]
    if res.targets:
        out += _target_lines(res)
    counts = ", ".join(f"{n} {k}" for k, n in sorted(d["pruned_counts"].items())) or "none"
    out += [f"## Pruned ({counts})", ""]
    groups = pruned_groups(res.candidates)
    for g in groups[:30]:
        cases = g["cases"]
        shown = ", ".join(cases[:3]) + (f" and {len(cases) - 3} more" if len(cases) > 3 else "")
        out.append(f"- {g['by']}: {g['reason']} ({shown})")
    if len(groups) > 30:
        out.append(f"- ... {len(groups) - 30} more reasons (--format json lists every candidate)")
    if d["not_measured"]:
        out += ["", "## Not measured", ""] + [f"- {x['case']}: {x['reason']}" for x in d["not_measured"][:20]]
    if s.headroom.events:
        out += ["", "## Memory headroom", ""] + [f"- {e}" for e in s.headroom.events]
    return "\n".join(out) + "\n"
