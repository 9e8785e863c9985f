"""``megatron-log``: Megatron-LM / Megatron-Core training logs (one file per run, or a folder of runs).

Read with the ``megatron`` parser (dlscale/external/parsers/megatron.py: samples/s = global
batch size / elapsed seconds per iteration, lines covering the first --warmup iterations skipped,
the next --steps reduced as total samples / total time). The workload comes from the command
line: --model, --precision, --batch-size (per device), --nproc-per-node, --nnodes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.importers import ImportOptions, Importer, register_importer
from dlscale.importers._logs import case_record, log_files, parse_options, parse_runs


@register_importer("megatron-log")
class MegatronLog(Importer):
    description = "Megatron training logs ('iteration N/M | ... | elapsed time per iteration (ms): T | ...')"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        try:
            files = log_files(path)
            results = parse_runs("megatron", files, parse_options(opts))
            gbs = {r.extra.get("global_batch") for r in results}
            world = (opts.nnodes or 1) * (opts.nproc_per_node or 1)
            if opts.batch_size and len(gbs) == 1 and None not in gbs and gbs != {opts.batch_size * world}:
                # with tensor/pipeline parallelism the data-parallel size is smaller than the world
                dp = gbs.pop() / opts.batch_size
                if dp != int(dp) or world % int(dp):
                    raise ConfigError(f"the log's global batch size {int(dp * opts.batch_size)} is not --batch-size "
                                      f"{opts.batch_size} x a divisor of the {world} device(s)")
            return [case_record(self.name, path, opts, results, files, unit_default="seq")]
        except ConfigError as e:
            raise self.fail(path, str(e)) from None
