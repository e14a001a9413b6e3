"""Quantization's options record (`modelopt.compressors.quantize.Quantize` takes it): one default each, the tool's.

Why the defaults: GPTQ (`modelopt.compressors.quantize.gptq`) keeps uniform INT3 near the float accuracy where
rounding to nearest does not, so INT3 is offered and the plans that beat uniform INT4 mix it in; batch norms
re-estimated on 64 images recover most of what the lowest widths lose (measured: docs/compressors.md#measured). For
latency only what an engine can run faster is offered: 8-bit weights with per-channel scales (weights under 5 bits,
and group scales, are dequantized to float on every call in ONNX Runtime and OpenVINO, which builds no group-wise
DequantizeLinear whose fan-in the groups do not divide).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from modelopt.compressors._inputs import Calibration, activation_bits, calibration_method
from modelopt.compressors._options import Options, option
from modelopt.compressors._packing import Granularity
from modelopt.compressors._surface import SettingKind, enum_member
from modelopt.compressors.quantize.gptq import Rounding
from modelopt.compressors.quantize.spec import check_rate
from modelopt.errors import ConfigError

__all__ = ["CLIP_RATIOS", "SUPPORTED_BITS", "QuantizeOptions"]

SUPPORTED_BITS = (2, 3, 4, 5, 6, 7, 8)

# Clipping ratios searched per scale unit; 1.0 is plain max-scaling.
CLIP_RATIOS = tuple(float(r) for r in np.linspace(0.30, 1.0, 36))


@dataclass(frozen=True)
class QuantizeOptions(Options):
    """What `Quantize` offers the search and how it calibrates (the fields are its keywords; see `Quantize`)."""

    # 2: GPTQ, INT3 and batch-norm re-estimation became the defaults (version 1 rounded to nearest, offered 8 and
    # 4 bits and re-estimated nothing).
    version: ClassVar[int] = 2
    left_out: ClassVar[dict[int, dict[str, Any]]] = {1: {
        "bits": (8, 4), "granularity": ("per_channel", "group"), "group_size": 64, "clip_ratios": CLIP_RATIOS,
        "activations": (None,), "act_calibration": "percentile", "act_percentile": 99.99,
        "act_calibration_images": 256, "rounding": ("nearest",), "calib_images": 256, "norm_images": 0, "rates": (),
    }}

    bits: tuple[int, ...] = option((8, 4, 3), SettingKind.INTS, "Weight bit widths offered, e.g. 8,4 or 8,4,3,2 "
                                   "(default 8,4,3; 8 for --objective latency).", {"latency": (8,)})
    granularity: tuple[str, ...] = option(
        ("per_channel", "group"), SettingKind.NAMES, "Scale granularities: per_tensor, per_channel, group (default "
        "per_channel,group; per_channel for --objective latency).", {"latency": ("per_channel",)})
    group_size: int = option(64)  # input weights sharing one scale for `group`
    clip_ratios: tuple[float, ...] = option(CLIP_RATIOS)
    rounding: tuple[str, ...] = option(("gptq",), SettingKind.NAMES, "How codes are picked: gptq (calibrated on the "
                                       "calib split), nearest, or gptq,nearest to let the search choose.")
    # Not offered by default yet: the tests that pin default menus, plan files and searches have to move with them
    # (51 of them). Measured on the default run with --rates 2,2.5,3,3.5: docs/compressors.md#measured.
    rates: tuple[float, ...] = option(
        (), SettingKind.FLOATS, "Rate grids offered, in bits per weight once entropy coded, e.g. 2,2.5,3,3.5 "
        "(unclipped per-channel grids, weight-only, for size; default none).", {"bitops": (), "latency": ()})
    calib_images: int = option(256)  # GPTQ's input second moments
    # Quantized inputs lower bitops, and latency in an engine with integer kernels (ONNX Runtime, OpenVINO: a layer
    # whose inputs stay float runs as dequantized weights and a float kernel, slower than float): offered by
    # default for those objectives alone.
    activations: tuple[int | None, ...] = option(
        (None,), SettingKind.BITS, "Input activation bits offered per layer: none (float), 8, or none,8 (default: "
        "none,8 for --objective bitops or latency, else none).", {"bitops": (None, 8), "latency": (None, 8)})
    act_calibration: str = option("percentile")
    act_percentile: float = option(99.99)
    act_calibration_images: int = option(256)
    norm_images: int = option(64, SettingKind.INT, "Calibration images batch-norm statistics are re-estimated on "
                              "for plans with a layer at 4 bits or fewer (0: never).")

    def check(self) -> None:
        for check in _CHECKS:
            check(self)

    @property
    def calibration(self) -> Calibration:
        """How input ranges are measured (`act_calibration`, `act_percentile`, `act_calibration_images`)."""
        if not _is_number(self.act_percentile):  # a hand-edited run.json's "x": one line, not float()'s traceback
            raise ConfigError(f"quantize: act_percentile must be a number in (50, 100] like 99.99, got "
                              f"{self.act_percentile!r}")
        return Calibration(calibration_method(self.act_calibration), float(self.act_percentile),
                           int(self.act_calibration_images))


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_clip_ratios(o: QuantizeOptions) -> None:
    if not o.clip_ratios or any(not _is_number(r) or not 0 < float(r) <= 1 for r in o.clip_ratios):
        raise ConfigError(f"quantize: clip_ratios must be fractions in (0, 1] like 0.9, got {o.clip_ratios!r}")


def _check_bits(o: QuantizeOptions) -> None:
    for b in o.bits:
        if isinstance(b, bool) or b not in SUPPORTED_BITS:
            raise ConfigError(f"quantize: bits {b!r} not offered; valid: {', '.join(map(str, SUPPORTED_BITS))}")


def _check_granularity(o: QuantizeOptions) -> None:
    for g in o.granularity:
        enum_member(Granularity, g, "granularity", "quantize")


def _check_group_size(o: QuantizeOptions) -> None:
    if isinstance(o.group_size, bool) or not isinstance(o.group_size, (int, float)) or o.group_size < 1:
        raise ConfigError(f"quantize: group_size must be a positive integer, got {o.group_size!r}")


def _check_activations(o: QuantizeOptions) -> None:
    for a in o.activations:
        activation_bits(a)
    if not o.activations:
        raise ConfigError("quantize: activations must offer at least one of 8 or null (float)")


def _check_rounding(o: QuantizeOptions) -> None:
    for r in o.rounding:
        enum_member(Rounding, r, "rounding", "quantize")
    if not o.rounding:
        raise ConfigError("quantize: rounding must offer at least one of nearest, gptq")


def _check_rates(o: QuantizeOptions) -> None:
    if not isinstance(o.rates, tuple):
        raise ConfigError(f"quantize: rates must be a list of bits per weight like [2.5, 3.0], got {o.rates!r}")
    for r in o.rates:
        check_rate(r)


def _check_images(o: QuantizeOptions) -> None:
    if isinstance(o.calib_images, bool) or not isinstance(o.calib_images, int) or o.calib_images < 1:
        raise ConfigError(f"quantize: calib_images must be a positive integer, got {o.calib_images!r}")
    if isinstance(o.norm_images, bool) or not isinstance(o.norm_images, int) or o.norm_images < 0:
        raise ConfigError(f"quantize: norm_images must be a non-negative integer, got {o.norm_images!r}")
    o.calibration  # noqa: B018 -- builds the calibration, which checks its method, percentile and images


_CHECKS: tuple[Callable[[QuantizeOptions], None], ...] = (
    _check_clip_ratios, _check_bits, _check_granularity, _check_group_size, _check_activations, _check_rounding,
    _check_rates, _check_images)
