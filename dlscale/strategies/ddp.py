"""`ddp`: torch DistributedDataParallel, one replica per process, gradients all-reduced in buckets.

Options (``strategy_options``): ``bucket_cap_mb`` (default 25, DDP's own), ``gradient_as_bucket_view``
(default True: gradients live in the communication buckets, saving a copy and memory),
``broadcast_buffers`` (default True, DDP's own: BatchNorm buffers follow rank 0),
``static_graph`` (default False).
"""
from torch.nn.parallel import DistributedDataParallel as DDP

from dlscale import ConfigError
from dlscale.strategies import Parallelized, make_optimizer, register_strategy

OPTIONS = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": True, "broadcast_buffers": True,
           "static_graph": False}


def options(cfg) -> dict:
    unknown = sorted(set(cfg.strategy_options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown ddp option(s) {', '.join(unknown)}; allowed: {', '.join(OPTIONS)}")
    return {**OPTIONS, **cfg.strategy_options}


@register_strategy("ddp", description="DistributedDataParallel (all-reduce of gradient buckets)",
                   validate=options)
def parallelize(model, spec, cfg, dist):
    opts = options(cfg)
    # broadcast_buffers is passed only when off: torch 2.13 deprecates the argument, 2.11 lacks its successor
    extra = {} if opts["broadcast_buffers"] else {"broadcast_buffers": False}
    ddp = DDP(model, device_ids=[dist.local_rank] if dist.device.type == "cuda" else None,
              bucket_cap_mb=float(opts["bucket_cap_mb"]),
              gradient_as_bucket_view=bool(opts["gradient_as_bucket_view"]),
              static_graph=bool(opts["static_graph"]), **extra)
    return Parallelized(module=ddp, optimizer=make_optimizer(ddp.parameters(), spec, cfg, dist.device),
                        dp_size=dist.world_size, no_sync=ddp.no_sync,
                        info={"dp_rank": dist.rank, **opts})
