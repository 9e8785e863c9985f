"""Loss parity across strategies: every strategy's loss trajectory beside `single`'s, with a verdict.

A *workload* is what fixes the numbers a correct strategy must reproduce: model, flavor,
precision, device type, seed, global batch, gradient accumulation, clipping, label. Within one,
the reference is the newest ok ``single`` record (the same compile setting first); every other
case (newest ok record per case) is compared point by point: each warm-up step's loss, then
``loss_after``. Verdict: ``pass`` when the largest relative difference is within the tolerance of
dlscale/results/parity.py, ``FAIL`` otherwise; ``expected to differ`` where the model normalises over
batch statistics (BatchNorm) and the case splits the batch (per-rank or per-micro-batch
statistics); ``not comparable`` where a record's losses are rank 0's share (older records).
Definitions: docs/parity.md.
"""
from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from dlscale.case.benchsuite import mp_knobs
from dlscale.fmt import md_code, md_heading, md_safe
from dlscale.report.data import (
    Filters, Loaded, Row, rec_config, rec_created, rec_device_type, rec_label, select_cases,
)
from dlscale.report.table import Column, Table, markdown, verdict_cell
from dlscale.results import parity

PASS, FAIL, EXPECTED, NOT_COMPARABLE, NO_LOSS, REFERENCE = (
    "pass", "FAIL", "expected to differ", "not comparable", "no losses", "reference")
WORKLOAD_KEYS = ("model", "flavor", "precision", "seed", "grad_accum", "clip_grad_norm")


@functools.lru_cache(maxsize=None)
def batch_statistics(model: str, flavor: str) -> bool | None:
    """Does the model normalise over batch statistics (BatchNorm)? Built on the meta device (no
    memory, no compute); None for a model this installation does not know."""
    try:
        import torch  # optional: torch
        from torch.nn.modules.batchnorm import _BatchNorm  # optional: torch

        from dlscale.models import get_model  # torch: keeps start-up light

        spec = get_model(model, flavor)
        with torch.device("meta"):
            m = spec.build()
        return any(isinstance(x, _BatchNorm) for x in m.modules())
    except Exception:  # noqa: BLE001 - unknown or unbuildable model: say unknown
        return None


def _losses(rep: dict[str, Any]) -> list[float | None]:
    return [parity.finite(x) for x in rep.get("warmup_losses") or []]


def _ok_repeats(rec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in rec.get("repeats") or [] if isinstance(r, dict) and r.get("status", "ok") == "ok"]


def trajectory(rec: dict[str, Any]) -> tuple[list[float | None], float | None, float | None]:
    """(warm-up losses, loss_after, largest relative spread between repeats) of the first ok repeat."""
    reps = _ok_repeats(rec)
    if not reps:
        return [], None, None
    first = reps[0]
    warm, after = _losses(first), parity.finite(first.get("loss_after"))
    spread = None
    for other in reps[1:]:
        pairs = list(zip(warm, _losses(other))) + [(after, parity.finite(other.get("loss_after")))]
        diffs = [parity.rel_diff(b, a) for a, b in pairs if a is not None and b is not None]
        if diffs:
            spread = max(diffs + ([spread] if spread is not None else []))
    return warm, after, spread


def after_steps(rec: dict[str, Any]) -> int | None:
    """Training steps the model had taken when ``loss_after`` was read: recorded (``loss_after_steps``),
    else warm-up + window for an older record without --breakdown or --profile; None where unknown
    (an older record whose breakdown or profile trained further steps before it)."""
    reps = _ok_repeats(rec)
    if reps and isinstance(reps[0].get("loss_after_steps"), int):
        return reps[0]["loss_after_steps"]
    cfg = rec_config(rec)
    if cfg.get("breakdown") or cfg.get("profile"):
        return None
    w, n = cfg.get("warmup"), cfg.get("steps")
    return w + n if isinstance(w, int) and isinstance(n, int) else None


def splits_batch(rec: dict[str, Any]) -> bool:
    """Does the case see the batch in pieces (per data-parallel rank, or per pipeline micro-batch)?"""
    cfg = rec_config(rec)
    gb, b, acc = rec.get("global_batch"), cfg.get("batch_size"), cfg.get("grad_accum") or 1
    dp = gb // (b * acc) if isinstance(gb, int) and isinstance(b, int) and b > 0 else 1
    info = rec.get("strategy_info") if isinstance(rec.get("strategy_info"), dict) else {}
    return dp > 1 or (info.get("microbatches") or 1) > 1 or (info.get("devices_per_process") or 1) > 1


