"""Report plots with matplotlib's Agg canvas (no pyplot state, no display needed).

Per table: throughput vs devices (with the ideal linear line from the baseline), speedup vs the
ideal line, scaling-efficiency bars, the per-step time distribution (a box per device count over
all steps of all repeats, with each repeat's median as a dot), and, only where records carry them,
a stacked step-time breakdown and utilisation bars. Per micro record: a line plot from its
``plot`` spec.
"""
from __future__ import annotations

import io
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dlscale import ConfigError
from dlscale.report.data import Group, Report, num, step_times
from dlscale.report.render import micro_title

BREAKDOWN_PARTS = (("data_ms", "data"), ("forward_ms", "forward"), ("backward_ms", "backward"),
                   ("optimizer_ms", "optimizer"), ("exposed_comm_ms", "exposed comm"))
UTIL_PARTS = (("gpu_util_pct_mean", "GPU util (%)"), ("gpu_mem_util_pct_mean", "GPU mem util (%)"),
              ("cpu_util_pct_mean", "CPU util (%)"))
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass
class Plot:
    key: str  # the group's DLPerf name, or "micro:<record id>"
    stem: str  # file name without extension
    title: str
    data: dict[str, bytes] = field(default_factory=dict)  # format -> bytes


def _figure(width: float = 5.6, height: float = 3.8):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _title(ax, text: str) -> None:
    ax.set_title(textwrap.fill(text, 62), fontsize=9)


def _save(fig, formats: Sequence[str]) -> dict[str, bytes]:
    fig.tight_layout()
    out = {}
    for fmt in formats:
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
        out[fmt] = buf.getvalue()
    return out


def _device_axis(ax, xs: Sequence[int]) -> None:
    ticks = sorted(set(xs))
    if len(ticks) > 1 and ticks[-1] / ticks[0] >= 4:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("devices")


def group_plots(g: Group, formats: Sequence[str]) -> list[Plot]:
    ok = [r for r in g.own_rows if r.ok]  # a borrowed baseline belongs to another strategy
    if not ok:
        return []
    plots = []
    xs = [r.devices for r in ok]
    unit = g.unit

    # throughput vs devices
    fig, ax = _figure()
    ys = [r.median for r in ok]
    lo = [r.median - (r.stat("min") if r.stat("min") is not None else r.median) for r in ok]
    hi = [(r.stat("max") if r.stat("max") is not None else r.median) - r.median for r in ok]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=COLORS[0],
                label="median (bars: min–max over repeats)")
    if g.baseline is not None:
        ideal_x = sorted(set(xs) | {1})
        ax.plot(ideal_x, [g.baseline.median * x for x in ideal_x], "--", color="#888", label="ideal linear")
        if g.baseline.borrowed:
            ax.plot([1], [g.baseline.median], "s", color="#555",
                    label=f"1-device baseline ({g.baseline.strategy})")
        xs = xs + [1]
    _device_axis(ax, xs)
    ax.set_ylabel(f"throughput ({unit}/s)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    _title(ax, f"Throughput: {g.title}")
    plots.append(Plot(g.name, f"{g.slug}__throughput", "throughput vs devices", _save(fig, formats)))

    sp = [r for r in ok if r.speedup is not None]
    if sp:
        fig, ax = _figure()
        sx = [r.devices for r in sp]
        top = max(sx)
        ax.plot([1, top], [1, top], "--", color="#888", label="ideal (speedup = devices)")
        ax.plot(sx, [r.speedup for r in sp], "o-", color=COLORS[1], label="measured")
        _device_axis(ax, sx + [1])
        if ax.get_xscale() == "log":
            ax.set_yscale("log", base=2)
            ax.minorticks_off()
            ticks = sorted(set(sx) | {1})
            ax.set_yticks(ticks, [str(t) for t in ticks])
        ax.set_ylabel("speedup (×)")
        ax.legend(fontsize=8)
        _title(ax, f"Speedup: {g.title}")
        plots.append(Plot(g.name, f"{g.slug}__speedup", "speedup vs ideal", _save(fig, formats)))

        fig, ax = _figure()
        labels = [r.node_gpu for r in sp]
        effs = [r.efficiency * 100 for r in sp]
        bars = ax.bar(range(len(sp)), effs, color=COLORS[2])
        ax.axhline(100, ls="--", color="#888")
        for b, e in zip(bars, effs):
            ax.annotate(f"{e:.1f}", (b.get_x() + b.get_width() / 2, e), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(sp)), labels)
        ax.set_xlabel("nodes × devices per node")
        ax.set_ylabel("scaling efficiency (%)")
        ax.set_ylim(0, max(110, max(effs) * 1.1))
        _title(ax, f"Scaling efficiency: {g.title}")
        plots.append(Plot(g.name, f"{g.slug}__efficiency", "scaling efficiency", _save(fig, formats)))

    timed = [(r, step_times(r.record)) for r in ok]
    timed = [(r, reps) for r, reps in timed if reps]
    if timed:
        import statistics

        fig, ax = _figure()
        data = [[t for rep in reps for t in rep] for _, reps in timed]
        ax.boxplot(data, flierprops={"markersize": 2})
        for i, (_, reps) in enumerate(timed, 1):
            meds = [statistics.median(rep) for rep in reps]
            offs = [(j - (len(meds) - 1) / 2) * 0.06 for j in range(len(meds))]
            ax.scatter([i + o for o in offs], meds, s=14, color=COLORS[3], zorder=3,
                       label="median of one repeat" if i == 1 else None)
        ax.set_xticks(range(1, len(timed) + 1), [r.node_gpu for r, _ in timed])
        ax.set_xlabel("nodes × devices per node")
        ax.set_ylabel("step time (ms)")
        ax.legend(fontsize=8)
        _title(ax, f"Per-step time over all repeats: {g.title}")
        plots.append(Plot(g.name, f"{g.slug}__step_times", "per-step time distribution", _save(fig, formats)))

    bd = [(r, r.record.get("breakdown")) for r in ok]
    bd = [(r, b) for r, b in bd if isinstance(b, dict) and any(num(b.get(k)) for k, _ in BREAKDOWN_PARTS)]
    if bd:
        fig, ax = _figure()
        bottom = [0.0] * len(bd)
        for (key, name), color in zip(BREAKDOWN_PARTS, COLORS):
            vals = [num(b.get(key)) or 0.0 for _, b in bd]
            if any(vals):
                ax.bar(range(len(bd)), vals, bottom=bottom, label=name, color=color)
                bottom = [x + v for x, v in zip(bottom, vals)]
        steps = [num(b.get("step_ms")) for _, b in bd]
        if any(s is not None for s in steps):
            ax.scatter([i for i, s in enumerate(steps) if s is not None], [s for s in steps if s is not None],
                       marker="_", s=400, color="black", zorder=3, label="measured step")
        ax.set_xticks(range(len(bd)), [r.node_gpu for r, _ in bd])
        ax.set_xlabel("nodes × devices per node")
        ax.set_ylabel("time per step (ms)")
        ax.set_ylim(0, max(bottom + [s or 0 for s in steps]) * 1.35)
        ax.legend(fontsize=7, ncol=3, loc="upper left")
        _title(ax, f"Step-time breakdown: {g.title}")
        plots.append(Plot(g.name, f"{g.slug}__breakdown", "step-time breakdown", _save(fig, formats)))

    ut = [(r, r.record.get("utilisation")) for r in ok]
    ut = [(r, u) for r, u in ut if isinstance(u, dict)]
    metrics = [(k, n) for k, n in UTIL_PARTS if any(num(u.get(k)) is not None for _, u in ut)]
    if ut and metrics:
        fig, ax = _figure()
        width = 0.8 / len(metrics)
        for j, ((key, name), color) in enumerate(zip(metrics, COLORS)):
            vals = [num(u.get(key)) or 0.0 for _, u in ut]
            ax.bar([i + (j - (len(metrics) - 1) / 2) * width for i in range(len(ut))], vals, width,
                   label=name, color=color)
        ax.set_xticks(range(len(ut)), [r.node_gpu for r, _ in ut])
        ax.set_xlabel("nodes × devices per node")
        ax.set_ylabel("mean utilisation (%)")
        ax.set_ylim(0, 120)
        ax.legend(fontsize=8, ncol=2, loc="upper left")
        _title(ax, f"Utilisation: {g.title}")
        plots.append(Plot(g.name, f"{g.slug}__utilisation", "utilisation", _save(fig, formats)))
    return plots


