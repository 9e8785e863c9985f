"""Report plots with matplotlib's Agg canvas (no pyplot state, no display needed).

Per table: throughput vs devices (with the ideal linear line from the baseline), speedup vs the
ideal line, scaling-efficiency bars, the per-step time distribution (a box per device count over
all steps of all repeats, with each repeat's median as a dot), and, only where records carry them,
a stacked step-time breakdown, utilisation bars, and the utilisation over time of one case (the
largest ok case whose median repeat left a readable series file in the store). Per micro record: a
line plot from its ``plot`` spec.
"""
from __future__ import annotations

import io
import math
import re
import statistics
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from dlscale import ConfigError
from dlscale.results import validity
from dlscale.report.data import (Group, Report, Row, median_repeat_entry, num, read_series,
                                 resolve_store_path, series_paths, step_times)
from dlscale.report import quality
from dlscale.report.render import MB, micro_title

# stacked bottom to top; backward_ms includes the exposed communication, so it is split in two
BREAKDOWN_PARTS = ("data", "forward", "backward compute", "exposed comm", "optimizer")
BREAKDOWN_COLORS = {"data": "#8c564b", "forward": "#1f77b4", "backward compute": "#2ca02c",
                    "exposed comm": "#d62728", "optimizer": "#ff7f0e"}
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
    from matplotlib.figure import Figure  # matplotlib: keeps start-up light

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


def breakdown_segments(b: dict[str, Any]) -> list[tuple[str, float]]:
    """(part, ms) bottom to top: data, forward, backward compute, exposed comm, optimizer.

    The breakdown's ``backward_ms`` includes the exposed communication (``exposed_comm_ms``, null on
    one device), so the backward bar is split into ``backward_ms - exposed`` and ``exposed``; the
    stack then sums to ``data + forward + backward + optimizer``, which is the breakdown's ``step_ms``.
    """
    data, fwd, bwd, opt = (num(b.get(k)) or 0.0 for k in ("data_ms", "forward_ms", "backward_ms", "optimizer_ms"))
    exposed = min(max(num(b.get("exposed_comm_ms")) or 0.0, 0.0), max(bwd, 0.0))
    return list(zip(BREAKDOWN_PARTS, (data, fwd, bwd - exposed, exposed, opt)))


def _nan(v: Any) -> float:
    x = num(v)
    return float("nan") if x is None else x


def _gpus(sample: dict[str, Any]) -> list[dict[str, Any]]:
    gpus = sample.get("gpus")
    return [g for g in gpus if isinstance(g, dict)] if isinstance(gpus, list) else []


def _gpu_stat(sample: dict[str, Any], key: str) -> tuple[float, float, float]:
    """Mean, min and max over the sample's GPUs of one per-GPU field (NaN when none reports it)."""
    vals = [num(g.get(key)) for g in _gpus(sample)]
    vals = [v for v in vals if v is not None]
    if not vals:
        return float("nan"), float("nan"), float("nan")
    return sum(vals) / len(vals), min(vals), max(vals)


def _over_time_series(samples: list[dict[str, Any]]) -> tuple[list, int, list, list]:
    """(per-sample GPU util (mean, min, max), GPUs, the % series, the MB/s series) of a series file; each
    series (label, values, colour, line style), one that no sample reports left out."""
    gpu = [_gpu_stat(s, "util_pct") for s in samples]
    gpu_mem = [_gpu_stat(s, "mem_util_pct")[0] for s in samples]
    cpu = [_nan(s.get("cpu_util_pct")) for s in samples]
    n_gpus = max((len(_gpus(s)) for s in samples), default=0)
    pct = [(f"GPU util (mean of {n_gpus} GPUs)" if n_gpus > 1 else "GPU util", [m for m, _, _ in gpu], COLORS[0], "-"),
           ("GPU mem util", gpu_mem, COLORS[4], "-"), ("CPU util (host)", cpu, COLORS[1], "-")]
    pct = [p for p in pct if any(not math.isnan(y) for y in p[1])]
    # rx dashed: with loopback traffic (one node) tx and rx are the same line
    rates = [(name, [_nan(s.get(key)) / MB for s in samples], color, ls)
             for key, name, color, ls in (("net_sent_bps", "net tx", COLORS[2], "-"),
                                          ("net_recv_bps", "net rx", COLORS[3], "--"),
                                          ("disk_read_bps", "disk read", COLORS[5], "-"),
                                          ("disk_write_bps", "disk write", COLORS[6], "--"))]
    rates = [p for p in rates if any(not math.isnan(y) for y in p[1])]
    return gpu, n_gpus, pct, rates


