"""`deepspeed`: DeepSpeed ZeRO stages 1, 2, 3 (optional extra: ``pip install 'dlscale[deepspeed]'``).

Recorded ``unsupported`` when ``import deepspeed`` fails. The model, with the model's default
optimizer (the same ``make_optimizer`` AdamW/SGD the other strategies use, as a DeepSpeed
"client optimizer"), goes through ``deepspeed.initialize``; each step runs
``engine(*batch)``, ``engine.backward(loss)``, ``engine.step()`` per micro-batch (DeepSpeed
counts the gradient-accumulation boundary itself).

Options:

* ``stage`` (default 2): 1 = optimizer state sharded, 2 = + gradients (reduce-scatter),
  3 = + parameters (gathered per layer in forward and backward).
* ``overlap_comm`` (default true): overlap gradient reduction with the backward.
* ``bucket_mb`` (default 200, DeepSpeed's 5e8 elements is its own default): reduce and
  all-gather bucket size, in millions of elements.

Precision: DeepSpeed's own mixed precision, not autocast: with ``amp-bf16`` (``amp-fp16``) the
engine holds bf16 (fp16, with dynamic loss scaling) model weights and fp32 master weights in the
sharded optimizer, and floating inputs are cast to the model's dtype. So its numbers are not
bit-comparable with the autocast strategies under amp; with fp32 they are (tolerance as
zero1/fsdp). ``clip-grad-norm`` maps to DeepSpeed's ``gradient_clipping`` (set to 0 without it:
DeepSpeed's own default clips at 1.0, which would make it train differently from the rest). Losses as for
ddp: the worker averages each rank's micro-batch loss over the ranks (the global batch's mean);
``loss_after`` evaluates the engine forward only, in eval mode (``eval_loss``).
"""
from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys

import torch

from dlscale.train.precision import compute_dtype
from dlscale.strategies import Capabilities, Hooks, Parallelized, make_optimizer, register_strategy, replicated, sharded
from dlscale.strategies._common import parse_options

OPTIONS = {"stage": 2, "overlap_comm": True, "bucket_mb": 200}
CHOICES = {"stage": (1, 2, 3)}


def options(cfg) -> dict:
    return parse_options("deepspeed", cfg, OPTIONS, CHOICES)


@functools.lru_cache(maxsize=None)
def _import_error() -> str | None:
    """Why ``import deepspeed`` fails (None: it imports), tried in a child process.

    Importing DeepSpeed in the launcher would print to its stdout (breaking ``--json``) and
    patch torch in the measuring process; the workers import it themselves.
    """
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed; pip install 'dlscale[deepspeed]'"
    proc = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        last = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()][-1:] or ["no output"]
        return f"import deepspeed fails: {last[0][:200]}"
    return None


def check(cfg, env) -> str | None:
    if env.get("assume_extras"):  # the compatibility matrix documents capability, not this machine
        return None
    return _import_error()


def ds_config(cfg, opts: dict, world: int) -> dict:
    bucket = int(opts["bucket_mb"] * 1e6)
    zero = {"stage": int(opts["stage"]), "overlap_comm": bool(opts["overlap_comm"]), "contiguous_gradients": True,
            "reduce_bucket_size": bucket, "allgather_bucket_size": bucket}
    if int(opts["stage"]) == 3:
        zero.update({"stage3_prefetch_bucket_size": bucket, "stage3_param_persistence_threshold": 1e5})
    conf = {
        "train_micro_batch_size_per_gpu": cfg.batch_size,
        "gradient_accumulation_steps": cfg.grad_accum,
        "train_batch_size": cfg.batch_size * cfg.grad_accum * world,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": cfg.precision == "amp-bf16"},
        "fp16": {"enabled": cfg.precision == "amp-fp16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    # explicit either way: DeepSpeed's own default clips to 1.0, which the other strategies don't
    conf["gradient_clipping"] = float(cfg.clip_grad_norm) if cfg.clip_grad_norm is not None else 0.0
    return conf


# DeepSpeed runs its own mixed precision (bf16/fp16 master-weight copies), not torchao's float8
def dims(world: int, nnodes: int, opts: dict):
    """Stage 3 shards the parameters over every rank; stages 1 and 2 keep a replica of them."""
    return sharded(world, nnodes, opts) if opts.get("stage") == 3 else replicated(world, nnodes, opts)


@register_strategy("deepspeed", description="DeepSpeed ZeRO stage 1/2/3 (optional extra)",
                   hooks=Hooks(check=check, validate=options, dims=dims),
                   caps=Capabilities(precisions=("fp32", "amp-bf16", "amp-fp16")))
def parallelize(model, spec, cfg, denv):
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if denv.device.type == "cuda" else "cpu")
    import deepspeed  # optional: deepspeed

    opts = options(cfg)
    optimizer = make_optimizer(model.parameters(), spec, cfg, denv.device)
    conf = ds_config(cfg, opts, denv.world_size)
    engine, ds_opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=conf,
                                                dist_init_required=False)
    dtype = compute_dtype(cfg.precision)

    def step(micro_batches: list[tuple]) -> torch.Tensor:
        loss = None
        for batch in micro_batches:
            if dtype is not None:
                batch = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch)
            loss = engine(*batch)
            engine.backward(loss)
            engine.step()
        return loss

    def eval_loss(batch: tuple) -> torch.Tensor:
        engine.eval()
        try:
            with torch.no_grad():
                if dtype is not None:
                    batch = tuple(t.to(dtype) if t.is_floating_point() else t for t in batch)
                return engine(*batch)
        finally:
            engine.train()

    return Parallelized(module=engine, optimizer=ds_opt, dp_size=denv.world_size, step=step, eval_loss=eval_loss,
                        dp_rank=denv.rank, info={"zero_stage": int(opts["stage"]),
                              "deepspeed": deepspeed.__version__, "ds_config": conf, **opts})
