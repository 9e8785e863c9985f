"""``dlperf-logs``: a DLPerf log folder, one log per run, several runs per case.

Layout (DLPerf's ``run_test.sh``/``extract_*_logs.py``): ``DIR/<N>n<M>g/<name>_b<batch>_<precision>_<run>.log``,
N nodes of M GPUs each; or ``DIR`` itself one such case folder. Each log is reduced as DLPerf
reduces it (the ``dlperf`` parser: gluon-nlp/MXNet or OneFlow lines), with the warm-up rule
--warmup/--steps (DLPerf's MXNet BERT page: --warmup 100 --steps 100); one record per case with
one repeat per log, so the median, mean and spread are recomputed over the runs and reports
recompute speedups from the medians (DLPerf's rule: median / median of 1n1g at the same batch).
Batch and precision come from the file names (``b32``, ``fp32``/``fp16``/``amp``) unless
--batch-size/--precision say; --model names the workload (file names are not dlscale names).
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.importers import Importer, ImportOptions, register_importer
from dlscale.importers._logs import case_record, parse_options, parse_runs
from dlscale.importers.records import registered_unit

CASE = re.compile(r"^(\d+)n(\d+)g$")
BATCH = re.compile(r"(?:^|[_\-.])(?:b|bs|bz)(\d+)(?=[_\-.]|$)")
RUN = re.compile(r"[_\-](\d+)\.(?:log|txt|out)$")
PRECISION = (("bf16", "amp-bf16"), ("fp16", "amp-fp16"), ("amp", "amp-fp16"), ("fp32", "fp32"))


def name_precision(name: str) -> str | None:
    parts = set(re.split(r"[_\-.]", name.lower()))
    for tag, prec in PRECISION:
        if tag in parts:
            return prec
    return None


@register_importer("dlperf-logs")
class DLPerfLogs(Importer):
    description = "a DLPerf log folder: <N>n<M>g/ sub-folders, one log per run"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        try:
            if not path.is_dir():
                raise ConfigError("give the log folder (with <N>n<M>g sub-folders), not a file")
            cases = [path] if CASE.match(path.name) else sorted(
                (p for p in path.iterdir() if p.is_dir() and CASE.match(p.name)), key=_case_order)
            if not cases:
                raise ConfigError("no case folders named like 1n1g, 1n8g, 4n8g")
            return [self._case(c, path, opts) for c in cases]
        except ConfigError as e:
            raise self.fail(path, str(e)) from None

    def _case(self, folder: Path, root: Path, opts: ImportOptions) -> dict[str, Any]:
        m = CASE.match(folder.name)
        nodes, per_node = int(m.group(1)), int(m.group(2))
        files = sorted((p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in (".log", ".txt", ".out")),
                       key=_run_order)
        if not files:
            raise ConfigError(f"{folder.name}: no logs")
        batch, precision = opts.batch_size, opts.precision
        for f in files:
            b = BATCH.search(f.name)
            p = name_precision(f.name)
            if opts.batch_size is None and b:
                if batch is not None and int(b.group(1)) != batch:
                    raise ConfigError(f"{folder.name}: logs of batch {batch} and {b.group(1)} in one case folder")
                batch = int(b.group(1))
            if opts.precision is None and p:
                if precision is not None and p != precision:
                    raise ConfigError(f"{folder.name}: logs of {precision} and {p} in one case folder")
                precision = p
        if batch is None:
            raise ConfigError(f"{folder.name}: no b<batch> in the log names: give --batch-size")
        if precision is None:
            raise ConfigError(f"{folder.name}: no fp32/fp16/amp/bf16 in the log names: give --precision")
        o = dataclasses.replace(opts, nnodes=nodes, nproc_per_node=per_node, batch_size=batch, precision=precision)
        popts = parse_options(o)
        if popts.seq_len is None and o.model:
            popts.seq_len = registered_unit(o.model)[1]
        results = parse_runs("dlperf", files, popts)
        rec = case_record(self.name, folder, o, results, files, unit_default="seq")
        rec["provenance"]["file"] = str(folder)
        rec["provenance"]["source"] = opts.source or str(root)
        return rec


def _case_order(p: Path) -> tuple[int, int]:
    m = CASE.match(p.name)
    return int(m.group(1)) * int(m.group(2)), int(m.group(1))


def _run_order(p: Path) -> tuple[int, str]:
    m = RUN.search(p.name)
    return (int(m.group(1)) if m else 1 << 30, p.name)
