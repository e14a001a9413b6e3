"""Discovery of a model's compressible layers: name, kind, shape, parameters and MACs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn


class LayerKind(str, Enum):
    CONV = "conv"
    LINEAR = "linear"


@dataclass(frozen=True)
class Layer:
    """One compressible layer (a Conv2d or Linear weight) of a workload's model."""

    name: str
    kind: LayerKind
    weight_shape: tuple[int, ...]
    macs: int  # multiply-accumulates per sample at the model's input size
    has_bias: bool
    # Internal channels (a residual block's conv1 -> norm -> ReLU -> conv2): the norm after this
    # layer and the layer reading its outputs. Set only where removing output channels touches
    # nothing else (never the residual stream), so structured pruning may remove them.
    channel_norm: str | None = None
    channel_consumer: str | None = None

    @property
    def params(self) -> int:
        n = 1
        for d in self.weight_shape:
            n *= d
        return n

    @property
    def out_channels(self) -> int:
        return self.weight_shape[0]

    @property
    def in_channels(self) -> int:
        """Input channels per group (a conv's weight dim 1; a linear layer's in_features)."""
        return self.weight_shape[1]

    @property
    def fan_in(self) -> int:
        """Weights feeding one output channel (in_channels/groups * kh * kw for a conv)."""
        return self.params // self.weight_shape[0]


def feed_inputs(model: nn.Module, modules: Mapping[str, nn.Module], x: torch.Tensor, batch_size: int,
                hook: Callable[[str, nn.Module, torch.Tensor], None]) -> None:
    """Runs `model` on `x` in batches (inference mode), calling `hook(name, module, input)` with each
    of `modules`' inputs before it runs: one pass that reads what every layer sees."""
    handles = [m.register_forward_pre_hook(lambda m, i, name=name: hook(name, m, i[0])) for name, m in modules.items()]
    try:
        with torch.inference_mode():
            for i in range(0, x.shape[0], batch_size):
                model(x[i : i + batch_size])
    finally:
        for h in handles:
            h.remove()


def compressible_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The Conv2d and Linear modules of `model`, by qualified name, in definition order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


def _weight(module: nn.Module) -> torch.Tensor:
    """The weight of a module `compressible_modules` returned (a Conv2d's or a Linear's)."""
    if not isinstance(module, (nn.Conv2d, nn.Linear)):
        raise TypeError(f"expected a Conv2d or Linear module, got {type(module).__name__}")
    return module.weight


def internal_channels(model: nn.Module) -> dict[str, tuple[str, str]]:
    """{conv1: (norm, conv2)} for every residual block laid out as conv1 -> bn1 -> ReLU -> conv2.

    A block module (not the model itself) with children `conv1` (Conv2d), `bn1` (a batch norm
    over conv1's outputs) and `conv2` (a Conv2d reading them), all ungrouped: the layout of the
    CIFAR ResNets and of torchvision's BasicBlock and Bottleneck. conv1's output channels feed
    only conv2 there, so removing some leaves the residual stream (and option-A shortcuts) as is.
    """
    out: dict[str, tuple[str, str]] = {}
    for name, mod in model.named_modules():
        if not name:
            continue
        c1, bn, c2 = (getattr(mod, a, None) for a in ("conv1", "bn1", "conv2"))
        if not (isinstance(c1, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and isinstance(c2, nn.Conv2d)):
            continue
        if c1.groups == 1 and c2.groups == 1 and bn.num_features == c1.out_channels == c2.in_channels:
            out[f"{name}.conv1"] = (f"{name}.bn1", f"{name}.conv2")
    return out


def discover_layers(model: nn.Module, example: torch.Tensor) -> tuple[Layer, ...]:
    """Runs one forward pass on `example` (a batch of one) and records each layer's MACs."""
    modules = compressible_modules(model)
    macs: dict[str, int] = {}
    hooks = []
    for name, mod in modules.items():

        def hook(m: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor, name: str = name) -> None:
            per_out = _weight(m)[0].numel()  # fan-in of one output element
            elems = out[0].numel() if out.dim() > 1 else out.numel()
            macs[name] = macs.get(name, 0) + per_out * elems

        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.inference_mode():
            model(example[:1])
    finally:
        for h in hooks:
            h.remove()
    layers = []
    internal = internal_channels(model)
    for name, mod in modules.items():
        kind = LayerKind.CONV if isinstance(mod, nn.Conv2d) else LayerKind.LINEAR
        norm, consumer = internal.get(name, (None, None))
        layers.append(
            Layer(
                name=name,
                kind=kind,
                weight_shape=tuple(_weight(mod).shape),
                macs=macs.get(name, 0),
                has_bias=mod.bias is not None,
                channel_norm=norm,
                channel_consumer=consumer,
            )
        )
    return tuple(layers)