def model_knobs(rec: dict[str, Any]) -> dict[str, Any]:
    """The strategy options that resize the model (embedding-shard's vocab_scale, partial-fc's
    classes, ...): a case so resized trains another model than the default-size `single`."""
    cfg = rec_config(rec)
    opts = cfg.get("strategy_options")
    return mp_knobs(SimpleNamespace(strategy=cfg.get("strategy"), strategy_options=opts if isinstance(opts, dict)
                                    else {}))


def workload(rec: dict[str, Any]) -> tuple:
    """Cases whose losses must agree; another framework's loss is not expected to match (its own init),
    nor a model the strategy's options resized."""
    cfg = rec_config(rec)
    return tuple(json.dumps(cfg.get(k), sort_keys=True) for k in WORKLOAD_KEYS) + (
        str(cfg.get("framework") or "torch"), rec_device_type(rec), str(rec.get("global_batch")),
        json.dumps(rec_label(rec)), json.dumps(model_knobs(rec), sort_keys=True, default=str))


@dataclass
class Entry:
    row: Row
    warmup: list[float | None]
    after: float | None
    repeat_spread: float | None
    max_rel_diff: float | None = None
    verdict: str = PASS
    note: str = ""

    @property
    def rec(self) -> dict[str, Any]:
        return self.row.record

    @property
    def name(self) -> str:
        cfg = rec_config(self.rec)
        s = str(cfg.get("strategy"))
        opts = cfg.get("strategy_options") or {}
        if opts:
            s += " " + ",".join(f"{k}={v}" for k, v in sorted(opts.items()))
        if cfg.get("compile"):
            s += " +compile"
        return s


@dataclass
class Group:
    key: tuple
    reference: Entry | None
    entries: list[Entry] = field(default_factory=list)
    tolerance: float = 0.0
    hint: str = ""  # without a reference: the global batches single did run, if any

    @property
    def rec(self) -> dict[str, Any]:
        return (self.reference or self.entries[0]).rec

    @property
    def title(self) -> str:
        cfg = rec_config(self.rec)
        model = str(cfg.get("model")) + (f" ({cfg.get('flavor')})" if cfg.get("flavor") not in (None, "full") else "")
        gb, acc = self.rec.get("global_batch"), cfg.get("grad_accum") or 1
        batch = f"global batch {gb}" + (f" ({acc} accumulated micro-batches)" if acc > 1 else "")
        bits = [model, str(cfg.get("precision")), rec_device_type(self.rec), batch, f"seed {cfg.get('seed')}"]
        if cfg.get("framework") not in (None, "torch"):
            bits.insert(1, str(cfg.get("framework")))
        if cfg.get("clip_grad_norm") is not None:
            bits.append(f"clip {cfg.get('clip_grad_norm')}")
        if rec_label(self.rec) is not None:
            bits.append(f"label {rec_label(self.rec)}")
        knobs = model_knobs(self.rec)
        if knobs:
            bits.append("model resized by " + ",".join(f"{k}={v}" for k, v in knobs.items()))
        return " · ".join(bits)

    @property
    def steps(self) -> int:
        return max((len(e.warmup) for e in self.all), default=0)

    @property
    def all(self) -> list[Entry]:
        return ([self.reference] if self.reference else []) + self.entries


@dataclass
class ParityReport:
    store: str
    groups: list[Group]
    tolerance_override: float | None = None

    def counts(self) -> dict[str, int]:
        c: dict[str, int] = defaultdict(int)
        for g in self.groups:
            for e in g.entries:
                c[e.verdict] += 1
        return dict(c)

    @property
    def failed(self) -> list[Entry]:
        return [e for g in self.groups for e in g.entries if e.verdict == FAIL]


def _judge(e: Entry, ref: Entry | None, tol: float) -> None:
    rec = e.rec
    if ref is None:
        knobs = model_knobs(e.rec)
        e.verdict, e.note = NOT_COMPARABLE, "no ok single record of this workload" + (
            f" (no reference at this model size: {', '.join(f'{k}={v}' for k, v in knobs.items())})" if knobs else "")
        return
    if not any(x is not None for x in e.warmup) and e.after is None:
        e.verdict, e.note = NO_LOSS, "the record holds no loss"
        return
    notes = []
    precision = str(rec_config(rec).get("precision"))
    cap = parity.compared_steps(precision)  # reduced precision: the first steps only (they drift apart)
    if cap is not None and len(e.warmup) > cap:
        notes.append(f"warm-up losses compared over the first {cap} steps ({precision})")
    if e.after is not None and ref.after is not None:
        mine, theirs = after_steps(rec), after_steps(ref.rec)
        why = None
        if cap is not None and mine is not None and mine > cap:
            why = f"{mine} training steps in {precision}, past the {cap} compared"
        elif mine is None or theirs is None or mine != theirs:
            # the trained models differ by the steps taken: only the warm-up losses are comparable
            why = (f"{mine} training steps against the reference's {theirs}" if mine is not None and theirs is not None
                   else "an older record whose --breakdown or --profile trained further steps before it")
        if why:
            e.after = None
            notes.append(f"loss after not compared: {why}")
    _judge_points(e, ref, tol, cap)
    if notes:
        e.note = "; ".join([e.note, *notes] if e.note else notes)


