"""``hf-trainer``: a Hugging Face Trainer's trainer_state.json (or its saved stdout).

A file, or a directory holding ``trainer_state.json`` (an output or checkpoint directory). The
figure is the Trainer's own ``train_samples_per_second`` (samples / seconds of the whole
``train()`` call): the warm-up steps are included, and the record says so in ``warnings``
(a run under ``dlscale run --command --parser hf-trainer`` applies the warm-up rule instead).
The per-device batch comes from --batch-size, else the state's ``train_batch_size``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from dlscale import ConfigError
from dlscale.importers import ImportOptions, Importer, register_importer
from dlscale.importers._logs import case_record, parse_options, parse_runs


@register_importer("hf-trainer")
class HFTrainerState(Importer):
    description = "Hugging Face Trainer trainer_state.json (log_history's final train_samples_per_second)"

    def records(self, path: Path, opts: ImportOptions) -> list[dict[str, Any]]:
        f = path / "trainer_state.json" if path.is_dir() else path
        try:
            if not f.is_file():
                raise ConfigError("no trainer_state.json in the directory" if path.is_dir() else
                                  "not a regular file: give trainer_state.json or the directory holding it")
            if opts.batch_size is None:
                try:
                    state = json.loads(f.read_text(encoding="utf-8"))
                except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                    state = None
                b = state.get("train_batch_size") if isinstance(state, dict) else None
                if isinstance(b, int) and not isinstance(b, bool) and b > 0:
                    opts = dataclasses.replace(opts, batch_size=b)
            results = parse_runs("hf-trainer", [f], parse_options(opts))
            return [case_record(self.name, f, opts, results, [f], unit_default="seq")]
        except ConfigError as e:
            raise self.fail(f, str(e)) from None
