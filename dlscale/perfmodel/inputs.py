"""Picking the model's inputs from records: workloads, the 1-device record, measured multi-device points,
links, gradient buckets and overlap, each with where it came from.

Records are dicts of kind ``run`` (measured by dlscale) or ``imported`` (a published table or another
tool's log, with a ``system`` block of stated links). They are picked the way reports pick them
(dlscale.report.data): the newest ok record per case; a *workload* is the config minus strategy,
device counts and how it was run, plus the device type, the label and, for imported records, the
source they came from.
"""
from __future__ import annotations

import functools
import json
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable

from dlscale import ConfigError
from dlscale.results import validity
from dlscale.case.config import LATE_FIELD_DEFAULTS
from dlscale.perfmodel.core import (DDP_BUCKET_CAP_MB, GRAD_BYTES_PER_PARAM, MIB, Link, Links, Shape, bucket_sizes,
                                    check_overlap, compute_terms, gradient_bytes)
from dlscale.perfmodel.law import DEFAULT_LAW, OverheadLaw
from dlscale.perfmodel.model import HostInput, Measured, WorkloadModel, infer_t1_s
from dlscale.report.data import (BASELINE_STRATEGY_PREFERENCE, VARIANT_FIELDS, Row, baseline_fields, freeze, num,
                                 rec_config, rec_created, rec_device_type, select_cases)

RECORD_KINDS = ("run", "imported")


@dataclass
class Query:
    """Which records describe the workload (None: any)."""

    model: str | None = None
    precision: str | None = None
    batch_size: int | None = None
    compile: bool | None = None
    label: str | None = None
    flavor: str | None = None
    source: str | None = None  # a part of an imported record's provenance source (case-insensitive)
    data: str | None = None  # the data source as `run --data` takes it, or its kind alone (imagefolder, tokens)

    def matches(self, rec: dict[str, Any]) -> bool:
        cfg = rec_config(rec)
        data = str(cfg.get("data") or "synthetic")
        return ((self.model is None or cfg.get("model") == self.model)
                and (self.data is None or self.data in (data, data.split(":", 1)[0]))
                and (self.precision is None or cfg.get("precision") == self.precision)
                and (self.batch_size is None or cfg.get("batch_size") == self.batch_size)
                and (self.compile is None or bool(cfg.get("compile")) == self.compile)
                and (self.label is None or str(rec.get("label", cfg.get("label"))) == self.label)
                and (self.flavor is None or str(cfg.get("flavor") or "full") == self.flavor)
                and (self.source is None or self.source.lower() in str(source_of(rec) or "").lower()))


@dataclass
class ModelOptions:
    """The model's knobs, each None (or "auto") for its documented default."""

    intra_busbw_gbps: float | None = None
    intra_latency_us: float | None = None
    inter_busbw_gbps: float | None = None
    inter_latency_us: float | None = None
    inter_algorithm: str = "auto"
    overlap: str | float = "auto"
    bucket_mb: float | None = None
    param_sizes: str = "auto"
    grad_bytes: float | None = None
    overhead_ms: float | None = None
    strategy: str = "ddp"
    gpus_per_node_max: int | None = None
    law: OverheadLaw = DEFAULT_LAW
    host_cores: int | None = None  # CPU cores of each predicted node's host (the host input floor)


