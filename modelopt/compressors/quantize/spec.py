"""The quantizer's choice for one layer: `QuantSpec` (weights), `ActQuantSpec` (weights and input activations) and
`RateSpec` (weights on a uniform grid sized for a rate, entropy coded). Frozen records: they cross into plans, plan
keys, journals and caches."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelopt.compressors._inputs import activation_bits as _activation_bits
from modelopt.compressors._packing import Granularity
from modelopt.compressors._surface import enum_member
from modelopt.compressors.quantize.gptq import Rounding
from modelopt.errors import ConfigError

__all__ = ["MAX_RATE", "MIN_RATE", "ActQuantSpec", "QuantSpec", "RateSpec", "check_rate"]

# Rates (bits per weight) a rate grid may target: below 1 most codes are 0 and the layer is all but pruned; above 6
# a gaussian layer's grid needs codes beyond the int8 container's [-127, 127].
MIN_RATE, MAX_RATE = 1.0, 6.0


def check_rate(rate: object, where: str = "quantize") -> float:
    """`rate` as a float; a ConfigError naming it and the valid range when it is not a number in it."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not MIN_RATE <= rate <= MAX_RATE:
        raise ConfigError(f"{where}: rate {rate!r} not offered; valid: a number of bits per weight in "
                          f"[{MIN_RATE}, {MAX_RATE}]")
    return float(rate)


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

    @property
    def weight_bits(self) -> int:
        """The width weight arithmetic runs at (bitops; batch-norm re-estimation at `NORM_BITS` or fewer)."""
        return self.bits

    @property
    def value_bits(self) -> float:
        """Bits one stored weight costs (before scales)."""
        return float(self.bits)

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


@dataclass(frozen=True)
class RateSpec(QuantSpec):
    """Weights on a uniform grid without clipping, its step set so the codes carry `rate` bits of information a weight,
    to be entropy coded. Each output channel's step is a layer-wide constant times the channel's RMS
    (`modelopt.compressors.quantize.rate`). Unlike INT-b it can be set to any rate; at the bytes an INT-b grid's coded
    codes take it has less error on heavy-tailed (real) layers, about as much on gaussian ones
    (tests/compressors/quantize/test_rate.py; benchmarks/rate_grid_probe.py).

    A subclass, as `ActQuantSpec` is, so weight-only plans keep their keys. `bits` is the int8 container the codes
    live in (symmetric, [-127, 127]), what the stored `IntegerWeight` says; the bytes are priced at `rate`.
    Weight-only: its inputs stay float.

    Example:
        >>> str(RateSpec(rate=3.0, rounding=Rounding.GPTQ))
        'rate3.0/per_channel/gptq'
    """

    bits: int = 8
    rate: float = field(kw_only=True)

    def __post_init__(self) -> None:
        # 3 and 3.0 are one choice: the plan key writes the JSON form, where they differ.
        object.__setattr__(self, "rate", check_rate(self.rate))
        object.__setattr__(self, "granularity", enum_member(Granularity, self.granularity, "granularity", "quantize"))
        object.__setattr__(self, "rounding", enum_member(Rounding, self.rounding, "rounding", "quantize"))
        if self.bits != 8 or self.granularity is not Granularity.PER_CHANNEL:
            raise ConfigError(f"quantize: a rate grid stores int8 codes with per-channel scales, got bits "
                              f"{self.bits!r} and granularity {self.granularity.value}")

    @classmethod
    def parse(cls, raw: Mapping[str, Any], where: str, rounding: Rounding) -> RateSpec:
        """The rate grid a plan entry with a `rate` names (`rounding`: the quantizer's first, where it names none)."""
        rate, bits = check_rate(raw["rate"], where), raw.get("bits")
        # bits 8 is the int8 container the codes live in, as the journal's form (and an entry merged over an INT8
        # default) says; any other width contradicts the rate.
        if bits is not None and (isinstance(bits, bool) or bits != 8):
            raise ConfigError(f"{where}: bits {bits!r} and rate {rate!r} together; a rate grid stores int8 codes: "
                              "give rate alone (bits: null where a default gives bits)")
        gran = enum_member(Granularity, raw.get("granularity", Granularity.PER_CHANNEL), "granularity", where)
        if gran is not Granularity.PER_CHANNEL:
            raise ConfigError(f"{where}: rate grids have per-channel scales; got granularity {gran.value!r}")
        if _activation_bits(raw.get("activations"), where) is not None:
            raise ConfigError(f"{where}: rate grids are weight-only; give activations: null with rate")
        return cls(rate=rate, rounding=enum_member(Rounding, raw.get("rounding", rounding), "rounding", where))

    @property
    def weight_bits(self) -> int:
        return math.ceil(self.rate)

    @property
    def value_bits(self) -> float:
        # An estimate: the evaluator prices the coded bytes of the real codes.
        return self.rate

    def with_activations(self, bits: int | None) -> QuantSpec:
        if bits is not None:
            raise ConfigError(f"quantize: rate grids are weight-only; {self} cannot take {bits}-bit inputs")
        return self

    def __str__(self) -> str:
        return f"rate{self.rate}/{self.granularity.value}" + (
            "" if self.rounding is Rounding.NEAREST else f"/{self.rounding.value}")
