"""Structural analyses: what a compressor needs to know of a model beyond its layers, built once, on first use.

A compressor's menus may need the model's graph (which output channels go together, which blocks can be removed):
an analysis is a class that finds it (`Analysis.build`, from the model, its compressible layers and example inputs)
and says what it found of each layer (`Analysis.facts`). The workload keeps one `Analyses` that builds each analysis
the first time it is asked for and keeps the result, and its layers (`Layers`) carry the door: a search space asks
them for the analyses its compressors read (`Layers.analysed`), and the layers it hands their menus carry each
analysis's finding (`Layer.facts`, read with `Analysis.of`). Registered by name (`ANALYSES`), an analysis also says
how its findings are written in a run folder's layer table (`to_json`, `from_json`), so a space is rebuilt there
without the model.

Nothing here knows an analysis: a compressor that needs a new one writes its class and lists it (the compressors'
contract: `UsesAnalyses`), with no change to the model's code.

Example:
    >>> @ANALYSES.register("even_channels")
    ... class EvenChannels(Analysis[frozenset[str], bool]):
    ...     @classmethod
    ...     def build(cls, view): return frozenset(n for n, m in view.layers.items() if m.weight.shape[0] % 2 == 0)
    ...     @classmethod
    ...     def facts(cls, result): return {name: True for name in result}
    >>> layers = workload.layers.analysed(EvenChannels)   # built now, once per workload
    >>> EvenChannels.of(layers[0])
    True
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar, cast

import torch
from torch import nn

from modelopt._registry import Registry, named
from modelopt.model.layers import Layer

__all__ = ["ANALYSES", "Analyses", "Analysis", "Layers", "ModelView"]

T = TypeVar("T")  # what an analysis finds of the whole model
F = TypeVar("F", bound=Hashable)  # what it finds of one layer


@dataclass(frozen=True)
class ModelView:
    """What an analysis reads of a model.

    Attributes:
        model: The model, on its device (an analysis must leave it as it is).
        layers: Its compressible layers' modules by name (`modelopt.model.layers.compressible_modules`).
        example: A batch of two inputs, prepared as the model reads them.
        check: Whether an analysis checks what it finds against the model where it can (off: a report rebuilding a
            layer table, which needs shapes only).
    """

    model: nn.Module
    layers: Mapping[str, nn.Module]
    example: torch.Tensor
    check: bool = True


class Analysis(ABC, Generic[T, F]):
    """A structural analysis of a model: its result `T`, and a finding `F` (hashable) per layer it concerns.

    An analysis is its class (the key `Analyses` keeps its result under); its `name` keys its findings on layers and
    in a run folder's layer table, set by registering it (``@ANALYSES.register(name)``) or by the class.
    """

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def build(cls, view: ModelView) -> T:
        """What the analysis finds of the model in `view`."""

    @classmethod
    def facts(cls, result: T) -> Mapping[str, F]:
        """{layer name: its finding} from `result`, for the layers it concerns (default: none)."""
        return {}

    @classmethod
    def of(cls, layer: Layer) -> F | None:
        """The finding on `layer` (None: none, or the analysis was not asked for on it)."""
        return cast("F | None", layer.fact(cls.name))

    @classmethod
    def to_json(cls, fact: F | None) -> dict[str, Any]:
        """A layer's finding as the fields of its entry in a run folder's layer table (default: not kept)."""
        return {}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> F | None:
        """The finding a layer table's entry holds (inverse of `to_json`); raises KeyError where the entry was written
        before the analysis was (the table is then rebuilt from the model)."""
        return None


# Analyses by name: the ones a run folder's layer table keeps (`modelopt.run.run_folder.save_layers`).
ANALYSES: Registry[type[Analysis[Any, Any]]] = Registry("structural analysis", None, named("structural analysis"))


class Analyses:
    """One model's analyses, each built the first time it is asked for and kept.

    Example:
        >>> analyses = Analyses(ModelView(model, compressible_modules(model), x[:2]))
        >>> analyses.get(EvenChannels) is analyses.get(EvenChannels)   # built once
        True
    """

    def __init__(self, view: ModelView) -> None:
        self.view = view
        self._results: dict[type[Analysis[Any, Any]], object] = {}

    def get(self, kind: type[Analysis[T, Any]]) -> T:
        """What `kind` finds of the model, built now if it was not before."""
        if kind not in self._results:
            self._results[kind] = kind.build(self.view)
        return cast(T, self._results[kind])


class Layers(tuple[Layer, ...]):
    """A model's compressible layers, in definition order, with the door to its analyses (a tuple of `Layer`).

    Args:
        layers: The layers.
        analyses: The model's analyses (`Workload.analyses`).
    """

    analyses: Analyses

    def __new__(cls, layers: Iterable[Layer], analyses: Analyses | None = None) -> Layers:
        self = super().__new__(cls, layers)
        if analyses is not None:  # None: unpickling, which sets the attribute after
            self.analyses = analyses
        return self

    def analysed(self, *kinds: type[Analysis[Any, Any]]) -> Layers:
        """These layers with the findings of `kinds` as well (`Layer.facts`), each analysis built on first use."""
        found = [(kind.name, kind.facts(self.analyses.get(kind))) for kind in kinds]
        return Layers((x.noted({name: facts[x.name] for name, facts in found if x.name in facts}) for x in self),
                      self.analyses)