@dataclass
class Workload:
    key: str
    rows: list[Row]

    @property
    def fields(self) -> dict[str, Any]:
        return json.loads(self.key)

    @property
    def baseline(self) -> Row | None:
        """The 1-device ok row: single, then ddp, then newest."""
        cands = [r for r in self.rows if r.ok and r.devices == 1]
        if not cands:
            return None
        prefs = BASELINE_STRATEGY_PREFERENCE
        return min(cands, key=lambda r: (prefs.index(r.strategy) if r.strategy in prefs else len(prefs),
                                         -rec_created(r.record)))

    def node_reference(self, strategy: str, exclude: Row | None = None) -> Row | None:
        """Where the workload has no 1-device record: its measured single-node point of the most GPUs (never
        ``exclude``), from which the model infers the 1-device step (``model.infer_t1_s``); else None."""
        if self.baseline is not None:
            return None
        nodes = [(sh.gpus_per_node, r) for sh, r in self.measured(strategy).items()
                 if sh.nodes == 1 and r is not exclude]
        return max(nodes, key=lambda gr: gr[0])[1] if nodes else None

    def measured(self, strategy: str) -> dict[Shape, Row]:
        """The ok multi-device row of ``strategy`` per shape: the strategy at its defaults (no
        ``strategy_options``, no optimizer graph: what the model describes) before a variant of it,
        then the newest."""
        def rank(r: Row) -> tuple:
            cfg = rec_config(r.record)
            return (not any(cfg.get(f) for f in VARIANT_FIELDS), rec_created(r.record))

        out: dict[Shape, Row] = {}
        for r in self.rows:
            if r.ok and r.devices > 1 and r.strategy == strategy:
                sh = shape_of(r)
                if sh not in out or rank(r) > rank(out[sh]):
                    out[sh] = r
        return out


def shape_of(row: Row) -> Shape:
    return Shape(row.nnodes, row.nproc_per_node)


def short_id(rec: dict[str, Any]) -> str:
    return str(rec.get("id"))[:8]


def model_info(rec: dict[str, Any]) -> dict[str, Any]:
    m = rec.get("model")
    return m if isinstance(m, dict) else {}


def source_of(rec: dict[str, Any]) -> str | None:
    prov = rec.get("provenance")
    return str(prov.get("source")) if isinstance(prov, dict) and prov.get("source") else None


def workload_key(rec: dict[str, Any]) -> str:
    d = baseline_fields(rec)
    if rec.get("kind") == "imported":
        d["source"] = source_of(rec)
    return freeze(d)


def usable(records: Iterable[dict[str, Any]], query: Query | None = None) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") in RECORD_KINDS and (query is None or query.matches(r))]


def group_workloads(records: Iterable[dict[str, Any]]) -> dict[str, Workload]:
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in select_cases(list(records)):
        groups[workload_key(row.record)].append(row)
    return {k: Workload(k, rows) for k, rows in groups.items()}


def only_one(keys: list[str], what: str) -> str:
    if len(keys) == 1:
        return keys[0]
    dicts = [json.loads(k) for k in keys]
    varying = sorted({k for d in dicts for k in d if len({freeze(x.get(k)) for x in dicts}) > 1})
    # a late field at its default is left out of the key: name the default
    options = "; ".join(", ".join(f"{k}={d.get(k, LATE_FIELD_DEFAULTS.get(k))}" for k in varying) for d in dicts)
    raise ConfigError(f"{len(keys)} workloads have {what} ({options}): narrow with --precision, --batch-size, "
                      f"--compile/--eager, --flavor, --data, --label or --source")


def pick_workload(records: list[dict[str, Any]], query: Query, store: str = "the store",
                  strategy: str = "ddp") -> Workload:
    """The one workload matching ``query`` that has a 1-device ok record (else, where none has, the one with a
    single-node ``strategy`` record: its 1-device step is then inferred); one-line errors otherwise."""
    recs = usable(records, query)
    if not recs:
        models = sorted({str(rec_config(r).get("model")) for r in usable(records)})
        what = f"of model {query.model!r} " if query.model else ""
        data = ""
        if query.data is not None:  # what --data could have named
            sources = sorted({str(rec_config(r).get("data") or "synthetic") for r in usable(records)})
            data = f"; data there: {', '.join(sources) or 'none'}"
        raise ConfigError(f"no run or imported records {what}matching the filters in {store} "
                          f"(models there: {', '.join(models) or 'none'}{data})")
    workloads = group_workloads(recs)
    have = [k for k, w in workloads.items() if w.baseline is not None]
    measured = [k for k in have if workloads[k].baseline.record.get("kind") == "run"]  # type: ignore[union-attr]
    have = measured or have  # measured beats imported
    if have:
        return workloads[only_one(have, "a 1-device ok record")]
    nodes = [k for k, w in workloads.items() if w.node_reference(strategy) is not None]
    if not nodes:
        raise ConfigError(f"no ok 1-device record of model {query.model!r} matching the filters, nor an ok "
                          f"single-node {strategy} record: the model needs the measured 1-device step (dlscale run "
                          f"--model {query.model} --nproc-per-node 1) or one node's")
    return workloads[only_one(nodes, f"a single-node {strategy} record and no 1-device one")]


