"""Reading structural analyses: the capability of a compressor whose menus need more of the model than its layers
(which output channels go together, which blocks can be removed), apart from the `Compressor` contract.

A compressor class lists it beside `Compressor` with the analyses it reads (`modelopt.model.analysis.Analysis`,
each a class of its own, written beside the compressor). A search space built on a workload's layers has the workload
build each one the first time any compressor asks for it, and keep it; the layers it hands the menus carry what each
found of them, read with `Analysis.of(layer)`. The capabilities that need the model's graph list theirs:
`RemovesChannels` the channel groups, `RemovesBranch` the residual branches.

Example:
    >>> @COMPRESSORS.register("even")
    ... class Even(Compressor, UsesAnalyses):
    ...     analyses = (EvenChannels,)
    ...     def menu(self, layer): return (None, "half") if EvenChannels.of(layer) else ()
"""

from __future__ import annotations

from typing import Any, ClassVar

from modelopt.model.analysis import Analysis

__all__ = ["UsesAnalyses"]


class UsesAnalyses:
    """The structural analyses a compressor's menus read (`analyses`), built by the workload on first use."""

    analyses: ClassVar[tuple[type[Analysis[Any, Any]], ...]] = ()
