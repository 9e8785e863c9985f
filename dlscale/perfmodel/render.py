"""Markdown tables and plots of predictions and validations."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from dlscale import ConfigError
from dlscale.fmt import MISSING, fmt_num
from dlscale.fmt import md_table as fmt_md_table
from dlscale.perfmodel.law import PROTOCOLS
from dlscale.perfmodel.predict import Prediction
from dlscale.perfmodel.validate import Summary, Validation, summarize_rows


def fmt(v: Any, digits: int = 2, suffix: str = "") -> str:
    """A prediction's number with thousands separators (dlscale/fmt.py rules), and its unit."""
    return MISSING if v is None else fmt_num(v, digits, group=True) + suffix


def md_table(header: list[str], rows: list[list[str]], align: str = "---:") -> str:
    """A Markdown table: numbers right-aligned (``align="---"``: every column left)."""
    return fmt_md_table(header, rows, numeric_from=0 if align == "---:" else len(header))


def _intra_text(inp: dict[str, Any]) -> str:
    bw = inp.get("intra_busbw_gbps")
    if not bw:
        return "not given"
    return ", ".join(f"{v:,.1f} GB/s" + (f" at {k} GPUs" if k != "0" else "") for k, v in sorted(bw.items()))


def render_prediction(pred: Prediction) -> str:
    inp, unit, w = pred.inputs, pred.unit, pred.workload
    spd = inp["samples_per_device_step"]
    qual = f" -- from {pred.what}" if pred.what else ""
    out = [f"# Predicted data-parallel scaling: {pred.model} ({w.get('precision')}, "
           f"{'compiled' if w.get('compile') else 'eager'}, {spd:g} {unit}/device/step){qual}", ""]
    if pred.what:
        out += [f"**These inputs are {pred.what}**: the figures describe that setup, not a full model on GPUs.", ""]
    spread = inp.get("step_rel_spread")
    out += [f"* 1-device step: {inp['step_ms']:.2f} ms ({inp['step_source']}; {inp['baseline_kind']} "
            f"{inp['baseline_strategy']} record {inp['baseline_short']}"
            + (f"; repeats spread {spread * 100:.1f} %" if spread else "; one figure, no spread") + ")",
            f"* split: {inp['compute_split']}",
            f"* gradients: {inp['gradient_bytes'] / 1e6:,.1f} MB per step ({inp['params']:,.0f} params x "
            f"{inp['bytes_per_gradient']:g} B), {inp['bucket_layout']}",
            f"* intra-node link: {_intra_text(inp)} ({inp['link_sources'].get('intra', 'none')})",
            "* inter-node link: " + (f"{inp['inter_busbw_gbps']:,.1f} GB/s per node, {inp['inter_latency_us']:.1f} us "
                                     f"({inp['link_sources'].get('inter')}); algorithm {inp['inter_algorithm']}"
                                     if inp.get("inter_busbw_gbps") else "not given"),
            f"* overlap: {inp['overlap']} ({inp['overlap_source']})",
            f"* overhead: {inp['overhead_source']}",
            f"* host input floor: {inp.get('host_input_floor') or 'none'}", ""]
    body = []
    for r in pred.rows:
        p = r.prediction
        d = r.to_dict(pred.rows[0].prediction.ideal_samples_per_s)
        meas = r.measured_samples_per_s
        err = ("baseline" if p.shape.devices == 1 else "calibration point" if r.calibration_point
               else fmt(d["error_pct"], 1, "%")) if meas else "-"
        body.append([p.shape.label, str(p.shape.devices), fmt(d["forward_ms"] + d["data_ms"]),
                     fmt(d["backward_ms"] + d["update_ms"]), fmt(d["overhead_ms"]), fmt(d["allreduce_ms"]),
                     fmt(d["exposed_ms"]), fmt(d["step_ms"]), fmt(p.samples_per_s, 1),
                     f"{fmt(p.low, 1)} .. {fmt(p.high, 1)}", fmt(p.speedup, 2), f"{p.shape.devices:g}",
                     fmt(d["efficiency"] * 100, 1, "%"), p.basis, p.limiting, fmt(meas, 1), err])
    out.append(md_table(["shape", "GPUs", "data+fwd (ms)", "bwd+upd (ms)", "overhead (ms)", "all-reduce (ms)",
                         "exposed (ms)", "step (ms)", f"{unit}/s", f"band ({unit}/s)", "speedup", "ideal",
                         "efficiency", "basis", "limited by", f"measured {unit}/s", "error"], body))
    last = pred.rows[-1].prediction
    out += ["", f"At {last.shape.label}: limited by {last.limiting}"
            + (f" ({last.evidence})" if last.evidence else "")
            + f"; band -{last.band_below_pct:.1f} % / +{last.band_above_pct:.1f} % ({last.basis}).",
            "basis: measured (the shape or its node was measured), from-multinode (the node and a multi-node "
            "shape measured: the network term's amplitude measured, its growth from the law), from-node (the node "
            "measured, the network term from the law), from-1-gpu (only the 1-device step measured). error = "
            "(predicted - measured) / measured.", "", "Model:"] + [f"* {n}" for n in pred.notes]
    return "\n".join(out)


def _summary_line(name: str, s: Summary) -> list[str]:
    if not s.n:
        return [name, "0", "-", "-", "-", "-", "-"]
    return [name, str(s.n), fmt(s.mean_abs_error_pct, 1, " %"), fmt(s.max_abs_error_pct, 1, " %"),
            fmt(s.mean_error_pct, 1, " %"), f"{s.over} / {s.under}", f"{s.in_band} / {s.n}"]


