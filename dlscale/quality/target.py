"""``--until``: the quality target, its checks, the learning-rate rule and the summary over repeats.

A target is ``val_loss<=X`` (the mean loss over the validation split's first ``--eval-batches``
global batches) or ``val_acc>=Y`` (for models that report an accuracy; none of the registered
ones does yet, so such a target is refused naming what the model produces). Everything here is
pure (no torch): ``RunConfig`` calls ``check_fields``, ``validate_case`` calls ``check_case``, the
launcher ``repeat_config`` and ``summarize``, the worker ``peak_lr`` and ``lr_at``.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Any

from dlscale import MAX_SEED, ConfigError
from dlscale.inputs import _pending
from dlscale.inputs.spec import parse_data
from dlscale.results import metrics

METRICS = {"val_loss": "<=", "val_acc": ">="}  # metric -> the comparison that means "good enough"
LR_SCHEDULES = ("constant", "cosine", "linear")
LR_SCALES = ("none", "linear", "sqrt")
MIN_LR_SHARE = 0.1  # cosine and linear decay end at this share of the peak rate (nanoGPT's rule)
# the defaults of the fields that only --until uses; RunConfig declares them with these (late) values
DEFAULTS: dict[str, Any] = {"eval_every": 20, "eval_batches": 4, "max_steps": None, "eval_data": None,
                            "lr": None, "lr_schedule": "constant", "lr_warmup": 0, "lr_scale": "none",
                            "lr_ref_batch": None}
VAL_FILE = "val.bin"
_TARGET = re.compile(r"^\s*([a-z_]+)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")


@dataclass(frozen=True)
class Target:
    metric: str
    op: str
    value: float

    def reached(self, v: float | None) -> bool:
        if v is None or not math.isfinite(v):
            return False
        return v <= self.value if self.op == "<=" else v >= self.value

    @property
    def text(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


def parse_target(text: str) -> Target:
    """``val_loss<=3.5`` / ``val_acc>=0.9`` -> Target; ConfigError (one line) for anything else."""
    m = _TARGET.match(str(text))
    if not m:
        raise ConfigError(f"until must look like val_loss<=X or val_acc>=Y, got {text!r}")
    metric, op, raw = m.groups()
    if metric not in METRICS:
        raise ConfigError(f"until: unknown metric {metric!r}; choose one of: {', '.join(METRICS)}")
    if op != METRICS[metric]:
        raise ConfigError(f"until: {metric} is a target to reach with {METRICS[metric]}, got {text!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"until: {raw!r} is not a number in {text!r}") from None
    if not math.isfinite(value) or (metric == "val_acc" and not 0 < value <= 1) or (metric == "val_loss"
                                                                                    and value <= 0):
        raise ConfigError(f"until: {metric} target must be {'in (0, 1]' if metric == 'val_acc' else '> 0'}, "
                          f"got {text!r}")
    return Target(metric, op, value)


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_fields(cfg) -> None:
    """RunConfig's cross-field checks: the quality fields need --until, --until needs real data."""
    if cfg.until is None:
        given = [_option(n) for n, d in DEFAULTS.items() if getattr(cfg, n) != d]
        if given:
            raise ConfigError(f"{', '.join(given)} needs --until (train to a quality target; docs/quality.md)")
        return
    if cfg.data == "synthetic":
        raise ConfigError("--until needs a real data source with a validation split: --data tokens:PATH "
                          "(dlscale data make text-corpus makes one); synthetic batches have no validation split")
    if cfg.framework != "torch":
        raise ConfigError(f"--until trains with the torch framework; --framework {cfg.framework} has no "
                          f"evaluation loop")
    if cfg.batch_size == "max":
        raise ConfigError("--until needs a batch size: find the largest with --batch-size max first, then give it")
    if cfg.eval_data is not None and not str(cfg.eval_data).startswith("tokens:"):
        raise ConfigError(f"eval-data must be tokens:PATH[:uint16|uint32], got {cfg.eval_data!r}")
    if cfg.lr_ref_batch is not None and cfg.lr_scale == "none":
        raise ConfigError("--lr-ref-batch is the global batch --lr-scale scales from: it needs --lr-scale "
                          "linear or sqrt")
    if cfg.max_steps is not None and cfg.lr_warmup > cfg.warmup + cfg.max_steps:
        raise ConfigError(f"--lr-warmup {cfg.lr_warmup} is longer than the run (warm-up {cfg.warmup} + max-steps "
                          f"{cfg.max_steps} steps)")


def eval_data_text(cfg) -> str:
    """The validation split's --data text: --eval-data, else val.bin beside the training file."""
    if cfg.eval_data is not None:
        return cfg.eval_data

    train = parse_data(cfg.data)
    return f"tokens:{os.path.join(os.path.dirname(train.path), VAL_FILE)}:{train.dtype}"


def produced_metrics(model) -> tuple[str, ...]:
    """What a model (a ModelSpec) reports on a validation split."""
    if model.data_kind is None:
        return ()
    return ("val_loss", "val_acc") if model.extra.get("accuracy") else ("val_loss",)


