"""The JAX training step: state, optimizer, precision, mesh and shardings, one jitted step.

One ``jax.jit`` step over the whole mesh (``donate_argnums``: the old state's buffers are reused
for the new one) runs ``grad_accum`` micro-batches forward and backward, averages the gradients,
optionally unscales and checks them (fp16), clips, and applies the optimizer. The optimizers are
the torch specs' own, in optax: SGD with momentum 0.9 and L2 weight decay added to the gradient
(torch's SGD), AdamW with betas (0.9, 0.95), eps 1e-8 and decoupled weight decay on every
parameter (torch's AdamW over one parameter group).

Precision (``dlscale.case.config.PRECISIONS``): fp32 (TF32 matmuls on GPUs, as the torch worker);
amp-bf16: bf16 compute, fp32 master weights and optimizer state; amp-fp16: fp16 compute with
dynamic loss scaling in the state, with torch GradScaler's constants (initial scale 2**16,
halved on a non-finite gradient and the step skipped, doubled after 2000 finite steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dlscale.frameworks.jax.layers import Ctx, HostInit, ShapeInit
from dlscale.frameworks.jax.models import JaxModel
from dlscale.frameworks.jax.strategies import fsdp_spec

DTYPES = {"fp32": "float32", "amp-bf16": "bfloat16", "amp-fp16": "float16"}
# torch.amp.GradScaler's defaults
SCALE_INIT, SCALE_GROWTH, SCALE_BACKOFF, SCALE_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000


class TrainState(NamedTuple):
    params: Any
    stats: Any  # BatchNorm running statistics (empty for the transformers)
    opt: Any
    step: Any  # int32 scalar
    scale: Any  # fp16 loss scale (1.0 otherwise)
    good_steps: Any  # finite steps since the scale last changed


@dataclass
class Setup:
    """Everything the worker needs to run steps, built by :func:`setup`."""

    mesh: Mesh
    ctx: Ctx
    state: TrainState
    state_sharding: Any
    batch_sharding: NamedSharding
    step: Any  # jitted step(state, batches) -> (state, loss)
    eval_loss: Any  # jitted eval_loss(params, stats, micro_batch) -> loss
    dp_size: int
    dp_rank: int  # this process's position on the data axis (its slice of the global batch)


def make_optimizer(model: JaxModel, clip: float | None) -> optax.GradientTransformation:
    spec = model.spec
    if spec.optimizer == "sgd":
        opt = optax.chain(optax.add_decayed_weights(spec.weight_decay),
                          optax.sgd(spec.lr, momentum=0.9))
    else:
        opt = optax.adamw(spec.lr, b1=0.9, b2=0.95, eps=1e-8, weight_decay=spec.weight_decay)
    return optax.chain(optax.clip_by_global_norm(clip), opt) if clip is not None else opt


def make_mesh(devices: list | None = None) -> Mesh:
    """A 1-D ``("data",)`` mesh over ``devices`` (default: every device of every process)."""
    return Mesh(np.array(devices if devices is not None else jax.devices()), ("data",))


def _all_finite(tree) -> Any:
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def build_step(model: JaxModel, ctx: Ctx, tx, accum: int, fp16: bool, seed: int):
    """step(state, batches) -> (new state, loss of the last micro-batch); ``batches``: a tuple of
    arrays whose leading axis is the micro-batch index."""
    base_key = jax.random.PRNGKey(seed + 1) if model.uses_dropout else None

    def step(state: TrainState, batches: tuple):
        def loss_fn(params, stats, mb, key):
            loss, new_stats = model.loss(params, stats, mb, ctx, key)
            return (loss * state.scale if fp16 else loss), (loss, new_stats)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        stats, grads, loss = state.stats, None, None
        for i in range(accum):
            key = None if base_key is None else jax.random.fold_in(jax.random.fold_in(base_key, state.step), i)
            (_, (loss, stats)), g = grad_fn(state.params, stats, tuple(b[i] for b in batches), key)
            grads = g if grads is None else jax.tree_util.tree_map(jnp.add, grads, g)
        if fp16 or accum > 1:
            div = accum * state.scale if fp16 else float(accum)
            grads = jax.tree_util.tree_map(lambda g: g / div, grads)
        updates, opt = tx.update(grads, state.opt, state.params)
        params = optax.apply_updates(state.params, updates)
        scale, good = state.scale, state.good_steps
        if fp16:  # skip the step on inf/nan gradients and move the scale, as GradScaler does
            finite = _all_finite(grads)
            keep = lambda new, old: jax.tree_util.tree_map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
            params, opt, stats = keep(params, state.params), keep(opt, state.opt), keep(stats, state.stats)
            grow = finite & (good + 1 >= SCALE_INTERVAL)
            scale = jnp.where(finite, jnp.where(grow, scale * SCALE_GROWTH, scale), scale * SCALE_BACKOFF)
            good = jnp.where(finite & ~grow, good + 1, 0)
        return TrainState(params, stats, opt, state.step + 1, scale, good), loss.astype(jnp.float32)

    return step


@dataclass(frozen=True)
class StepOptions:
    """How a case trains under JAX: what :func:`setup` takes from the run's configuration."""

    precision: str
    strategy: str
    accum: int  # micro-batches per step
    seed: int
    clip: float | None  # global gradient-norm clip, None: none
    attention: str | None  # "cudnn" or "xla"
    vocab_multiple: int  # the embedding's rows padded to a multiple of this


