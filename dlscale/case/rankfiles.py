"""What a worker rank and its launcher share: the worker's command line (the case's RunConfig as
JSON, the output folder) and ``started-rank<R>.json``, by which the launcher names the ranks that
started and stalled. Both workers (torch and JAX) use it; no torch here."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path

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
