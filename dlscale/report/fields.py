"""A record's config and device type, read safely: the accessors the report's lowest modules share
(data.py re-exports them; sources.py, which data builds on, reads them here)."""
from __future__ import annotations

from typing import Any


def rec_config(rec: dict[str, Any]) -> dict[str, Any]:
    cfg = rec.get("config")
    return cfg if isinstance(cfg, dict) else {}


def rec_device_type(rec: dict[str, Any]) -> str:
    return str(rec.get("device_type") or rec_config(rec).get("device") or "unknown")
