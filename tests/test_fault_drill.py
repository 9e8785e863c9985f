"""The fault drill runs (benchmarks/fault_drill.py): its input scenarios here; every group by hand."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

DRILL = Path(__file__).resolve().parent.parent / "benchmarks" / "fault_drill.py"


def test_the_drill_covers_every_group_of_the_issue():
    spec = importlib.util.spec_from_file_location("fault_drill", DRILL)
    drill = sys.modules["fault_drill"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(drill)
    every = drill.scenarios()
    assert {s.group for s in every} == {"procs", "records", "input", "values"} and len(every) >= 38
    assert len({s.name for s in every}) == len(every)


@pytest.mark.slow
def test_no_input_runs_code():
    p = subprocess.run([sys.executable, str(DRILL), "--only", "input"], capture_output=True, text=True, timeout=300)
    last = p.stdout.strip().splitlines()[-1]
    assert p.returncode == 0 and last.startswith("fault drill: 4 scenarios: 0 orphaned processes"), p.stdout[-2000:]
    assert last.endswith("0 ways to run code from input")
