"""The compressor contract: a menu of choices per layer, apply, size accounting, the stored form for export.

`Compressor` is what every plugin implements: its core (a name, a place in a layer's chain, the menu,
the hand-written form of a choice, apply, the weight's bytes, its part of the stored form, its options),
then a few members with defaults that a plugin overrides where they apply (what it lowers, how reports and
users see it, how the weight is stored in a chain, the bits its arithmetic runs at, the calibration data it
needs). Capabilities one plugin needs have their own small interfaces beside it: `Routes` (samples that
leave early, `modelopt.compressors._routing`) and `RemovesChannels` (structured pruning,
`modelopt.compressors._channels`). The stored form's records and bit-packing are in
`modelopt.compressors._packing`; what calibration a choice needs, in `modelopt.compressors._calibration`.
How to write one: docs/compressors.md.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from modelopt.compressors._calibration import CalibrationNeed
from modelopt.compressors._options import Options
from modelopt.compressors._packing import Storage, WeightForm
from modelopt.compressors._surface import ReportColumn
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer

__all__ = ["Choice", "Compressor", "Precision"]

Choice = Hashable  # None means "this compressor leaves the layer alone"


@dataclass(frozen=True)
class Precision:
    """The bits a layer's arithmetic runs at under a choice: bitops are MACs x weight bits x input bits."""

    weight: int = 32  # bits per weight the arithmetic runs at; 32: float
    activation: int = 32  # bits of the layer's input activations; 32: float


class Compressor(ABC):
    """A plugin that offers per-layer choices and applies them to a layer's weight.

    Subclasses register with `@COMPRESSORS.register(name)`. Choices are frozen,
    hashable values (None = off); they cross into plans, caches and journals.

    Example:
        >>> @COMPRESSORS.register("round1")
        ... class Round(Compressor):
        ...     def menu(self, layer): return (None, "1dp")
        ...     def parse(self, raw, layer): return None if raw is None else "1dp"
        ...     def dump(self, choice): return None if choice is None else {"decimals": 1}
        ...     def apply(self, weight, choice): return weight if choice is None else weight.round(decimals=1)
        ...     def weight_bytes(self, layer, choice): return layer.params * 4
    """

    # ---- the core ----------------------------------------------------------------------------

    name: ClassVar[str]  # set by registering: ``@COMPRESSORS.register("round1")`` (`_registry`)
    # Where the compressor runs in a layer's chain, lowest first, whatever order users list them
    # in: pruning (10) runs before quantization (20), so the quantizer sees the pruned weight.
    order: ClassVar[int] = 50

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

    def pack(self, form: WeightForm, choice: Choice, inputs: LayerInputs | None = None) -> WeightForm:
        """This compressor's part of the layer's stored form for export, given the form the ones
        before it left (`inputs` as for `apply_calibrated`). It must agree with `stored`.

        Default: a choice that leaves the values unchanged (None, an early exit) leaves the form;
        any other is stored as the float32 weight `apply_calibrated` gives.
        """
        if choice is None:
            return form
        weight = self.apply_calibrated(form.weight, choice, inputs)
        return form if torch.equal(weight, form.weight) else WeightForm(weight)

    def __init__(self, opts: Options | None = None, **changes: Any) -> None:
        # The record (`record`: the tool's defaults when None), with the fields given by keyword changed.
        self.opts = (self.record() if opts is None else opts).replace(**changes)

    def options(self) -> dict[str, Any]:
        """The options record in its JSON form, with its version (run records; `record.from_json` reads it)."""
        return self.opts.to_json()

    # ---- overridable extras (tests/compressors/test_contract.py keeps them few) -----------------

    # The objectives (modelopt.objective.Target values) this compressor can lower: by default the
    # compressors a run uses are the registered ones that lower its objective (modelopt.api).
    reduces: ClassVar[frozenset[str]] = frozenset({"size", "bitops", "latency"})
    # How the off choice (None) reads in reports and the Optuna export ("float" for a quantizer).
    off_label: ClassVar[str] = "off"
    # Its options, one typed, versioned record (`_options.Options`): its fields are the constructor's keywords and
    # run.json's options; those declared with a kind are what users set by name (`record.settings()`: each a
    # --flag, a sweep-file key, an `optimize` keyword). The base record has no fields.
    record: ClassVar[type[Options]] = Options
    # Columns of the per-layer map in reports (`_surface.ReportColumn`); none: one generic column.
    report_columns: ClassVar[tuple[ReportColumn, ...]] = ()

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        """How the weight is stored after this compressor, given how it was before (`inner`).

        `layer` has the stored shape (structured pruning already applied). The default: the
        compressor re-encodes the whole weight in `weight_bytes` (the last one to touch it decides).
        """
        if choice is None:
            return inner
        shaped = dataclasses.replace(layer, weight_shape=inner.shape)
        return Storage(inner.shape, None, 0, self.weight_bytes(shaped, choice))

    def precision(self, choice: Choice) -> Precision:
        """The bits the layer's weights and input activations run at under `choice` (for bitops); float
        (32, 32) by default. Inputs below 32 bits are fake-quantized by the evaluator, their ranges measured
        as `calibration(choice).input_ranges` says."""
        return Precision()

    def calibration(self, choice: Choice) -> CalibrationNeed:
        """The calibration data `choice` needs (`_calibration.CalibrationNeed`); none by default."""
        return CalibrationNeed()

    def apply_calibrated(self, weight: torch.Tensor, choice: Choice, inputs: LayerInputs | None) -> torch.Tensor:
        """`apply` given the second moments of the layer's inputs on `calibration(choice).layer_inputs` calib
        images (None where the evaluator has none, e.g. a grouped conv pruned within a group); default: `apply`."""
        return self.apply(weight, choice)
