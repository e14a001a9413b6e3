"""The compressor plugin surface: a menu of choices per layer, apply, size accounting."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping
from typing import Any, ClassVar

import torch

from modelopt.layers import Layer

Choice = Hashable  # None means "this compressor leaves the layer alone"


class Compressor(ABC):
    """A plugin that offers per-layer choices and applies them to a layer's weight.

    Subclasses register with `@COMPRESSORS.register(name)`. Choices are frozen,
    hashable values (None = off); they cross into plans, caches and journals.
    """

    name: ClassVar[str]

    @abstractmethod
    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        """The choices offered for `layer`, None (off) first; empty if the layer is not handled."""

    @abstractmethod
    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        """A choice from its hand-written form (YAML mapping); raises ConfigError if invalid."""

    @abstractmethod
    def dump(self, choice: Choice) -> dict[str, Any] | None:
        """The hand-writable form of `choice` (inverse of `parse`)."""

    @abstractmethod
    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        """The weight the evaluator runs with (e.g. quantize-dequantize), same shape and dtype."""

    @abstractmethod
    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        """Exact bytes the packed export writes for this layer's weight under `choice`."""

    def weight_bits(self, choice: Choice) -> int:
        """Bits per weight that arithmetic runs at (for bitops); 32 when float."""
        return 32

    def options(self) -> dict[str, Any]:
        """The constructor options, for run records."""
        return {}
