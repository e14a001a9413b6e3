"""The quantizer's choice for one layer: `QuantSpec` (weights) and `ActQuantSpec` (weights and input
activations). Frozen records: they cross into plans, plan keys, journals and caches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from modelopt.compressors._inputs import activation_bits as _activation_bits
from modelopt.compressors._packing import Granularity
from modelopt.compressors.quantize.gptq import Rounding
from modelopt.errors import ConfigError

__all__ = ["ActQuantSpec", "QuantSpec"]


@dataclass(frozen=True)
class QuantSpec:
    """How one layer's weight is quantized; its input activations stay float (see `ActQuantSpec`)."""

    bits: int
    granularity: Granularity = Granularity.PER_CHANNEL
    group_size: int = 64
    # Left out of `Plan.key` when nearest, so plans saved before rounding existed keep their keys.
    rounding: Rounding = field(default=Rounding.NEAREST, metadata={"key": "omit_default"})

    @property
    def activations(self) -> int | None:
        """Bits of the layer's input activations; None: float."""
        return None

    def with_activations(self, bits: int | None) -> QuantSpec:
        """This weight quantization with input activations at `bits` (None: float).

        Example:
            >>> QuantSpec(8).with_activations(8)
            ActQuantSpec(bits=8, granularity=<Granularity.PER_CHANNEL: 'per_channel'>, group_size=64,
                         rounding=<Rounding.NEAREST: 'nearest'>, activations=8)
        """
        if bits is None:
            return QuantSpec(self.bits, self.granularity, self.group_size, self.rounding)
        return ActQuantSpec(self.bits, self.granularity, self.group_size, self.rounding, bits)

    def with_rounding(self, rounding: Rounding) -> QuantSpec:
        """This quantization with codes picked by `rounding`."""
        return dataclasses.replace(self, rounding=Rounding(rounding))

    def __str__(self) -> str:
        tail = f"g{self.group_size}" if self.granularity is Granularity.GROUP else self.granularity.value
        return (f"int{self.bits}/{tail}" + ("" if self.activations is None else f"/a{self.activations}")
                + ("" if self.rounding is Rounding.NEAREST else f"/{self.rounding.value}"))


@dataclass(frozen=True)
class ActQuantSpec(QuantSpec):
    """A QuantSpec that also quantizes the layer's input activations (uint8, calibrated ranges).

    A subclass rather than a field of QuantSpec defaulting to None because `Plan.key` hashes every
    dataclass field of a choice: a new field would change the key of every saved weight-only plan
    (journals, resumed runs, optuna studies). Weight-only specs keep their three fields and keys.
    """

    activations: int = 8  # a field here, a None-valued property on QuantSpec

    def __post_init__(self) -> None:
        if _activation_bits(self.activations) is None:
            raise ConfigError("quantize: an ActQuantSpec needs activation bits; float inputs are a QuantSpec")
