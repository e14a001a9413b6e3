"""Any network whose body is a chain of blocks, cut into stem -> blocks -> tail by tracing it.

The blocks are the children of the model's `nn.Sequential`s of blocks (torchvision's `features` in MobileNets,
EfficientNets and ConvNeXts, with their stages opened up; RegNet's `trunk_output`; ResNet's and ShuffleNet's
stages). `torch.fx` traces the model with those blocks as leaves; the chain is the longest run of block calls in
which each reads exactly the previous one's output (torchvision's ResNet: layer1.0 ... layer4.1), and it
qualifies when nothing after it reads a value computed before it (no skip around it). The stem is the traced
graph up to the first child's input, the tail the graph from the last child's output to the logits: both
`GraphModule`s that share the model's modules (no copies), so a compressed state loaded into the model is what
they run. The cut is then checked: stem, blocks and tail in order give the model's own logits.

Exits need (N, C, H, W) feature maps at every candidate point (the heads pool them): a chain of transformer
blocks (tokens) does not qualify, and the error says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx, nn

__all__ = ["Chain", "NotAChain", "trace_chain"]


class NotAChain(ValueError):
    """The candidate Sequential cannot be cut exactly; the message says why, in one line."""


class _Leaves(fx.Tracer):
    """torch.fx's tracer with the chain's blocks as leaves (their insides are not traced)."""

    def __init__(self, leaves: set[str]) -> None:
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return module_qualified_name in self.leaves or super().is_leaf_module(m, module_qualified_name)


@dataclass(frozen=True, eq=False)
class Chain:
    """A cut: `stem`, the `blocks` (qualified name, module) and `tail`, with the modules the stem runs."""

    stem: nn.Module
    blocks: tuple[tuple[str, nn.Module], ...]
    tail: nn.Module
    stem_modules: frozenset[str]


def _weighted(m: nn.Module) -> bool:
    return any(isinstance(x, (nn.Conv2d, nn.Linear)) for x in m.modules())


def _of_blocks(m: nn.Module) -> bool:
    """An nn.Sequential whose children all hold a Conv2d or Linear (blocks; not a conv -> norm -> act triple)."""
    return isinstance(m, nn.Sequential) and len(m) > 0 and all(_weighted(c) for c in m.children())


def _leaf_blocks(module: nn.Module, prefix: str = "") -> list[str]:
    """The blocks of every Sequential of blocks, nested stages opened up (a stage of blocks inside `features`
    gives its blocks), found anywhere in the model but never inside a block."""
    out = []
    for name, child in module.named_children():
        qual = f"{prefix}{name}"
        if _of_blocks(module) and not _of_blocks(child):
            out.append(qual)
        else:
            out.extend(_leaf_blocks(child, qual + "."))
    return out


def _chains(graph: fx.Graph, leaves: set[str]) -> list[list[fx.Node]]:
    """Runs of block calls in which each reads exactly the previous one's output, and nothing else does; the
    longest first."""
    runs: list[list[fx.Node]] = []
    for node in graph.nodes:
        if node.op != "call_module" or node.target not in leaves:
            continue
        prev = runs[-1][-1] if runs else None
        if prev is not None and node.args == (prev,) and not node.kwargs and set(prev.users) == {node}:
            runs[-1].append(node)
        else:
            runs.append([node])
    return sorted((r for r in runs if len(r) >= 2), key=len, reverse=True)


def _cut(model: nn.Module, graph: fx.Graph, nodes: list[fx.Node]) -> Chain:
    """Stem and tail `GraphModule`s around the chain `nodes` of `graph`."""
    first_name, last_name = str(nodes[0].target), str(nodes[-1].target)
    if len(nodes[0].args) != 1 or nodes[0].kwargs or not isinstance(nodes[0].args[0], fx.Node):
        raise NotAChain(f"{first_name} takes more than one input")
    order = list(graph.nodes)
    first, last = order.index(nodes[0]), order.index(nodes[-1])

    stem_graph, env = fx.Graph(), dict[fx.Node, fx.Node]()
    for node in order[:first]:
        env[node] = stem_graph.node_copy(node, lambda n: env[n])
    stem_graph.output(env[nodes[0].args[0]])
    stem_modules = frozenset(str(n.target) for n in order[:first] if n.op == "call_module")

    tail_graph = fx.Graph()
    tail_env: dict[fx.Node, fx.Node] = {nodes[-1]: tail_graph.placeholder("h")}

    def read(n: fx.Node) -> fx.Node:
        if n not in tail_env:
            if n.op != "get_attr":
                raise NotAChain(f"the part after {last_name} reads {n.name}, computed before it (a skip around "
                                f"the chain from {first_name})")
            tail_env[n] = tail_graph.node_copy(n)
        return tail_env[n]

    for node in order[last + 1:]:
        if node.op == "output":
            tail_graph.output(fx.graph.map_arg(node.args[0], read))
        else:
            tail_env[node] = tail_graph.node_copy(node, read)
    blocks = tuple((str(n.target), model.get_submodule(str(n.target))) for n in nodes)
    return Chain(fx.GraphModule(model, stem_graph), blocks, fx.GraphModule(model, tail_graph), stem_modules)


def trace_chain(model: nn.Module, example: torch.Tensor,
                check: Callable[[Chain, torch.Tensor], str | None]) -> Chain:
    """The cut around the longest chain of blocks that passes `check` (None: it passes; else why not).

    Raises:
        NotAChain: no chain qualifies; the message gives the longest one's reason.
    """
    leaves = _leaf_blocks(model)
    if not leaves:
        raise NotAChain("it has no nn.Sequential of blocks to place exits along")
    try:
        graph = _Leaves(set(leaves)).trace(model)
    except Exception as e:  # noqa: BLE001 - whatever fx refuses, the user gets its first line
        raise NotAChain(f"it does not trace with torch.fx ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
                        ) from None
    reasons = []
    for nodes in _chains(graph, set(leaves)):
        try:
            chain = _cut(model, graph, nodes)
        except NotAChain as e:
            reasons.append(str(e))
            continue
        why = check(chain, example)
        if why is None:
            return chain
        reasons.append(f"{nodes[0].target}..{nodes[-1].target}: {why}")
    raise NotAChain(reasons[0] if reasons else "no two of its blocks run one after the other")
