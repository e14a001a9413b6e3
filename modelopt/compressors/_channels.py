"""Removing channels: the capability of a compressor whose choices take whole output channels out (structured
pruning), apart from the `Compressor` contract because one shipped plugin needs it.

A compressor class lists it beside `Compressor` (``class Prune(Compressor, RemovesChannels)``); it reads the model's
checked channel groups (`ChannelAnalysis`, `modelopt.model.channels`: built once per workload, the first time a space
asks), whose roots carry their group (`ChannelAnalysis.of(layer).members`). The evaluator asks
``isinstance(compressor, RemovesChannels)`` on those roots, removes what the group ties to the kept channels and
refits their readers, and the cost model counts the smaller shapes (`modelopt.evaluation.cost`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch

from modelopt.compressors._analyses import UsesAnalyses
from modelopt.compressors._base import Choice
from modelopt.model.channels import ChannelAnalysis
from modelopt.model.layers import Layer

__all__ = ["RemovesChannels"]


class RemovesChannels(UsesAnalyses, ABC):
    """Which output channels of a channel group's root a choice keeps, and the MACs it saves."""

    analyses = (ChannelAnalysis,)

    @abstractmethod
    def kept_channels(self, weight: torch.Tensor, choice: Choice,
                      reader: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """Indices (ascending) of the output channels `choice` keeps of a group root's `weight`; None for a
        choice that removes none. `reader`: the weight and input second moments of the group's one plain
        reader, when it has one and the choice asks for layer inputs (`Compressor.calibration`): those readers
        are refitted on the channels kept (`modelopt.solvers.least_squares`), and the choice may pick the channels
        by that refit's cost."""

    @abstractmethod
    def macs_saved(self, layer: Layer, choice: Choice, layers: Mapping[str, Layer]) -> int:
        """Multiply-accumulates per sample `choice` removes (from `layer` and the layers its group ties to it),
        for strategies' cost estimates; the evaluator counts them exactly."""
