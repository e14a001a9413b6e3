"""Built-in models: the CIFAR-10 ResNets, registered by name in `MODELS`."""

from __future__ import annotations

from modelopt.zoo import cifar_resnet
from modelopt.zoo._registry import MODELS, ZooEntry, asset

__all__ = ["MODELS", "ZooEntry", "asset", "cifar_resnet"]
