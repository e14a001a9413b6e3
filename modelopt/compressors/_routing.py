"""Routing: a compressor whose choices let samples leave the network early (early exit).

Two interfaces, apart from the `Compressor` contract because one shipped plugin needs them:

- `Routes`, the capability a compressor class adds beside `Compressor` (``class EarlyExit(Compressor, Routes)``):
  its plan's model-level form (`parse_top`, `dump_top`), the options it derives from the model, the bytes its
  choices add outside the weights, the `Routing` it drives plans with, and how a packed checkpoint stores and
  rebuilds its route. Callers ask ``isinstance(compressor, Routes)``.
- `Routing`, what the evaluator (`modelopt.evaluation.routes`) drives when plans are scored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from modelopt.compressors._base import Choice
from modelopt.errors import ConfigError
from modelopt.model.images import Images
from modelopt.model.layers import Layer

if TYPE_CHECKING:  # annotations only: the workload is built from modules that import this one's plugins
    from modelopt.model.workload import Workload

__all__ = ["ExitTap", "Forward", "Route", "Routes", "Routing"]


Route = Hashable  # a plan's routing as a `Routing` describes it (early exit: its active exits and thresholds)
Forward = Callable[[Images], torch.Tensor]  # the resident model's logits on images, batch by batch


@dataclass(frozen=True, eq=False)
class ExitTap:
    """Where a routed plan's samples may leave a model, as a graph export cuts it (`Routing.taps`): after
    `block` (a module the model calls once per forward pass) `head` maps the block's output to (logits,
    confidence); a sample whose confidence is at least `threshold` leaves with those logits."""

    name: str
    block: nn.Module
    head: nn.Module
    threshold: float


class Routing(ABC):
    """What a compressor whose choices let samples leave the network early does when plans are scored.

    A compressor offers one through `Routes.routing`; the evaluator (`modelopt.evaluation.routes`)
    drives it with the plan's choices on that compressor's decisions, {layer: choice}, and never looks
    inside a route. Early exit is the one shipped (`modelopt.compressors.early_exit.routing`).
    """

    @abstractmethod
    def route(self, choices: Mapping[str, Choice]) -> Route | None:
        """The route of the plan's choices; None when every sample runs the whole network."""

    @abstractmethod
    def one_time_keys(self, route: Route | None) -> set[str]:
        """The one-time preparations a plan with `route` is charged for, when it is the run's first."""

    @abstractmethod
    def prepare(self, route: Route | None) -> dict[str, float]:
        """Prepares what a plan with `route` needs (e.g. fits heads, on the float model), and the budget each
        of its `one_time_keys` costs."""

    @abstractmethod
    def predict(self, forward: Forward, x: Images, route: Route) -> tuple[torch.Tensor, torch.Tensor]:
        """(top-1 prediction, position of the exit each sample left at; len(exits): the end) for `x`, with the
        plan's weights in place; raises TrialError when the outputs are not finite."""

    @abstractmethod
    def reach(self, route: Route, exit_at: torch.Tensor) -> dict[str, float]:
        """Per compressible layer, the share of samples that ran it."""

    @abstractmethod
    def extra_macs(self, route: Route, exit_at: torch.Tensor) -> float:
        """Mean MACs per sample of what the route adds (heads), over the samples as they left."""

    @abstractmethod
    def left_early(self, route: Route, exit_at: torch.Tensor) -> float:
        """The share of samples that left before the end of the network."""

    def priors(self) -> dict[str, tuple[tuple[float, float] | None, ...]]:
        """Before any trial: per decision layer and choice, (MACs it saves per sample, expected loss on the
        strategies' weight-error scale), or None to keep the data-free estimate. Default: none."""
        return {}

    def describe(self, route: Route) -> str:
        """The route in a few words, for messages (e.g. "exits after block 'layer1.2'")."""
        return str(route)

    @abstractmethod
    def deployable(self, model: nn.Module, route: Route) -> nn.Module:
        """`model` (the plan's physical model) wrapped so that it really routes (what latency is measured on)."""

    def taps(self, model: nn.Module, route: Route) -> list[ExitTap]:
        """Where samples may leave `model` (the plan's physical model) under `route`, in the order they run: what
        an ONNX export cuts into segments that return early (`modelopt.exporters.onnx_exits`). Default: the
        route cannot be exported to a graph."""
        raise ConfigError(f"route {self.describe(route)} cannot be exported to a graph")

    def pack(self, route: Route) -> tuple[list[Any], list[torch.Tensor]]:
        """What a packed checkpoint stores for `route`: index entries (JSON) and float32 tensors, read back by
        the compressor's `unpack`. Default: nothing (the route cannot be exported)."""
        return [], []


class Routes(ABC):
    """The capability of a compressor whose choices route samples (early exit): a compressor class lists it beside
    `Compressor` (``class EarlyExit(Compressor, Routes)``); a run may use one. A graph export cuts a routed plan
    into segments (`Routing.taps`), and strategies price its decisions as routes (a fixed cost, a saving by the
    samples that leave)."""

    # The key a packed checkpoint stores a route's entries under (`Routing.pack`); None: it stores none.
    packed_key: ClassVar[str | None] = None

    @classmethod
    def model_options(cls, model: nn.Module) -> dict[str, Any]:
        """Options derived from the model when the user gives none (early exit: where exits may sit); raises
        ConfigError when the compressor cannot handle the model at all."""
        return {}

    @abstractmethod
    def routing(self, workload: Workload, decisions: Sequence[tuple[str, tuple[Choice, ...]]]) -> Routing | None:
        """How this compressor's choices route samples when plans are scored on `workload`, for its
        `decisions` ((layer, choices) each); None: they route nothing here (e.g. no decisions)."""

    def parse_top(self, raw: Any, layers: Sequence[Layer]) -> dict[str, Choice] | None:
        """Choices per layer from a plan's top-level `<name>:` key, when the decisions read better as one
        model-level setting (early exit's exits and threshold); None: this compressor has no such form."""
        return None

    def dump_top(self, choices: Mapping[str, Choice]) -> Any:
        """The top-level form of {layer: choice} (inverse of `parse_top`); None: write them per layer."""
        return None

    def added_bytes(self, layer: Layer, choice: Choice) -> int:
        """Bytes `choice` adds outside the layer's weight (an exit head), for strategies' cost
        estimates; the evaluator's size_bytes counts them exactly."""
        return 0

    @classmethod
    def unpack(cls, module: nn.Module, entries: list[Any], floats: torch.Tensor, meta: Mapping[str, Any]) -> nn.Module:
        """The loaded `module` wrapped as the route stored under `packed_key` describes (`floats`: the
        tensors `Routing.pack` wrote, in order; `meta`: the file's model record)."""
        raise NotImplementedError(f"{cls.__name__} stores no route")
