"""Built-in models: the CIFAR-10 ResNets, a MobileNetV2 and a small vision transformer, registered by name in
`MODELS`."""

from __future__ import annotations

from modelopt.zoo import cifar_mobile, cifar_resnet
from modelopt.zoo._registry import MODELS, ZooEntry, asset

__all__ = ["MODELS", "ZooEntry", "asset", "cifar_mobile", "cifar_resnet"]
