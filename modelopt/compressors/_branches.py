"""Removing residual branches: the capability of a compressor whose choices take a block's whole branch out (depth),
apart from the `Compressor` contract because one shipped plugin needs it.

A compressor class lists it beside `Compressor` (``class Depth(Compressor, RemovesBranch)``); its decisions sit on
the last layer of a removable branch (`Layer.branch`, `modelopt.model.branches`). The evaluator asks
``isinstance(compressor, RemovesBranch)``: a choice that is not None removes every layer of `Layer.branch` (their
MACs are gone, their other choices no longer matter), the branch's end gives its mean, and the next block's branch
is refitted to stand in for it (`modelopt.model.skip_repair`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from modelopt.compressors._base import Choice

__all__ = ["RemovesBranch"]


class RemovesBranch(ABC):
    """Whether a choice removes its layer's residual branch."""

    @abstractmethod
    def removes(self, choice: Choice) -> bool:
        """True where `choice` takes the branch out."""
