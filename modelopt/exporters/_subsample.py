"""Option-A shortcuts (``F.pad(x[:, :, ::2, ::2], channels)``) as one strided 1x1 convolution for engines.

Exported as written, an option-A shortcut is two Slices and a Pad; ONNX Runtime runs the Slices on uint8 but the Pad
in float between a DequantizeLinear and a QuantizeLinear: five ops, a share of the kernel time worth removing
(measured: docs/export-and-latency.md#export, `benchmarks/onnx_graph.py`). The same map is a 1x1 convolution of
stride 2 whose weight holds a 1 where output channel ``c + front`` reads input channel ``c`` and zeros elsewhere;
with integer codes 1 at scale 1 and the output quantized at the input's scale and zero point it runs as one
QLinearConv and returns the input's codes exactly.

Shortcuts are found by what they compute, not by their class: a leaf module with no parameters whose output,
on a real batch, equals the input subsampled by 2 with zero channels around it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

STRIDE = 2


class Subsample(nn.Module):
    """``x[:, :, ::2, ::2]`` with `front` zero channels before and the rest after, as one strided 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, front: int) -> None:
        super().__init__()
        weight = torch.zeros(c_out, c_in, 1, 1)
        weight[torch.arange(c_in) + front, torch.arange(c_in)] = 1.0
        self.weight: torch.Tensor
        self.register_buffer("weight", weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, stride=STRIDE)


def subsample_shortcuts(model: nn.Module, x: torch.Tensor) -> tuple[str, ...]:
    """Replaces, in `model`, each parameterless leaf module that computes an option-A shortcut on `x` by a
    `Subsample`; returns the replaced modules' names (the ONNX weight of each is ``<name>.weight``)."""
    seen: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def hook(name: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], torch.Tensor], None]:
        def record(_m: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            seen.setdefault(name, []).append((args[0] if len(args) == 1 else torch.empty(0), out))
        return record

    def copy_input(_m: nn.Module, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)  # in-place modules alias it

    candidates = {name: m for name, m in model.named_modules()
                  if name and not list(m.children()) and not list(m.parameters()) and not list(m.buffers())}
    handles = [h for name, m in candidates.items()
               for h in (m.register_forward_pre_hook(copy_input), m.register_forward_hook(hook(name)))]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in handles:
            h.remove()
    replaced = []
    for name, calls in seen.items():
        # A module called more than once (torchvision's shared ReLU) may see other shapes on other calls.
        inp, out = calls[0]
        front = _front(inp, out) if len(calls) == 1 and isinstance(out, torch.Tensor) else None
        if front is None:
            continue
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, child, Subsample(inp.shape[1], out.shape[1], front).to(inp.device))
        replaced.append(name)
    return tuple(replaced)


def _front(inp: torch.Tensor, out: torch.Tensor) -> int | None:
    """The zero channels before the input's in `out` if `out` is `inp` subsampled by 2 and padded with zero
    channels (None otherwise)."""
    if inp.ndim != 4 or out.ndim != 4 or inp.shape[0] != out.shape[0] or out.shape[1] < inp.shape[1]:
        return None
    sub = inp[:, :, ::STRIDE, ::STRIDE]
    if sub.shape[2:] != out.shape[2:] or min(inp.shape[2:]) < STRIDE or not bool(inp.abs().sum() > 0):
        return None
    front = (out.shape[1] - inp.shape[1]) // 2
    expected = F.pad(sub, (0, 0, 0, 0, front, out.shape[1] - inp.shape[1] - front))
    return front if torch.equal(expected, out) else None
