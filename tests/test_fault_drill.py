"""The fault drill runs (benchmarks/fault_drill.py): its input scenarios here; every group by hand."""
import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

DRILL = Path(__file__).resolve().parent.parent / "benchmarks" / "fault_drill.py"


def _drill():
    spec = importlib.util.spec_from_file_location("fault_drill", DRILL)
    drill = sys.modules["fault_drill"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(drill)
    return drill


def test_the_drill_covers_every_group_of_the_issue():
    every = _drill().scenarios()
    assert {s.group for s in every} == {"procs", "records", "input", "values", "hostile"} and len(every) >= 38
    assert len({s.name for s in every}) == len(every)


@pytest.mark.slow
def test_no_input_runs_code(tmp_path):
    """The drill's input scenarios of the job script through its own runner (each a real ``python -m
    dlscale``, checked for exit code, message, tracebacks, orphans and the payload), without the
    finished run ``fault_drill.py`` makes first for the records group, which these scenarios do not
    read. Two at a time: each has its own folder and process tag, and a process's start is mostly one
    core's work. The group's inductor program (cpp.cxx) on the command line and in a suite: the same
    `dlscale run` and `sweep` in this process, test_faults_records.py's
    test_inductor_program_on_the_command_line_and_in_a_suite_is_exit_2."""
    drill = _drill()
    chosen = [s for s in drill.scenarios() if s.group == "input" and "cpp.cxx" not in s.name]
    assert chosen and all(s.argv[0] == "slurm" for s in chosen)
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(zip([s.name for s in chosen],
                         pool.map(lambda s: drill.run_scenario(s, tmp_path, verbose=False), chosen)))
    assert found == {s.name: {} for s in chosen}


@pytest.mark.slow
def test_hostile_input_is_one_line_or_the_right_diagnosis(tmp_path):
    """A few of the drill's hostile-input scenarios through its own runner: a FIFO to import (which
    once blocked forever), a job name leaving STORE/slurm/, an inductor setting taking a callable
    (each otherwise unit-tested in test_faults_hostile.py); the whole group by hand."""
    drill = _drill()
    names = {"import a FIFO as a table", "slurm --job-name ../../escaped",
             "--inductor-option post_grad_custom_post_pass=1"}
    chosen = [s for s in drill.scenarios() if s.name in names]
    assert len(chosen) == len(names)
    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(zip([s.name for s in chosen],
                         pool.map(lambda s: drill.run_scenario(s, tmp_path, verbose=False), chosen)))
    assert found == {s.name: {} for s in chosen}
