"""`dp`: ``torch.nn.DataParallel``: one process drives all ``--nproc-per-node`` GPUs of one node.

Every step the single process scatters its batch over the GPUs, replicates the module onto them
(a broadcast of all parameters and buffers from GPU 0, every step), runs the replicas in
threads, gathers the per-GPU losses on GPU 0 and back-propagates through the replication, so
gradients are summed onto GPU 0's parameters and only GPU 0 runs the optimizer. The historical
baseline that DDP replaced; measured to show what the GIL, the per-step replication and GPU 0's
extra work cost.

Data: ``--batch-size`` stays per device: the process feeds ``batch-size x nproc-per-node``
samples per micro-batch (the same global batch as ``ddp``). The model returns a scalar loss per
replica; they are averaged (equal chunks: the global batch's mean loss). BatchNorm statistics
are per GPU chunk, and only GPU 0's running statistics are kept.

Needs CUDA (recorded unsupported on the CPU) and one node. The launcher starts one process
(``single_process=True`` in the registry); peak memory is that of GPU 0, the busiest.
"""
from __future__ import annotations

import torch
from torch import nn

from dlscale import ConfigError
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy
from dlscale.strategies._common import parse_options
from dlscale.planner.layout import Layout


def _validate(cfg) -> None:
    parse_options("dp", cfg, {})
    if cfg.nnodes != 1:
        raise ConfigError(f"strategy dp (nn.DataParallel) runs on one node, got nnodes {cfg.nnodes}; use ddp")


def _check(cfg, env) -> str | None:
    if env.get("device_type") != "cuda":
        return "nn.DataParallel drives several CUDA GPUs from one process; not on the CPU (use ddp there)"
    return None


class _MeanLoss(nn.Module):
    """DataParallel gathers the replicas' scalar losses into a vector: average it."""

    def __init__(self, dp: nn.DataParallel):
        super().__init__()
        self.dp = dp

    def forward(self, *batch):
        out = self.dp(*batch)
        return out.mean() if out.dim() else out


def memory_layout(dims, opts: dict):
    return Layout("dp", dims)


@register_strategy("dp", description="nn.DataParallel: one process, all GPUs of the node (single-process baseline)",
                   hooks=Hooks(check=_check, validate=_validate, memory_layout=memory_layout),
                   caps=Capabilities(single_process=True,
                                     no_checkpointing="nn.DataParallel copies the blocks every step; use ddp"))
def parallelize(model, spec, cfg, denv):
    n = cfg.nproc_per_node
    if denv.world_size != 1:
        raise RuntimeError(f"strategy dp runs in one process but {denv.world_size} were started: the launcher "
                           "must honour StrategyInfo.single_process")
    if torch.cuda.device_count() < n:
        raise RuntimeError(f"dp needs {n} GPUs, {torch.cuda.device_count()} visible")
    devices = list(range(n))
    module = _MeanLoss(nn.DataParallel(model, device_ids=devices, output_device=devices[0]))
    return Parallelized(module=module, optimizer=make_optimizer(model.parameters(), spec, cfg, denv.device),
                        dp_size=n, dp_rank=0, devices_per_process=n, info={"devices": devices})
