"""Residual branches: the part of a block that a plan may remove whole, keeping the block's shortcut.

A block of the backbone (`modelopt.model.backbone`) whose last operation adds two tensors computed from its input,
one through layers (the branch) and one through fewer or none (the shortcut), holds a removable branch: CIFAR and
torchvision ResNets' blocks, MobileNetV2's inverted residuals. Removing it leaves ``shortcut(x) + c`` (then whatever
the block did after the sum), `c` the branch's mean output per channel on calibration images, so the next layers
see inputs of the right level (Veit et al., NeurIPS 2016: residual networks lose little when one block is deleted;
the mean keeps the loss smaller than zero does).

The evaluator simulates a removal with weights alone, so the model it scores and the packed checkpoint it writes
compute the same function: the branch's layers zero and its end (a batch norm, or the last layer with a bias)
giving `c` (a norm's scale zero, its shift `c`). `skipped_block` builds the block the engines run instead, with the
branch's operations gone from the graph.

The branches are a structural analysis (`BranchAnalysis`, `modelopt.model.analysis`), built the first time a search
space's compressors ask for it (`RemovesBranch` does); each branch's layers are on its last layer.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from modelopt.errors import ConfigError
from modelopt.model.analysis import ANALYSES, Analysis, ModelView
from modelopt.model.backbone import split_backbone
from modelopt.model.layers import Layer

__all__ = ["Branch", "BranchAnalysis", "BranchMean", "Residuals", "residual_branches", "skipped_block"]

_ADDS = {operator.add, operator.iadd, torch.add}


@dataclass(frozen=True)
class Branch:
    """A block's removable residual branch.

    Attributes:
        block: The block's qualified module name (``"layer2.1"``).
        layers: The compressible layers on the branch, in forward order; the last one carries the decision.
        end: The module whose output joins the shortcut: a batch norm right after the last layer, or the last
            layer itself when it has a bias.
    """

    block: str
    layers: tuple[str, ...]
    end: str


def _ancestors(node: fx.Node) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n not in seen:
            seen.add(n)
            stack.extend(n.all_input_nodes)
    return seen


def residual_add(graph: fx.Graph) -> tuple[fx.Node, int] | None:
    """The traced block's last addition of two computed tensors, and which of its arguments is the branch (the side with
    more modules of its own); None where the block has none."""
    adds = [n for n in graph.nodes if (n.op == "call_function" and n.target in _ADDS)
            or (n.op == "call_method" and n.target in ("add", "add_"))]
    for node in reversed(adds):
        args = [a for a in node.args[:2] if isinstance(a, fx.Node)]
        if len(args) != 2 or node.kwargs:
            continue
        sides = [_ancestors(a) for a in args]
        own = [{n for n in sides[i] - sides[1 - i] if n.op == "call_module"} for i in range(2)]
        if len(own[0]) != len(own[1]):
            return node, 0 if len(own[0]) > len(own[1]) else 1
    return None


def traced_block(block: nn.Module) -> fx.GraphModule | None:
    """`block` traced by torch.fx (its submodules shared); None where it does not trace."""
    try:
        return fx.symbolic_trace(block)
    except Exception:  # noqa: BLE001 -- a block with data-dependent control flow: it offers no branch
        return None


def _branch(name: str, block: nn.Module, compressible: Mapping[str, nn.Module]) -> Branch | None:
    traced = traced_block(block)
    found = None if traced is None else residual_add(traced.graph)
    if traced is None or found is None:
        return None
    add, side = found
    branch_out = add.args[side]
    shortcut = add.args[1 - side]
    assert isinstance(branch_out, fx.Node) and isinstance(shortcut, fx.Node)
    own = _ancestors(branch_out) - _ancestors(shortcut)
    modules = dict(traced.named_modules())
    layers = [f"{name}.{n.target}" for n in traced.graph.nodes
              if n in own and n.op == "call_module" and f"{name}.{n.target}" in compressible]
    if not layers or branch_out.op != "call_module":
        return None
    end = modules[str(branch_out.target)]
    if isinstance(end, nn.BatchNorm2d) and end.affine:
        feeds = branch_out.all_input_nodes
        if len(feeds) != 1 or feeds[0].op != "call_module" or f"{name}.{feeds[0].target}" != layers[-1]:
            return None
    elif not (f"{name}.{branch_out.target}" == layers[-1] and getattr(end, "bias", None) is not None):
        return None
    return Branch(name, tuple(layers), f"{name}.{branch_out.target}")


def residual_branches(blocks: Sequence[tuple[str, nn.Module]], compressible: Mapping[str, nn.Module]
                      ) -> dict[str, Branch]:
    """{the branch's last layer: its `Branch`} for each of `blocks` (a backbone's (name, module) pairs) that holds
    a removable residual branch; `compressible`: the model's compressible layers by name.

    Example:
        >>> bb = split_backbone(model)
        >>> residual_branches(bb.blocks, compressible_modules(model))["layer1.0.conv2"]
        Branch(block='layer1.0', layers=('layer1.0.conv1', 'layer1.0.conv2'), end='layer1.0.bn2')
    """
    out = {}
    for name, block in blocks:
        branch = _branch(name, block, compressible)
        if branch is not None:
            out[branch.layers[-1]] = branch
    return out


@dataclass(frozen=True)
class Residuals:
    """What `BranchAnalysis` finds: the backbone's blocks in order, and their removable branches by last layer (none
    where the model does not cut into blocks, `split_backbone`)."""

    blocks: tuple[str, ...] = ()
    branches: Mapping[str, Branch] = field(default_factory=dict)


@ANALYSES.register("residual_branches")
class BranchAnalysis(Analysis[Residuals, tuple[str, ...]]):
    """The removable residual branches (`residual_branches`); on a branch's last layer, the branch's compressible
    layers in forward order, itself last.

    Example:
        >>> BranchAnalysis.of(space.layers["layer1.0.conv2"])
        ('layer1.0.conv1', 'layer1.0.conv2')
        >>> workload.analyses.get(BranchAnalysis).branches["layer1.0.conv2"].end
        'layer1.0.bn2'
    """

    @classmethod
    def build(cls, view: ModelView) -> Residuals:
        if view.example.dim() != 4:
            return Residuals()
        try:
            backbone = split_backbone(view.model, (int(view.example.shape[-2]), int(view.example.shape[-1])))
        except (ConfigError, ValueError, RuntimeError):
            return Residuals()
        return Residuals(tuple(name for name, _ in backbone.blocks), residual_branches(backbone.blocks, view.layers))

    @classmethod
    def facts(cls, result: Residuals) -> Mapping[str, tuple[str, ...]]:
        return {end: branch.layers for end, branch in result.branches.items()}

    @classmethod
    def of(cls, layer: Layer) -> tuple[str, ...]:
        """The branch `layer` ends, else ()."""
        found = layer.fact(cls.name)
        return found if isinstance(found, tuple) else ()

    @classmethod
    def to_json(cls, fact: tuple[str, ...] | None) -> dict[str, Any]:
        return {"branch": list(fact)} if fact else {}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> tuple[str, ...] | None:
        return tuple(str(n) for n in entry.get("branch", ())) or None


class BranchMean(nn.Module):
    """What the removed branch leaves: its mean per channel."""

    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("value", value.detach().clone().reshape(1, -1, 1, 1))

    def forward(self) -> torch.Tensor:
        return self.get_buffer("value")


def skipped_block(block: nn.Module, constant: torch.Tensor) -> nn.Module:
    """`block` with its residual branch removed from the graph: the sum reads `constant` (per channel) in its
    place, and the branch's operations are gone, so an engine runs only the shortcut.

    Example:
        >>> lean = skipped_block(model.layer1[0], model.layer1[0].bn2.bias)   # relu(x + c)
    """
    traced = traced_block(block)
    found = None if traced is None else residual_add(traced.graph)
    if traced is None or found is None:
        raise ValueError(f"{type(block).__name__} has no residual branch to remove")
    add, side = found
    traced.add_submodule("skipped", BranchMean(constant))
    with traced.graph.inserting_before(add):
        const = traced.graph.call_module("skipped")
    args = list(add.args)
    args[side] = const
    add.args = tuple(args)
    traced.graph.eliminate_dead_code()
    traced.delete_all_unused_submodules()
    traced.recompile()
    return traced
