"""Discovery of a model's compressible layers: name, kind, shape, parameters and MACs."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn

from modelopt.model.images import Images


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
    # What the structural analyses a search space asked for found of this layer (`modelopt.model.analysis`):
    # (analysis name, finding) pairs in name order, each read through its analysis (`Analysis.of`). Empty where
    # none was asked for or none found anything here.
    facts: tuple[tuple[str, Hashable], ...] = ()

    @property
    def params(self) -> int:
        n = 1
        for d in self.weight_shape:
            n *= d
        return n

    def fact(self, name: str) -> Hashable | None:
        """The finding of the analysis `name` on this layer (None: none)."""
        return next((found for key, found in self.facts if key == name), None)

    def noted(self, facts: Mapping[str, Hashable]) -> Layer:
        """This layer with `facts` {analysis name: finding} among its findings (replacing that analysis's own)."""
        if not facts:
            return self
        return dataclasses.replace(self, facts=tuple(sorted({**dict(self.facts), **facts}.items())))

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


def feed_inputs(model: nn.Module, modules: Mapping[str, nn.Module], x: torch.Tensor | Images, batch_size: int,
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
    for name, mod in modules.items():
        kind = LayerKind.CONV if isinstance(mod, nn.Conv2d) else LayerKind.LINEAR
        layers.append(Layer(name=name, kind=kind, weight_shape=tuple(_weight(mod).shape), macs=macs.get(name, 0),
                            has_bias=mod.bias is not None))
    return tuple(layers)

