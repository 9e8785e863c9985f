"""dlscale's JAX backend (``--framework jax``): the same models, data, optimizers and records.

Plain JAX with optax, no neural-network library. Why: the three models are a few hundred lines of
pure functions over parameter dicts whose names and shapes are the torch modules' (so counts,
structure and even weights map one to one: ``convert.py``), the sharding rules of ``ddp``/``fsdp``
are one PartitionSpec per leaf of that dict, and nothing sits between the step and XLA. Flax
would add a second API (linen or nnx, which changed across the 0.10-0.12 releases this must run
on), orbax and tensorstore to the install, and nothing the benchmark needs.

Modules: ``layers`` (dense, conv, norms, attention, losses; torch autocast's precision rules),
``gpt2``/``bert``/``resnet50`` (the models), ``models`` (registry), ``train`` (state, optimizer,
shardings, the jitted step), ``strategies`` (names, checks, FSDP layout; imports no JAX),
``worker`` (what torchrun starts), ``profile`` (profiler trace, top ops), ``convert`` (torch
weights -> JAX). Only ``strategies`` may be imported without JAX installed.
"""
