"""Removing residual branches: the capability of a compressor whose choices take a block's whole branch out (depth),
apart from the `Compressor` contract because one shipped plugin needs it.

A compressor class lists it beside `Compressor` (``class Depth(Compressor, RemovesBranch)``); it reads the model's
removable residual branches (`BranchAnalysis`, `modelopt.model.branches`: built once per workload, the first time a
space asks), and its decisions sit on a branch's last layer, which carries the branch's layers
(`BranchAnalysis.of(layer)`). The evaluator asks ``isinstance(compressor, RemovesBranch)``: a choice that is not
None removes every layer of the branch (their MACs are gone, their other choices no longer matter), the branch's end
gives its mean, and the next block's branch is refitted to stand in for it (`modelopt.model.skip_repair`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from modelopt.compressors._analyses import UsesAnalyses
from modelopt.compressors._base import Choice
from modelopt.model.branches import BranchAnalysis

__all__ = ["RemovesBranch"]


class RemovesBranch(UsesAnalyses, ABC):
    """Whether a choice removes its layer's residual branch."""

    analyses = (BranchAnalysis,)

    @abstractmethod
    def removes(self, choice: Choice) -> bool:
        """True where `choice` takes the branch out."""
