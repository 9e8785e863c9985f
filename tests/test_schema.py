"""The record schema: standard JSON Schema, documented field by field, the small validator agrees with jsonschema."""
import copy
import json
import re
from pathlib import Path

import pytest

from dlscale.importers import ImportOptions, import_path
from dlscale.schema import record_errors, record_schema, validate_record

ROOT = Path(__file__).parent.parent
TABLE = ROOT / "tests" / "fixtures" / "tables" / "mxnet-bert-base-v100.yaml"


def property_names(schema):
    out = set()

    def walk(s):
        if isinstance(s, dict):
            for k, v in (s.get("properties") or {}).items():
                out.add(k)
                walk(v)
            for key in ("items", "then", "if"):
                walk(s.get(key))
            for v in s.get("allOf") or []:
                walk(v)
            for v in (s.get("$defs") or {}).values():
                walk(v)

    walk(schema)
    return out


def test_every_schema_field_is_documented():
    doc = (ROOT / "docs" / "records.md").read_text()
    missing = sorted(n for n in property_names(record_schema()) if f"`{n}`" not in doc)
    assert not missing, f"fields in record.schema.json but not in docs/records.md: {missing}"
    assert all(isinstance(v.get("description"), str) for v in record_schema()["properties"].values())


def test_schema_is_valid_json_schema_and_package_data():
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) not installed")
    jsonschema.Draft202012Validator.check_schema(record_schema())
    text = (ROOT / "pyproject.toml").read_text()
    assert '"schema/*.json"' in text


@pytest.fixture(scope="module")
def imported():
    return import_path(TABLE, "table", ImportOptions())


def broken(rec):
    """Ways to break a record, each of which the schema must catch."""
    out = []
    for path, value in ((("schema",), "dlscale.record/2"), (("kind",), "measured"), (("status",), "great"),
                        (("config", "batch_size"), 0), (("config", "precision"), "fp4"),
                        (("world_size",), "2"), (("repeats",), {}), (("summary", "samples_per_s", "n"), -1),
                        (("provenance", "source"), None)):
        r = copy.deepcopy(rec)
        d = r
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        out.append((path, r))
    for key in ("id", "case_key", "config", "provenance", "summary"):
        r = copy.deepcopy(rec)
        del r[key]
        out.append(((key, "missing"), r))
    return out


def test_imported_records_valid_and_breakages_caught_by_both_validators(imported):
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (test extra) not installed")
    v = jsonschema.Draft202012Validator(record_schema())
    for rec in imported:
        rec = json.loads(json.dumps(rec))  # as stored
        assert record_errors(rec) == [] and list(v.iter_errors(rec)) == []
    ok = json.loads(json.dumps(next(r for r in imported if r["status"] == "ok")))
    for what, bad in broken(ok):
        mine = validate_record(bad)
        theirs = list(v.iter_errors(bad))
        assert mine is not None and theirs, what


def test_validator_refuses_keywords_it_does_not_implement():
    from dlscale.schema import _errors

    with pytest.raises(ValueError, match="not supported"):
        _errors("x", {"pattern": "^a"}, {}, "")
    assert re.match(r"/config/batch_size: 0 is less than 1",
                    validate_record({**json.loads(json.dumps(import_path(TABLE, "table", ImportOptions())[0])),
                                     "config": {"model": "m", "nproc_per_node": 1, "nnodes": 1, "batch_size": 0,
                                                "precision": "fp32", "framework": None}}) or "")
