"""Torch weights -> the JAX parameter tree of the same model (same initial state in both).

The JAX tree uses the torch module names; a JAX ``kernel`` is the torch ``weight`` in JAX's
layout (dense: transposed; convolution: OIHW -> HWIO), everything else is copied as it is.
BatchNorm running statistics go to the ``stats`` tree (``mean``, ``var``). Tied weights
(``lm_head.weight``, ``decoder.weight``) are the embedding, which JAX stores once.
"""
from __future__ import annotations

from typing import Any

import numpy as np

TIED = ("lm_head.weight", "decoder.weight")
_STATS = {"mean": "running_mean", "var": "running_var"}


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple[tuple, Any]]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _paths(v, prefix + (str(k),))]
    if isinstance(tree, (list, tuple)):
        return [p for i, v in enumerate(tree) for p in _paths(v, prefix + (str(i),))]
    return [(prefix, tree)]


def _set(tree: Any, path: tuple, value: Any) -> None:
    node = tree
    for k in path[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[path[-1]] = value


def _copy_structure(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _copy_structure(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_copy_structure(v) for v in tree]
    return None


def _to_jax_layout(name: str, w: np.ndarray, shape: tuple) -> np.ndarray:
    if w.ndim == 2:
        w = w.T
    elif w.ndim == 4:
        w = w.transpose(2, 3, 1, 0)
    if tuple(w.shape) != tuple(shape):
        raise ValueError(f"{name}: torch shape {tuple(w.shape)} does not map onto JAX shape {tuple(shape)}")
    return np.ascontiguousarray(w)


def torch_to_jax(module, params_shape: Any, stats_shape: Any) -> tuple[Any, Any]:
    """(params, stats) as numpy trees shaped like ``params_shape``/``stats_shape`` (e.g. from
    ``jax.eval_shape(model.init, key)``), filled from ``module``'s tensors.

    Raises ValueError when a JAX leaf has no torch tensor of a matching shape or a torch
    parameter is left unused: the two models then differ in structure.
    """
    sd = {k: v.detach().float().cpu().numpy() for k, v in module.state_dict().items()}
    used: set[str] = set()
    out = []
    for tree in (params_shape, stats_shape):
        filled = _copy_structure(tree)
        for path, leaf in _paths(tree):
            if tree is stats_shape:
                name = ".".join(path[:-1] + (_STATS[path[-1]],))
                value = sd.get(name)
            else:
                name = ".".join(path[:-1] + ("weight" if path[-1] == "kernel" else path[-1],))
                value = sd.get(name)
                if value is not None and path[-1] == "kernel":
                    value = _to_jax_layout(name, value, leaf.shape)
            if value is None:
                raise ValueError(f"JAX leaf {'.'.join(path)} has no torch tensor {name}")
            if tuple(value.shape) != tuple(leaf.shape):
                raise ValueError(f"{name}: torch shape {tuple(value.shape)} != JAX shape {tuple(leaf.shape)}")
            used.add(name)
            _set(filled, path, value)
        out.append(filled)
    params_names = {n for n, _ in module.named_parameters()}  # tied parameters are listed once
    left = sorted(params_names - used - set(TIED))
    if left:
        raise ValueError(f"torch parameters without a JAX counterpart: {', '.join(left[:5])}")
    return out[0], out[1]
