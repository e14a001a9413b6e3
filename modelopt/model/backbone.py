"""A network cut into a stem, a chain of blocks (the candidate exit points) and a tail.

CIFAR-style ResNets (`conv1`, `bn1`, `layer1..N`, `linear`) are cut by their attributes; any other network by
tracing it for a chain of blocks (`chain.py`: torchvision's `features` and the like).

An exit can sit after any block: its head reads that block's output. The cut is exact: running
stem, every block and tail in order gives the model's own logits, so a deployable module built on
it computes the same function as the model for samples that do not exit.

MACs are counted as `modelopt.model.layers` counts them (docs/certification.md, Numbers: macs): the
multiply-accumulates of the Conv2d and Linear layers only; batch norms, ReLUs, residual additions and
pooling are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from modelopt.errors import ConfigError
from modelopt.model.chain import Chain, NotAChain, trace_chain
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
        classes: Classes the model scores (its logits' width).
        stem_layers: The compressible layers the stem runs (before the first block).
    """

    stem: nn.Module
    blocks: tuple[tuple[str, nn.Module], ...]
    tail: nn.Module
    points: tuple[ExitPoint, ...]
    total_macs: int
    classes: int
    stem_layers: frozenset[str]

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
    """Cuts a network into stem, blocks and tail: a CIFAR-style ResNet by its layout, any other by tracing.

    Args:
        model: The network: `modelopt.zoo.cifar_resnet.CifarResNet` or any model with the same attribute
            layout and forward (relu(bn1(conv1)), the stages, global average pool, linear); otherwise any
            model with a chain of blocks `chain.trace_chain` finds (torchvision's `features`, ...).
        input_size: (height, width) of one input, for the MACs and output sizes.

    Returns:
        The backbone with one exit point per block.

    Raises:
        ConfigError: No exact cut into blocks with (N, C, H, W) outputs; one line says why.

    Example:
        >>> bb = split_backbone(load_model("cifar10_resnet20").module)
        >>> [p.name for p in bb.points][:2], bb.total_macs
        (['layer1.0', 'layer1.1'], 40551680)
    """
    needed = ("conv1", "bn1", "layer1", "linear")
    if not all(hasattr(model, a) for a in needed):
        return _traced(model, input_size)
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
    device = next(model.parameters()).device
    example = torch.zeros(1, conv1.in_channels, *input_size, device=device)
    chain = Chain(_Stem(conv1, bn1), tuple(blocks), _Tail(linear), frozenset({"conv1"}))
    return _with_points(model, chain, example, linear.out_features)


def _traced(model: nn.Module, input_size: tuple[int, int]) -> Backbone:
    """The cut `chain.trace_chain` finds, checked exact, with its exit points."""
    first_conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    example = torch.randn(2, first_conv.in_channels if first_conv else 3, *input_size, device=device,
                          generator=torch.Generator(device).manual_seed(0))
    was_training = model.training
    want: list[torch.Tensor] = []

    def check(chain: Chain, x: torch.Tensor) -> str | None:
        try:
            with torch.inference_mode():
                if not want:
                    want.append(model(x))
                h, shapes = chain.stem(x), []
                for _, block in chain.blocks:
                    h = block(h)
                    shapes.append(tuple(h.shape))
                got = chain.tail(h)
        except Exception as e:  # noqa: BLE001 - a model that needs another input: one line says so
            return f"it does not run on a {tuple(x.shape)} input ({str(e).splitlines()[0] if str(e) else e!r})"
        flat = [s for s in shapes[:-1] if len(s) != 4]
        if flat:
            return f"its blocks give {flat[0]}-shaped outputs, and exit heads pool (N, C, H, W) feature maps"
        if not isinstance(got, torch.Tensor) or got.shape != want[0].shape or not torch.allclose(
                got, want[0], 1e-4, 1e-5):
            return "stem, blocks and tail in order do not give the model's logits"
        return None

    model.eval()
    try:
        chain = trace_chain(model, example, check)
        return _with_points(model, chain, example[:1], int(want[0].shape[1]))
    except NotAChain as e:
        raise ConfigError(f"early exit needs a chain of blocks with (N, C, H, W) outputs (a CIFAR ResNet's "
                          f"layer1..N, an nn.Sequential like torchvision's features); {type(model).__name__}: {e}"
                          ) from None
    finally:
        model.train(was_training)


def _with_points(model: nn.Module, chain: Chain, example: torch.Tensor, classes: int) -> Backbone:
    """The backbone of a traced chain, with an exit point (MACs up to it, output shape) per block."""
    layer_macs = {layer.name: layer.macs for layer in discover_layers(model, example)}
    stem_layers = frozenset(n for n in layer_macs if any(n == m or n.startswith(m + ".") for m in chain.stem_modules))
    macs = sum(layer_macs[n] for n in stem_layers)
    points = []
    with torch.inference_mode():
        h = chain.stem(example)
        for i, (name, block) in enumerate(chain.blocks):
            h = block(h)
            macs += sum(m for n, m in layer_macs.items() if n.startswith(name + "."))
            size = (int(h.shape[2]), int(h.shape[3])) if h.dim() == 4 else (1, 1)
            points.append(ExitPoint(name, i, int(h.shape[1]), size, macs))
    return Backbone(chain.stem, chain.blocks, chain.tail, tuple(points), sum(layer_macs.values()), classes,
                    stem_layers)


def exit_layers(backbone: Backbone) -> dict[str, str]:
    """{last conv (or Linear) layer of each block: exit point name}: the layers `EarlyExit(exits=...)` decides on.

    Example:
        >>> exit_layers(split_backbone(load_model("cifar10_resnet20").module))["layer2.0.conv2"]
        'layer2.0'
    """
    out = {}
    for name, block in backbone.blocks:
        convs = [n for n, m in block.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
        if convs:
            out[f"{name}.{convs[-1]}" if convs[-1] else name] = name
    return out
