"""Depth: remove a block's residual branch and keep its shortcut (`modelopt.model.branches`).

Offered on the last layer of every removable branch (`BranchAnalysis.of(layer)`): a ResNet block's conv2, an inverted
residual's projection. Removing it takes every layer of the branch out of the graph the engines run, so it is a
decision about speed: a block removed is a block no engine runs, where channels pruned to odd counts fall off the
int8 kernels' blocking (LayerPrune, arXiv 2007.05667: removing blocks cuts more latency than removing filters at
the same accuracy). What is left computes ``shortcut(x) + mean(branch)``; the next block's branch is refitted by
least squares to give the sum the float model gave (`modelopt.model.skip_repair`), calibration images only.

Size is unchanged: the packed checkpoint stores the branch's layers (zeros behind a norm of scale zero compute the
removed branch exactly, and `modelopt.load` needs no new module); the ONNX graph and the torch engine's module drop
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._branches import RemovesBranch
from modelopt.compressors._packing import Storage
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._surface import Cell, ReportColumn
from modelopt.errors import ConfigError
from modelopt.model.branches import BranchAnalysis
from modelopt.model.layers import Layer


@dataclass(frozen=True)
class Skip:
    """The branch is removed (the field gives the choice its plan-file form, ``{skip: true}``)."""

    skip: bool = True

    def __str__(self) -> str:
        return "skip"


SKIP = Skip()


def _cell(raw: Mapping[str, Any] | None) -> Cell:
    return Cell("kept", None) if raw is None else Cell("removed", 1.0)


@COMPRESSORS.register("depth")
class Depth(Compressor, RemovesBranch):
    """Removes residual branches: ``{skip: true}`` on a branch's last layer (`BranchAnalysis.of(layer)`).

    Example:
        >>> Depth().menu(layers["layer1.0.conv2"])
        (None, Skip(skip=True))
        >>> space.parse_plan({"layers": {"layer2.2.conv2": {"depth": {"skip": True}}}})
    """

    order = 5  # before pruning and quantization: the branch's other choices no longer matter
    # Size is unchanged (the packed form keeps the branch); MACs, bitops and latency lose the branch.
    reduces = frozenset({"latency"})
    off_label = "kept"
    report_columns = (ReportColumn("depth", "Greys", _cell),)

    def removes(self, choice: Choice) -> bool:
        return choice is not None

    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        return (None, SKIP) if BranchAnalysis.of(layer) else ()

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        if raw is None or raw is False:
            return None
        if raw is True or (isinstance(raw, Mapping) and set(raw) == {"skip"} and isinstance(raw["skip"], bool)):
            if not BranchAnalysis.of(layer):
                raise ConfigError(f"depth: layer {layer.name!r} does not end a removable residual branch; name the "
                                  "last layer of a block's branch (a ResNet block's conv2)")
            return SKIP if raw is True or raw["skip"] else None
        raise ConfigError(f"depth for {layer.name}: expected {{skip: true}} or null, got {raw!r}")

    def dump(self, choice: Choice) -> dict[str, Any] | None:
        return None if choice is None else {"skip": True}

    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        """Zeros: the layer's output no longer reaches the network (its norm gives the branch's mean)."""
        return weight if choice is None else torch.zeros_like(weight)

    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        return layer.params * 4

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        """The packed form stores the branch as the layer's other compressors make it (see the module's note)."""
        return inner
