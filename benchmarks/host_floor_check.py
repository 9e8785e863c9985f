"""The host input floor of `dlscale predict` against 1-GPU runs on fewer cores (suite host-floor).

    python benchmarks/host_floor_check.py DIR

DIR holds one run of the host-floor suite's real-data case per host size, each under its own directory
with a ``store`` (the whole host, and ``taskset`` runs on fewer cores). Every store's record is predicted
from every other store's record with ``dlscale predict --shapes 1x1 --host-cores C`` (C: the cores the
predicted run could use, from its record); the table prints measured, predicted, error and what limited the
prediction. From a larger host the floor is the prediction; from a smaller one whose loaders were busy the
record's step is itself input-bound: with ``--synthetic STORE`` (the same case on synthetic batches) predict
takes the GPU's own step from it and the floor adds the host, else the record's step stands (a lower bound).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
    """``dlscale predict`` of the 1-GPU step on a host of ``cores`` cores (its JSON)."""
    out = subprocess.run([sys.executable, "-m", "dlscale", "predict", str(store_file), "--model", "resnet50",
                          "--data", "imagefolder", "--shapes", "1x1", "--host-cores", str(cores), "--format", "json"],
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def measured_cell(rec: dict) -> str:
    r = Row(rec)
    late = ", interrupted" if rec.get("status") != "ok" else ""
    return f"{r.median:,.1f} ({r.stat('min'):,.0f}-{r.stat('max'):,.0f}, n {r.stat('n'):.0f}{late})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="directory of host-floor runs, each with a store/")
    ap.add_argument("--synthetic", default=None, metavar="STORE",
                    help="a store with the synthetic run of the same case (the GPU's own step): predict reads it "
                         "beside each record, so that a record whose own step was input-bound predicts more cores")
    args = ap.parse_args()
    extra = load_records(args.synthetic).records if args.synthetic else []
    tmp = Path(tempfile.mkdtemp(prefix="host-floor-check-"))
    stores = sorted(Path(args.dir).glob("*/store"))
    recs = {s: the_record(s) for s in stores}
    body = []
    for src in stores:
        both = tmp / f"{src.parent.name}.jsonl"  # the record, and the synthetic run where given
        both.write_text("".join(json.dumps(r) + "\n" for r in load_records(src).records + extra))
        for dst in (d for d in stores if d != src):
            c = cores_of(recs[dst])
            js = predict_1x1(both, c)
            pred, meas = js["rows"][0]["samples_per_s"], Row(recs[dst]).median or float("nan")
            what = ("fewer cores: the floor" if c < cores_of(recs[src]) else
                    "more cores: the synthetic run's step, bounded by the floor"
                    if "synthetic run" in js["inputs"]["host_input_floor"] else
                    "more cores: the record's own step, a lower bound")
            body.append([what, f"{cores_of(recs[src])} cores ({Row(recs[src]).loader_cores or 0.0:.2f} used by "
                         f"loaders)", f"{c} cores", measured_cell(recs[dst]), f"{pred:,.1f}",
                         f"{(pred - meas) / meas * 100:+.1f} %", js["rows"][0]["limiting"]])
    body.sort(key=lambda r: not r[0].startswith("fewer"))
    print(md_table(["prediction", "predicted from (record)", "predicted host", "measured img/s (min-max, repeats)",
                    "predicted img/s", "error", "limited by"], body))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