def over_time_plot(g: Group, row: Row, rel: str, samples: list[dict[str, Any]],
                   formats: Sequence[str]) -> Plot | None:
    """GPU and CPU utilisation (%) and disk/network MB/s against time, from one series file."""
    from matplotlib.figure import Figure  # matplotlib: keeps start-up light

    t0 = samples[0]["t"]
    x = [s["t"] - t0 for s in samples]
    gpu, n_gpus, pct, rates = _over_time_series(samples)
    if not pct and not rates:
        return None
    panels = [p for p in (pct, rates) if p]
    fig = Figure(figsize=(5.6, 3.0 + 1.6 * len(panels)), dpi=100)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [3, 2][:len(panels)]})[:, 0]
    rep = median_repeat_entry(row.record) or {}
    ww = rep.get("window_wall")
    window = None
    if isinstance(ww, (list, tuple)) and len(ww) == 2 and all(num(v) is not None for v in ww):
        window = (num(ww[0]) - t0, num(ww[1]) - t0)
    for ax in axes:
        ax.grid(True, alpha=0.3)
        if window:
            ax.axvspan(*window, color="#999", alpha=0.15, label="timed window" if ax is axes[0] else None)
    if pct:
        ax = axes[0]
        for name, ys, color, ls in pct:
            ax.plot(x, ys, ls, lw=1.2, color=color, label=name)
        if n_gpus > 1 and pct[0][0].startswith("GPU util"):
            ax.fill_between(x, [lo for _, lo, _ in gpu], [hi for _, _, hi in gpu], color=COLORS[0], alpha=0.2,
                            lw=0, label="GPU util min–max over GPUs")
        ax.set_ylabel("utilisation (%)")
        ax.set_ylim(0, 135)  # the legend sits above 100 %
        ax.set_yticks(range(0, 101, 20))
        ax.legend(fontsize=7, ncol=2, loc="upper center")
    if rates:
        ax = axes[-1]
        for name, ys, color, ls in rates:
            ax.plot(x, ys, ls, lw=1.0, color=color, label=name)
        ax.set_ylabel("MB/s")
        top = max((y for _, ys, _, _ in rates for y in ys if not math.isnan(y)), default=0.0)
        ax.set_ylim(0, top * 1.5 if top > 0 else 1.0)
        ax.legend(fontsize=7, ncol=4, loc="upper center")
    axes[-1].set_xlabel("seconds since the first sample")
    which = f"median repeat {rep.get('repeat')}" if rep.get("repeat") is not None else "median repeat"
    _title(axes[0], f"Utilisation over time: {g.title} · {row.node_gpu}, {which} · {Path(rel).name}")
    return Plot(g.name, f"{g.slug}__utilisation_over_time", f"utilisation over time ({row.node_gpu}, {which})",
                _save(fig, formats))


def utilisation_over_time(g: Group, formats: Sequence[str]) -> Plot | None:
    """The over-time plot of the table's largest ok case with a readable series file, or None.

    Series paths are relative to the store directory; a missing or unreadable file is passed over
    (the table's notes name missing files), never an error.
    """
    if g.store_dir is None:
        return None
    rows = sorted((r for r in g.own_rows if r.ok), key=lambda r: (-r.devices, -r.nnodes))
    for r in rows:
        for rel in series_paths(r.record):
            samples = read_series(resolve_store_path(g.store_dir, rel))
            if len(samples) < 2:
                continue
            try:
                p = over_time_plot(g, r, rel, samples, formats)
            except (TypeError, ValueError, OverflowError):  # odd values in a foreign or damaged file
                p = None
            if p is not None:
                return p
    return None


FLAG_COLOR = "#d9822b"  # flagged numbers: hatched and orange, never a plain bar
EFF_AXIS_MAX = 150.0  # efficiency axis top when a flagged value is far above ideal


def _warned(flags) -> bool:
    return any(f.severity == validity.WARN for f in flags)


def scaling_plots(g: Group, ok: list[Row], formats: Sequence[str]) -> list[Plot]:
    """Speedup vs the ideal line and efficiency bars, only where some case has more than one device
    (one point says nothing about scaling). A flagged speedup is an open orange marker; a flagged
    efficiency a hatched orange bar whose part above 100 % is only outlined, with the reason's name."""
    sp = [r for r in ok if r.speedup is not None]
    if not any(r.devices > 1 for r in sp):
        return []
    return [_speedup_plot(g, sp, formats), _efficiency_plot(g, sp, formats)]


