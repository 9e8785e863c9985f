"""What the log importers share: one log per run, several runs per case, a parser per log."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.external.parsers import ParseError, ParseOptions, ParseResult, get_parser, parse_file
from dlscale.importers import ImportOptions
from dlscale.importers.records import (Figures, ImportedCase, Provenance, check_precision, check_rate, imported_record,
                                      need, workload_unit)

LOG_SUFFIXES = (".log", ".txt", ".out")


def log_files(path: Path) -> list[Path]:
    """The runs of a case: one file, or every log file of a directory (sorted)."""
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in LOG_SUFFIXES)
    if not files:
        raise ConfigError(f"no log files ({', '.join(LOG_SUFFIXES)}) in the directory")
    return files


def parse_runs(parser: str, files: list[Path], popts: ParseOptions) -> list[ParseResult]:
    p = get_parser(parser)
    p.check(popts)
    out = []
    for f in files:
        try:
            out.append(parse_file(p, str(f), popts))
        except ParseError as e:
            raise ConfigError(str(e)) from None
    return out


def case_record(fmt: str, path: Path, opts: ImportOptions, results: list[ParseResult], files: list[Path],
                *, unit_default: str | None, to_samples: float = 1.0) -> dict[str, Any]:
    """One imported case from its runs' parse results (samples/s = parsed x ``to_samples``)."""
    need(opts, "model", "precision", "batch_size")
    check_precision(opts.precision, "--precision")
    unit, seq = workload_unit(opts, unit_default)
    runs = [check_rate(r.samples_per_s * to_samples, f"{f.name}: the window's throughput")
            for f, r in zip(files, results)]
    warnings = sorted({w for r in results for w in r.warnings})
    prov = Provenance(source=opts.source, tool=opts.tool, date=opts.date, fmt=fmt, file=str(path), gpu=opts.gpu,
                      gpus_per_node=opts.gpus_per_node, interconnect=opts.interconnect, method=results[0].method)
    extra = [{"file": str(f), "window_steps": r.window_steps, "skipped_steps": r.skipped_steps,
              "window_s": r.window_s, "step_times_ms": r.step_times_ms or None} for f, r in zip(files, results)]
    case = ImportedCase(model=opts.model, precision=opts.precision, batch_size=opts.batch_size,
                        nnodes=opts.nnodes or 1, gpus_per_node=opts.nproc_per_node or 1, unit=unit,
                        strategy=opts.strategy or "ddp", compile=bool(opts.compile), framework=opts.framework,
                        seq_len=seq, params=opts.params)
    return imported_record(case, Figures(runs=runs, repeat_extra=extra), prov, label=opts.label, warnings=warnings)


def parse_options(opts: ImportOptions, **kw: Any) -> ParseOptions:
    world = (opts.nnodes or 1) * (opts.nproc_per_node or 1)
    gb = opts.batch_size * world if opts.batch_size else None
    base = dict(warmup=opts.warmup, steps=opts.steps, global_batch=gb, world_size=world, seq_len=opts.seq_len,
                options=dict(opts.options))
    base.update(kw)
    return ParseOptions(**base)
