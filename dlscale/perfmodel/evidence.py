"""Stored records as the strategy model's evidence: measured runs of a model as ``Reference`` points (their
configuration read the way the strategy declares its memory layout), ``micro layer`` records of its block
shape as ``LayerTiming``; ``micro comm`` records as the links (``inputs.links_for``'s rule)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from dlscale import ConfigError
from dlscale.micro.peaks import bandwidth_bps
from dlscale.perfmodel.core import Links
from dlscale.perfmodel.host import HostSample, fit_host_costs
from dlscale.perfmodel.strategies import DEFAULT_MFU, Candidate, Evidence, LayerTiming, Machine, Reference


ONE_DEVICE_KEPT = ("fsdp", "hsdp", "tensor")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 else None


def record_candidate(rec: dict[str, Any]) -> Candidate | None:
    """The Candidate of a stored run (or imported) record, None where its strategy has no layout or the model
    no transformer architecture."""
    from dlscale.planner.memplan import layout_for_run  # keeps the CLI start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    cfg = rec.get("config") or {}
    try:
        spec = get_model(cfg.get("model"), cfg.get("flavor") or "full")
        world = int(cfg.get("nproc_per_node") or 1) * int(cfg.get("nnodes") or 1)
        # one device of a strategy that shards or splits still runs its machinery (FSDP's units, DTensor): kept
        name = str(cfg.get("strategy")) if world > 1 or cfg.get("strategy") in ONE_DEVICE_KEPT else "single"
        if name == "single":
            from dlscale.planner.memplan import Layout  # keeps the CLI start-up light
            layout = Layout("single")
        else:
            layout = layout_for_run(spec, name, world, int(cfg.get("nnodes") or 1), dict(cfg.get("strategy_options") or {}))
    except (ConfigError, KeyError, TypeError, ValueError):
        return None
    if getattr(spec, "arch", None) is None or not hasattr(spec.arch, "attn_dim"):
        return None
    return Candidate.from_layout(layout, int(cfg.get("batch_size") or 1), str(cfg.get("activation_checkpointing")
                                                                               or "none"),
                                 str(cfg.get("precision") or "fp32"), bool(cfg.get("compile")))


def record_tokens_per_s(rec: dict[str, Any], seq_len: int) -> float | None:
    """Measured tokens/s per device of a record (samples/s per device x sequence length)."""
    s = rec.get("summary") or {}
    sps = _num(s.get("samples_per_s_per_device"))
    if sps is None:
        total, cfg = _num(s.get("samples_per_s")), rec.get("config") or {}
        world = int(cfg.get("nproc_per_node") or 1) * int(cfg.get("nnodes") or 1)
        sps = total / world if total else None
    return sps * seq_len if sps else None


def block_floor(records: Iterable[dict[str, Any]], model: str, flavor: str, compiled: bool,
                device_name: str | None = None) -> tuple[float, str]:
    """The shortest measured forward + backward of one block of ``model`` (s) and where it is from: the median
    block of each pipeline record's timed pieces (``strategy_info.piece_cost_ms``, balance=time: one
    micro-batch each), the smallest of those medians over the records of that compile setting (and GPU);
    (0, '') where none is stored."""
    best: tuple[float, str] | None = None
    for rec in records:
        cfg = rec.get("config") or {}
        pieces = ((rec.get("strategy_info") or {}).get("piece_cost_ms") or {}).get("blocks")
        if (rec.get("status") != "ok" or cfg.get("model") != model or str(cfg.get("flavor") or "full") != flavor
                or bool(cfg.get("compile")) != compiled or not pieces
                or (device_name and (rec.get("summary") or {}).get("device_name") != device_name)):
            continue
        med = sorted(pieces)[len(pieces) // 2] * 1e-3
        if best is None or med < best[0]:
            best = (med, f"the median timed block of pipeline record {str(rec.get('id'))[:8]}")
    return best or (0.0, "")


def references(records: Iterable[dict[str, Any]], model: str, flavor: str, peak_flops: float, links: Links,
               device_type: str = "cuda", floors: dict[bool, float] | None = None) -> list[Reference]:
    """Every ok measured record of ``model``/``flavor`` on ``device_type`` as a Reference (newest per case);
    ``floors``: the block floor of each compile setting (``block_floor``), set on each reference's machine."""
    from dlscale.models import get_model  # torch: keeps start-up light

    arch = get_model(model, flavor).arch
    out: dict[tuple, Reference] = {}
    for rec in sorted(records, key=lambda r: str(r.get("created") or "")):
        cfg = rec.get("config") or {}
        if (rec.get("kind", "run") not in ("run", "imported") or rec.get("status") != "ok"
                or cfg.get("model") != model or str(cfg.get("flavor") or "full") != flavor
                or str(cfg.get("device") or "cuda") not in (device_type, "auto")):
            continue
        cand = record_candidate(rec)
        tps = record_tokens_per_s(rec, arch.seq_len)
        if cand is None or tps is None:
            continue
        gpn = int(cfg.get("nproc_per_node") or 1)
        peak = _num((rec.get("summary") or {}).get("peak_flops")) or peak_flops
        name = str((rec.get("summary") or {}).get("device_name") or "")
        machine = Machine(cand.devices, gpn, peak, links, name, (floors or {}).get(cand.compiled, 0.0),
                          mem_bw_bps=bandwidth_bps(name))
        out[(cand, gpn)] = Reference(cand, machine, tps, f"record {str(rec.get('id'))[:8]}")
    return list(out.values())