# ----------------------------------------------------------------------------- measured points

def samples_per_device_step(row: Row) -> float:
    """What one device processes per optimizer step, in the unit of the record's throughput: samples, or
    tokens (batch x sequence length) where the throughput is in tokens/s."""
    cfg = rec_config(row.record)
    n = float(int(cfg.get("batch_size") or 1) * int(cfg.get("grad_accum") or 1))
    info = row.record.get("model") or {}
    if info.get("unit") == "tok":
        seq = num(info.get("seq_len"))
        if not seq or seq <= 0:
            raise ConfigError(f"record {short_id(row.record)} counts tokens/s and states no sequence length, so its "
                              f"step time is unknown: import it with --seq-len (a table: seq_len)")
        n *= seq
    return n


def _without_data(rec: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in baseline_fields(rec).items() if not k.startswith("data")}


def synthetic_twin(base: Row, records: list[dict[str, Any]]) -> Row | None:
    """The 1-device run on synthetic batches of the real-data ``base``'s workload (everything else equal): the
    GPU's own step, without the host's input work."""
    want = _without_data(base.record)
    runs = (r for r in usable(records, Query(data="synthetic")) if r.get("kind") == "run")
    for w in group_workloads(runs).values():
        if w.baseline is not None and _without_data(w.baseline.record) == want:
            return w.baseline
    return None


def host_input(base: Row, opts: ModelOptions) -> tuple[HostInput | None, str]:
    """The host input floor's inputs from the 1-device record: the core-seconds its data loaders spent per sample
    (real data only) and the host's cores (``opts.host_cores``, else what the record's process could use)."""
    cores_used, rate = base.loader_cores, base.median
    if cores_used is None or cores_used <= 0 or not rate:
        return None, "none: the 1-device record has no loader CPU measurement (synthetic data)"
    env = base.record.get("env") if isinstance(base.record.get("env"), dict) else {}
    own = num(env.get("cpu_affinity_count")) or num(env.get("cpu_count"))
    cores = opts.host_cores or own
    if not cores:
        return None, "none: no host core count (give --host-cores)"
    how = "--host-cores" if opts.host_cores else "the 1-device record's host"
    src = (f"the 1-device record's loaders used {cores_used:.2f} cores for {rate:,.1f} samples/s "
           f"({1e3 * cores_used / rate:.3f} core-ms a sample); {int(cores)} cores a host ({how})")
    bound = bool(own) and cores_used >= 0.9 * max(own - 1, 1)  # its loaders took (nearly) every core left them
    host = HostInput(cores_used / rate, int(cores), src, int(own) if own else None, bound)
    if own and host.other_host:
        src += f"; the record ran on {int(own)}: the floor bounds the 1-device step too"
    if bound:
        src += (f"; the record's loaders used {cores_used:.2f} of the {max(int(own) - 1, 1)} cores its loop "
                f"left them: its own step may be input-bound")
    return replace(host, source=src), src


def gpu_step_on_other_host(base: Row, records: list[dict[str, Any]], host: HostInput | None
                           ) -> tuple[Row | None, str]:
    """Where the record's own step was input-bound and the predicted host has other cores, the GPU's own step
    comes from the synthetic twin (the floor then adds the host's input work): (the twin or None, a note)."""
    if host is None or not host.record_input_bound or not host.other_host:
        return None, ""
    twin = synthetic_twin(base, records)
    if twin is None:
        return None, ("; no synthetic run of the workload says what the GPU's own step is, so on more cores the "
                      "prediction is a lower bound")
    return twin, (f"; the GPU's own step from its synthetic run ({short_id(twin.record)}, {twin.median:,.1f} "
                  f"samples/s), the host's input work from the floor (measured multi-device points, from the "
                  f"record's host, are not fitted)")


def rel_spread(row: Row) -> float | None:
    """stdev / median of the record's repeats (None with one figure)."""
    sd, med, n = row.stat("stdev"), row.median, row.stat("n")
    if sd is None or not med or (n is not None and n < 2):
        return None
    return sd / med


