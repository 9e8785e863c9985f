"""The framework comparison table (report md/csv/json/html) and `compare` across frameworks."""
from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest

from dlscale.cli import main
from dlscale.case.config import RunConfig

FIXTURES = Path(__file__).resolve().parent / "fixtures"
_spec = importlib.util.spec_from_file_location("report_fixtures", FIXTURES / "report_fixtures.py")
F = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(F)

TITLE = "gpt2 · amp-bf16 · batch 16/device"


def _rec(rid: str, strategy: str, nproc: int, samples: list[float], framework: str = "torch",
         compile: bool = False) -> dict:
    rec = F.run_record(rid, "gpt2", "amp-bf16", 16, strategy, 1, nproc, samples, mfu=0.3)
    rec["config"].update(compile=compile)
    if framework != "torch":
        rec["config"]["framework"] = framework
        rec["env"] = dict(rec["env"], framework=framework,
                          jax={"jax": "0.11.2", "jaxlib": "0.11.2", "optax": "0.2.8", "backend": "gpu"})
    rec["case_key"] = RunConfig.from_dict(rec["config"]).case_key()
    return rec


@pytest.fixture
def store(tmp_path: Path) -> Path:
    F.write_store(tmp_path / "s", [
        _rec("t1", "single", 1, [100, 100, 100]), _rec("t2", "ddp", 2, [190, 190, 190]),
        _rec("c1", "single", 1, [150, 150, 150], compile=True), _rec("c2", "ddp", 2, [290, 290, 290], compile=True),
        _rec("j1", "single", 1, [140, 140, 140], "jax"), _rec("j2", "ddp", 2, [270, 270, 270], "jax"),
    ])
    return tmp_path / "s"


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_markdown_framework_table(store, capsys):
    rc, out, _ = _cli(capsys, "report", str(store))
    assert rc == 0
    section = out[out.index("## Frameworks (DLPerf comparison)"):]
    assert f"### {TITLE}" in section
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| framework")]
    got = {(r[0], r[1], r[3]): r[4:] for r in rows[:6]}
    assert got[("torch", "single", "1")] == ["100.00", "1.00", "100.0", "30.0", "1.000"]
    assert got[("torch-compiled", "ddp", "2")] == ["290.00", "1.93", "96.7", "30.0", "1.526"]  # 290/150, 290/190
    assert got[("jax", "ddp", "2")] == ["270.00", "1.93", "96.4", "30.0", "1.421"]  # 270/140, 270/190
    assert [r[0] for r in rows[:6]] == ["torch", "torch", "torch-compiled", "torch-compiled", "jax", "jax"]
    assert "jax 0.11.2, jaxlib 0.11.2, optax 0.2.8, backend gpu" in section
    # the per-framework scaling tables stay as they were: jax has its own, named by the framework field
    assert "gpt2 · amp-bf16 · jax (XLA) · ddp · batch 16/device · framework=jax" in out


def test_csv_json_html_carry_the_comparison(store, capsys, tmp_path):
    _, out, _ = _cli(capsys, "report", str(store), "--format", "csv")
    rows = {r["record_id"]: r for r in csv.DictReader(io.StringIO(out))}
    assert rows["j2"]["framework"] == "jax" and float(rows["j2"]["vs_torch_eager"]) == pytest.approx(270 / 190)
    assert rows["c1"]["framework"] == "torch-compiled" and float(rows["c1"]["vs_torch_eager"]) == pytest.approx(1.5)
    _, out, _ = _cli(capsys, "report", str(store), "--format", "json")
    fw = json.loads(out)["frameworks"]
    assert len(fw) == 1 and fw[0]["title"] == TITLE and fw[0]["unit"] == "seq/s"
    j1 = next(r for r in fw[0]["rows"] if r["record_id"] == "j1")
    assert j1["framework"] == "jax" and j1["vs_torch_eager"] == pytest.approx(1.4) and j1["speedup"] == 1.0
    html = tmp_path / "r.html"
    _cli(capsys, "report", str(store), "--format", "html", "--no-plots", "-o", str(html))
    text = html.read_text()
    assert '<h2 id="frameworks">Frameworks (DLPerf comparison)</h2>' in text and "torch-compiled" in text


def test_no_section_with_one_framework(tmp_path, capsys):
    F.write_store(tmp_path / "s", [_rec("t1", "single", 1, [100]), _rec("c1", "single", 1, [150], compile=True)])
    _, out, _ = _cli(capsys, "report", str(tmp_path / "s"))
    assert "Frameworks (DLPerf comparison)" not in out
    _, out, _ = _cli(capsys, "report", str(tmp_path / "s"), "--format", "json")
    assert json.loads(out)["frameworks"] == []


def test_compare_across_frameworks(store, capsys):
    rc, out, _ = _cli(capsys, "compare", str(store), "--framework-a", "torch", "--framework-b", "jax",
                      "--format", "json")
    assert rc == 0
    cases = {(c["strategy"], c["devices"]): c for c in json.loads(out)["cases"]}
    assert set(cases) == {("single", 1), ("ddp", 2)}
    assert cases[("single", 1)]["ratio"] == pytest.approx(1.4)
    assert (cases[("ddp", 2)]["record_a"], cases[("ddp", 2)]["record_b"]) == ("t2", "j2")
    rc, out, _ = _cli(capsys, "compare", str(store), "--framework-a", "torch-compiled", "--framework-b", "jax",
                      "--format", "json")
    assert json.loads(out)["cases"][0]["record_a"] in ("c1", "c2")
    rc, _, err = _cli(capsys, "compare", str(store))
    assert rc == 2 and "--framework-a" in err and "--framework-b" in err and err.count("\n") == 1, err
