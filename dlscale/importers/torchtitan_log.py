"""``torchtitan-log``: torchtitan training logs (one file per run, or a folder of runs).

Read with the ``torchtitan`` parser (tps per device x --nproc-per-node x --nnodes = job tokens/s,
lines covering the first --warmup steps skipped, the next --steps reduced as total tokens / total
time). Records count sequences when the sequence length is known (--seq-len, or the registered
model's), else tokens (unit tok).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.importers import ImportOptions, Importer, register_importer
from dlscale.importers._logs import case_record, log_files, parse_options, parse_runs
from dlscale.importers.records import workload_unit


@register_importer("torchtitan-log")
class TorchTitanLog(Importer):
    description = "torchtitan training logs ('step: N  loss: ...  tps: T  tflops: F  mfu: M%')"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        try:
            files = log_files(path)
            results = parse_runs("torchtitan", files, parse_options(opts))
            unit, seq = workload_unit(opts, "seq" if opts.seq_len else "tok")
            if unit == "seq" and not seq:
                raise ConfigError("unit seq needs the sequence length: give --seq-len")
            if unit == "img":
                raise ConfigError("torchtitan counts tokens: --unit img does not apply")
            rec = case_record(self.name, path, opts, results, files, unit_default=unit,
                              to_samples=1.0 / seq if unit == "seq" else 1.0)
            mfu = [r.extra["mfu_pct"] for r in results if "mfu_pct" in r.extra]
            if mfu:
                rec["summary"]["mfu_logged"] = sum(mfu) / len(mfu) / 100.0  # the tool's own MFU, 0..1
            if unit == "seq":
                rec["summary"]["tokens_per_s"] = rec["summary"]["samples_per_s"]["median"] * seq
            return [rec]
        except ConfigError as e:
            raise self.fail(path, str(e)) from None