def measured_point(row: Row) -> Measured:
    sh = shape_of(row)
    return Measured(sh, sh.devices * samples_per_device_step(row) / row.median,  # type: ignore[operator]
                    rel_spread(row), f"{row.record.get('kind')} {short_id(row.record)}")


def base_step_s(row: Row) -> tuple[float, str]:
    """Seconds per step of the 1-device record: its median throughput (what speedups are relative to)."""
    spd = samples_per_device_step(row)
    if row.median and row.median > 0:
        return spd / row.median, f"{spd:g} samples / median {row.median:,.2f} samples/s"
    v = num(row.summary("step_ms_p50"))
    if v is not None and v > 0:
        return v / 1000.0, "summary.step_ms_p50"
    raise ConfigError(f"1-device record {short_id(row.record)} has no throughput or step time")


# ----------------------------------------------------------------------------- links

def _comm_micro(records: list[dict[str, Any]], device_type: str) -> dict[str, Any] | None:
    best = None
    for rec in records:
        if rec.get("kind") != "micro" or rec.get("micro") != "comm":
            continue
        dev = rec.get("device")
        if device_type not in ("unknown", "auto") and dev and dev != device_type:
            continue
        if _ar_rows(rec) and (best is None or rec_created(rec) > rec_created(best)):
            best = rec
    return best


