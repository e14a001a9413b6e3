"""Activation quantization: calibrated static uint8 ranges for layer inputs, and fake quantization.

A layer whose quantize choice has ``activations: 8`` (W8A8) sees its input quantize-dequantized
with an asymmetric per-tensor uint8 grid: ``q = clamp(round(x / scale) + zero_point, 0, 255)``,
``x' = (q - zero_point) * scale``. The ranges are static: measured once on calibration images with
the float model, as a deployed integer model fixes them before it runs. Zero is always exactly
representable (padding, ReLU); a nonnegative input (after a ReLU) gets zero point 0.

`minmax` takes each input's extremes over the images; `percentile` takes the given percentile of
each tail, estimated on a seeded subsample of the values (`Calibration.samples` per layer), so that
a few outliers do not stretch the grid.

On ResNet-20, 8-bit inputs cost no measurable accuracy, minmax ranges are as good as percentile ones, and
calibrating on the compressed model instead of the float one changes nothing measurable (measured:
docs/compressors.md#measured).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from modelopt.errors import ConfigError
from modelopt.model.images import Images
from modelopt.model.layers import feed_inputs

QPARAM_BYTES = 5  # what the packed export stores per quantized input: float32 scale + uint8 zero point
SUPPORTED_ACTIVATION_BITS = (8,)  # uint8 inputs (W8A8), the integer kernels deployed CPUs and GPUs run


def activation_bits(value: object, where: str = "quantize") -> int | None:
    """Input activation bits from a plan or option value (None: float inputs); ConfigError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or value not in SUPPORTED_ACTIVATION_BITS:
        valid = ", ".join(map(str, SUPPORTED_ACTIVATION_BITS))
        raise ConfigError(f"{where}: activations {value!r} not offered; valid: {valid} or null (float)")
    return next(b for b in SUPPORTED_ACTIVATION_BITS if b == value)  # the offered int (8 for 8.0, as int() gave)


