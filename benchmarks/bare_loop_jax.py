"""A bare hand-written JAX training loop over dlscale's JAX models: the yardstick for dlscale's JAX runs.

The JAX analogue of benchmarks/bare_loop.py: what a user writes in a few lines of JAX around the
model (dlscale's JAX definition, as bare_loop.py uses dlscale's torch models): parameters from the
model's init, optax (AdamW betas (0.9, 0.95) / SGD momentum 0.9, the spec's lr and weight decay),
bf16 compute with fp32 master weights, one ``jax.jit`` step with the state donated, a fixed
synthetic batch on the device, W warm-up steps, then N steps between two ``block_until_ready``.
No dlscale worker, launcher, loss scale or records. One process, one device; or, under torchrun,
data parallel as a JAX user writes it: ``jax.distributed.initialize``, one device a process, the
parameters replicated and the batch split over a one-axis mesh (NamedSharding), so that XLA inserts
the gradients' all-reduce (``--batch-size`` per device, each process its own batch, seed + rank).

    python benchmarks/bare_loop_jax.py --model gpt2 --batch-size 16
    torchrun --nproc-per-node 2 benchmarks/bare_loop_jax.py --model gpt2 --batch-size 16 --device cuda

``--legacy matmul-f32-out`` / ``--legacy gather-ce`` (diagnosis only, repeatable) swap in the
formulations dlscale's JAX layers used before: matmuls and convolutions with
``preferred_element_type=float32`` then a cast (which makes every backward matmul mix float32
with bfloat16), and the cross-entropy through ``take_along_axis`` on the float32 log-softmax; an
A/B of each against the default measures what it cost.

Prints one JSON line: {"bench": "bare_loop_jax", "model", "samples_per_s", "mfu", "compile_s", ...}.
With --out DIR it also writes DIR/rank0.json in the shape dlscale's worker writes, so that
benchmarks/run.py stores the run as a record of its dlscale case (a suite's ``bare`` entry with
``loop: jax``, the default for a JAX case).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import time
from pathlib import Path


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="gpt2", help="resnet50, bert-base, gpt2 or gpt2-vpad")
    ap.add_argument("--flavor", default="full", choices=("full", "tiny"))
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--precision", default="amp-bf16", choices=("amp-bf16", "fp32"))
    ap.add_argument("--device", default="auto", choices=("auto", "cuda", "cpu"),
                    help="auto: JAX's default backend")
    ap.add_argument("--seed", type=int, default=0, help="seed of the weights and the batch (dlscale's rule)")
    ap.add_argument("--attention", default="auto", choices=("auto", "cudnn", "xla"),
                    help="jax.nn.dot_product_attention implementation; auto: dlscale's rule (cudnn on a GPU "
                         "below fp32, else xla; cudnn falls back to xla where it cannot run)")
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", default=None, metavar="DIR", help="also write DIR/rank<R>.json (default: none)")
    ap.add_argument("--legacy", action="append", default=[], choices=sorted(LEGACY),
                    help="diagnosis: use an earlier layer formulation (repeatable)")
    return ap.parse_args()


def _legacy_matmul_f32_out(layers) -> None:
    """dense, vocab_logits, conv: float32 outputs (preferred_element_type) cast to the compute dtype."""
    import jax.numpy as jnp
    from jax import lax

    f32 = jnp.float32

    def dense(p, x, ctx):
        dt = ctx.cdt
        y = jnp.dot(x.astype(dt), p["kernel"].astype(dt), preferred_element_type=f32).astype(dt)
        return y + p["bias"].astype(dt) if "bias" in p else y

    def vocab_logits(x, table, bias, ctx):
        vocab, dt = table.shape[0], ctx.cdt
        pad = -vocab % ctx.vocab_multiple
        w = table if pad == 0 else jnp.pad(table, ((0, pad), (0, 0)))
        logits = jnp.dot(x.astype(dt), w.astype(dt).T, preferred_element_type=f32).astype(dt)
        b = jnp.zeros((vocab,), f32) if bias is None else bias
        if pad:
            b = jnp.concatenate([b, jnp.full((pad,), layers.MASKED_LOGIT, f32)])
        return logits + b.astype(dt)

    def conv(p, x, ctx, stride=1, padding=0):
        dt = ctx.cdt
        return lax.conv_general_dilated(
            x.astype(dt), p["kernel"].astype(dt), (stride, stride), [(padding, padding)] * 2,
            dimension_numbers=("NHWC", "HWIO", "NHWC"), preferred_element_type=f32).astype(dt)

    layers.dense, layers.vocab_logits, layers.conv = dense, vocab_logits, conv


def _legacy_gather_ce(layers) -> None:
    """cross_entropy: take_along_axis on the float32 log-softmax (its gradient is a scatter)."""
    import jax
    import jax.numpy as jnp

    def cross_entropy(logits, labels, ignore_index=None):
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        valid = jnp.ones(labels.shape, bool) if ignore_index is None else labels != ignore_index
        nll = -jnp.take_along_axis(logp, jnp.where(valid, labels, 0)[..., None], axis=-1)[..., 0]
        return jnp.sum(jnp.where(valid, nll, 0.0)) / jnp.maximum(jnp.sum(valid), 1)

    layers.cross_entropy = cross_entropy


LEGACY = {"matmul-f32-out": _legacy_matmul_f32_out, "gather-ce": _legacy_gather_ce}


def mesh_devices(devices: list, world: int) -> list:
    """The devices of the data-parallel mesh: every process's one device under torchrun; a lone
    process only its first, since it sees every visible GPU and a mesh over them all would split
    its batch across them (one process's throughput from several GPUs)."""
    return list(devices) if world > 1 else list(devices)[:1]


def main() -> None:
    args = parse_args()
    import jax

    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.device != "auto":
        jax.config.update("jax_platforms", args.device)
    if world > 1:
        from dlscale.frameworks.jax.worker import coordinator_address

        cpu = args.device == "cpu"
        if cpu:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator_address(rank, 300), num_processes=world,
                                   process_id=rank, local_device_ids=None if cpu else [local])
    import numpy as np
    import optax
    import torch
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from dlscale.results import metrics
    from dlscale.frameworks.jax import layers
    from dlscale.frameworks.jax.layers import Ctx, HostInit
    from dlscale.frameworks.jax.models import count_params, get_jax_model

    for name in args.legacy:  # the models call layers.<fn> at trace time, so this swaps them in
        LEGACY[name](layers)
    gpu = jax.default_backend() == "gpu"
    if gpu:  # fp32 matmuls on TF32 tensor cores, as dlscale's JAX worker (and torch's allow_tf32)
        jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    attention = args.attention if args.attention != "auto" else \
        ("cudnn" if gpu and args.precision != "fp32" else "xla")
    model = get_jax_model(args.model, args.flavor)
    spec = model.spec
    ctx = Ctx(dtype="bfloat16" if args.precision == "amp-bf16" else "float32", train=True,
              attention=attention if gpu else "xla", vocab_multiple=64 if gpu else 1)
    if spec.optimizer == "sgd":
        tx = optax.chain(optax.add_decayed_weights(spec.weight_decay), optax.sgd(spec.lr, momentum=0.9))
    else:
        tx = optax.adamw(spec.lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=spec.weight_decay)
    mesh = Mesh(np.array(mesh_devices(jax.devices(), world)), ("data",))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def put(tree):  # the same host values on every process -> one replicated global array each
        return jax.tree_util.tree_map(lambda x: jax.make_array_from_callback(x.shape, replicated, lambda i: x[i]), tree)

    params, stats = put(model.init(HostInit(args.seed)))
    n_params = count_params(params)
    opt = jax.jit(tx.init)(params)  # one small program, not one per parameter shape
    local_batch = model.to_numpy(spec.make_batch(args.batch_size, torch.device("cpu"),
                                                 torch.Generator().manual_seed(args.seed + 12345 + rank)))
    batch = tuple(jax.make_array_from_process_local_data(split, x, (x.shape[0] * world, *x.shape[1:]))
                  for x in local_batch)
    key = put(np.asarray(jax.random.PRNGKey(args.seed + 1)))

    def train_step(params, stats, opt, key, batch):
        key, sub = jax.random.split(key)
        (loss, stats), grads = jax.value_and_grad(
            lambda p: model.loss(p, stats, batch, ctx, sub if model.uses_dropout else None), has_aux=True)(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), stats, opt, key, loss

    step = jax.jit(train_step, donate_argnums=(0, 1, 2, 3))
    t = time.perf_counter()
    step = step.lower(params, stats, opt, key, batch).compile()
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(args.warmup):
        params, stats, opt, key, loss = step(params, stats, opt, key, batch)
    jax.block_until_ready(params)
    warmup_s = time.perf_counter() - t
    t0 = time.perf_counter()
    for _ in range(args.steps):
        params, stats, opt, key, loss = step(params, stats, opt, key, batch)
    jax.block_until_ready((params, loss))
    loss = float(np.asarray(loss.addressable_data(0)))  # replicated: this process's copy
    dt = time.perf_counter() - t0
    sps = args.steps * args.batch_size * world / dt
    dev = jax.local_devices()[0]
    name = dev.device_kind if gpu else None
    peak, _ = metrics.peak_flops(name, metrics.precision_dtype(args.precision, "cuda" if gpu else "cpu"))
    mem = (dev.memory_stats() or {}).get("peak_bytes_in_use") if gpu else None
    if args.out:
        result = {"rank": rank, "local_rank": local, "status": "ok", "error": None, "window_s": dt,
                  "warmup_s": warmup_s, "step_times_ms": [], "dp_size": world,
                  "device": f"{'cuda' if gpu else 'cpu'}:{local if gpu else 0}",
                  "device_name": name or "cpu", "pid": os.getpid(), "params": n_params, "framework": "jax",
                  "compile_s": compile_s, "loss_last": loss, "peak_mem_allocated_bytes": mem,
                  "peak_rss_bytes": None if gpu else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        path = Path(args.out) / f"rank{rank}.json"
        path.with_suffix(".tmp").write_text(json.dumps(result))
        os.replace(path.with_suffix(".tmp"), path)
    if rank != 0:
        return
    print(json.dumps({"bench": "bare_loop_jax", "model": args.model, "flavor": args.flavor, "device": name or "cpu",
                      "world": world, "devices": int(mesh.size),
                      "precision": args.precision, "batch_size": args.batch_size, "steps": args.steps,
                      "attention": sorted(layers.ATTENTION_USED), "compile_s": round(compile_s, 2),
                      "samples_per_s": sps, "step_ms": dt / args.steps * 1e3,
                      "mfu": metrics.mfu(spec.flops_per_sample, sps, peak) if peak else None,
                      "loss": loss, "peak_mem_gib": mem / 2**30 if mem else None,
                      "legacy": sorted(set(args.legacy)),
                      "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS")}), flush=True)


if __name__ == "__main__":
    main()
