"""Issue 3's sweep-overhead check from benchmarks/sweep_overhead_gpu.sh OUTDIR:
python benchmarks/summarize_overhead.py OUTDIR

Pools the repeats of the two sweep blocks and of the two run blocks (same case, alternated in one
call) and says whether the sweep's median differs from the run's by more than run-to-run noise:
ratio of medians, a 95 % bootstrap interval of that ratio and the exact Mann-Whitney p-value
(the statistics of `dlscale compare`).
"""
import statistics
import sys
from pathlib import Path

from dlscale.report.stats import bootstrap_ratio_ci, mann_whitney
from dlscale.store import ResultStore

out = Path(sys.argv[1])
pools = {}
for kind in ("sweep", "run"):
    xs = []
    for d in sorted(out.glob(f"{kind}-*")):
        for r in ResultStore(d).load("run").records:
            got = [rep["samples_per_s"] for rep in r["repeats"] if rep.get("status") == "ok"]
            print(f"{d.name}: {', '.join(f'{x:,.1f}' for x in got)} samples/s")
            xs += got
    pools[kind] = xs
s, r = pools["sweep"], pools["run"]
ms, mr = statistics.median(s), statistics.median(r)
lo, hi = bootstrap_ratio_ci(r, s, resamples=2000, confidence=0.95, seed=0)
_, p, method = mann_whitney(r, s)
print(f"\nsweep median {ms:,.1f} (n={len(s)}, sd {statistics.stdev(s):.1f}); run median {mr:,.1f} "
      f"(n={len(r)}, sd {statistics.stdev(r):.1f}); sweep / run = {ms / mr:.4f}, "
      f"95 % CI [{lo:.4f}, {hi:.4f}], Mann-Whitney p = {p:.3f} ({method})")
