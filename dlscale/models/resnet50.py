"""ResNet-50 v1.5 (torchvision layout), own compact implementation.

Layout, as ``torchvision.models.resnet50``: stem (7x7/2 conv, BN, ReLU, 3x3/2 max pool), four
stages ``layer1..layer4`` of bottleneck blocks [3, 4, 6, 3] (1x1 -> 3x3 -> 1x1, expansion 4,
the stride on the 3x3 conv = "v1.5", downsample = 1x1 conv + BN), global average pool, ``fc``.
Full flavour: 1000 classes, 224x224 inputs, 25,557,032 parameters.

Structure a pipeline splitter can rely on:

* ``model.embed(x)`` -> the stem (``conv1``, ``bn1``, ReLU, ``maxpool``);
* ``spec.blocks(model)`` -> the 16 ``Bottleneck`` blocks in execution order (running them one
  after the other is exactly ``layer1`` .. ``layer4``);
* ``model.head(h, labels)`` -> average pool, ``fc``, cross-entropy loss;
* ``model(images, labels) == model.head(run_blocks(model.embed(images)), labels)``.

After ``to_empty`` from meta, ``model.init_weights()`` re-initialises parameters and the BN
running statistics.

``make_batch`` returns images already in channels_last memory format (``spec.channels_last``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from dlscale.models import ModelSpec, register_model

_CONFIGS = {
    # flavor: (blocks per stage, base width, classes, image size)
    "full": ((3, 4, 6, 3), 64, 1000, 224),
    "tiny": ((1, 1, 1, 1), 8, 10, 32),
}


@dataclass(frozen=True)
class ResNetArch:
    """Typed shape of a bottleneck ResNet (v1.5)."""

    stages: tuple[int, ...]  # bottleneck blocks per stage
    base_width: int
    classes: int
    image_size: int

    @property
    def n_blocks(self) -> int:
        return sum(self.stages)

    @property
    def features(self) -> int:
        """Channels out of the last stage, into the classifier."""
        return 4 * self.base_width * 2 ** (len(self.stages) - 1)

    def bottlenecks(self):
        """(input channels, width, stride, downsample?) of every bottleneck block in order (v1.5:
        the stride on the 3x3; a 1x1 downsample where the stride or the channel count changes)."""
        cin = self.base_width
        for i, n in enumerate(self.stages):
            width = self.base_width * 2**i
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                yield cin, width, stride, stride != 1 or cin != 4 * width
                cin = 4 * width

    def param_count(self) -> int:
        """Convolutions (no bias), BatchNorm scale and shift, the classifier; tests compare it with
        the module."""
        w = self.base_width
        total = 3 * w * 49 + 2 * w  # stem conv + BN
        for cin, width, _stride, down in self.bottlenecks():
            total += cin * width + 2 * width + width * width * 9 + 2 * width + width * 4 * width + 8 * width
            if down:
                total += cin * 4 * width + 8 * width  # downsample conv + BN
        return total + self.features * self.classes + self.classes

    def forward_flops(self) -> int:
        """Forward FLOPs of one image, 2 per multiply-add of the convolutions and the classifier
        (what ``torch.utils.flop_counter`` counts; tests compare the two). Analytic: counting on
        meta tensors runs Python meta kernels that import torch._dynamo, seconds in every launcher."""

        def out(h: int, k: int, stride: int, pad: int) -> int:
            return (h + 2 * pad - k) // stride + 1

        def conv(cin: int, cout: int, k: int, h_out: int) -> int:
            return 2 * cin * cout * k * k * h_out * h_out

        w = self.base_width
        h = out(self.image_size, 7, 2, 3)
        total = conv(3, w, 7, h)
        h = out(h, 3, 2, 1)  # max pool
        for cin, width, stride, down in self.bottlenecks():
            h_out = out(h, 3, stride, 1)
            total += conv(cin, width, 1, h) + conv(width, width, 3, h_out) + conv(width, 4 * width, 1, h_out)
            if down:
                total += conv(cin, 4 * width, 1, h_out)
            h = h_out
        return total + 2 * self.features * self.classes


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int = 1):
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), base_width: int = 64, num_classes: int = 1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, base_width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(base_width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_ch = base_width
        stages = []
        for i, n in enumerate(layers):
            width = base_width * 2**i
            blocks = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(Bottleneck(in_ch, width, stride))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)
        self.init_weights()

    def init_weights(self) -> None:
        """torchvision's init (Kaiming fan-out convs, BN = identity + fresh stats, default Linear)."""
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                m.reset_running_stats()
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                m.reset_parameters()

    def block_list(self) -> list[nn.Module]:
        return [b for stage in (self.layer1, self.layer2, self.layer3, self.layer4) for b in stage]

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def head(self, h: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.fc(torch.flatten(self.avgpool(h), 1))
        return F.cross_entropy(logits, labels)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.head(h, labels)


@register_model("resnet50")
def make_spec(flavor: str) -> ModelSpec:
    layers, width, classes, size = _CONFIGS[flavor]
    arch = ResNetArch(tuple(layers), width, classes, size)

    def build() -> nn.Module:
        return ResNet(layers, width, classes)

    def make_batch(batch_size: int, device: torch.device, generator: torch.Generator) -> tuple:
        g = generator
        x = torch.randn(batch_size, 3, size, size, generator=g, device=g.device)
        y = torch.randint(0, classes, (batch_size,), generator=g, device=g.device)
        x = x.to(device).contiguous(memory_format=torch.channels_last)
        return x, y.to(device)

    return ModelSpec(
        name="resnet50",
        flavor=flavor,
        build=build,
        make_batch=make_batch,
        flops_per_sample=3.0 * arch.forward_flops(),
        unit="img",
        seq_len=None,
        optimizer="sgd",
        lr=0.1,
        weight_decay=1e-4,
        channels_last=True,
        data_kind="image",
        blocks=lambda m: m.block_list(),
        arch=arch,
    )