def _speedup_plot(g: Group, sp: list[Row], formats: Sequence[str]) -> Plot:
    fig, ax = _figure()
    sx = [r.devices for r in sp]
    top = max(sx)
    ax.plot([1, top], [1, top], "--", color="#888", label="ideal (speedup = devices)")
    ax.plot(sx, [r.speedup for r in sp], "-", color=COLORS[1])
    plain = [r for r in sp if not _warned(r.speedup_flags)]
    flagged = [r for r in sp if _warned(r.speedup_flags)]
    ax.plot([r.devices for r in plain], [r.speedup for r in plain], "o", color=COLORS[1], label="measured")
    if flagged:
        ax.plot([r.devices for r in flagged], [r.speedup for r in flagged], "o", mfc="none", mec=FLAG_COLOR, mew=2,
                ms=9, label="flagged (see the table's notes)")
    _device_axis(ax, sx + [1])
    if ax.get_xscale() == "log":
        ax.set_yscale("log", base=2)
        ax.minorticks_off()
        ticks = sorted(set(sx) | {1})
        ax.set_yticks(ticks, [str(t) for t in ticks])
    ax.set_ylabel("speedup (×)")
    ax.legend(fontsize=8)
    _title(ax, f"Speedup: {g.title}")
    return Plot(g.name, f"{g.slug}__speedup", "speedup vs ideal", _save(fig, formats))


def _efficiency_plot(g: Group, sp: list[Row], formats: Sequence[str]) -> Plot:
    fig, ax = _figure()
    effs = [r.efficiency * 100 for r in sp]
    flagged_any = any(_warned(r.speedup_flags) for r in sp)
    # a flagged efficiency far above ideal would squash the axis: draw up to EFF_AXIS_MAX, say the rest
    top = EFF_AXIS_MAX if flagged_any and max(effs) > EFF_AXIS_MAX else max(125.0, max(effs) * 1.15)
    for i, (r, e) in enumerate(zip(sp, effs)):
        if not _warned(r.speedup_flags):
            ax.bar(i, e, color=COLORS[2])
            ax.annotate(f"{e:.1f}", (i, e), ha="center", va="bottom", fontsize=8)
            continue
        ax.bar(i, min(e, 100.0), color="#fbe3c8", edgecolor=FLAG_COLOR, hatch="//", lw=1.2)
        if e > 100.0:  # the part above ideal: a dashed outline, never a filled bar
            ax.bar(i, min(e, top) - 100.0, bottom=100.0, fill=False, edgecolor=FLAG_COLOR, ls="--", lw=1.2)
        names = ", ".join(sorted({f.check for f in r.speedup_flags if f.severity == validity.WARN}))
        label = f"{e:.1f} % (off scale)" if e > top else f"{e:.1f} %"
        ax.annotate(f"flagged: {label}\n{textwrap.fill(names, 22)}", (i, min(e, top) if e <= top else top * 0.97),
                    ha="center", va="bottom" if e <= top else "top", fontsize=7, color=FLAG_COLOR)
    ax.axhline(100, ls="--", color="#888")
    ax.set_xticks(range(len(sp)), [r.node_gpu for r in sp])
    ax.set_xlabel("nodes × devices per node")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_ylim(0, top * (1.12 if flagged_any else 1.0))
    if flagged_any:
        from matplotlib.patches import Patch  # matplotlib: keeps start-up light

        ax.legend(handles=[Patch(facecolor="#fbe3c8", edgecolor=FLAG_COLOR, hatch="//",
                                 label="flagged: not a sound number (reasons in the table's notes)")],
                  fontsize=7, loc="lower left")
    _title(ax, f"Scaling efficiency: {g.title}")
    return Plot(g.name, f"{g.slug}__efficiency", "scaling efficiency", _save(fig, formats))


def group_plots(g: Group, formats: Sequence[str]) -> list[Plot]:
    ok = [r for r in g.own_rows if r.ok]  # a borrowed baseline belongs to another strategy
    if not ok:
        return []
    plots = []
    xs = [r.devices for r in ok]
    unit = g.unit
    if len(set(xs) | ({1} if g.baseline is not None else set())) < 2:
        # one device count: no scaling to draw (the report's side-by-side table compares such cases)
        return plots + _other_plots(g, ok, formats)

    # throughput vs devices
    fig, ax = _figure()
    ys = [r.median for r in ok]
    lo = [r.median - (r.stat("min") if r.stat("min") is not None else r.median) for r in ok]
    hi = [(r.stat("max") if r.stat("max") is not None else r.median) - r.median for r in ok]
    ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, color=COLORS[0],
                label="median (bars: min–max over repeats)")
    bad = [r for r in ok if not r.validity.sound]
    if bad:
        ax.plot([r.devices for r in bad], [r.median for r in bad], "o", mfc="none", mec=FLAG_COLOR, mew=2, ms=10,
                label="flagged record (see the table's notes)")
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

    plots += scaling_plots(g, ok, formats)
    return plots + _other_plots(g, ok, formats)


def _step_time_plot(g: Group, ok: list[Row], formats: Sequence[str]) -> Plot | None:
    """Per-step times over all repeats of each case: a box per case, its repeats' medians as dots."""
    timed = [(r, step_times(r.record)) for r in ok]
    timed = [(r, reps) for r, reps in timed if reps]
    if not timed:
        return None

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
    return Plot(g.name, f"{g.slug}__step_times", "per-step time distribution", _save(fig, formats))


