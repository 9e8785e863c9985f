"""``dlperf-json``: the result JSON of DLPerf's extract scripts (or the ``dlperf`` part of
``dlscale report --format json``).

Shape: ``{model: {"1n1g": {"average_speed": ..., "median_speed": ..., "batch_size_per_device":
..., "speedup": ...}, ...}}``; ``NnMg`` is N nodes of M GPUs. One record per model and case, with
the median and mean as published (the number of runs is not in the file: ``n`` stays null).
The file's speedups are not stored: reports recompute them from the medians, and the importer
warns when the file's disagree by more than rounding. --precision is required (DLPerf's file
does not say it); --model renames a file's only model (e.g. ``bert`` -> ``bert-base``).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.importers import ImportOptions, Importer, register_importer
from dlscale.importers.records import (Figures, ImportedCase, Provenance, check_batch, check_precision, check_rate,
                                       imported_record, need, workload_unit)

CASE = re.compile(r"^(\d+)n(\d+)g$")


@register_importer("dlperf-json")
class DLPerfJSON(Importer):
    description = "DLPerf result JSON {model: {'1n1g': {average_speed, median_speed, batch_size_per_device, speedup}}}"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        try:
            if path.is_dir():
                raise ConfigError("give the result .json file, not a directory")
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError) as e:
                raise ConfigError(f"cannot read: {e}") from None
            except json.JSONDecodeError as e:
                raise ConfigError(f"not JSON ({e.msg} at line {e.lineno})") from None
            except ValueError:  # an integer of thousands of digits
                raise ConfigError("a number of more than 4300 digits cannot be read (no figure has that "
                                  "many)") from None
            except RecursionError:
                raise ConfigError("nested too deeply to read (lists or mappings over a few hundred levels deep)") from None
            if isinstance(data, dict) and isinstance(data.get("dlperf"), dict):
                data = data["dlperf"]
            if not isinstance(data, dict) or not data:
                raise ConfigError("not a DLPerf result (expected {model: {'1n1g': {...}}})")
            need(opts, "precision")
            check_precision(opts.precision, "--precision")
            if opts.model and len(data) > 1:
                raise ConfigError(f"--model renames a file's only model; this one has {len(data)}: "
                                  f"{', '.join(map(str, data))}")
            out = []
            for key, cases in data.items():
                model = opts.model or str(key)
                out += self._model(path, model, cases, opts)
            return out
        except ConfigError as e:
            raise self.fail(path, str(e)) from None

    def _model(self, path: Path, model: str, cases: Any, opts: ImportOptions) -> list[dict[str, Any]]:
        if not isinstance(cases, dict):
            raise ConfigError(f"model {model}: expected a mapping of cases like '1n1g'")
        unit, seq = workload_unit(dataclasses.replace(opts, model=model), None)
        rows = []
        for name, e in cases.items():
            m = CASE.match(str(name))
            if not m:
                continue  # dlscale's report JSON adds '1n1g_single'-style borrowed baselines
            if not isinstance(e, dict):
                raise ConfigError(f"{model} {name}: expected a mapping")
            if e.get("baseline") is True:
                continue
            status = e.get("status", "ok")
            batch = check_batch(e.get("batch_size_per_device"), f"{model} {name}: batch_size_per_device")
            med = check_rate(e.get("median_speed"), f"{model} {name}: median_speed") if status == "ok" else None
            mean = e.get("average_speed")
            mean = check_rate(mean, f"{model} {name}: average_speed") if (status == "ok" and mean is not None) else None
            rows.append((int(m.group(1)), int(m.group(2)), batch, status, med, mean, e.get("speedup"), name))
        if not rows:
            raise ConfigError(f"model {model}: no cases named like 1n1g")
        base = {b: med for n, g, b, st, med, _, _, _ in rows if n * g == 1 and st == "ok"}
        prov = Provenance(source=opts.source, tool=opts.tool, date=opts.date, fmt=self.name, file=str(path),
                          gpu=opts.gpu, gpus_per_node=opts.gpus_per_node, interconnect=opts.interconnect,
                          method="DLPerf: median of the runs' window averages (as published)")
        out = []
        for n, g, batch, status, med, mean, sp, name in rows:
            warnings = []
            if med and isinstance(sp, (int, float)) and base.get(batch):
                mine = med / base[batch]
                if abs(mine - sp) > 0.006 + 1e-9:
                    warnings.append(f"{name}: the file's speedup {sp} differs from median / 1n1g median = {mine:.3f}")
            case = ImportedCase(model=model, precision=opts.precision, batch_size=batch, nnodes=n, gpus_per_node=g,
                                unit=unit, strategy=opts.strategy or "ddp", compile=bool(opts.compile),
                                framework=opts.framework, seq_len=seq, params=opts.params)
            figures = Figures(median=med, mean=mean, status=status,
                              error=f"{status} in the file" if status != "ok" else None)
            out.append(imported_record(case, figures, prov, label=opts.label, warnings=warnings))
        return out
