"""A removed residual branch's constant as the bias of a 1x1 identity convolution, so engines add it on integers.

A block whose branch a plan removes computes ``shortcut(x) + c`` (`modelopt.model.branches.skipped_block`), `c` the
branch's mean per channel. Exported as written, that is an Add of a float constant: ONNX Runtime cannot fuse a float
initializer into an integer Add, so it runs DequantizeLinear, Add and QuantizeLinear in float (a share of the kernel
time worth removing: docs/export-and-latency.md#removing-blocks, `benchmarks/onnx_graph.py`). The same sum is a 1x1
convolution with identity weights and bias `c`; with the weight as int8 code 127 at scale 1/127 per channel, the bias
is an int32 at a 127th of the input's step, so the integer conv adds `c` to within 1/254 of an input step before it
rounds to its output's grid (where the Add rounded once too), and ORT runs one QLinearConv.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx, nn

from modelopt.model.branches import BranchMean

__all__ = ["Shift", "shift_constants"]


class Shift(nn.Module):
    """``x + value`` (per channel) as a 1x1 convolution with identity weights and bias `value`."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        channels = value.numel()
        self.weight: torch.Tensor
        self.bias: torch.Tensor
        self.register_buffer("weight", torch.eye(channels, dtype=value.dtype, device=value.device)
                             .reshape(channels, channels, 1, 1))
        self.register_buffer("bias", value.detach().reshape(-1).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias)


def shift_constants(model: nn.Module) -> tuple[str, ...]:
    """Rewrites, in `model`, each removed branch's ``shortcut + constant`` into a `Shift` of the shortcut; returns the
    shifts' module names (the ONNX weight of each is ``<name>.weight``, its bias ``<name>.bias``)."""
    names = []
    for block_name, block in list(model.named_modules()):
        if not isinstance(block, fx.GraphModule):
            continue
        for node in list(block.graph.nodes):
            if node.op != "call_module" or not isinstance(block.get_submodule(node.target), BranchMean):
                continue
            users = list(node.users)
            if len(users) != 1 or len(users[0].args) != 2 or users[0].kwargs:
                continue  # not the plain sum `skipped_block` writes: left as it is
            add = users[0]
            other = add.args[1] if add.args[0] is node else add.args[0]
            target = f"{node.target}_shift"
            block.add_submodule(target, Shift(block.get_submodule(node.target).get_buffer("value")))
            with block.graph.inserting_before(add):
                shifted = block.graph.call_module(target, (other,))
            add.replace_all_uses_with(shifted)
            block.graph.erase_node(add)
            block.graph.eliminate_dead_code()
            block.delete_all_unused_submodules()
            block.recompile()
            names.append(f"{block_name}.{target}" if block_name else target)
    return tuple(names)
