"""Discovery of a model's compressible layers: name, kind, shape, parameters and MACs."""

from __future__ import annotations

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
    def fan_in(self) -> int:
        """Weights feeding one output channel (in_channels/groups * kh * kw for a conv)."""
        return self.params // self.weight_shape[0]


def compressible_modules(model: nn.Module) -> dict[str, nn.Module]:
    """The Conv2d and Linear modules of `model`, by qualified name, in definition order."""
    return {n: m for n, m in model.named_modules() if isinstance(m, (nn.Conv2d, nn.Linear))}


def discover_layers(model: nn.Module, example: torch.Tensor) -> tuple[Layer, ...]:
    """Runs one forward pass on `example` (a batch of one) and records each layer's MACs."""
    modules = compressible_modules(model)
    macs: dict[str, int] = {}
    hooks = []
    for name, mod in modules.items():

        def hook(m: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor, name: str = name) -> None:
            per_out = m.weight[0].numel()  # fan-in of one output element
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
    for name, mod in modules.items():
        kind = LayerKind.CONV if isinstance(mod, nn.Conv2d) else LayerKind.LINEAR
        layers.append(
            Layer(
                name=name,
                kind=kind,
                weight_shape=tuple(mod.weight.shape),
                macs=macs.get(name, 0),
                has_bias=mod.bias is not None,
            )
        )
    return tuple(layers)
