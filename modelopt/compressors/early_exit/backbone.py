"""A network cut into a stem, a chain of blocks (the candidate exit points) and a tail.

An exit can sit after any block: its head reads that block's output. The cut is exact: running
stem, every block and tail in order gives the model's own logits, so a deployable module built on
it computes the same function as the model for samples that do not exit.

MACs are counted as `modelopt.model.layers` counts them (DESIGN.md, macs): the multiply-accumulates
of the Conv2d and Linear layers only; batch norms, ReLUs, residual additions and pooling are
not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modelopt.errors import ConfigError
from modelopt.model.layers import discover_layers

__all__ = ["Backbone", "ExitPoint", "exit_layers", "split_backbone"]


@dataclass(frozen=True)
class ExitPoint:
    """Where an exit may be placed: after block `name`.

    Attributes:
        name: The block's qualified module name, e.g. ``"layer2.4"``.
        index: Position of the block in the chain (0 = first block after the stem).
        channels: Channels of the block's output.
        size: (height, width) of the block's output at the model's input size.
        macs: Backbone MACs per sample from the input up to and including this block.
    """

    name: str
    index: int
    channels: int
    size: tuple[int, int]
    macs: int


class _Stem(nn.Module):
    def __init__(self, conv: nn.Conv2d, bn: nn.Module) -> None:
        super().__init__()
        self.conv, self.bn = conv, bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)))


class _Tail(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


@dataclass(frozen=True, eq=False)
class Backbone:
    """A model as stem -> blocks -> tail, sharing the model's modules (no copies).

    Attributes:
        stem: Input to the first block's input.
        blocks: (qualified name, module) of each block, in order.
        tail: Last block's output to logits.
        points: One `ExitPoint` per block.
        total_macs: MACs of the whole model per sample.
    """

    stem: nn.Module
    blocks: tuple[tuple[str, nn.Module], ...]
    tail: _Tail
    points: tuple[ExitPoint, ...]
    total_macs: int

    @property
    def classes(self) -> int:
        """Classes the model scores: its final linear layer's outputs."""
        return self.tail.linear.out_features

    def point(self, name: str) -> ExitPoint:
        """The exit point after block `name`; ConfigError naming the valid ones otherwise."""
        for p in self.points:
            if p.name == name:
                return p
        raise ConfigError(f"no exit point {name!r}; valid: {', '.join(p.name for p in self.points)}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits, through the cut (equals the model's own forward)."""
        h = self.stem(x)
        for _, block in self.blocks:
            h = block(h)
        return self.tail(h)


def split_backbone(model: nn.Module, input_size: tuple[int, int] = (32, 32)) -> Backbone:
    """Cuts a CIFAR-style ResNet (`conv1`, `bn1`, `layer1..N` of blocks, `linear`) into blocks.

    Args:
        model: The network; `modelopt.zoo.cifar_resnet.CifarResNet` and any model with the same
            attribute layout and forward (relu(bn1(conv1)), the stages, global average pool, linear).
        input_size: (height, width) of one input, for the MACs and output sizes.

    Returns:
        The backbone with one exit point per residual block.

    Raises:
        ConfigError: The model does not have that layout.

    Example:
        >>> bb = split_backbone(load_model("cifar10_resnet20").module)
        >>> [p.name for p in bb.points][:2], bb.total_macs
        (['layer1.0', 'layer1.1'], 40551680)
    """
    needed = ("conv1", "bn1", "layer1", "linear")
    if not all(hasattr(model, a) for a in needed):
        raise ConfigError(
            f"early exit needs a CIFAR-style ResNet with attributes {', '.join(needed)} (stages layer1..N "
            f"of blocks); {type(model).__name__} lacks {[a for a in needed if not hasattr(model, a)]}"
        )
    blocks: list[tuple[str, nn.Module]] = []
    stage = 1
    while hasattr(model, f"layer{stage}"):
        for i, block in enumerate(getattr(model, f"layer{stage}")):
            blocks.append((f"layer{stage}.{i}", block))
        stage += 1
    conv1, bn1, linear = (model.get_submodule(a) for a in ("conv1", "bn1", "linear"))
    if not isinstance(conv1, nn.Conv2d) or not isinstance(linear, nn.Linear):
        raise ConfigError(
            f"early exit needs a CIFAR-style ResNet whose conv1 is a Conv2d and linear a Linear; "
            f"{type(model).__name__} has {type(conv1).__name__} and {type(linear).__name__}"
        )
    stem, tail = _Stem(conv1, bn1), _Tail(linear)
    device = next(model.parameters()).device
    example = torch.zeros(1, conv1.in_channels, *input_size, device=device)
    layer_macs = {layer.name: layer.macs for layer in discover_layers(model, example)}
    points = []
    macs = layer_macs.get("conv1", 0)
    with torch.inference_mode():
        h = stem(example)
        for i, (name, block) in enumerate(blocks):
            h = block(h)
            macs += sum(m for n, m in layer_macs.items() if n.startswith(name + "."))
            points.append(ExitPoint(name, i, int(h.shape[1]), (int(h.shape[2]), int(h.shape[3])), macs))
    return Backbone(stem, tuple(blocks), tail, tuple(points), sum(layer_macs.values()))


def exit_layers(backbone: Backbone) -> dict[str, str]:
    """{last conv layer of each block: exit point name}: the layers `EarlyExit(exits=...)` decides on.

    Example:
        >>> exit_layers(split_backbone(load_model("cifar10_resnet20").module))["layer2.0.conv2"]
        'layer2.0'
    """
    out = {}
    for name, block in backbone.blocks:
        convs = [n for n, m in block.named_modules() if isinstance(m, torch.nn.Conv2d)]
        if convs:
            out[f"{name}.{convs[-1]}"] = name
    return out
