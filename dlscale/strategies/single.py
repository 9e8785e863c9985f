"""`single`: one process, one device, no parallelism (the 1-device baseline)."""
from dlscale import ConfigError
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.planner.layout import Layout, ParallelDims


def _validate(cfg) -> None:
    parse_options("single", cfg, {})  # no options: a misspelt one must not pass silently
    if cfg.world_size != 1:
        raise ConfigError(f"strategy single runs one process, got {cfg.world_size} "
                          f"(nnodes {cfg.nnodes} x nproc-per-node {cfg.nproc_per_node}); use ddp for more")


def dims(world: int, nnodes: int, opts: dict):
    return ParallelDims(world, where="single")


def memory_layout(dims, opts: dict):
    return Layout("single", dims)


@register_strategy("single", description="one process on one device",
                   hooks=Hooks(validate=_validate, dims=dims, memory_layout=memory_layout),
                   caps=Capabilities(cudagraph_safe=True, checkpoint_saves=True))
def parallelize(model, spec, cfg, dist):
    return Parallelized(module=model, optimizer=make_optimizer(model.parameters(), spec, cfg, dist.device),
                        dp_size=1, dp_rank=0)
