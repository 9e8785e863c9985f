"""Reports over a result store: DLPerf-style scaling tables, plots, HTML, and A/B comparison.

Everything here only reads the store. Speedup and scaling efficiency are computed from the
stored records at report time (never at measurement time); see docs/reports.md.
"""
from dlscale.report.data import Report, build_report, load_records

__all__ = ["Report", "build_report", "load_records"]
