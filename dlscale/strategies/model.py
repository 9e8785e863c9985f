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
from dlscale.strategies import register_strategy
from dlscale.strategies._common import parse_options
from dlscale.strategies.pipeline import build_pipeline, validate_pipeline
from dlscale.layout import Layout


def options(cfg) -> dict:
    opts = parse_options("model", cfg, {"balance": "time"})
    validate_pipeline("model", cfg, get_model(cfg.model, cfg.flavor), cfg.world_size, "gpipe", 1, 1, opts["balance"])
    return opts


def memory_layout(world: int, nnodes: int, opts: dict):
    return Layout("model", pp=world, microbatches=1, schedule="gpipe", options=opts)


@register_strategy("model", description="naive model parallel: stages by blocks, one micro-batch (no pipelining)",
                   validate=options, min_world=2, memory_layout=memory_layout)
def parallelize(model, spec, cfg, denv):
    opts = options(cfg)
    return build_pipeline(model, spec, cfg, denv, schedule="gpipe", microbatches=1, virtual=1,
                          balance=opts["balance"], pp_group=None,
                          pp_rank=denv.rank, pp_size=denv.world_size, name="model")