def check_case(cfg) -> None:
    """The target against the model, and the validation split against the evaluation (exit 2)."""
    if cfg.until is None:
        return
    from dlscale.inputs import dataset_info  # ctypes: keeps the CLI start-up light
    from dlscale.models import get_model  # torch: keeps start-up light

    if cfg.optimizer_graph:
        raise ConfigError("--until sets the learning rate every step; --optimizer-graph replays a captured update "
                          "(use one or the other)")
    target = parse_target(cfg.until)
    model = get_model(cfg.model, cfg.flavor)
    have = produced_metrics(model)
    if target.metric not in have:
        raise ConfigError(f"until {target.text}: model {cfg.model} does not report {target.metric}; it reports "
                          f"{', '.join(have) or 'nothing on real data'}")
    if parse_data(cfg.data).kind != "tokens":
        raise ConfigError(f"--until evaluates token files; --data {cfg.data} is not tokens:PATH")
    text = eval_data_text(cfg)
    spec = parse_data(text)

    if _pending(spec.path) or _pending(parse_data(cfg.data).path):  # a suite's before command makes both
        return
    if not os.path.isfile(spec.path):
        raise ConfigError(f"no validation split at {spec.path}: give --eval-data tokens:PATH (dlscale data make "
                          f"text-corpus writes val.bin beside train.bin)")
    seq = int(model.seq_len)
    windows = (dataset_info.token_count(spec) - 1) // seq
    need = cfg.eval_batches * cfg.batch_size * cfg.world_size
    if windows < need:
        raise ConfigError(f"validation split {spec.path}: {windows} sequences of {seq} tokens, fewer than "
                          f"--eval-batches {cfg.eval_batches} x one global batch of {cfg.batch_size * cfg.world_size}"
                          f" ({need}); lower --eval-batches or make a larger split")
    dataset_info.check_tokens(spec, int(model.arch.vocab), seq + 1)  # the vocabulary, as the training file's


def horizon(cfg) -> int:
    """Optimizer steps a --until run may take: warm-up + --max-steps (default --steps)."""
    return cfg.warmup + (cfg.max_steps if cfg.max_steps is not None else cfg.steps)


def peak_lr(cfg, model_lr: float, global_batch: int) -> float:
    """The rate after warm-up: --lr (default the model's), scaled by --lr-scale from --lr-ref-batch
    (default one device's batch: per-device batch x grad-accum) to the case's global batch."""
    base = cfg.lr if cfg.lr is not None else model_lr
    ref = cfg.lr_ref_batch or cfg.batch_size * cfg.grad_accum
    ratio = global_batch / ref
    if cfg.lr_scale == "linear":
        return base * ratio
    if cfg.lr_scale == "sqrt":
        return base * math.sqrt(ratio)
    return base


def lr_at(step: int, peak: float, schedule: str, warmup: int, total: int) -> float:
    """Rate of optimizer step ``step`` (0-based): linear warm-up over ``warmup`` steps, then
    constant, or cosine/linear decay to MIN_LR_SHARE of the peak at step ``total``."""
    if warmup and step < warmup:
        return peak * (step + 1) / warmup
    if schedule == "constant" or total <= warmup:
        return peak
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = MIN_LR_SHARE * peak
    if schedule == "cosine":
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return peak - (peak - floor) * p


def repeat_config(cfg, i: int):
    """The config repeat ``i`` runs: with --until, seed + i (weights and data order), so the repeats
    of a time-to-quality case are repeats over seeds; otherwise the case as given."""
    if cfg.until is None or i == 0:
        return cfg
    return dataclasses.replace(cfg, seed=(cfg.seed + i) % (MAX_SEED + 1))


def summarize(repeats: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The case's time to quality over its ok repeats: median and spread of samples, steps and
    seconds to the target over the repeats that reached it, and how many did."""
    qs = [r["quality"] for r in repeats if r.get("status") == "ok" and isinstance(r.get("quality"), dict)]
    if not qs:
        return None
    hit = [q for q in qs if q.get("reached")]
    out = {"target": qs[0].get("target"), "repeats": len(qs), "reached": len(hit),
           "all_reached": len(hit) == len(qs), "seeds": [q.get("seed") for q in qs],
           "reached_seeds": [q.get("seed") for q in hit]}
    for key in ("samples_to_target", "steps_to_target", "time_to_target_s", "wall_to_target_s"):
        out[key] = metrics.summarize([q[key] for q in hit if q.get(key) is not None])
    out["final_val"] = metrics.summarize([q["final_val"] for q in qs if q.get("final_val") is not None])
    out["reasons"] = sorted({q["reason"] for q in qs if not q.get("reached") and q.get("reason")})
    if 0 < len(hit) < len(qs):
        out["flag"] = f"reached by {len(hit)} of {len(qs)} repeats"
    elif not hit:
        out["flag"] = f"not reached by any of {len(qs)} repeats"
    return out