def _ar_rows(rec: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for row in rec.get("results") or []:
        if not isinstance(row, dict) or row.get("op") != "all_reduce" or row.get("status", "ok") != "ok":
            continue
        bw, nbytes = num(row.get("busbw_gbps")), num(row.get("bytes"))
        if bw is not None and bw > 0 and nbytes is not None and nbytes > 0:
            out.append(row)
    return sorted(out, key=lambda r: r["bytes"])


def _micro_link(micro: dict[str, Any], latency_us: float | None) -> tuple[int, Link, str]:
    rows = _ar_rows(micro)
    big, small = rows[-1], rows[0]
    n = int(num(big.get("nranks")) or num(micro.get("nranks")) or 2)
    bw = float(big["busbw_gbps"]) * 1e9
    if latency_us is not None:
        lat, how = latency_us * 1e-6, "--intra-latency-us"
    else:  # the smallest message is latency-bound: t = 2(n-1) alpha + S 2(n-1)/n / busbw
        t_small = (num(small.get("time_us")) or 0.0) * 1e-6
        lat = max(0.0, t_small - small["bytes"] * 2.0 * (n - 1) / n / bw) / (2 * (n - 1)) if n > 1 else 0.0
        how = f"{small['time_us']:.1f} us for {int(small['bytes'])} B"
    device = micro.get("device_name") or "?"
    return n, Link(bw, lat), (f"micro comm record {short_id(micro)} ({n} rank(s) of {device}): "
                              f"busbw {big['busbw_gbps']:.1f} GB/s at {int(big['bytes'])} B; latency "
                              f"{lat * 1e6:.2f} us ({how})")


def _stated_link(spec: Any, what: str) -> tuple[dict[int, Link], str] | None:
    """A table's ``system.intra``/``inter`` block: busbw_gbps a number or a mapping GPUs -> number."""
    if not isinstance(spec, dict) or spec.get("busbw_gbps") is None:
        return None
    lat = (num(spec.get("latency_us")) or 0.0) * 1e-6
    bw = spec["busbw_gbps"]
    try:
        table = ({int(k): Link(float(v) * 1e9, lat) for k, v in bw.items()} if isinstance(bw, dict)
                 else {0: Link(float(bw) * 1e9, lat)})
    except (TypeError, ValueError):
        raise ConfigError(f"the {what} link's busbw_gbps must be a number or a mapping of GPUs to numbers, "
                          f"got {bw!r}") from None
    figs = ", ".join(f"{v.busbw_bps / 1e9:g} GB/s" + (f" at {k} GPUs" if k else "") for k, v in sorted(table.items()))
    return table, f"stated by the source: {figs} ({spec.get('source') or 'no source given'})"


def links_for(base: Row, records: list[dict[str, Any]], opts: ModelOptions) -> tuple[Links, dict[str, Any] | None]:
    """The links of a workload: command-line figures, else the record's stated ``system`` block, else the
    newest micro comm record of the device type (intra only). Returns the links and the micro record."""
    links = Links(inter_algorithm=opts.inter_algorithm)
    system = base.record.get("system") if isinstance(base.record.get("system"), dict) else {}
    micro = None
    if opts.intra_busbw_gbps is not None:
        lat = opts.intra_latency_us or 0.0
        links.intra = {0: Link(opts.intra_busbw_gbps * 1e9, lat * 1e-6)}
        links.sources["intra"] = f"--intra-busbw {opts.intra_busbw_gbps:g} GB/s, latency {lat:g} us"
    elif (stated := _stated_link(system.get("intra"), "intra-node")) is not None:
        links.intra, links.sources["intra"] = stated
    else:
        micro = _comm_micro(records, rec_device_type(base.record))
        if micro is not None:
            n, link, src = _micro_link(micro, opts.intra_latency_us)
            links.intra, links.sources["intra"] = {n: link}, src
    if opts.inter_busbw_gbps is not None:
        lat = opts.inter_latency_us or 0.0
        links.inter = Link(opts.inter_busbw_gbps * 1e9, lat * 1e-6)
        links.sources["inter"] = f"--inter-busbw {opts.inter_busbw_gbps:g} GB/s per node, latency {lat:g} us"
    elif (stated := _stated_link(system.get("inter"), "inter-node")) is not None:
        links.inter, links.sources["inter"] = next(iter(stated[0].values())), stated[1]
    return links, micro


def _env_gpu_count(rec: dict[str, Any] | None) -> int | None:
    env = rec.get("env") if isinstance(rec, dict) else None
    gpus = env.get("gpus") if isinstance(env, dict) else None
    return len(gpus) if isinstance(gpus, list) and gpus else None


def node_limit(opts: ModelOptions, links: Links, records: list[dict[str, Any]],
               micro: dict[str, Any] | None) -> tuple[int | None, str]:
    """GPUs per node the model may use, and why (None: no limit)."""
    if opts.gpus_per_node_max is not None:
        return opts.gpus_per_node_max, "--nproc-per-node"
    if opts.intra_busbw_gbps is not None:
        return None, "intra-node link given with --intra-busbw: no limit"
    hw = [num((r.get("provenance") or {}).get("hardware", {}).get("gpus_per_node"))
          for r in records if isinstance(r.get("provenance"), dict)
          and isinstance(r["provenance"].get("hardware"), dict)]
    hw = [int(h) for h in hw if h]
    if hw:
        return max(hw), "GPUs per server stated by the source"
    counts = [c for c in (_env_gpu_count(r) for r in records + ([micro] if micro else [])) if c]
    if counts:
        return max(counts), "GPUs the records' environment saw"
    if micro is not None:
        return int(num(micro.get("nranks")) or 1), "ranks of the micro comm measurement"
    return None, "unknown (no environment in the records)"


def check_shapes(shapes: list[Shape], links: Links, limit: int | None, why: str) -> None:
    for sh in shapes:
        if limit is not None and sh.gpus_per_node > limit:
            raise ConfigError(f"shape {sh.label} has {sh.gpus_per_node} GPUs per node, more than the {limit} of the "
                              f"measured node ({why}); give --nproc-per-node G, or the intra-node link with "
                              f"--intra-busbw GBPS for a larger node")
        if sh.gpus_per_node > 1 and links.intra_for(sh.gpus_per_node) is None:
            raise ConfigError(f"no intra-node all-reduce bandwidth for shape {sh.label}: give --intra-busbw GBPS, "
                              f"or measure it into the store with 'dlscale micro comm --op all_reduce "
                              f"--nproc-per-node N --store STORE'")
        if sh.nodes > 1 and links.inter is None:
            raise ConfigError(f"shape {sh.label} spans {sh.nodes} nodes: give --inter-busbw GBPS (the network bus "
                              f"bandwidth per node, e.g. 12.5 for 100 Gb/s InfiniBand)")


# ----------------------------------------------------------------------------- gradients

@functools.lru_cache(maxsize=16)
def registry_param_numels(model: str, flavor: str) -> tuple[int, ...] | None:
    """Parameter sizes (elements) of a registered model in registration order, built on the meta device
    (no memory, no weights); None when dlscale does not know the model or it cannot be built so."""
    try:
        import torch  # optional: torch

        from dlscale.models import get_model  # torch: keeps start-up light

        spec = get_model(model, flavor)
        with torch.device("meta"):
            module = spec.build()
        seen, out = set(), []
        for p in module.parameters():
            if id(p) not in seen and p.requires_grad:
                seen.add(id(p))
                out.append(int(p.numel()))
        return tuple(out)
    except Exception:  # noqa: BLE001 - any failure means: fall back to uniform buckets
        return None


@dataclass
class Gradients:
    params: float
    bytes_per_param: float
    bytes_source: str
    cap_mb: float
    cap_source: str
    buckets: list[float]
    layout: str


def gradients(base: Row, workload: Workload, opts: ModelOptions) -> Gradients:
    params = num(model_info(base.record).get("params"))
    if not params or params <= 0:
        raise ConfigError(f"1-device record {short_id(base.record)} has no model.params")
    system = base.record.get("system") if isinstance(base.record.get("system"), dict) else {}
    if opts.grad_bytes is not None:
        bpp, bsrc = opts.grad_bytes, "--grad-bytes"
    elif num(system.get("grad_bytes_per_param")):
        bpp, bsrc = float(system["grad_bytes_per_param"]), "stated by the source"
    else:
        bpp, bsrc = float(GRAD_BYTES_PER_PARAM), "fp32 gradients (DDP all-reduces fp32 .grad under AMP)"
    caps = {num((rec_config(r.record).get("strategy_options") or {}).get("bucket_cap_mb"))
            for r in workload.rows if r.strategy == "ddp" and r.devices > 1} - {None}
    if opts.bucket_mb is not None:
        cap_mb, csrc = opts.bucket_mb, "--bucket-mb"
    elif num(system.get("bucket_mb")):
        cap_mb, csrc = float(system["bucket_mb"]), "stated by the source"
    elif len(caps) == 1:
        cap_mb, csrc = float(caps.pop()), "bucket_cap_mb of the workload's ddp records"  # type: ignore[arg-type]
    else:
        cap_mb, csrc = DDP_BUCKET_CAP_MB, "DDP default"
    g = gradient_bytes(params, bpp)
    cap = cap_mb * MIB
    if opts.param_sizes == "auto":
        cfg = rec_config(base.record)
        numels = registry_param_numels(str(cfg.get("model")), str(cfg.get("flavor") or "full"))
        if numels and sum(numels) == int(params):
            # DDP rebuilds its buckets in the order gradients became ready: about the reverse of registration
            b = bucket_sizes(g, cap, [n * bpp for n in reversed(numels)])
            return Gradients(params, bpp, bsrc, cap_mb, csrc, b,
                             f"{len(b)} bucket(s) of <= {cap_mb:g} MiB over the {len(numels)} parameters of the "
                             f"registered model, in reverse registration order (largest {max(b) / 1e6:.1f} MB)")
    b = bucket_sizes(g, cap)
    return Gradients(params, bpp, bsrc, cap_mb, csrc, b,
                     f"{len(b)} bucket(s) of {cap_mb:g} MiB cut from the gradient bytes (uniform)")


def overlap_for(workload: Workload, base: Row, opts: ModelOptions,
                exclude: Row | None = None) -> tuple[str | float, str]:
    """The overlap mode and why: the option; else the source's statement; else the overlap ratio of a
    measured multi-device breakdown of the workload (never ``exclude``'s own; one whose phases agree
    with its window's step first, see validity's ``breakdown_gap``); else none."""
    if opts.overlap != "auto":
        mode = check_overlap(opts.overlap)
        return mode, {"none": "--overlap none: all-reduce after backward",
                      "buckets": "--overlap buckets: DDP buckets pipelined behind backward"}.get(
            str(mode), f"--overlap {mode}: that share of the all-reduce hidden")
    system = base.record.get("system") if isinstance(base.record.get("system"), dict) else {}
    stated = system.get("overlap")
    if stated is not None:
        mode = "buckets" if stated == "backward" else check_overlap(stated)
        return mode, f"stated by the source: {stated}"
    cands = []
    for row in workload.rows:
        if row is exclude or not row.ok or row.devices < 2:
            continue
        r = num(row.breakdown.get("overlap_ratio")) if row.breakdown else None
        if r is not None and 0.0 <= r <= 1.0:
            got = validity.breakdown_gap(row.record)
            gap = got[2] if got is not None and abs(got[2]) > validity.THRESHOLDS.max_breakdown_gap else None
            cands.append((gap is None, row.strategy == opts.strategy, row.devices, rec_created(row.record), r, row,
                          gap))
    if cands:
        *_, r, row, gap = max(cands, key=lambda c: c[:4])
        off = f" (its phases {gap * 100:+.1f} % off its window's step: breakdown_gap)" if gap is not None else ""
        return r, (f"measured: overlap_ratio {r:.2f} of the {row.devices}-device {row.strategy} breakdown, "
                   f"record {short_id(row.record)}{off}")
    return "none", "no measured breakdown of this workload at > 1 device: none hidden (all-reduce after backward)"


# ----------------------------------------------------------------------------- the model of a workload

def _inferred_one_device(model: WorkloadModel, node: Row) -> tuple[WorkloadModel, str]:
    """``model`` with the 1-device step inferred from the measured step of ``node`` (one node, no 1-device
    record), and where that step comes from."""
    g, t_node = shape_of(node).gpus_per_node, measured_point(node).step_s
    if not model.links.intra_for(g):
        raise ConfigError(f"inferring the 1-device step from the 1x{g} record needs the intra-node link "
                          f"(--intra-busbw, a micro comm record, or the source's system.intra)")
    t1 = infer_t1_s(t_node, g, model)
    if t1 <= 0:
        raise ConfigError(f"the modelled intra-node all-reduce alone is longer than the measured 1x{g} step: "
                          f"no 1-device step is left to infer (check the intra-node link figure)")
    return replace(model, compute=compute_terms(t1), t1_inferred=True), (
        f"inferred from the measured 1x{g} step ({t_node * 1e3:.2f} ms, record {short_id(node.record)}) less its "
        f"modelled all-reduce and the law's node overhead (no 1-device record)")


@dataclass
class BuiltModel:
    model: WorkloadModel
    base: Row
    workload: Workload
    info: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None
    limit_why: str = ""


@dataclass(frozen=True)
class _OneDevice:
    """The 1-device step a workload's model starts from, its compute split, host input floor and spread."""

    step_s: float
    step_src: str
    compute: Any
    host: Any
    host_src: str
    spread: float | None
    twin: Row | None = None


def _one_device(base: Row | None, ref: Row, records: list[dict[str, Any]], opts: ModelOptions) -> _OneDevice:
    """From the 1-device record (or its synthetic-data twin on another host); without one, the node's step
    (``build_model`` infers the 1-device step from it)."""
    if base is None:
        step_s = measured_point(ref).step_s
        return _OneDevice(step_s, "", compute_terms(step_s), None,
                          "none: no 1-device record to measure the loaders' CPU time on", rel_spread(ref))
    step_s, step_src = base_step_s(base)
    host, host_src = host_input(base, opts)
    twin, twin_note = gpu_step_on_other_host(base, records, host)
    if twin is None:
        return _OneDevice(step_s, step_src, compute_terms(step_s, base.breakdown), host, host_src + twin_note,
                          rel_spread(base))
    step_s, step_src = base_step_s(twin)
    return _OneDevice(step_s, f"the synthetic run's {step_src}", compute_terms(step_s, twin.breakdown), host,
                      host_src + twin_note, rel_spread(twin), twin)


def _overhead_source(opts: ModelOptions, points: list) -> tuple[float | None, str]:
    """The fixed overhead (s) of --overhead-ms, if given, and what the overhead rests on."""
    if opts.overhead_ms is not None:
        return opts.overhead_ms / 1000.0, f"--overhead-ms {opts.overhead_ms:g}: fixed at every N > 1"
    if points:
        return None, ("fitted on the measured " + ", ".join(f"{p.shape.label} ({p.ref})" for p in points)
                      + f"; elsewhere the law: {opts.law.describe()}")
    return None, f"no measured multi-device {opts.strategy} point: the default law, {opts.law.describe()}"


def build_model(workload: Workload, records: list[dict[str, Any]], opts: ModelOptions,
                calibrate_on: Iterable[Shape] | None = None, exclude: Row | None = None) -> BuiltModel:
    """The workload's model. ``calibrate_on``: the measured shapes the overhead may be fitted on (None:
    every measured multi-device shape of ``opts.strategy``); ``exclude``: a row that must not inform the
    model (the one being predicted in a validation)."""
    base = workload.baseline
    node = workload.node_reference(opts.strategy, exclude)
    ref = base or node
    if ref is None:
        raise ConfigError(f"the workload has no ok 1-device record and no ok single-node {opts.strategy} record")
    links, micro = links_for(ref, records, opts)
    limit, why = node_limit(opts, links, [r.record for r in workload.rows], micro)
    grads = gradients(ref, workload, opts)
    overlap, ov_src = overlap_for(workload, ref, opts, exclude)
    measured_rows = workload.measured(opts.strategy)
    allowed = set(measured_rows) if calibrate_on is None else set(calibrate_on)
    points = [measured_point(r) for sh, r in sorted(measured_rows.items()) if sh in allowed and r is not exclude]
    usable_points = [p for p in points if (p.shape.gpus_per_node == 1 or links.intra_for(p.shape.gpus_per_node))
                     and (p.shape.nodes == 1 or links.inter is not None)]
    one = _one_device(base, ref, records, opts)
    step_s, step_src, compute, host, host_src, spread = (one.step_s, one.step_src, one.compute, one.host,
                                                         one.host_src, one.spread)
    if one.twin is not None:  # the synthetic run's step: the real-data points do not calibrate it
        usable_points = []
    fixed, oh_src = _overhead_source(opts, usable_points)
    cfg = rec_config(ref.record)
    compiled = bool(cfg.get("compile")) and cfg.get("framework") in (None, "torch")
    model = WorkloadModel(compute, samples_per_device_step(ref), grads.buckets, links, overlap, opts.law,
                          spread, usable_points, fixed, oh_src, compiled, host)
    if base is None:
        model, step_src = _inferred_one_device(model, ref)
        compute, step_s = model.compute, model.t1_s
    info = {
        "baseline_record": str(ref.record.get("id")), "baseline_kind": ref.record.get("kind"),
        "baseline_strategy": ref.strategy, "one_device_inferred": base is None, "step_ms": step_s * 1e3,
        "step_source": step_src,
        "step_rel_spread": spread, "compute_split": compute.split,
        "data_ms": compute.data_s * 1e3, "forward_ms": compute.forward_s * 1e3,
        "backward_ms": compute.backward_s * 1e3, "update_ms": compute.update_s * 1e3,
        "samples_per_device_step": model.samples_per_device_step, "params": grads.params,
        "bytes_per_gradient": grads.bytes_per_param, "bytes_per_gradient_source": grads.bytes_source,
        "gradient_bytes": model.grad_bytes, "buckets": len(grads.buckets), "bucket_mb": grads.cap_mb,
        "bucket_source": grads.cap_source, "bucket_layout": grads.layout,
        "intra_busbw_gbps": {str(k): v.busbw_bps / 1e9 for k, v in links.intra.items()} or None,
        "inter_busbw_gbps": links.inter.busbw_bps / 1e9 if links.inter else None,
        "inter_latency_us": links.inter.latency_s * 1e6 if links.inter else None,
        "inter_algorithm": links.inter_algorithm, "link_sources": dict(links.sources),
        "gpus_per_node_max": limit, "gpus_per_node_source": why,
        "overlap": overlap, "overlap_source": ov_src, "overhead_source": oh_src,
        "overhead_law": opts.law.describe(), "calibration_points": [p.shape.label for p in usable_points],
        "host_input_floor": host_src,
    }
    return BuiltModel(model, ref, workload, info, limit, why)