def summary_table(val: Validation, groups: list[str] | None = None) -> str:
    """Per protocol over the unflagged points; the points of flagged series (left out) are counted, and
    where there are any, summed up on a line of their own below."""
    flagged = {p: val.select(p, groups, flagged=True) for p in PROTOCOLS}
    rows = [_summary_line(p, val.summary(p, groups)) + [str(len(flagged[p]))] for p in PROTOCOLS]
    table = md_table(["protocol", "points", "mean abs error", "max abs error", "mean error",
                      "over / under", "in band", "left out (flagged)"], rows)
    extra = [f"{p}: {len(flagged[p])} point(s) of series flagged {FLAGGED}, left out above; with them: "
             f"{_inline(summarize_rows(val.select(p, groups) + flagged[p]))}" for p in PROTOCOLS if flagged[p]]
    return "\n".join([table] + ([""] + extra if extra else []))


FLAGGED = ("above_ideal (a point of the series scales above ideal past its noise: a measurement problem, "
           "no test of the model)")


def _inline(s: Summary) -> str:
    return (f"{s.n} points, mean |error| {fmt(s.mean_abs_error_pct, 1, ' %')}, max {fmt(s.max_abs_error_pct, 1, ' %')}"
            f", over / under {s.over} / {s.under}")


def render_validation(val: Validation, title: str) -> str:
    out = [f"# Model validation: {title}", "", f"law: {val.law}", "", summary_table(val), ""]
    by_series: dict[str, list] = defaultdict(list)
    for r in val.rows:
        by_series[r.series].append(r)
    body = []
    for name in sorted(by_series):
        for r in sorted(by_series[name], key=lambda r: (r.protocol, r.devices)):
            body.append([name, r.shape, r.protocol, fmt(r.measured, 1), fmt(r.predicted, 1),
                         f"{fmt(r.low, 1)} .. {fmt(r.high, 1)}", fmt(r.error_pct, 1, "%"),
                         "yes" if r.in_band else "no", fmt(r.overhead_ms), r.limiting, r.flags or "—"])
    out.append(md_table(["series", "shape", "protocol", "measured", "predicted", "band", "error", "in band",
                         "overhead (ms)", "limited by", "flag"], body))
    out += ["", "error = (predicted - measured) / measured; over = predicted faster than measured. from-1-gpu: "
                "only the 1-device point known; from-node: the series' single-node points known; from-multinode: "
                "those and its multi-node points of fewer nodes known. flag: " + FLAGGED + "."]
    if val.skipped:
        out += ["", "Skipped:"] + [f"* {s}" for s in val.skipped]
    return "\n".join(out)


def write_plot(path: str, series: list[tuple[str, list[tuple[int, float, float, float]]]],
               measured: list[tuple[int, float]], title: str) -> None:
    """Speedup against GPUs: predicted lines with their bands, the ideal line, measured points."""
    import matplotlib  # matplotlib: keeps start-up light

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: keeps start-up light
    import matplotlib.ticker  # matplotlib: keeps start-up light

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xs_all = sorted({p[0] for _, pts in series for p in pts} | {x for x, _ in measured})
    ax.plot(xs_all, xs_all, "--", color="grey", label="ideal")
    for name, pts in series:
        pts = sorted(pts)
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        ax.fill_between([p[0] for p in pts], [p[2] for p in pts], [p[3] for p in pts], color=line.get_color(),
                        alpha=0.2, linewidth=0)
    if measured:
        ax.plot([p[0] for p in measured], [p[1] for p in measured], "ks", label="measured", markerfacecolor="none")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    for axis in (ax.xaxis, ax.yaxis):  # 1, 2, 4 ... rather than 2^n
        axis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("speedup over 1 GPU")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot write plot {path}: {e}") from None
    finally:
        plt.close(fig)


def plot_prediction(pred: Prediction, path: str) -> None:
    base = pred.rows[0].prediction.ideal_samples_per_s
    pts = [(r.prediction.shape.devices, r.prediction.speedup, r.prediction.low / base, r.prediction.high / base)
           for r in pred.rows]
    meas = [(r.prediction.shape.devices, r.measured_samples_per_s / base) for r in pred.rows
            if r.measured_samples_per_s]
    write_plot(path, [("predicted", pts)], meas, f"{pred.model}: predicted (band) vs ideal speedup"
               + (f" -- {pred.what}" if pred.what else ""))


def plot_validation(val: Validation, path: str) -> None:
    """Predicted against measured samples/s of every point, with the bands (log-log), by protocol."""
    import matplotlib  # matplotlib: keeps start-up light

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # matplotlib: keeps start-up light

    fig, ax = plt.subplots(figsize=(5.6, 5.2))
    lo = min((min(r.measured, r.low) for r in val.rows), default=1.0)
    hi = max((max(r.measured, r.high) for r in val.rows), default=10.0)
    ax.plot([lo, hi], [lo, hi], "--", color="grey", label="predicted = measured")
    for proto, marker in zip(PROTOCOLS, ("o", "s", "^")):
        rows = [r for r in val.rows if r.protocol == proto]
        if rows:
            ax.errorbar([r.measured for r in rows], [r.predicted for r in rows],
                        yerr=[[r.predicted - r.low for r in rows], [r.high - r.predicted for r in rows]],
                        fmt=marker, ms=4, alpha=0.7, label=proto, capsize=2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured samples/s")
    ax.set_ylabel("predicted samples/s (band)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot write plot {path}: {e}") from None
    finally:
        plt.close(fig)
