"""The model zoo's record type and registry (third parties add entries via the `modelopt.models` entry-point group)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

from torch import nn

from modelopt._registry import Registry

if TYPE_CHECKING:
    if sys.version_info >= (3, 11):
        from importlib.resources.abc import Traversable
    else:
        from importlib.abc import Traversable

# The akamaster checkpoints were trained with ImageNet statistics, not CIFAR-10's own.
CIFAR10_MEAN = (0.485, 0.456, 0.406)
CIFAR10_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class ZooEntry:
    """A built-in model: how to build it, how to feed it, and its bundled weights.

    Attributes:
        name: Registry name, e.g. ``"cifar10_resnet20"``.
        factory: Builds the architecture with fresh weights.
        mean: Per-channel mean subtracted from [0, 1] RGB inputs.
        std: Per-channel std the centred inputs are divided by.
        input_size: (height, width) the model was trained on.
        num_classes: Number of outputs.
        weights: File name of a checkpoint in ``modelopt/zoo/assets/``, or None.
        description: One line for listings and error messages.
    """

    name: str
    factory: Callable[[], nn.Module]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    input_size: tuple[int, int]
    num_classes: int
    weights: str | None
    description: str


MODELS: Registry[ZooEntry] = Registry("model", "modelopt.models")


def asset(filename: str) -> Traversable:
    """Returns a bundled file in ``modelopt/zoo/assets/`` (use `importlib.resources.as_file` for a path)."""
    return resources.files("modelopt.zoo") / "assets" / filename