def _judge_points(e: Entry, ref: Entry, tol: float, cap: int | None = None) -> None:
    rec = e.rec
    scopes = {r.get("loss_scope") for r in rec.get("repeats") or [] if isinstance(r, dict)}
    if parity.LOSS_SCOPE not in scopes and splits_batch(rec):
        e.verdict = NOT_COMPARABLE
        e.note = "older record: warm-up losses are rank 0's share of the batch"
        pairs = [(e.after, ref.after)]  # loss_after was global already
    else:
        pairs = list(zip(e.warmup[:cap], ref.warmup[:cap])) + [(e.after, ref.after)]
    diffs = [parity.rel_diff(a, b) for a, b in pairs if a is not None and b is not None]
    e.max_rel_diff = max(diffs) if diffs else None
    if e.verdict == NOT_COMPARABLE:
        return
    if e.max_rel_diff is None:
        e.verdict, e.note = NO_LOSS, "no loss point in common with the reference"
        return
    if e.max_rel_diff <= tol:
        e.verdict = PASS
    elif splits_batch(rec) and batch_statistics(str(rec_config(rec).get("model")), str(rec_config(rec).get("flavor"))):
        e.verdict = EXPECTED
        e.note = (f"largest difference {e.max_rel_diff:.2e}: BatchNorm normalises over each rank's or "
                  "micro-batch's samples, not the whole batch")
    else:
        e.verdict = FAIL
        e.note = f"largest difference {e.max_rel_diff:.2e} > tolerance {tol:.0e}"


def build(loaded: Loaded, filters: Filters | None = None, tolerance: float | None = None) -> ParityReport:
    filters = filters or Filters()
    runs = [r for r in loaded.records if r.get("kind") == "run" and filters.match_run(r)]
    rows = [r for r in select_cases(runs) if r.ok]
    by_key: dict[tuple, list[Row]] = defaultdict(list)
    for r in rows:
        by_key[workload(r.record)].append(r)
    groups = []
    for key, members in by_key.items():
        singles = [r for r in members if r.strategy == "single" and r.devices == 1]
        eager = [r for r in singles if not rec_config(r.record).get("compile")]
        pick = max(eager or singles, key=lambda r: rec_created(r.record)) if singles else None
        ref = Entry(pick, *trajectory(pick.record), verdict=REFERENCE) if pick else None
        strategies = [r for r in members if r is not pick]  # a compiled single is compared too
        if filters.strategies:
            strategies = [r for r in strategies if r.strategy in filters.strategies]
        if not strategies:
            continue  # nothing to compare with single
        cfg = rec_config(members[0].record)
        tol = tolerance if tolerance is not None else parity.tolerance(rec_device_type(members[0].record),
                                                                        str(cfg.get("precision")))
        g = Group(key, ref, tolerance=tol)
        if ref is None:
            g.hint = _other_singles(rows, members[0].record)
        for r in sorted(strategies, key=lambda r: (r.devices, r.strategy, str(rec_config(r.record)))):
            e = Entry(r, *trajectory(r.record))
            _judge(e, ref, tol)
            g.entries.append(e)
        groups.append(g)
    groups.sort(key=lambda g: g.title)
    return ParityReport(loaded.store, groups, tolerance)


def _other_singles(rows: list[Row], rec: dict[str, Any]) -> str:
    """Where single ran the same model and precision on another global batch (why nothing matched)."""
    knobs = model_knobs(rec)
    if knobs:
        return (f" (the strategy's options resize the model: {', '.join(f'{k}={v}' for k, v in knobs.items())}; "
                "`single` trains the registered size, so no reference of this model exists)")
    cfg = rec_config(rec)
    same = [r for r in rows if r.strategy == "single" and rec_device_type(r.record) == rec_device_type(rec)
            and all(rec_config(r.record).get(k) == cfg.get(k) for k in ("model", "flavor", "precision"))]
    batches = sorted({r.record.get("global_batch") for r in same if isinstance(r.record.get("global_batch"), int)})
    if not batches:
        return ""
    return (f" (single ran global batch {', '.join(map(str, batches))}; this case trains "
            f"{rec.get('global_batch')}: run single with that global batch to compare)")