# a candidate's precision -> the ``precision`` of the micro layer rows that time it (dlscale run's fp32 runs
# with TF32 on where the GPU has it: its rows say tf32; on the CPU fp32)
LAYER_PRECISION = {"amp-bf16": ("bf16",), "amp-fp16": ("fp16",), "fp8": ("fp8",), "fp32": ("tf32", "fp32"),
                   "fp32-strict": ("fp32",)}


def row_fused(row: dict[str, Any]) -> bool:
    """Whether a micro layer row ran at the speed of a compiled step: compiled, or a precision without casts to
    fuse. An fp8 row measured eager (every row without ``compiled``, the option being newer) spends its time in
    torchao's unfused float8 casts and amax reductions, not torchao's compiled fp8 speed."""
    return bool(row.get("compiled")) or row.get("precision") != "fp8"


def layer_row_matches(row: dict[str, Any], arch: Any, precision: str = "amp-bf16", compiled: bool = False) -> bool:
    """Whether an ok forward+backward micro layer row times the block of ``arch`` for a candidate of that
    precision and compile setting: hidden, MLP width, heads, kv heads (where the row has them), sequence length
    and precision equal; an eager fp8 row never stands for a compiled fp8 candidate."""
    kv = row.get("kv_heads")
    return (row.get("status") == "ok" and row.get("pass") == "forward+backward"
            and row.get("d_model") == arch.hidden and row.get("d_ff") == arch.ffn_hidden
            and row.get("heads") == arch.n_heads and row.get("seq") == arch.seq_len
            and (kv is None or kv == (getattr(arch, "n_kv_heads", None) or arch.n_heads))
            and row.get("precision") in LAYER_PRECISION.get(precision, (precision,))
            and (row_fused(row) or not compiled)
            and bool(_num(row.get("time_us"))) and bool(_num(row.get("flops"))))


def layer_timing(records: Iterable[dict[str, Any]], arch: Any, batch: int, precision: str = "amp-bf16",
                 compiled: bool = False) -> LayerTiming | None:
    """The newest ``micro layer`` forward+backward row of the model's block shape for a candidate of
    ``precision`` (dlscale's names: amp-bf16, fp8, ...) and compile setting (``layer_row_matches``), at the
    batch nearest ``batch``."""
    best = None
    for rec in records:
        if rec.get("kind") != "micro" or rec.get("micro") != "layer":
            continue
        for row in rec.get("results") or []:
            if layer_row_matches(row, arch, precision, compiled):
                key = (-abs((row.get("batch") or 0) - batch), str(rec.get("created") or ""))
                if best is None or key > best[0]:
                    how = "" if row_fused(row) else ", eager fp8: unfused casts"
                    best = (key, LayerTiming(row["time_us"] * 1e-6, float(row["flops"]),
                                             f"micro layer {str(rec.get('id'))[:8]}, batch {row.get('batch')}, "
                                             f"{row.get('precision')}{how}"))
    return best[1] if best else None


