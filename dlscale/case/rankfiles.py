"""What a worker rank and its launcher share: the worker's command line (the case's RunConfig as
JSON, the output folder), ``started-rank<R>.json``, by which the launcher names the ranks that
started and stalled, and ``rank<R>.json``, the rank's result. Both workers (torch and JAX), the
external spawner and the launcher use it; no torch here."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from dlscale.case.config import RunConfig


def worker_args(argv: list[str] | None, description: str) -> tuple[RunConfig, Path]:
    """The case and the output folder of a worker started as ``WORKER --config JSON --out DIR``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--config", required=True, help="path of the RunConfig JSON")
    ap.add_argument("--out", required=True, help="directory for rank<R>.json results")
    args = ap.parse_args(argv)
    return RunConfig.from_dict(json.loads(Path(args.config).read_text())), Path(args.out)


def write_started(out_dir: Path, rank: int) -> None:
    """``started-rank<R>.json``: the rank runs, as this pid."""
    with contextlib.suppress(OSError):
        (out_dir / f"started-rank{rank}.json").write_text(json.dumps({"rank": rank, "pid": os.getpid()}))


def read_started(out_dir: Path) -> dict[int, int]:
    """rank -> pid of the ranks that started."""
    out = {}
    for p in out_dir.glob("started-rank*.json"):
        try:
            d = json.loads(p.read_text())
            out[int(d["rank"])] = int(d["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_result(out_dir: Path, rank: int, result: dict[str, Any]) -> None:
    """``rank<R>.json``: the rank's result, replaced whole (the launcher never reads half a file)."""
    out = out_dir / f"rank{rank}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, out)


def read_results(out_dir: Path) -> list[dict[str, Any]]:
    """The ranks' results in rank order; a file that cannot be read is left out."""
    ranks = []
    for p in sorted(out_dir.glob("rank*.json"), key=lambda p: int(p.stem[4:])):
        try:
            ranks.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return ranks