def micro_plot(rec: dict[str, Any], formats: Sequence[str]) -> Plot | None:
    spec = rec.get("plot")
    rows = [r for r in rec.get("results") or [] if isinstance(r, dict)]
    if not isinstance(spec, dict) or not rows or not spec.get("x") or not spec.get("y"):
        return None
    xk, yk, sk = spec["x"], spec["y"], spec.get("series")
    series: dict[str, list[tuple[Any, float]]] = {}
    for r in rows:
        x, y = r.get(xk), num(r.get(yk))
        if x is None or y is None:
            continue
        series.setdefault(str(r.get(sk)) if sk else str(yk), []).append((x, y))
    if not series:
        return None
    numeric_x = all(num(x) is not None for pts in series.values() for x, _ in pts)
    fig, ax = _figure()
    for (name, pts), color in zip(series.items(), COLORS * 8):
        if numeric_x:
            pts = sorted(pts, key=lambda p: p[0])
        ax.plot([str(x) if not numeric_x else x for x, _ in pts], [y for _, y in pts], "o-", ms=3,
                color=color, label=name if sk else None)
    xvals = sorted({num(x) for pts in series.values() for x, _ in pts}) if numeric_x else []
    if spec.get("logx") and numeric_x and xvals[0] > 0:
        ax.set_xscale("log", base=2 if all(float(x).is_integer() and int(x) & (int(x) - 1) == 0
                                           for x in xvals) else 10)
        if len(xvals) <= 12:
            ax.minorticks_off()
            ax.set_xticks(xvals, [f"{x:g}" for x in xvals])
    if spec.get("logy"):
        ax.set_yscale("log")
    ax.set_xlabel(str(spec.get("xlabel") or xk))
    ax.set_ylabel(str(spec.get("ylabel") or yk))
    if sk:
        ax.legend(fontsize=8, title=str(sk), title_fontsize=8)
    _title(ax, micro_title(rec))
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", f"micro_{rec.get('micro')}_{str(rec.get('id'))[:8]}")
    return Plot(f"micro:{rec.get('id')}", stem, f"micro {rec.get('micro')}", _save(fig, formats))


def render_plots(report: Report, formats: Sequence[str] = ("png",)) -> list[Plot]:
    plots: list[Plot] = []
    for g in report.groups:
        plots += group_plots(g, formats)
    for m in report.micro:
        p = micro_plot(m, formats)
        if p is not None:
            plots.append(p)
    return plots


def write_plots(plots: Sequence[Plot], directory: str | Path) -> dict[str, list[tuple[str, str]]]:
    """Write every format of every plot; returns {plot key: [(title, path of the PNG)]}."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot create plots directory {d}: {e.strerror or e}") from None
    links: dict[str, list[tuple[str, str]]] = {}
    for p in plots:
        for fmt, data in p.data.items():
            (d / f"{p.stem}.{fmt}").write_bytes(data)
        links.setdefault(p.key, []).append((p.title, str(d / f"{p.stem}.png")))
    return links