def _workload(rec: dict[str, Any]) -> tuple:
    cfg = rec.get("config") or {}
    return (cfg.get("model"), cfg.get("flavor") or "full", cfg.get("batch_size"), cfg.get("precision"),
            bool(cfg.get("compile")), cfg.get("activation_checkpointing") or "none",
            str((rec.get("summary") or {}).get("device_name")))


def record_samples(records: list[dict[str, Any]], source: str, links: Any, peak_flops: float,
                   floor: Callable[[str, str, bool], float]) -> list[HostSample]:
    """The samples of one store: each ok fsdp / tensor run with the newest single-device run of its workload in
    the same store; ``floor(model, flavor, compiled)``: the block floor their machines take."""
    from dlscale.models import get_model  # torch: keeps start-up light

    singles: dict[tuple, Reference] = {}
    runs = []
    for rec in sorted(records, key=lambda r: str(r.get("created") or "")):
        cfg = rec.get("config") or {}
        if rec.get("kind", "run") != "run" or rec.get("status") != "ok" or not cfg.get("model"):
            continue
        cand = record_candidate(rec)
        if cand is None or cand.strategy not in ("single", "fsdp", "tensor"):
            continue
        arch = get_model(cfg["model"], cfg.get("flavor") or "full").arch
        tps = record_tokens_per_s(rec, arch.seq_len)
        if not tps:
            continue
        peak = float((rec.get("summary") or {}).get("peak_flops") or peak_flops)
        machine = Machine(cand.devices, int(cfg.get("nproc_per_node") or 1), peak, links,
                          block_floor_s=floor(cfg["model"], cfg.get("flavor") or "full", cand.compiled),
                          mem_bw_bps=bandwidth_bps((rec.get("summary") or {}).get("device_name")))
        ident = f"{source} {str(rec.get('id'))[:8]}"
        if cand.strategy == "single":
            singles[_workload(rec)] = Reference(cand, machine, tps, ident)
        else:
            runs.append((_workload(rec), (cand, arch, machine, tps, ident)))
    return [HostSample(source, cand, arch, machine, tps, singles[key], ident)
            for key, (cand, arch, machine, tps, ident) in runs if key in singles]


@dataclass(frozen=True)
class StoreQuery:
    """Whose evidence a store is read for: the model, the peak FLOP/s and links its records' machines take, the
    batch a ``micro layer`` row is picked for, the MFU assumed where nothing is measured, the device type."""

    model: str
    flavor: str
    peak_flops: float
    links: Links
    batch: int = 1
    assumed_mfu: float = DEFAULT_MFU
    device_type: str = "cuda"


def store_host_samples(records: list[dict[str, Any]], links: Links, peak_flops: float) -> list[HostSample]:
    """The host samples of one store, their block floor measured in the same store."""
    return record_samples(records, "the store", links, peak_flops,
                          lambda model, flavor, compiled: block_floor(records, model, flavor, compiled)[0])


def store_evidence(records: list[dict[str, Any]], q: StoreQuery, store: list[dict[str, Any]] | None = None
                   ) -> Evidence:
    """Everything ``records`` hold for the strategy model of ``q.model``: measured references, the block floors,
    the ``micro layer`` timings (by precision and compile setting) and the strategies' host costs, the last two
    read from ``store`` (default: the same records) since they are not the model's runs."""
    from dlscale.models import get_model  # torch: keeps start-up light

    store = records if store is None else store
    arch = get_model(q.model, q.flavor).arch
    floors = {c: block_floor(records, q.model, q.flavor, c)[0] for c in (False, True)}
    refs = references(records, q.model, q.flavor, q.peak_flops, q.links, q.device_type, floors)
    # one timing per precision and compile setting: the candidates ranked from one Evidence differ in both
    layers = {(p, c): lt for p in LAYER_PRECISION for c in (False, True)
              if (lt := layer_timing(store, arch, q.batch, p, c)) is not None}
    return Evidence(tuple(refs), None, q.assumed_mfu, floors,
                    fit_host_costs(store_host_samples(store, q.links, q.peak_flops)), layers)


def evidence_from_records(records: list[dict[str, Any]], model: str, flavor: str, peak_flops: float, links: Links,
                          batch: int, assumed_mfu: float) -> Evidence:
    """Everything a store holds for the strategy model of ``model``/``flavor`` (``store_evidence``)."""
    return store_evidence(records, StoreQuery(model, flavor, peak_flops, links, batch, assumed_mfu))
