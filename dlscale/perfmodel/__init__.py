"""Data-parallel performance model and run cost (docs/perfmodel.md; docs/metrics.md "Performance model").

``core``: shapes, links, the alpha-beta all-reduce, buckets, overlap, the compute split.
``law``: the overhead law and its fitted defaults. ``model``: one workload's step model and a shape's
prediction with its band. ``inputs``: picking the inputs from records. ``predict``: a workload's
prediction over shapes. ``validate``/``fit``: checking and fitting the model on measured or published
points. ``cost``: time, money and energy of a run. ``strategies``: the step model of every parallel strategy
(fsdp, hsdp, tensor, pipeline, hybrid, and ddp/zero1 for ``plan``), its entry point ``predict_step``
(``strategies.predict``); ``evidence``, ``predict_strategy``, ``validate_strategies``: its inputs from records,
the ``predict --strategy`` rows and its validation. Nothing here reads command-line arguments.
"""
from dlscale.perfmodel.core import (DDP_BUCKET_CAP_MB, GRAD_BYTES_PER_PARAM, MIB, Compute, Link, Links, Overlap,
                                    Shape, allreduce_phases_s, allreduce_s, bucket_sizes, compute_terms, error_pct,
                                    gradient_bytes, overlap_model, parse_shape, parse_shapes, ring_allreduce_s,
                                    step_time_from_throughput, tree_allreduce_s)
from dlscale.perfmodel.law import DEFAULT_LAW, OverheadLaw
from dlscale.perfmodel.model import HostInput, Measured, ShapePrediction, WorkloadModel
from dlscale.perfmodel.strategies import (Candidate, Evidence, LayerTiming, Machine, Reference, StepPrediction,
                                          predict as predict_step)

__all__ = [
    "DDP_BUCKET_CAP_MB", "GRAD_BYTES_PER_PARAM", "MIB", "Compute", "Link", "Links", "Overlap", "Shape",
    "allreduce_phases_s", "allreduce_s", "bucket_sizes", "compute_terms", "error_pct", "gradient_bytes",
    "overlap_model", "parse_shape", "parse_shapes", "ring_allreduce_s", "step_time_from_throughput",
    "tree_allreduce_s", "DEFAULT_LAW", "OverheadLaw", "HostInput", "Measured", "ShapePrediction", "WorkloadModel",
    "Candidate", "Evidence", "LayerTiming", "Machine", "Reference", "StepPrediction", "predict_step",
]