# ----------------------------------------------------------------------------- rendering

def table(g: Group) -> Table:
    """One workload: reference first, then the strategies."""
    n = g.steps
    loss = lambda h: Column(h, decimals=6)  # noqa: E731
    sci = lambda h, nd: Column(h, format=lambda v: f"{v:.{nd}e}")  # noqa: E731
    cols = [Column("strategy", left=True), Column("devices")] + [loss(f"loss step {i + 1}") for i in range(n)] + [
        loss("loss after"), sci("max rel. diff", 1), sci("tolerance", 0), sci("repeat spread", 1),
        Column("verdict", left=True)]
    rows = []
    for e in g.all:
        ref = e.verdict == REFERENCE
        rows.append([e.name + (" (reference)" if ref else ""), e.row.devices]
                    + [e.warmup[i] if i < len(e.warmup) else None for i in range(n)]
                    + [e.after, None if ref else e.max_rel_diff, None if ref else g.tolerance, e.repeat_spread,
                       verdict_cell(REFERENCE if ref else e.verdict)])
    return Table(g.title, cols, rows, notes(g), title_md=md_heading(g.title, rec_label(g.rec)), kind="parity")


METHOD = ("Each strategy's loss per warm-up step and after training (`loss_after`: the trained model, eval mode, "
          "micro-batch 0), every one the mean over the global batch, beside `single` on the same global batch, "
          "seed and precision. max rel. diff = the largest |loss − single's| ÷ |single's| over those points; "
          "pass when within the tolerance (docs/parity.md). repeat spread: the largest difference between "
          "repeats of one case (nondeterminism).")


def notes(g: Group) -> list[str]:
    out = [] if g.reference else [f"no ok `single` record of this workload: nothing to compare with{g.hint}"]
    out += [f"{e.name} × {e.row.devices}: {e.note}" for e in g.entries if e.note and g.reference]
    return out


def to_markdown(rep: ParityReport, heading: str = "#") -> str:
    out = [f"{heading} dlscale parity", "", f"Store {md_code(rep.store)}. " + METHOD, ""]
    if not rep.groups:
        out += ["No workload has a strategy other than `single` to compare.", ""]
    for g in rep.groups:
        out += markdown(table(g), heading=heading + "#")
    c = rep.counts()
    out.append("Summary: " + (", ".join(f"{n} {v}" for v, n in sorted(c.items())) or "nothing compared"))
    return md_safe("\n".join(out) + "\n")


def to_json_obj(rep: ParityReport) -> dict[str, Any]:
    groups = []
    for g in rep.groups:
        cfg = rec_config(g.rec)
        groups.append({
            "title": g.title, "model": cfg.get("model"), "flavor": cfg.get("flavor"),
            "precision": cfg.get("precision"), "device_type": rec_device_type(g.rec),
            "global_batch": g.rec.get("global_batch"), "grad_accum": cfg.get("grad_accum"), "seed": cfg.get("seed"),
            "label": rec_label(g.rec), "tolerance": g.tolerance,
            "reference": _entry_obj(g.reference) if g.reference else None,
            "cases": [_entry_obj(e) for e in g.entries],
        })
    return {"store": rep.store, "definition": METHOD, "tolerances": {f"{d}/{p}": t for (d, p), t in
                                                                       parity.TOLERANCES.items()},
            "tolerance_override": rep.tolerance_override, "groups": groups, "summary": rep.counts(),
            "passed": not rep.failed}


def _entry_obj(e: Entry) -> dict[str, Any]:
    cfg = rec_config(e.rec)
    return {"strategy": cfg.get("strategy"), "strategy_options": cfg.get("strategy_options") or {},
            "compile": cfg.get("compile"), "devices": e.row.devices, "record_id": e.rec.get("id"),
            "case_key": e.rec.get("case_key"), "warmup_losses": e.warmup, "loss_after": e.after,
            "max_rel_diff": e.max_rel_diff, "verdict": e.verdict, "note": e.note or None,
            "repeat_spread": e.repeat_spread}


def to_json(rep: ParityReport) -> str:
    return json.dumps(to_json_obj(rep), indent=2) + "\n"
