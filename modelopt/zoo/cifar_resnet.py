"""CIFAR ResNets of He et al. (2016), laid out as akamaster/pytorch_resnet_cifar10.

Module names match that repository's checkpoints once their `module.` prefix is
stripped, so its `resnet{20,32,44,56,110}-*.th` files load with `strict=True`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from modelopt.zoo._registry import CIFAR10_MEAN, CIFAR10_STD, MODELS, ZooEntry

__all__ = ["BasicBlock", "CifarResNet", "ShortcutA", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110"]

# Upstream checkpoint file of each depth (akamaster/pytorch_resnet_cifar10 releases).
UPSTREAM_CHECKPOINTS = {
    20: "resnet20-12fca82f.th",
    32: "resnet32-d509ac18.th",
    44: "resnet44-014dd654.th",
    56: "resnet56-4bfd9763.th",
    110: "resnet110-1d1ed7c2.th",
}


class ShortcutA(nn.Module):
    """Option-A shortcut: subsample by 2 and zero-pad the new channels; no parameters.

    A module rather than upstream's lambda so the model deep-copies, traces and exports.
    """

    def __init__(self, planes: int) -> None:
        super().__init__()
        self.pad = planes // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, self.pad, self.pad))

    def extra_repr(self) -> str:
        return f"pad={self.pad}"


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN pairs with an identity (or option-A) shortcut."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = (
            ShortcutA(planes) if stride != 1 or in_planes != planes else nn.Sequential()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs: 16/32/64 channels, n blocks per stage."""

    def __init__(self, num_blocks: tuple[int, int, int], num_classes: int = 10) -> None:
        super().__init__()
        self.in_planes = 16
        self.conv1 = nn.Conv2d(3, 16, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = self._make_layer(16, num_blocks[0], stride=1)
        self.layer2 = self._make_layer(32, num_blocks[1], stride=2)
        self.layer3 = self._make_layer(64, num_blocks[2], stride=2)
        self.linear = nn.Linear(64, num_classes)
        for m in self.modules():  # upstream's init, so fresh models look like trained ones in scale
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(BasicBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = torch.flatten(F.adaptive_avg_pool2d(out, 1), 1)
        return self.linear(out)


def _depth(depth: int, num_classes: int) -> CifarResNet:
    if (depth - 2) % 6:
        raise ValueError(f"CIFAR ResNet depth must be 6n+2, got {depth}")
    n = (depth - 2) // 6
    return CifarResNet((n, n, n), num_classes)


def resnet20(num_classes: int = 10) -> CifarResNet:
    """ResNet-20 (0.27 M parameters)."""
    return _depth(20, num_classes)


def resnet32(num_classes: int = 10) -> CifarResNet:
    """ResNet-32 (0.46 M parameters)."""
    return _depth(32, num_classes)


def resnet44(num_classes: int = 10) -> CifarResNet:
    """ResNet-44 (0.66 M parameters)."""
    return _depth(44, num_classes)


def resnet56(num_classes: int = 10) -> CifarResNet:
    """ResNet-56 (0.85 M parameters)."""
    return _depth(56, num_classes)


def resnet110(num_classes: int = 10) -> CifarResNet:
    """ResNet-110 (1.7 M parameters)."""
    return _depth(110, num_classes)


for _depth_n, _factory in [(20, resnet20), (32, resnet32), (44, resnet44), (56, resnet56), (110, resnet110)]:
    _name = f"cifar10_resnet{_depth_n}"
    MODELS.register(_name)(
        ZooEntry(
            name=_name,
            factory=_factory,
            mean=CIFAR10_MEAN,
            std=CIFAR10_STD,
            input_size=(32, 32),
            num_classes=10,
            weights=f"{_name}.th" if _depth_n == 20 else None,
            description=(
                f"ResNet-{_depth_n} for CIFAR-10 (He et al. 2016); checkpoint: "
                f"akamaster/pytorch_resnet_cifar10 {UPSTREAM_CHECKPOINTS[_depth_n]}"
            ),
        )
    )
del _depth_n, _factory, _name
