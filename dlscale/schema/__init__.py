"""The store's record schema (``record.schema.json``, JSON Schema 2020-12) and a small validator.

Other tools can write records that dlscale reads by following the schema (docs/records.md).
``validate_record`` checks a record before an importer stores it, with no dependency: it
implements the part of JSON Schema the schema file uses (type, const, enum, required,
properties, items, minimum, minItems, minLength, allOf, if/then, local $ref). The tests check the
same records with the ``jsonschema`` package (test extra) to prove the file is standard JSON
Schema and the two agree.
"""
from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
USED = {"$schema", "$id", "title", "description", "type", "const", "enum", "required", "properties", "items",
        "minimum", "minItems", "minLength", "allOf", "if", "then", "$ref", "$defs"}


@functools.lru_cache(maxsize=1)
def record_schema() -> dict[str, Any]:
    """The record schema, from the package data."""
    return json.loads(resources.files(__package__).joinpath("record.schema.json").read_text(encoding="utf-8"))


def _is_type(v: Any, t: str) -> bool:
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, TYPES[t])


def _errors(v: Any, s: dict[str, Any], root: dict[str, Any], path: str) -> list[str]:
    unknown = set(s) - USED
    if unknown:  # a keyword this validator does not implement must not pass silently
        raise ValueError(f"schema keyword(s) {sorted(unknown)} at {path or '/'} not supported")
    if "$ref" in s:
        ref = s["$ref"]
        if not ref.startswith("#/$defs/"):
            raise ValueError(f"only local $ref supported, got {ref}")
        return _errors(v, root["$defs"][ref.split("/")[-1]], root, path)
    where = path or "/"
    if "type" in s:
        types = s["type"] if isinstance(s["type"], list) else [s["type"]]
        if not any(_is_type(v, t) for t in types):
            return [f"{where}: {v!r:.60} is not of type {' or '.join(types)}"]
    if "const" in s and v != s["const"]:
        return [f"{where}: must be {s['const']!r}"]
    if "enum" in s and v not in s["enum"]:
        return [f"{where}: {v!r:.60} is not one of {s['enum']}"]
    out: list[str] = []
    if isinstance(v, (int, float)) and not isinstance(v, bool) and "minimum" in s and v < s["minimum"]:
        out.append(f"{where}: {v} is less than {s['minimum']}")
    if isinstance(v, str) and "minLength" in s and len(v) < s["minLength"]:
        out.append(f"{where}: shorter than {s['minLength']}")
    if isinstance(v, list):
        if "minItems" in s and len(v) < s["minItems"]:
            out.append(f"{where}: fewer than {s['minItems']} item(s)")
        if "items" in s:
            for i, x in enumerate(v):
                out += _errors(x, s["items"], root, f"{path}/{i}")
    if isinstance(v, dict):
        for k in s.get("required", []):
            if k not in v:
                out.append(f"{where}: missing required field {k!r}")
        for k, sub in s.get("properties", {}).items():
            if k in v:
                out += _errors(v[k], sub, root, f"{path}/{k}")
    for sub in s.get("allOf", []):
        out += _errors(v, sub, root, path)
    if "if" in s and not _errors(v, s["if"], root, path):
        out += _errors(v, s.get("then", {}), root, path)
    return out


def record_errors(record: Any) -> list[str]:
    """Every way ``record`` breaks the schema (empty: valid)."""
    schema = record_schema()
    return _errors(record, schema, schema, "")


def validate_record(record: Any) -> str | None:
    """None when ``record`` follows the schema, else the first problem in one line."""
    errs = record_errors(record)
    return errs[0] if errs else None
