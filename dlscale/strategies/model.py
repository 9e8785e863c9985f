"""`model`: naive model parallelism: the model split by blocks across devices, no micro-batches.

The baseline that pipelining is measured against: the same stages as ``pipeline`` (stage 0 =
embed + first blocks, last = last blocks + head; tied weights kept equal by summing their
gradients), run with the GPipe schedule on a single micro-batch, so at any time exactly one
device works while the others wait for its activations (forward) or gradients (backward).
Implemented as ``pipeline -o schedule=gpipe -o microbatches=1``; one option, ``balance``, as
pipeline's (default ``time``, timed on the whole batch), so that both split the model alike. BatchNorm sees the
whole batch, so unlike ``pipeline`` this trains resnet50 exactly as ``single`` does.
"""
from __future__ import annotations

from dlscale.models import get_model
from dlscale.strategies import Capabilities, Hooks, register_strategy, staged
from dlscale.strategies._common import parse_options
from dlscale.strategies.pipeline import PipelineJob, PipelinePlace, PipelineShape, build_pipeline, validate_pipeline
from dlscale.planner.layout import Layout


def _shape(opts: dict) -> PipelineShape:
    """gpipe on one micro-batch: one device works at a time."""
    return PipelineShape("gpipe", microbatches=1, virtual=1, balance=opts["balance"])


def options(cfg) -> dict:
    opts = parse_options("model", cfg, {"balance": "time"})
    validate_pipeline("model", cfg, get_model(cfg.model, cfg.flavor), cfg.world_size, _shape(opts))
    return opts


def memory_layout(dims, opts: dict):
    return Layout("model", dims, microbatches=1, schedule="gpipe", options=opts)


@register_strategy("model", description="naive model parallel: stages by blocks, one micro-batch (no pipelining)",
                   hooks=Hooks(validate=options, dims=staged, memory_layout=memory_layout),
                   caps=Capabilities(min_world=2))
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    job = PipelineJob(_shape(opts), PipelinePlace.of_world(denv), name="model")
    return build_pipeline(model, spec, cfg, denv, job)