class CalibrationMethod(str, Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"


def calibration_method(value: object) -> CalibrationMethod:
    """`value` as a CalibrationMethod; ConfigError naming the valid ones otherwise."""
    try:
        return CalibrationMethod(value)
    except ValueError:
        valid = ", ".join(m.value for m in CalibrationMethod)
        raise ConfigError(f"activation calibration {value!r} not offered; valid: {valid}") from None


@dataclass(frozen=True)
class Calibration:
    """How input ranges are measured; the evaluator caches ranges per Calibration.

    Args:
        method: ``minmax`` (extremes) or ``percentile`` (tails clipped at `percentile`).
        percentile: the upper percentile taken (the lower one is 100 - it), in (50, 100].
        images: calibration images the ranges are measured on (the first ones of the calib split).
        samples: input values per layer the percentiles are estimated on (a seeded subsample).
        seed: the subsample's seed.
    """

    method: CalibrationMethod = CalibrationMethod.PERCENTILE
    percentile: float = 99.99
    images: int = 256
    samples: int = 2**20
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", calibration_method(self.method))
        if not 50 < self.percentile <= 100:
            raise ConfigError(f"activation percentile must be in (50, 100], got {self.percentile!r}")
        if self.images < 1 or self.samples < 1:
            raise ConfigError(
                f"activation calibration needs images and samples >= 1, got {self.images}, {self.samples}"
            )

    def __str__(self) -> str:  # how run output names it ("input ranges (percentile 99.99, 256 images)")
        how = f"percentile {self.percentile:g}" if self.method is CalibrationMethod.PERCENTILE else self.method.value
        return f"{how}, {self.images} images"


@dataclass(frozen=True)
class InputQParams:
    """Asymmetric per-tensor quantization of one layer's input: unsigned `bits`-bit codes."""

    scale: float  # float32-representable (what the packed export stores)
    zero_point: int
    bits: int = 8

    @property
    def qmax(self) -> int:
        return 2**self.bits - 1

    @classmethod
    def from_range(cls, lo: float, hi: float, bits: int = 8) -> InputQParams:
        """The grid covering [lo, hi] widened to hold 0 (0 is then exactly a code)."""
        qmax = 2**bits - 1
        lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
        scale = float(torch.tensor((hi - lo) / qmax, dtype=torch.float32))
        if not math.isfinite(scale) or scale <= 0:  # a constant-zero input: any grid holds it
            return cls(1.0, 0, bits)
        return cls(scale, int(min(max(round(-lo / scale), 0), qmax)), bits)


def fake_quantize(x: torch.Tensor, qp: InputQParams) -> torch.Tensor:
    """`x` quantized to `qp`'s grid and back (same shape and dtype)."""
    q = torch.clamp(torch.round(x / qp.scale) + qp.zero_point, 0, qp.qmax)
    return ((q - qp.zero_point) * qp.scale).to(x.dtype)


def input_ranges(
    model: nn.Module, modules: Mapping[str, nn.Module], x: torch.Tensor | Images, calibration: Calibration,
    batch_size: int = 128,
) -> dict[str, tuple[float, float]]:
    """(low, high) of each module's input over the images `x`, as `calibration` measures it.

    Runs `model` (in inference mode, as it is: calibrate the float model) on `x` in batches, with
    forward pre-hooks on `modules` reading their inputs.
    """
    lo = dict.fromkeys(modules, math.inf)
    hi = dict.fromkeys(modules, -math.inf)
    samples: dict[str, list[torch.Tensor]] = {n: [] for n in modules}
    n_batches = max(1, math.ceil(x.shape[0] / batch_size))
    per_batch = max(1, calibration.samples // n_batches)
    gen = torch.Generator().manual_seed(calibration.seed)
    percentile = calibration.method is CalibrationMethod.PERCENTILE

    def hook(name: str, m: nn.Module, inp: torch.Tensor) -> None:
        v = inp.detach().reshape(-1)
        lo[name], hi[name] = min(lo[name], float(v.min())), max(hi[name], float(v.max()))
        if percentile:
            if v.numel() > per_batch:  # memory: a seeded subsample (with replacement) of the values
                v = v[torch.randint(v.numel(), (per_batch,), generator=gen).to(v.device)]
            samples[name].append(v.float().cpu())

    feed_inputs(model, modules, x, batch_size, hook)
    if percentile:
        q = torch.tensor([1 - calibration.percentile / 100, calibration.percentile / 100], dtype=torch.float64)
        for name in modules:
            v = torch.cat(samples[name]).double()
            lo[name], hi[name] = (float(t) for t in torch.quantile(v, q))
    return {n: (lo[n], hi[n]) for n in modules}


def install_input_quantizers(modules: Mapping[str, nn.Module], qparams: Mapping[str, InputQParams]
                             ) -> list[RemovableHandle]:
    """Forward pre-hooks fake-quantizing each named module's first input; the caller removes them.

    `modelopt.load` leaves them on the model it rebuilds; `fake_quantized_inputs` removes them.
    """
    missing = sorted(set(qparams) - set(modules))
    if missing:
        raise ConfigError(f"no layer {missing[0]!r} to quantize the input of; layers: {', '.join(modules)}")

    handles = []
    try:
        for name, qp in qparams.items():
            handles.append(modules[name].register_forward_pre_hook(_InputQuantizer(qp)))
    except BaseException:
        for h in handles:
            h.remove()
        raise
    return handles


@dataclass(frozen=True)
class _InputQuantizer:
    """The pre-hook: an object, not a closure, so a model carrying it still pickles."""

    qparams: InputQParams

    def __call__(self, module: nn.Module, inp: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (fake_quantize(inp[0], self.qparams), *inp[1:])


@contextlib.contextmanager
def fake_quantized_inputs(modules: Mapping[str, nn.Module], qparams: Mapping[str, InputQParams]) -> Iterator[None]:
    """Within the block, each module named in `qparams` sees its input quantize-dequantized.

    The hooks are removed on exit, also when the block raises.

    Example:
        >>> with fake_quantized_inputs(workload.modules, {"layer1.0.conv1": InputQParams(0.02, 0)}):
        ...     logits = workload.logits(x)
    """
    handles = install_input_quantizers(modules, qparams)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
