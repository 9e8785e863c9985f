"""Wide & Deep click-through-rate model (Cheng et al. 2016), in the shape of DLPerf's Wide & Deep tests.

Full flavour, as OneFlow's WDL that DLPerf measured (OneFlow-Benchmark
``ClickThroughRate/WideDeepLearning/wdl_train_eval.py``; DLPerf
``reports/dlperf_Wide_and_Deep_test_report_v1.md``) with the per-column Criteo sizes of
OneFlow-Inc/models ``RecommenderSystems/wide_and_deep/train_global_graph.sh``:

* deep part: 26 categorical fields (Criteo C1..C26; 1,737,709 rows in all), each looked up in an
  embedding of width 16, concatenated with 13 dense features (Criteo I1..I13), then 7 hidden
  layers of 1024 (ReLU, dropout 0.5) and a linear layer to one logit;
* wide part: a linear model over 2 crossed features (144,108 and 447,097 ids), one weight per id
  (an embedding of width 1), summed, plus a bias;
* logit = wide + deep; binary cross-entropy with logits, inside ``forward``.

DLPerf ran batch 16384 per device with one shared deep table of 2,322,444 rows; here each field
has its own table (as TorchRec and OneFlow's OneEmbedding runs do), stored fused: one weight per
width with the fields' rows stacked (``FusedTables``), so a lookup is one gather per part.
Training: AdamW lr 1e-3 without weight decay over every row each step (OneFlow used lazy Adam,
which updates only the rows looked up; dense AdamW is what plain PyTorch does).

Synthetic input (``make_batch``): dense features U(0, 1); labels Bernoulli(0.25) (about Criteo's
click rate); ids of each field Zipf-distributed (exponent ``zipf``): rank k in [0, rows) with
probability about proportional to 1 / (k + 1), drawn by inverting the continuous power law, then
scattered over the table by multiplication with a prime modulo the rows (a fixed bijection, as
hashing spreads real ids) so that the hot rows are not all at the start of the table.

Structure a sharding strategy relies on (``dlscale/strategies/embedding_shard.py``):

* ``model.embedding_groups()`` -> ``{"wide": FusedTables, "deep": FusedTables}``: the attribute
  names of the tables' modules, each called as ``module(ids) -> (B, fields, width)``;
* ``model.embed(wide_ids, deep_ids)``: ``forward`` looks every table up through this one call, so
  a strategy that replaces it on the instance exchanges all the tables' ids and vectors at once;
* ``FusedTables.rows`` (rows per field), ``.dim``, ``.fill(field, out, row_start)`` (the
  initial values of rows [row_start, row_start + len(out)) of that field, see ``_rows.py``);
* ``model.init_weights(tables=False)`` re-initialises everything but the tables, from the
  model's own seed, after ``to_empty`` from the meta device.

Size knobs (``spec.resize``): ``fields`` (the first K deep fields; at most the flavour's, since
the sizes of more are unknown), ``vocab_scale`` (every table's rows times K, as DLPerf's
"vocab size x2" tests), ``dim`` (the deep embedding width; DLPerf used 16, and 32 on 32 GPUs).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from dlscale import ConfigError
from dlscale.models import ModelSpec, register_model
from dlscale.models._rows import draw_seed, fill_rows, settle_rng

CRITEO_DEEP_ROWS = (1460, 558, 335378, 211710, 305, 20, 12136, 633, 3, 51298, 5302, 332600, 3179, 27, 12191,
                    301211, 10, 4841, 2086, 4, 324273, 17, 15, 79734, 96, 58622)
CRITEO_WIDE_ROWS = (144108, 447097)
_PRIMES = (1_000_003, 998_244_353)  # multipliers of the id scatter (one not dividing the rows)


@dataclass(frozen=True)
class WideDeepConfig:
    deep_rows: tuple[int, ...] = CRITEO_DEEP_ROWS  # rows of each categorical field's table
    wide_rows: tuple[int, ...] = CRITEO_WIDE_ROWS  # rows of each crossed feature's table (width 1)
    dense: int = 13
    dim: int = 16  # deep embedding width
    hidden: int = 1024
    layers: int = 7
    dropout: float = 0.5
    zipf: float = 1.0  # exponent of the id distribution
    ctr: float = 0.25  # share of positive labels


_CONFIGS = {
    "full": WideDeepConfig(),
    "tiny": WideDeepConfig(deep_rows=(50, 37, 20, 9, 3), wide_rows=(40, 23), dense=4, dim=8, hidden=32, layers=2,
                           dropout=0.0),
}
KNOBS = ("fields", "vocab_scale", "dim")


class FusedTables(nn.Module):
    """The tables of several fields of one width in one weight, the fields' rows stacked.

    ``forward(ids)``: ids (B, fields), each below its field's rows -> (B, fields, dim).
    """

    def __init__(self, rows: tuple[int, ...], dim: int, seed: int, table_base: int):
        super().__init__()
        self.rows, self.dim, self.seed, self.table_base = tuple(rows), dim, seed, table_base
        self.weight = nn.Parameter(torch.empty(sum(rows), dim))
        starts = [0]
        for r in rows[:-1]:
            starts.append(starts[-1] + r)
        self.register_buffer("offsets", torch.tensor(starts, dtype=torch.long), persistent=False)

    def fill(self, field: int, out: torch.Tensor, row_start: int = 0) -> torch.Tensor:
        """Initial values of rows [row_start, row_start + len(out)) of ``field`` (U(-0.05, 0.05), as OneFlow)."""
        return fill_rows(out, row_start, self.rows[field], self.seed, self.table_base + field, "uniform", 0.05)

    def reset_parameters(self) -> None:
        start = 0
        for f, r in enumerate(self.rows):
            self.fill(f, self.weight.data[start:start + r])
            start += r

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids + self.offsets, self.weight)


class OverArch(nn.Module):
    """Everything but the tables: the deep MLP, the wide bias and the loss."""

    def __init__(self, cfg: WideDeepConfig):
        super().__init__()
        width = cfg.dense + cfg.dim * len(cfg.deep_rows)
        layers: list[nn.Module] = []
        for _ in range(cfg.layers):
            layers += [nn.Linear(width, cfg.hidden), nn.ReLU(inplace=True), nn.Dropout(cfg.dropout)]
            width = cfg.hidden
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)
        self.wide_bias = nn.Parameter(torch.zeros(1))

    def forward(self, dense: torch.Tensor, wide: torch.Tensor, deep: torch.Tensor, labels: torch.Tensor):
        x = torch.cat([deep.flatten(1), dense], dim=1)
        logit = self.mlp(x).squeeze(1).float() + wide.sum(dim=(1, 2)).float() + self.wide_bias
        return F.binary_cross_entropy_with_logits(logit, labels.float())


class WideDeep(nn.Module):
    def __init__(self, cfg: WideDeepConfig):
        super().__init__()
        self.seed = draw_seed()
        self.wide = FusedTables(cfg.wide_rows, 1, self.seed, table_base=0)
        self.deep = FusedTables(cfg.deep_rows, cfg.dim, self.seed, table_base=len(cfg.wide_rows))
        self.over = OverArch(cfg)
        self.init_weights()
        settle_rng(self.seed)

    def embedding_groups(self) -> dict[str, FusedTables]:
        return {"wide": self.wide, "deep": self.deep}

    @torch.no_grad()
    def init_weights(self, tables: bool = True) -> None:
        """Xavier-uniform MLP weights and zero biases (OneFlow's WDL), from the model's own seed;
        the tables' rows from their blocks (``tables=False`` leaves them alone)."""
        dev = self.over.wide_bias.device
        if dev.type == "meta":  # built on the meta device: nothing to fill
            return
        gen = torch.Generator(device=dev).manual_seed(self.seed)
        for m in self.over.mlp:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight, generator=gen)
                nn.init.zeros_(m.bias)
        nn.init.zeros_(self.over.wide_bias)
        if tables:
            self.wide.reset_parameters()
            self.deep.reset_parameters()

    def embed(self, wide_ids, deep_ids):
        """Every table's lookup, one ids tensor per module of ``embedding_groups()`` in its order (a
        sharding strategy replaces this on the instance: one exchange for all the tables)."""
        return self.wide(wide_ids), self.deep(deep_ids)

    def forward(self, dense, wide_ids, deep_ids, labels):
        wide, deep = self.embed(wide_ids, deep_ids)
        return self.over(dense, wide, deep, labels)