def setup(model: JaxModel, opts: StepOptions, devices: list | None = None) -> Setup:
    """Mesh, shardings, initial state (identical on every process: same seed) and the jitted step."""
    precision, strategy, accum, seed = opts.precision, opts.strategy, opts.accum, opts.seed
    clip, attention, vocab_multiple = opts.clip, opts.attention, opts.vocab_multiple
    mesh = make_mesh(devices)
    n = mesh.devices.size
    dp = 1 if strategy == "single" else n
    if strategy == "single" and n != 1:
        raise ValueError(f"strategy single needs one device, the mesh has {n}")
    ctx = Ctx(dtype=DTYPES[precision], train=True, attention=attention, vocab_multiple=vocab_multiple,
              bn_groups=dp)
    fp16 = precision == "amp-fp16"
    tx = make_optimizer(model, clip)

    params, stats = model.init(HostInit(seed))  # numpy, identical on every process
    shapes = state_shapes(model, tx, fp16)
    if strategy == "fsdp":
        state_sharding = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, fsdp_spec(tuple(s.shape), n)), shapes)
    else:
        state_sharding = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, P()), shapes)
    # every optax state of these optimizers starts at zero (step counts, momenta, moments)
    opt = jax.tree_util.tree_map(lambda s: np.zeros(s.shape, s.dtype), shapes.opt)
    host = TrainState(params, stats, opt, np.zeros((), np.int32),
                      np.asarray(SCALE_INIT if fp16 else 1.0, np.float32), np.zeros((), np.int32))
    state = place(host, state_sharding)
    batch_sharding = NamedSharding(mesh, P(None, "data"))
    replicated = NamedSharding(mesh, P())
    step = jax.jit(build_step(model, ctx, tx, accum, fp16, seed), donate_argnums=(0,),
                   out_shardings=(state_sharding, replicated))
    eval_ctx = Ctx(dtype=ctx.dtype, train=False, attention=attention, vocab_multiple=vocab_multiple, bn_groups=dp)
    eval_loss = jax.jit(lambda params, stats, mb: model.loss(params, stats, mb, eval_ctx)[0].astype(jnp.float32),
                        out_shardings=replicated)
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    dp_rank = int(list(mesh.devices.flat).index(local[0])) if dp > 1 else 0
    return Setup(mesh, ctx, state, state_sharding, batch_sharding, step, eval_loss, dp, dp_rank)


def state_shapes(model: JaxModel, tx, fp16: bool) -> TrainState:
    """The TrainState as ShapeDtypeStructs: nothing allocated, nothing compiled."""
    params, stats = model.init(ShapeInit())
    return TrainState(params, stats, jax.eval_shape(tx.init, params), jax.ShapeDtypeStruct((), jnp.int32),
                      jax.ShapeDtypeStruct((), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))


def place(host_tree, shardings):
    """Host (numpy) arrays -> global arrays laid out as ``shardings``; each process builds only the
    shards of its own devices (the same host values everywhere make them one array)."""
    def one(x, sharding):
        x = np.asarray(x)
        return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])

    return jax.tree_util.tree_map(one, host_tree, shardings)


def global_batches(setup_: Setup, local: list[tuple[np.ndarray, ...]]) -> tuple:
    """This process's micro-batches (a list of grad_accum tuples of numpy arrays, its slice of the
    global batch) -> a tuple of global arrays (micro-batch axis first) sharded over ``data``."""
    out = []
    for parts in zip(*local):
        stacked = np.stack(parts)
        global_shape = (stacked.shape[0], stacked.shape[1] * setup_.dp_size) + stacked.shape[2:]
        out.append(jax.make_array_from_process_local_data(setup_.batch_sharding, stacked, global_shape))
    return tuple(out)


def state_bytes_per_device(state: TrainState) -> int:
    """Bytes of parameters, optimizer state and statistics held on this process's first device."""
    dev = jax.local_devices()[0]
    total = 0
    for x in jax.tree_util.tree_leaves(state):
        for s in x.addressable_shards:
            if s.device == dev:
                total += s.data.nbytes
    return total
