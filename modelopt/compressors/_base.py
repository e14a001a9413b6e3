"""The compressor plugin surface: a menu of choices per layer, apply, size accounting."""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from modelopt.compressors.gptq import LayerInputs
from modelopt.layers import Layer

Choice = Hashable  # None means "this compressor leaves the layer alone"


def index_bytes_per_entry(numel: int) -> int:
    """Bytes of one position in an index list over `numel` weights (smallest unsigned int that fits)."""
    return 1 if numel <= 2**8 else 2 if numel <= 2**16 else 4


def sparse_index_bytes(numel: int, kept: int) -> int:
    """Bytes saying which of `numel` weights are kept: the cheaper of a bitmask and an index list."""
    return min(math.ceil(numel / 8), kept * index_bytes_per_entry(numel))


@dataclass(frozen=True)
class Storage:
    """How a layer's weight is stored once a chain of compressors has run (DESIGN.md, size_bytes).

    Each compressor of the chain maps the storage left by the ones before it to its own
    (`Compressor.stored`), so pruning then quantizing stores the kept values at the quantizer's bits.
    """

    shape: tuple[int, ...]  # the stored weight's shape (structured pruning shrinks it)
    kept: int | None = None  # values kept by unstructured sparsity; None: dense
    value_bits: int = 32  # bits per stored value
    extra_bytes: int = 0  # scales, zero points, or an opaque encoding's whole size

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def index_bytes(self) -> int:
        return 0 if self.kept is None else sparse_index_bytes(self.numel, self.kept)

    @property
    def bytes(self) -> int:
        values = self.numel if self.kept is None else self.kept
        return math.ceil(values * self.value_bits / 8) + self.index_bytes + self.extra_bytes


class Compressor(ABC):
    """A plugin that offers per-layer choices and applies them to a layer's weight.

    Subclasses register with `@COMPRESSORS.register(name)`. Choices are frozen,
    hashable values (None = off); they cross into plans, caches and journals.
    """

    name: ClassVar[str]
    # Where the compressor runs in a layer's chain, lowest first, whatever order users list them
    # in: pruning (10) runs before quantization (20), so the quantizer sees the pruned weight.
    order: ClassVar[int] = 50
    # The objectives (modelopt.objective.Target values) this compressor can lower: by default the
    # compressors a run uses are the registered ones that lower its objective (modelopt.api).
    reduces: ClassVar[frozenset[str]] = frozenset({"size", "bitops", "latency"})

    @classmethod
    def model_options(cls, model: torch.nn.Module) -> dict[str, Any]:
        """Options this compressor derives from the model when the user gives none (e.g. where
        early exits may sit); raises ConfigError when it cannot handle the model at all."""
        return {}

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

    def input_images(self, choice: Choice) -> int:
        """Calibration images whose inputs to the layer `choice` needs (`apply_calibrated`); 0: none."""
        return 0

    def apply_calibrated(self, weight: torch.Tensor, choice: Choice, inputs: LayerInputs | None) -> torch.Tensor:
        """`apply` given the second moments of the layer's inputs on `input_images(choice)` calib
        images (None where the evaluator has none, e.g. a grouped conv); default: `apply`."""
        return self.apply(weight, choice)

    @abstractmethod
    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        """Exact bytes the packed export writes for this layer's weight under `choice`."""

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        """How the weight is stored after this compressor, given how it was before (`inner`).

        `layer` has the stored shape (structured pruning already applied). The default: the
        compressor re-encodes the whole weight in `weight_bytes` (the last one to touch it decides).
        """
        if choice is None:
            return inner
        shaped = dataclasses.replace(layer, weight_shape=inner.shape)
        return Storage(inner.shape, None, 0, self.weight_bytes(shaped, choice))

    def parse_top(self, raw: Any, layers: Sequence[Layer]) -> dict[str, Choice] | None:
        """Choices per layer from a plan's top-level `<name>:` key, for compressors whose decisions
        read better as one model-level setting (early exit); None: this compressor has no such form."""
        return None

    def dump_top(self, choices: Mapping[str, Choice]) -> Any:
        """The top-level form of {layer: choice} (inverse of `parse_top`); None: write them per layer."""
        return None

    def added_bytes(self, layer: Layer, choice: Choice) -> int:
        """Bytes `choice` adds outside the layer's weight (an exit head), for strategies' cost
        estimates; the evaluator's size_bytes counts them exactly."""
        return 0

    def macs_saved(self, layer: Layer, choice: Choice, layers: Mapping[str, Layer]) -> int:
        """Multiply-accumulates per sample `choice` removes (from `layer` and the layers it feeds),
        for strategies' cost estimates; the evaluator counts them exactly."""
        return 0

    def kept_channels(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor | None:
        """Indices (ascending) of the output channels `choice` keeps, for choices that remove
        channels (structured pruning of a layer with `channel_consumer`); None otherwise."""
        return None

    def norm_calibration(self, choice: Choice) -> int:
        """Calibration images to re-estimate batch-norm statistics on after `choice` (0: none)."""
        return 0

    def weight_bits(self, choice: Choice) -> int:
        """Bits per weight that arithmetic runs at (for bitops); 32 when float."""
        return 32

    def activation_bits(self, choice: Choice) -> int:
        """Bits of the layer's input activations under `choice` (for bitops); 32 when float.

        A compressor offering quantized inputs says how the evaluator calibrates their ranges in a
        `calibration` attribute (`modelopt.compressors.activations.Calibration`; default percentile).
        """
        return 32

    def options(self) -> dict[str, Any]:
        """The constructor options, for run records."""
        return {}