def zipf_ids(batch: int, rows: tuple[int, ...], exponent: float, generator: torch.Generator) -> torch.Tensor:
    """(batch, fields) int64 ids; field f's below rows[f], Zipf-like over ranks, scattered by a prime."""
    n = torch.tensor(rows, dtype=torch.float64)
    u = torch.rand(batch, len(rows), generator=generator, dtype=torch.float64)
    if abs(exponent - 1.0) < 1e-12:  # density 1/x on [1, n+1): x = (n+1)^u
        x = torch.exp(u * torch.log1p(n))
    else:  # density x^-s on [1, n+1), inverted
        a = 1.0 - exponent
        x = (u * (torch.pow(n + 1.0, a) - 1.0) + 1.0).pow(1.0 / a)
    rank = (x.floor().long() - 1).clamp_(min=0)
    rank = torch.minimum(rank, torch.tensor(rows, dtype=torch.long) - 1)
    mult = torch.tensor([next(p for p in _PRIMES if r % p) for r in rows], dtype=torch.long)
    return (rank * mult) % torch.tensor(rows, dtype=torch.long)


def mlp_forward_flops(cfg: WideDeepConfig) -> int:
    """Forward FLOPs of one sample (2 per multiply-add of the MLP; lookups and the wide sum do none)."""
    width = cfg.dense + cfg.dim * len(cfg.deep_rows)
    flops = 0
    for _ in range(cfg.layers):
        flops += 2 * width * cfg.hidden
        width = cfg.hidden
    return flops + 2 * width