def _breakdown_plot(g: Group, ok: list[Row], formats: Sequence[str]) -> Plot | None:
    """The step-time breakdown of each case stacked, beside its breakdown step and window p50."""
    bd = [(r, r.breakdown) for r in ok]
    bd = [(r, b) for r, b in bd if b and any(v > 0 for _, v in breakdown_segments(b))]
    if not bd:
        return None
    fig, ax = _figure()
    bottom = [0.0] * len(bd)
    segs = [dict(breakdown_segments(b)) for _, b in bd]
    for name in BREAKDOWN_PARTS:
        vals = [sg[name] for sg in segs]
        if any(vals):
            ax.bar(range(len(bd)), vals, bottom=bottom, label=name, color=BREAKDOWN_COLORS[name])
            bottom = [x + v for x, v in zip(bottom, vals)]
    steps = [num(b.get("step_ms")) for _, b in bd]
    if any(s is not None for s in steps):
        ax.scatter([i for i, s in enumerate(steps) if s is not None], [s for s in steps if s is not None],
                   marker="_", s=400, color="black", zorder=3, label="breakdown step_ms")
    timed = [r.summary("step_ms_p50") for r, _ in bd]
    timed = [num(t) for t in timed]
    if any(t is not None for t in timed):
        ax.scatter([i for i, t in enumerate(timed) if t is not None], [t for t in timed if t is not None],
                   marker="D", s=22, facecolors="none", edgecolors="black", zorder=3,
                   label="timed-window step (p50)")
    steps = steps + timed
    ax.set_xticks(range(len(bd)), [r.node_gpu for r, _ in bd])
    ax.set_xlabel("nodes × devices per node")
    ax.set_ylabel("time per step (ms)")
    ax.set_ylim(0, max(bottom + [s or 0 for s in steps]) * 1.35)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    _title(ax, f"Step-time breakdown: {g.title}")
    return Plot(g.name, f"{g.slug}__breakdown", "step-time breakdown", _save(fig, formats))


def _utilisation_plot(g: Group, ok: list[Row], formats: Sequence[str]) -> Plot | None:
    """Mean utilisation of each case's timed window, a bar per metric."""
    ut = [(r, r.record.get("utilisation")) for r in ok]
    ut = [(r, u) for r, u in ut if isinstance(u, dict)]
    metrics = [(k, n) for k, n in UTIL_PARTS if any(num(u.get(k)) is not None for _, u in ut)]
    if not (ut and metrics):
        return None
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
    return Plot(g.name, f"{g.slug}__utilisation", "utilisation", _save(fig, formats))


def _other_plots(g: Group, ok: list[Row], formats: Sequence[str]) -> list[Plot]:
    """Step-time distribution, breakdown, utilisation bars and over time: also for one device count."""
    plots = [p for p in (_step_time_plot(g, ok, formats), _breakdown_plot(g, ok, formats),
                         _utilisation_plot(g, ok, formats)) if p is not None]
    over_time = utilisation_over_time(g, formats)
    if over_time is not None:
        plots.append(over_time)
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
    plots += quality_plots(quality.build(report.loaded, report.filters), formats)
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


def quality_plots(groups: Sequence["quality.QGroup"], formats: Sequence[str]) -> list[Plot]:
    """Per workload: validation loss against samples and against training seconds, a line per repeat."""
    from matplotlib.figure import Figure  # matplotlib: keeps start-up light

    out = []
    for g in groups:
        fig = Figure(figsize=(9.6, 3.8), dpi=100)
        axes = fig.subplots(1, 2)
        target = num((g.rows[0].quality.get("target") or "").partition("=")[2])
        for r, color in zip(g.rows, COLORS * 8):
            name = f"{r.row.devices} dev, batch {r.global_batch}, {r.row.strategy}"
            for i, c in enumerate(quality.curves(r)):
                pts = [p for p in c if num(p.get("val")) is not None]
                for ax, x in zip(axes, ("samples", "train_s")):
                    ax.plot([p[x] for p in pts], [p["val"] for p in pts], "-", color=color, lw=1, alpha=0.8,
                            label=name if i == 0 else None)
        for ax, xl in zip(axes, ("samples", "training seconds")):
            ax.grid(True, alpha=0.3)
            ax.set_xlabel(xl)
            ax.set_ylabel("validation loss")
            if target is not None:
                ax.axhline(target, color="k", ls="--", lw=0.8)
        axes[0].legend(fontsize=7)
        _title(axes[0], f"{quality.TITLE}: {g.title}")
        out.append(Plot(f"quality:{g.slug}", f"quality__{g.slug}", "validation loss vs samples and time",
                        _save(fig, formats)))
    return out
