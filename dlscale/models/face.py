"""Face recognition: an IResNet-50 backbone to 512-d features and an ArcFace margin softmax over N identities.

The shape of InsightFace's ``arcface_torch`` (deepinsight/insightface
``recognition/arcface_torch/backbones/iresnet.py``, ``iresnet50``) at 112x112, as DLPerf's
InsightFace report measured (Oneflow-Inc/DLPerf ``reports/insightface``: R100 and MobileFaceNet
backbones, ArcFace loss, SGD momentum 0.9, weight decay 5e-4, batch 64 per device; MS1MV2
"emore" with 85,742 identities, Glint360K with 360,232, and up to 2 million classes on one GPU and
13.5 million on eight with a class-sharded head). Own compact implementation:

* stem: 3x3 conv (stride 1), BN, PReLU; four stages of ``IBasicBlock`` [3, 4, 14, 3] with widths
  64, 128, 256, 512, the first block of each with stride 2 (BN -> 3x3 conv -> BN -> PReLU ->
  3x3 conv (stride) -> BN, plus the identity or a 1x1 conv + BN downsample);
* BN, flatten (512 x 7 x 7), linear to 512 features, BatchNorm1d (weight fixed at 1);
* ``margin``: ArcFace (scale 64, additive angular margin 0.5): logits s * cos(theta) with
  cos(theta + m) for the target class (cos(theta) - m sin(m) past theta + m > pi), over the
  L2-normalised features and class centres (N x 512, initialised N(0, 0.01)); cross-entropy.

Full flavour: 85,742 classes (MS1MV2), 43,590,848 backbone parameters (the fixed BatchNorm1d weight
included) and 6.31 G multiply-adds per image forward (InsightFace lists r50 at 6.3 G), plus 512 x N
in the head. ``spec.resize(classes=N)`` changes N.

Structure strategies rely on:

* pipelines: ``model.embed(x)`` (stem), ``spec.blocks(model)`` (the IBasicBlocks in order),
  ``model.head(h, labels)`` (BN, flatten, linear, BatchNorm1d, ``margin``);
* class sharding (``dlscale/strategies/partial_fc.py``): ``model.margin`` (``ArcFaceHead``:
  ``classes``, ``features``, ``weight``, ``fill(out, row_start)`` for the initial values of class
  rows [row_start, row_start + len(out)), ``scale``, ``margin``), swapped for a sharded module
  with the same call ``margin(features, labels) -> loss``; ``model.init_weights(head=False)``
  re-initialises the backbone after ``to_empty`` from the meta device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from dlscale import ConfigError
from dlscale.models import ModelSpec, register_model
from dlscale.models._rows import draw_seed, fill_rows, settle_rng


@dataclass(frozen=True)
class FaceConfig:
    layers: tuple[int, ...] = (3, 4, 14, 3)  # iresnet50
    widths: tuple[int, ...] = (64, 128, 256, 512)
    image: int = 112
    features: int = 512
    classes: int = 85_742  # MS1MV2 (emore)
    scale: float = 64.0
    margin: float = 0.5


_CONFIGS = {
    "full": FaceConfig(),
    "tiny": FaceConfig(layers=(1, 1, 1, 1), widths=(8, 8, 16, 16), image=32, features=16, classes=50),
}
KNOBS = ("classes",)


class IBasicBlock(nn.Module):
    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_ch, eps=1e-5)
        self.conv1 = nn.Conv2d(in_ch, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width, eps=1e-5)
        self.prelu = nn.PReLU(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width, eps=1e-5)
        self.downsample = None
        if stride != 1 or in_ch != width:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, width, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(width, eps=1e-5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (x if self.downsample is None else self.downsample(x))


def arcface_logits(cos: torch.Tensor, target: torch.Tensor, scale: float, margin: float) -> torch.Tensor:
    """s * cos with the target column of each row (target >= 0) replaced by s * cos(theta + m).

    Rows whose target is -1 (another rank holds that class) are left as they are. No host sync.
    """
    has = target >= 0
    col = target.clamp(min=0).unsqueeze(1)
    t = cos.gather(1, col).squeeze(1)
    sin_t = (1.0 - t * t).clamp(min=1e-12).sqrt()
    phi = t * math.cos(margin) - sin_t * math.sin(margin)
    # past theta + m > pi, cos(theta + m) would grow again: fall back to a linear penalty (InsightFace)
    phi = torch.where(t > math.cos(math.pi - margin), phi, t - math.sin(math.pi - margin) * margin)
    return cos.scatter(1, col, torch.where(has, phi, t).unsqueeze(1)) * scale


def cosine(features: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """cos(theta) between L2-normalised features and class centres, fp32, clamped to [-1, 1]."""
    return F.linear(F.normalize(features), F.normalize(weight)).float().clamp(-1.0, 1.0)


class ArcFaceHead(nn.Module):
    """The classifier over all ``classes`` identities with the ArcFace margin and cross-entropy."""

    def __init__(self, classes: int, features: int, scale: float, margin: float, seed: int):
        super().__init__()
        self.classes, self.features, self.scale, self.margin, self.seed = classes, features, scale, margin, seed
        self.weight = nn.Parameter(torch.empty(classes, features))

    def fill(self, out: torch.Tensor, row_start: int = 0) -> torch.Tensor:
        """Initial values of class rows [row_start, row_start + len(out)): N(0, 0.01), as arcface_torch."""
        return fill_rows(out, row_start, self.classes, self.seed, 0, "normal", 0.01)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = arcface_logits(cosine(features, self.weight), labels, self.scale, self.margin)
        return F.cross_entropy(logits, labels)


class FaceNet(nn.Module):
    def __init__(self, cfg: FaceConfig):
        super().__init__()
        self.seed = draw_seed()
        w0 = cfg.widths[0]
        self.conv1 = nn.Conv2d(3, w0, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(w0, eps=1e-5)
        self.prelu = nn.PReLU(w0)
        in_ch, stages = w0, []
        for n, width in zip(cfg.layers, cfg.widths):
            blocks = []
            for j in range(n):
                blocks.append(IBasicBlock(in_ch, width, 2 if j == 0 else 1))
                in_ch = width
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.bn2 = nn.BatchNorm2d(in_ch, eps=1e-5)
        side = cfg.image // 2 ** len(cfg.layers)
        self.fc = nn.Linear(in_ch * side * side, cfg.features)
        self.bn_features = nn.BatchNorm1d(cfg.features, eps=1e-5)
        self.bn_features.weight.requires_grad = False  # fixed at 1, as arcface_torch
        self.margin = ArcFaceHead(cfg.classes, cfg.features, cfg.scale, cfg.margin, self.seed)
        self.init_weights()
        settle_rng(self.seed)

    def block_list(self) -> list[nn.Module]:
        return [b for stage in (self.layer1, self.layer2, self.layer3, self.layer4) for b in stage]

    @torch.no_grad()
    def init_weights(self, head: bool = True) -> None:
        """arcface_torch's init from the model's own seed: convs N(0, 0.1), BN identity with fresh
        statistics, PReLU 0.25, the linear layer as torch's default; the head's rows from their
        blocks (``head=False`` leaves them alone)."""
        dev = self.fc.weight.device
        if dev.type == "meta":  # built on the meta device: nothing to fill
            return
        gen = torch.Generator(device=dev).manual_seed(self.seed)
        for name, m in self.named_modules():
            if name.startswith("margin"):
                continue
            if isinstance(m, nn.Conv2d):
                m.weight.normal_(0.0, 0.1, generator=gen)
            elif isinstance(m, (nn.BatchNorm2d, nn.BatchNorm1d)):
                m.reset_running_stats()
                m.weight.fill_(1.0)
                m.bias.zero_()
            elif isinstance(m, nn.PReLU):
                m.weight.fill_(0.25)
            elif isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=gen)
                bound = 1.0 / math.sqrt(m.in_features)
                m.bias.uniform_(-bound, bound, generator=gen)
        if head:
            self.margin.fill(self.margin.weight.data)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.prelu(self.bn1(self.conv1(x)))

    def features(self, h: torch.Tensor) -> torch.Tensor:
        return self.bn_features(self.fc(torch.flatten(self.bn2(h), 1)))

    def head(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.margin(self.features(h), labels)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.layer4(self.layer3(self.layer2(self.layer1(self.embed(x)))))
        return self.head(h, labels)


def backbone_forward_flops(cfg: FaceConfig) -> int:
    """Forward FLOPs of one image through the backbone to the features: 2 per multiply-add of the
    convolutions and the linear layer (what torch's FlopCounterMode counts; BN and PReLU are not)."""
    h = cfg.image
    flops = 2 * 3 * cfg.widths[0] * 9 * h * h  # stem, stride 1
    c = cfg.widths[0]
    for n, w in zip(cfg.layers, cfg.widths):
        for j in range(n):
            stride = 2 if j == 0 else 1
            out = h // stride
            flops += 2 * c * w * 9 * h * h + 2 * w * w * 9 * out * out  # conv1 at h, conv2 (stride) to out
            if stride != 1 or c != w:
                flops += 2 * c * w * out * out  # 1x1 downsample
            c, h = w, out
    return flops + 2 * c * h * h * cfg.features


def head_forward_flops(cfg: FaceConfig) -> int:
    """The classifier's matmul (features x classes); normalisation and the loss are not counted."""
    return 2 * cfg.features * cfg.classes


def _resize(flavor: str, cfg: FaceConfig, **knobs) -> ModelSpec:
    unknown = sorted(set(knobs) - set(KNOBS))
    if unknown:
        raise ConfigError(f"face has no size knob {', '.join(unknown)}; knobs: {', '.join(KNOBS)}")
    n = knobs.get("classes")
    if n is None:
        return _make_spec(flavor, cfg)
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"face classes must be an integer >= 2, got {n!r}")
    return _make_spec(flavor, replace(cfg, classes=n))


def _make_spec(flavor: str, cfg: FaceConfig) -> ModelSpec:
    def build() -> nn.Module:
        return FaceNet(cfg)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g = generator
        x = torch.randn(batch_size, 3, cfg.image, cfg.image, generator=g, device=g.device)
        y = torch.randint(0, cfg.classes, (batch_size,), generator=g, device=g.device)
        return x.to(device).contiguous(memory_format=torch.channels_last), y.to(device)

    return ModelSpec(
        name="face",
        flavor=flavor,
        build=build,
        make_batch=make_batch,
        flops_per_sample=3.0 * (backbone_forward_flops(cfg) + head_forward_flops(cfg)),
        unit="img",
        optimizer="sgd",
        lr=0.1,
        weight_decay=5e-4,
        channels_last=True,
        blocks=lambda m: m.block_list(),
        resize=lambda **knobs: _resize(flavor, cfg, **knobs),
    )


@register_model("face")
def make_spec(flavor: str) -> ModelSpec:
    return _make_spec(flavor, _CONFIGS[flavor])
