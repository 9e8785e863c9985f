"""The host input floor of `dlscale predict` against 1-GPU runs on fewer cores (suite host-floor).

    python benchmarks/host_floor_check.py RUN [RUN ...]      RUN: DIR or DIR,SYNTHETIC_STORE

DIR holds one run of the host-floor suite's real-data case per host size, each under its own directory
with a ``store`` (the whole host, and ``taskset`` runs on fewer cores). Every store's record is predicted
from every other store's record of the same DIR with ``dlscale predict --shapes 1x1 --host-cores C`` (C: the
cores the predicted run could use, from its record); the table prints measured, predicted, error and what
limited the prediction. From a larger host the floor is the prediction; from a smaller one whose loaders
were busy the record's step is itself input-bound: with a SYNTHETIC_STORE (the same case on synthetic batches)
predict takes the GPU's own step from it and the floor adds the host, else the record's step stands (a lower
bound). Last, over every RUN: the floor-bound predictions' band (``model.HOST_FLOOR_BAND`` is what it gave).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlscale.cli import main as main_cli  # noqa: E402
from dlscale.perfmodel.fit import band_sides  # noqa: E402
from dlscale.perfmodel.render import md_table  # noqa: E402
from dlscale.report.data import Row, load_records  # noqa: E402


def the_record(store: Path) -> dict:
    recs = [r for r in load_records(store).records if r.get("kind") == "run" and Row(r).ok]
    if len(recs) != 1:  # ok, or interrupted with finished repeats (flagged in the table)
        raise SystemExit(f"{store}: expected one measured run record, found {len(recs)}")
    return recs[0]


def cores_of(rec: dict) -> int:
    return int(rec["env"]["cpu_affinity_count"])


def predict_1x1(store_file: Path, cores: int) -> dict:
    """``dlscale predict`` of the 1-GPU step on a host of ``cores`` cores (its JSON; the CLI, in process)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main_cli(["predict", str(store_file), "--model", "resnet50", "--data", "imagefolder", "--shapes", "1x1",
                       "--host-cores", str(cores), "--format", "json"])
    if rc:
        raise SystemExit(f"dlscale predict {store_file} --host-cores {cores} exited {rc}")
    return json.loads(buf.getvalue())


def measured_cell(rec: dict) -> str:
    r = Row(rec)
    late = ", interrupted" if rec.get("status") != "ok" else ""
    return f"{r.median:,.1f} ({r.stat('min'):,.0f}-{r.stat('max'):,.0f}, n {r.stat('n'):.0f}{late})"


def check(run_dir: Path, synthetic: str | None, tmp: Path) -> list[tuple[list[str], float, float]]:
    """Each record of ``run_dir`` predicted from each other one: (table row, predicted, measured)."""
    extra = load_records(synthetic).records if synthetic else []
    stores = sorted(run_dir.glob("*/store"))
    recs = {s: the_record(s) for s in stores}
    out = []
    for src in stores:
        both = tmp / f"{run_dir.name}-{src.parent.name}.jsonl"  # the record, and the synthetic run where given
        both.write_text("".join(json.dumps(r) + "\n" for r in load_records(src).records + extra))
        for dst in (d for d in stores if d != src):
            c = cores_of(recs[dst])
            js = predict_1x1(both, c)
            pred, meas = js["rows"][0]["samples_per_s"], Row(recs[dst]).median or float("nan")
            what = ("fewer cores: the floor" if c < cores_of(recs[src]) else
                    "more cores: the synthetic run's step, bounded by the floor"
                    if "synthetic run" in js["inputs"]["host_input_floor"] else
                    "more cores: the record's own step, a lower bound")
            row = [run_dir.name, what, f"{cores_of(recs[src])} cores ({Row(recs[src]).loader_cores or 0.0:.2f} "
                   f"used by loaders)", f"{c} cores", measured_cell(recs[dst]), f"{pred:,.1f}",
                   f"{(pred - meas) / meas * 100:+.1f} %", js["rows"][0]["limiting"]]
            out.append((row, pred, meas))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="RUN",
                    help="DIR (host-floor runs, each with a store/) or DIR,SYNTHETIC_STORE (with the same case on "
                         "synthetic batches: the GPU's own step, for predictions to more cores)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="host-floor-check-"))
    got = []
    for run in args.runs:
        run_dir, _, synthetic = run.partition(",")
        got += check(Path(run_dir), synthetic or None, tmp)
    got.sort(key=lambda g: (g[0][0], not g[0][1].startswith("fewer")))
    print(md_table(["run", "prediction", "predicted from (record)", "predicted host",
                    "measured img/s (min-max, repeats)", "predicted img/s", "error", "limited by"],
                   [g[0] for g in got]))
    bound = [(p, m) for row, p, m in got if row[-1] == "host input"]
    if bound:
        errs = [abs(p - m) / m * 100 for p, m in bound]
        print(f"\n{len(bound)} floor-bound prediction(s): mean |error| {sum(errs) / len(errs):.1f} %, max "
              f"{max(errs):.1f} %; band [below, above] (80th percentile per side): {band_sides(bound)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