def _resize(flavor: str, cfg: WideDeepConfig, **knobs) -> ModelSpec:
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ConfigError(f"wide-deep has no size knob {', '.join(unknown)}; knobs: {', '.join(KNOBS)}")
    out = cfg
    for key in KNOBS:
        if knobs.get(key) is None:
            continue
        v = knobs[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"wide-deep {key} must be an integer >= 1, got {v!r}")
        if key == "fields":
            if v > len(cfg.deep_rows):
                raise ConfigError(f"wide-deep ({flavor}) fields must be 1..{len(cfg.deep_rows)} (the sparse "
                                  f"fields whose sizes are known), got {v}")
            out = replace(out, deep_rows=out.deep_rows[:v])
        elif key == "vocab_scale":
            out = replace(out, deep_rows=tuple(r * v for r in out.deep_rows),
                          wide_rows=tuple(r * v for r in out.wide_rows))
        else:
            out = replace(out, dim=v)
    return _make_spec(flavor, out)


def _make_spec(flavor: str, cfg: WideDeepConfig) -> ModelSpec:
    def build() -> nn.Module:
        return WideDeep(cfg)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g = generator
        dense = torch.rand(batch_size, cfg.dense, generator=g, device=g.device)
        wide = zipf_ids(batch_size, cfg.wide_rows, cfg.zipf, g)
        deep = zipf_ids(batch_size, cfg.deep_rows, cfg.zipf, g)
        labels = (torch.rand(batch_size, generator=g, device=g.device) < cfg.ctr).float()
        return dense.to(device), wide.to(device), deep.to(device), labels.to(device)

    return ModelSpec(
        name="wide-deep",
        flavor=flavor,
        build=build,
        make_batch=make_batch,
        flops_per_sample=3.0 * mlp_forward_flops(cfg),
        unit="sample",
        optimizer="adamw",
        lr=1e-3,
        weight_decay=0.0,
        resize=lambda **knobs: _resize(flavor, cfg, **knobs),
    )


@register_model("wide-deep")
def make_spec(flavor: str) -> ModelSpec:
    return _make_spec(flavor, _CONFIGS[flavor])
