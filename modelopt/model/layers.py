"""Discovery of a model's compressible layers: name, kind, shape, parameters and MACs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import torch
from torch import nn

from modelopt.model.images import Images

if TYPE_CHECKING:  # the groups are found on the layers' modules: its type only
    from modelopt.model.channels import ChannelGroups


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
    # Structured pruning (`modelopt.model.channels`), on the root of a channel group: the compressible layers
    # its output channels are rows (True) or columns (False) of, itself first (a block's conv1 and the conv2
    # reading it; a depthwise conv between them; every layer of a residual stream); and the float entries per
    # channel outside those weights that removing one drops (norms' scales and shifts, biases). Empty on a
    # layer whose output channels no checked group removes.
    channel_group: tuple[tuple[str, bool], ...] = ()
    channel_floats: int = 0
    # Depth (`modelopt.model.branches`), on the last layer of a block's removable residual branch: the branch's
    # compressible layers in forward order, itself last. Empty elsewhere.
    branch: tuple[str, ...] = ()

    @property
    def params(self) -> int:
        n = 1
        for d in self.weight_shape:
            n *= d
        return n

    @property
    def prunable(self) -> bool:
        """Whether structured pruning may remove this layer's output channels (it roots a channel group)."""
        return bool(self.channel_group)

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


def discover_layers(model: nn.Module, example: torch.Tensor, groups: ChannelGroups | None = None) -> tuple[Layer, ...]:
    """Runs one forward pass on `example` (a batch of one) and records each layer's MACs; `groups`: the model's
    checked channel groups, which structured pruning may remove (`modelopt.model.channels`)."""
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
        group, floats = ((), 0) if groups is None or name not in groups.roots else _group(groups, name, modules)
        layers.append(Layer(name=name, kind=kind, weight_shape=tuple(_weight(mod).shape), macs=macs.get(name, 0),
                            has_bias=mod.bias is not None, channel_group=group, channel_floats=floats))
    return tuple(layers)


def _group(groups: ChannelGroups, root: str, modules: Mapping[str, nn.Module]) -> tuple[tuple[tuple[str, bool], ...],
                                                                                        int]:
    """(compressible members as (layer, rows), float entries dropped per channel) of `root`'s group."""
    members: list[tuple[str, bool]] = []
    floats = 0
    for r in groups.removals(root, [0]):
        module = groups.model.get_submodule(r.module)
        rows = r.out or (isinstance(module, nn.Conv2d) and module.groups > 1)
        if r.module in modules:
            members.append((r.module, rows))
            floats += int(rows and getattr(module, "bias", None) is not None)
        else:  # a norm: its scale and shift
            floats += sum(getattr(module, a, None) is not None for a in ("weight", "bias"))
    members.sort(key=lambda m: m[0] != root)  # the root first
    return tuple(dict.fromkeys(members)), floats
