"""A measured case as dlscale stores it: the typed ``Record`` that ``measure`` returns.

The store keeps records as JSON lines (``Record.to_dict``); reports read those dicts. The fields
below the divider are set by the caller that stores the record (a batch search, a sweep, a
multi-node lead, a Slurm task) and are written only when set, as before they existed.
"""
from __future__ import annotations

import dataclasses
import datetime as _dt
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Iterable

from dlscale.results.store import SCHEMA, STATUSES  # noqa: F401 - the record's schema id and statuses

_OPTIONAL = ("backend", "threads", "data_set", "data", "batch_search", "sweep", "nodes", "rendezvous", "recorded_by",
             "validity", "quality")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Record:
    """One case: its config and environment, every repeat, the summary of the ok repeats."""

    status: str
    error: str | None
    config: dict[str, Any]
    case_key: str
    label: str | None
    command: str
    device_type: str
    world_size: int
    env: dict[str, Any]
    ranks: list[dict[str, Any]] = field(default_factory=list)
    repeats: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    global_batch: int | None = None
    tf32: bool | None = None
    strategy_info: dict[str, Any] | None = None
    # the median repeat's extras, at the top level for reports
    utilisation: dict[str, Any] | None = None
    breakdown: dict[str, Any] | None = None
    median_repeat: int | None = None
    trace: str | None = None
    profile_top_ops: list[dict[str, Any]] | None = None
    omp_num_threads: str | None = None  # the launcher's OMP_NUM_THREADS on the CPU
    kind: str = "run"
    schema: str = SCHEMA
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: str = field(default_factory=_now)
    # ---- written only when set
    backend: str | None = None  # the process group's: gloo or nccl
    threads: list[int] | None = None  # intra-op threads each rank used, as torch reports them
    data_set: dict[str, Any] | None = None  # the input data's identity (dlscale/inputs)
    data: dict[str, Any] | None = None  # the median repeat's data wait and loader figures
    batch_search: dict[str, Any] | None = None
    sweep: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] | None = None
    rendezvous: dict[str, Any] | None = None
    recorded_by: dict[str, Any] | None = None
    validity: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None  # --until: time to quality over the repeats (dlscale/quality)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in _OPTIONAL:
            if d[k] is None:
                del d[k]
        return d

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def median_repeat_with(rec: dict[str, Any] | None, key: str, ok_only: bool = False,
                       test: Callable[[Any], bool] = lambda v: isinstance(v, dict)) -> dict[str, Any] | None:
    """A stored record's median repeat (``median_repeat``) where it holds ``key`` (``test`` of its value),
    else the first repeat that does (of the ok ones with ``ok_only``); None where none does. What a
    section reads from one repeat: its checkpoint phase, energy, phases, per-rank steps."""
    reps = [r for r in (rec or {}).get("repeats") or [] if isinstance(r, dict) and test(r.get(key))
            and (not ok_only or r.get("status", "ok") == "ok")]
    med = (rec or {}).get("median_repeat")
    return next((r for r in reps if r.get("repeat") == med), reps[0] if reps else None)


def newest_per_key(records: Iterable[dict[str, Any]],
                   keys: Callable[[dict[str, Any]], Iterable[Hashable]]) -> dict[Hashable, dict[str, Any]]:
    """Key -> the newest record (by ``created``; of two as new, the later in ``records``) of each key
    that ``keys`` gives a record; a record given no key (or a false one) is left out. What a rerun
    reads back and a report shows of a case measured more than once."""
    out: dict[Hashable, dict[str, Any]] = {}
    for r in records:
        for k in keys(r):
            if k and (k not in out or str(r.get("created")) >= str(out[k].get("created"))):
                out[k] = r
    return out
