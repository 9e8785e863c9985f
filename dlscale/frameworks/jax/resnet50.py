"""ResNet-50 v1.5 in JAX, NHWC: the layout of ``dlscale.models.resnet50``.

Stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), bottleneck stages ``layer1..layer4`` (stride on the
3x3 conv, downsample = 1x1 conv + BN as ``downsample.0`` / ``downsample.1``), global average
pool, ``fc``; torchvision's init. Activations are NHWC throughout (JAX's natural convolution
layout, what torch's channels_last gives on GPUs); BatchNorm statistics are per data-parallel
device in training (``Ctx.bn_groups``), as under torch DDP. Running statistics live in ``stats``.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dlscale.frameworks.jax import layers as L
from dlscale.frameworks.jax.models import JaxModel
from dlscale.models import ModelSpec

EXPANSION = 4


def _conv_params(ini, k: int, cin: int, cout: int) -> dict:
    # kaiming_normal_(mode="fan_out", nonlinearity="relu"): std = sqrt(2 / (cout * k * k))
    return {"kernel": ini.normal((k, k, cin, cout), math.sqrt(2.0 / (cout * k * k)))}


def _bn_stats(ini, c: int) -> dict:
    return {"mean": ini.zeros((c,)), "var": ini.ones((c,))}


def _plan(layers, width):
    """(in_ch, width, stride, has_downsample) of every bottleneck, stage by stage."""
    plan, in_ch = [], width
    for i, n in enumerate(layers):
        w = width * 2 ** i
        stage = []
        for j in range(n):
            stride = 2 if (i > 0 and j == 0) else 1
            stage.append((in_ch, w, stride, stride != 1 or in_ch != w * EXPANSION))
            in_ch = w * EXPANSION
        plan.append(stage)
    return plan, in_ch


def make(spec: ModelSpec) -> JaxModel:
    a = spec.arch
    layers, width, classes = tuple(a.stages), a.base_width, a.classes
    plan, feat = _plan(layers, width)

    def init(ini):
        params = {"conv1": _conv_params(ini, 7, 3, width), "bn1": L.norm_params(ini, width)}
        stats = {"bn1": _bn_stats(ini, width)}
        for i, stage in enumerate(plan):
            ps, ss = [], []
            for in_ch, w, stride, down in stage:
                out = w * EXPANSION
                p = {"conv1": _conv_params(ini, 1, in_ch, w), "bn1": L.norm_params(ini, w),
                     "conv2": _conv_params(ini, 3, w, w), "bn2": L.norm_params(ini, w),
                     "conv3": _conv_params(ini, 1, w, out), "bn3": L.norm_params(ini, out)}
                s = {"bn1": _bn_stats(ini, w), "bn2": _bn_stats(ini, w), "bn3": _bn_stats(ini, out)}
                if down:
                    p["downsample"] = {"0": _conv_params(ini, 1, in_ch, out), "1": L.norm_params(ini, out)}
                    s["downsample"] = {"1": _bn_stats(ini, out)}
                ps.append(p)
                ss.append(s)
            params[f"layer{i + 1}"], stats[f"layer{i + 1}"] = ps, ss
        params["fc"] = L.dense_params(ini, feat, classes)  # nn.Linear's default init
        return params, stats

    def bottleneck(p, s, h, stride, ctx):
        new = {}
        if "downsample" in p:
            identity, ns = L.batch_norm(p["downsample"]["1"], s["downsample"]["1"],
                                        L.conv(p["downsample"]["0"], h, ctx, stride), ctx)
            new["downsample"] = {"1": ns}
        else:
            identity = h
        out, new["bn1"] = L.batch_norm(p["bn1"], s["bn1"], L.conv(p["conv1"], h, ctx), ctx)
        out = jax.nn.relu(out)
        out, new["bn2"] = L.batch_norm(p["bn2"], s["bn2"], L.conv(p["conv2"], out, ctx, stride, 1), ctx)
        out = jax.nn.relu(out)
        out, new["bn3"] = L.batch_norm(p["bn3"], s["bn3"], L.conv(p["conv3"], out, ctx), ctx)
        return jax.nn.relu(out + identity.astype(out.dtype)), new

    def loss(params, stats, batch, ctx: L.Ctx, key=None):
        images, labels = batch
        new = {}
        h, new["bn1"] = L.batch_norm(params["bn1"], stats["bn1"], L.conv(params["conv1"], images, ctx, 2, 3), ctx)
        h = L.max_pool(jax.nn.relu(h), 3, 2, 1)
        for i, stage in enumerate(plan):
            name = f"layer{i + 1}"
            new[name] = []
            for (_, _, stride, _), p, s in zip(stage, params[name], stats[name]):
                h, ns = bottleneck(p, s, h, stride, ctx)
                new[name].append(ns)
        pooled = jnp.mean(h.astype(jnp.float32), axis=(1, 2))
        logits = L.dense(params["fc"], pooled, ctx)
        return L.cross_entropy(logits, labels), new

    def to_numpy(batch: tuple) -> tuple[np.ndarray, ...]:
        images, labels = batch
        return np.ascontiguousarray(images.detach().cpu().permute(0, 2, 3, 1).numpy()), labels.detach().cpu().numpy()

    return JaxModel(spec.name, spec.flavor, spec, init, loss, to_numpy)
