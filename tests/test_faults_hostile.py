"""Hostile input, second pass: every input ends in one line and the right exit code, never a hang or
a traceback; the diagnosis names what happened (docs/faults.md)."""
import time

import pytest

from dlscale.cli import main


def run(*argv):
    try:
        return main([str(a) for a in argv])
    except SystemExit as e:
        return e.code


def one_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("dlscale: error:"), err
    return err[0]


# ----------------------------------------------------------------------------- the --metric regex

@pytest.mark.slow
def test_a_catastrophic_metric_regex_ends_within_the_time_limit(monkeypatch):
    """(a+)+b over 34 a's backtracks for hours; the parse runs in a child bounded by the case's limit
    and the case is recorded ``timeout``. A plain expression gives the same values as in-process."""
    from dlscale.external import spawner as sp
    from dlscale.external.case import ExternalCase
    from dlscale.procs import ProcResult

    lines = ["a" * 34]
    monkeypatch.setattr(sp, "spawn", lambda cmd, limit, env=None, on_line=None, cwd=None: (
        [on_line(x) for x in lines], ProcResult(0, False, 0.5))[1])
    case = ExternalCase(command=["true"], parser="regex", metric="(?P<value>(a+)+)b", unit="seq", model="gpt2", precision="fp32",
                        batch_size=4, warmup=0, steps=1, repeats=1, time_limit=1.5, monitor=False)
    t0 = time.monotonic()
    _, (r0,) = sp.ExternalSpawner(case, "cpu")(0)
    assert time.monotonic() - t0 < 10
    assert r0["status"] == "timeout" and "--metric" in r0["error"]
    lines[:] = [f"samples/sec: {v}" for v in (10, 20)]
    case = ExternalCase(command=["true"], parser="regex", metric=r"samples/sec: (?P<value>[0-9]+)", unit="seq",
                        model="gpt2", precision="fp32", batch_size=4, warmup=0, steps=2, repeats=1, time_limit=5, monitor=False)
    _, (r0,) = sp.ExternalSpawner(case, "cpu")(0)
    assert r0["status"] == "ok" and r0["per_step_samples_per_s"] == [10.0, 20.0]
