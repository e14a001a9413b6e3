"""Weight quantization: symmetric INT2..INT8, per-tensor, per-channel or group-wise scales; or rate grids.

Each scale unit (the tensor, an output channel, or a block of `group_size`
consecutive input weights of one output channel) gets the scale that minimises
its squared quantization error over a grid of clipping ratios. Codes use the full
signed range [-2^(b-1), 2^(b-1)-1]; scales are stored as float16 (as deployed INT4/INT8
kernels take them), and the search scores each candidate with its float16-rounded scale,
so the quantize-dequantize the evaluator runs is exactly what the packed export decodes.

A spec may also quantize the layer's input activations (`ActQuantSpec`, W8A8): the evaluator
calibrates static uint8 ranges for them (`modelopt.compressors._inputs`) and counts the layer's
bitops at 8 activation bits; the layer then also stores its input's scale and zero point.

A rate grid (`RateSpec`, offered by `rates`) stores int8 codes on an unclipped per-channel grid whose step is set
for the codes' entropy (`modelopt.compressors.quantize.rate`); the packed file entropy codes them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from modelopt.compressors._base import Choice, Compressor, Precision
from modelopt.compressors._calibration import CalibrationNeed
from modelopt.compressors._inputs import QPARAM_BYTES, Calibration
from modelopt.compressors._inputs import activation_bits as _activation_bits
from modelopt.compressors._packing import (
    SCALE_BYTES,
    SCALE_DTYPE,
    Granularity,
    IntegerWeight,
    Storage,
    WeightForm,
    scale_units,
    to_scale_dtype,
)
from modelopt.compressors._packing import code_range as _code_range
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._surface import Cell, ReportColumn, enum_member
from modelopt.compressors.quantize.gptq import Rounding, gptq_round
from modelopt.compressors.quantize.options import CLIP_RATIOS, SUPPORTED_BITS, QuantizeOptions
from modelopt.compressors.quantize.rate import quantize_rate
from modelopt.compressors.quantize.spec import ActQuantSpec, QuantSpec, RateSpec
from modelopt.errors import ConfigError
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer

__all__ = ["ActQuantSpec", "Granularity", "QuantSpec", "Quantize", "QuantizeOptions", "RateSpec", "Rounding",
           "dequantize", "parse_rounding", "quantize", "search_scales"]

# The clipping search minimises sum |q*s - w|^p, not the squared error: squared error clips the large weights that
# matter most and loses accuracy at low bit widths. p was chosen on the calibration split (training images), never
# on val or test, the larger p the fewer the bits (measured: docs/compressors.md#measured).
ERROR_P_DEFAULT = 3.0
ERROR_P_LOW_BITS = 6.0  # for 2 and 3 bits
NORM_BITS = 4  # a plan with a layer at this many bits or fewer may re-estimate batch norms (norm_images)


def error_p(bits: int) -> float:
    """The exponent of the error the clipping search minimises at `bits`."""
    return ERROR_P_LOW_BITS if bits <= 3 else ERROR_P_DEFAULT


def search_scales(units: torch.Tensor, bits: int, ratios: Sequence[float] | None = None) -> torch.Tensor:
    """Per-unit stored (float16-rounded) scale minimising sum(|q*s - w|^p) over clipping ratios of max|w|."""
    ratios = CLIP_RATIOS if ratios is None else ratios
    p = error_p(bits)
    qmin, qmax = _code_range(bits)
    amax = units.abs().amax(dim=1)
    amax = torch.where(amax > 0, amax, torch.ones_like(amax))
    best_err = torch.full_like(amax, float("inf"))
    best_scale = to_scale_dtype(amax / qmax)
    for r in ratios:
        s = to_scale_dtype(r * amax / qmax).unsqueeze(1)
        # Errors relative to the unit's max|w| (a per-unit constant, so the argmin is unchanged):
        # keeps |.|^p within float range for tiny and large weights alike.
        rel = (torch.clamp(torch.round(units / s), qmin, qmax) * s - units).abs() / amax.unsqueeze(1)
        err = (rel**p).sum(dim=1)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_scale = torch.where(better, s.squeeze(1), best_scale)
    return best_scale


def quantize(
    weight: torch.Tensor, spec: QuantSpec, ratios: Sequence[float] | None = None, inputs: LayerInputs | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer codes (int8 tensor, same shape as `weight`) and float16 scales (one per unit).

    `ratios`: the clipping ratios searched (default CLIP_RATIOS; (1.0,) is plain max-scaling).
    `inputs`: the layer's calibration inputs; with them a GPTQ spec picks its codes by GPTQ
    (scales are the same either way). Without them every spec rounds to nearest.
    """
    units = scale_units(weight, spec.granularity, spec.group_size)
    scales = search_scales(units, spec.bits, ratios)
    qmin, qmax = _code_range(spec.bits)
    if spec.rounding is Rounding.GPTQ and inputs is not None:
        codes = gptq_round(weight, _per_weight(scales, spec, weight), qmin, qmax, inputs)
    else:
        codes = torch.clamp(torch.round(units / scales.unsqueeze(1)), qmin, qmax)
        codes = codes.reshape(weight.shape[0], -1)[:, : weight[0].numel()].reshape(weight.shape)
    return codes.to(torch.int8), scales.to(SCALE_DTYPE)


def _per_weight(scales: torch.Tensor, spec: QuantSpec, weight: torch.Tensor) -> torch.Tensor:
    """Each weight's scale, as the weight flattened per output channel (rows x fan-in)."""
    rows, k = weight.shape[0], weight[0].numel()
    if spec.granularity is Granularity.PER_TENSOR:
        return scales.reshape(1, 1).expand(rows, k)
    if spec.granularity is Granularity.PER_CHANNEL:
        return scales.reshape(rows, 1).expand(rows, k)
    return scales.reshape(rows, -1).repeat_interleave(spec.group_size, dim=1)[:, :k]


def integer_weight(codes: torch.Tensor, scales: torch.Tensor, spec: QuantSpec) -> IntegerWeight:
    """The stored form of codes and scales under `spec` (what the packed export and ONNX write)."""
    return IntegerWeight(codes, scales, spec.bits, spec.granularity, spec.group_size)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """Float weights from codes and scales (the inverse mapping export's loader uses)."""
    return integer_weight(codes, scales, spec).dequantize()


def n_scales(layer: Layer, spec: QuantSpec) -> int:
    return IntegerWeight.n_scales(layer.weight_shape, spec.granularity, spec.group_size)


@COMPRESSORS.register("quantize")
class Quantize(Compressor):
    """Weight quantization with an error-minimising scale per unit.

    Takes its options as a record (`QuantizeOptions`, the tool's defaults when None) or as its fields by keyword,
    which change that record.

    Args:
        bits: bit widths offered to the search (any of 2..8).
        granularity: scale granularities offered (per_tensor, per_channel, group).
        group_size: input weights sharing one scale for `group`.
        clip_ratios: clipping ratios of max|w| searched per scale unit; (1.0,) is max-scaling.
        activations: input activation bits offered with every weight choice (None: float inputs;
            8: uint8 inputs, W8A8). The default offers float inputs only.
        act_calibration: how input ranges are calibrated: ``percentile`` or ``minmax``.
        act_percentile: the tail percentile ``percentile`` calibration keeps, in (50, 100].
        act_calibration_images: calibration images the ranges are measured on.
        rounding: how codes are picked, offered to the search (nearest, gptq); a plan entry
            without `rounding` takes the first offered.
        rates: rate grids offered (`RateSpec`: bits per weight once entropy coded, in [1, 6]), each
            with every offered rounding; weight-only, per channel. None by default.
        calib_images: calibration images GPTQ's input second moments are measured on.
        norm_images: calibration images batch-norm statistics are re-estimated on for a plan with
            a layer at `NORM_BITS` or fewer (0: never); it lifts agreement most at the fewest bits
            (measured: docs/compressors.md#measured). Charged per plan like pruning's re-estimation.

    Example:
        >>> q = Quantize(bits=(8, 4), granularity=("per_channel", "group"))
        >>> calibrated = Quantize(bits=(4, 3, 2), rounding=("gptq",))
        >>> w8a8 = Quantize(bits=(8,), activations=(None, 8), act_calibration="minmax")
        >>> coded = Quantize(bits=(8,), rates=(2.5, 3.0))
    """

    order = 20  # after pruning: scales are searched on the pruned weight
    off_label = "float"
    record = QuantizeOptions
    opts: QuantizeOptions
    report_columns = (
        ReportColumn("bits", "YlOrRd", lambda raw: _bits_cell(raw)),
        ReportColumn("scales", "Blues", lambda raw: _granularity_cell(raw)),
        ReportColumn("inputs", "Oranges", lambda raw: _activations_cell(raw)),
    )

    # What the search is offered, read from the record (`QuantizeOptions` checked every value when it was built):
    # each offer once, in the order given, as the types plans use.
    @property
    def bits(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(int(b) for b in self.opts.bits))

    @property
    def granularity(self) -> tuple[Granularity, ...]:
        return tuple(dict.fromkeys(_granularity(g) for g in self.opts.granularity))

    @property
    def group_size(self) -> int:
        return int(self.opts.group_size)

    @property
    def clip_ratios(self) -> tuple[float, ...]:
        return tuple(float(r) for r in self.opts.clip_ratios)

    @property
    def activations(self) -> tuple[int | None, ...]:
        return tuple(dict.fromkeys(_activation_bits(a) for a in self.opts.activations))

    @property
    def input_calibration(self) -> Calibration:
        return self.opts.calibration

    @property
    def rounding(self) -> tuple[Rounding, ...]:
        return tuple(dict.fromkeys(_rounding(r) for r in self.opts.rounding))

    @property
    def rates(self) -> tuple[float, ...]:
        return tuple(dict.fromkeys(float(r) for r in self.opts.rates))

    @property
    def calib_images(self) -> int:
        return int(self.opts.calib_images)

    @property
    def norm_images(self) -> int:
        return int(self.opts.norm_images)

    def _canonical(self, spec: QuantSpec, layer: Layer) -> QuantSpec:
        if isinstance(spec, RateSpec):
            return spec  # per channel, weight-only: already canonical
        # One group covering a whole channel is per-channel quantization: same math, same bytes.
        if spec.granularity is Granularity.GROUP and layer.fan_in <= spec.group_size:
            per_channel = QuantSpec(spec.bits, Granularity.PER_CHANNEL, rounding=spec.rounding)
            return per_channel.with_activations(spec.activations)
        if spec.granularity is not Granularity.GROUP:
            return QuantSpec(spec.bits, spec.granularity, rounding=spec.rounding).with_activations(spec.activations)
        return spec

    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        specs = (
            self._canonical(QuantSpec(b, g, self.group_size, r).with_activations(a), layer)
            for b, g, r, a in itertools.product(self.bits, self.granularity, self.rounding, self.activations)
        )
        rates = (RateSpec(rate=r, rounding=ro) for r, ro in itertools.product(self.rates, self.rounding))
        return (None, *dict.fromkeys(specs), *rates)

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise ConfigError(f"quantize for {layer.name}: expected a mapping like {{bits: 4}} or null, got {raw!r}")
        unknown = set(raw) - {"bits", "rate", "granularity", "group_size", "activations", "rounding"}
        if unknown:
            raise ConfigError(f"quantize for {layer.name}: unknown key {min(unknown)!r}; "
                              "valid: bits, granularity, group_size, activations, rounding, rate")
        if raw.get("rate") is not None:
            return RateSpec.parse(raw, f"quantize for {layer.name}", self.rounding[0])
        bits = raw.get("bits")
        if bits is None:
            raise ConfigError(
                f"quantize for {layer.name}: 'bits' is required (one of {', '.join(map(str, SUPPORTED_BITS))})"
            )
        if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
            raise ConfigError(
                f"quantize for {layer.name}: bits {bits!r} not offered; valid: {', '.join(map(str, SUPPORTED_BITS))}"
            )
        gran = _granularity(raw.get("granularity", Granularity.PER_CHANNEL))
        group_size = raw.get("group_size", self.group_size)
        if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
            raise ConfigError(f"quantize for {layer.name}: group_size must be a positive integer, got {group_size!r}")
        acts = _activation_bits(raw.get("activations"), f"quantize for {layer.name}")
        rounding = _rounding(raw.get("rounding", self.rounding[0]), f"quantize for {layer.name}")
        return self._canonical(QuantSpec(int(bits), gran, group_size, rounding).with_activations(acts), layer)

    def dump(self, choice: Choice) -> dict[str, Any] | None:
        if choice is None:
            return None
        if isinstance(choice, RateSpec):
            # `bits: null` (and `rate: null` on INT entries): plan files merge a layer's entry over the default's,
            # where a rate entry over an INT4 default would otherwise read as both.
            rate: dict[str, Any] = {"bits": None, "rate": choice.rate, "granularity": choice.granularity.value,
                                    "rounding": choice.rounding.value}
            return rate if self.activations == (None,) else {**rate, "activations": None}
        assert isinstance(choice, QuantSpec)
        out: dict[str, Any] = {"bits": choice.bits, "granularity": choice.granularity.value}
        if self.rates:  # written only by a quantizer that offers rates, so other plan files stay as they were
            out["rate"] = None
        if choice.granularity is Granularity.GROUP:
            out["group_size"] = choice.group_size
        # Float inputs are written only by a quantizer that offers quantized ones, so a default
        # quantizer's plan files stay as they were; there a layer's `activations: null` must be
        # explicit, as plan files merge each layer's entry over the default's.
        if choice.activations is not None or self.activations != (None,):
            out["activations"] = choice.activations
        # Likewise rounding: a plan entry without it takes the quantizer's first offered rounding.
        if choice.rounding is not Rounding.NEAREST or self.rounding != (Rounding.NEAREST,):
            out["rounding"] = choice.rounding.value
        return out

    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        return self.apply_calibrated(weight, choice, None)

    def calibration(self, choice: Choice) -> CalibrationNeed:
        """GPTQ's layer inputs, batch norms re-estimated at `NORM_BITS` or fewer, and quantized inputs' ranges."""
        if not isinstance(choice, QuantSpec):
            return CalibrationNeed()
        return CalibrationNeed(layer_inputs=self.calib_images if choice.rounding is Rounding.GPTQ else 0,
                               norm_images=self.norm_images if choice.weight_bits <= NORM_BITS else 0,
                               input_ranges=None if choice.activations is None else self.input_calibration)

    def apply_calibrated(self, weight: torch.Tensor, choice: Choice, inputs: LayerInputs | None) -> torch.Tensor:
        if choice is None:
            return weight
        codes, scales = self.encode(weight, choice, inputs)
        assert isinstance(choice, QuantSpec)
        return dequantize(codes, scales, choice).to(weight.dtype)

    def encode(self, weight: torch.Tensor, choice: Choice, inputs: LayerInputs | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """The codes and float16 scales `choice` stores for `weight` (what `apply` dequantizes).

        `inputs`: the layer's calibration inputs (`Evaluator.layer_inputs`), used by GPTQ choices.
        """
        if isinstance(choice, RateSpec):
            return quantize_rate(weight, choice, inputs)
        assert isinstance(choice, QuantSpec)
        return quantize(weight, choice, self.clip_ratios, inputs)

    def pack(self, form: WeightForm, choice: Choice, inputs: LayerInputs | None = None) -> WeightForm:
        """The codes and scales `choice` stores (of the kept weights, under a mask: zeros stay code 0)."""
        if choice is None:
            return form
        assert isinstance(choice, QuantSpec)
        integer = integer_weight(*self.encode(form.weight, choice, inputs), choice)
        return WeightForm(integer.dequantize().to(form.weight.dtype), form.mask, integer)

    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        if choice is None:
            return layer.params * 4
        assert isinstance(choice, QuantSpec)
        return math.ceil(layer.params * choice.value_bits / 8) + _extra_bytes(layer, choice)

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        if choice is None:
            return inner
        assert isinstance(choice, QuantSpec)
        if isinstance(choice, RateSpec):
            # int8 codes (what a layer left bit-packed costs), priced as coded at `rate` bits a kept value: an
            # estimate, which the evaluator replaces by the coded bytes of the real codes.
            packed = Storage(inner.shape, inner.kept, choice.bits, _extra_bytes(layer, choice))
            values = packed.numel if packed.kept is None else packed.kept
            return dataclasses.replace(packed, coded=math.ceil(values * choice.rate / 8) + packed.index_bytes)
        # Kept values (all of them when dense) become codes; one float16 scale per unit.
        return Storage(inner.shape, inner.kept, choice.bits, _extra_bytes(layer, choice))

    def precision(self, choice: Choice) -> Precision:
        if choice is None:
            return Precision()
        assert isinstance(choice, QuantSpec)
        return Precision(choice.weight_bits, 32 if choice.activations is None else choice.activations)


def _extra_bytes(layer: Layer, spec: QuantSpec) -> int:
    """One float16 scale per unit; with quantized inputs, the input's scale and zero point too."""
    return n_scales(layer, spec) * SCALE_BYTES + (0 if spec.activations is None else QPARAM_BYTES)


def parse_rounding(values: Sequence[object]) -> tuple[Rounding, ...]:
    """Rounding names as `Rounding`s; raises ConfigError naming a bad one and the valid ones."""
    return tuple(_rounding(v) for v in values)


def _rounding(value: object, where: str = "quantize") -> Rounding:
    return enum_member(Rounding, value, "rounding", where)


def _granularity(value: object) -> Granularity:
    return enum_member(Granularity, value, "granularity", "quantize")


def _bits_cell(raw: Mapping[str, Any] | None) -> Cell:
    if raw is None:
        return Cell("float", None)
    rate = raw.get("rate")
    bits = float(rate) if rate is not None else int(raw["bits"])
    label = f"r{bits}" if rate is not None else f"int{bits}"
    return Cell(label, min(1.0, max(0.0, 1.0 - math.log2(bits) / 4.0)) * 0.85 + 0.1)


_GRAN_LEVEL = {"per_tensor": 0.75, "per_channel": 0.45, "group": 0.2}  # coarser scales: fewer bytes, more error


def _granularity_cell(raw: Mapping[str, Any] | None) -> Cell:
    if raw is None:
        return Cell("–", None)
    gran = str(raw.get("granularity", "per_channel"))
    label = f"group {raw.get('group_size', 64)}" if gran == "group" else gran.replace("_", "-")
    return Cell(label, _GRAN_LEVEL.get(gran, 0.5))


def _activations_cell(raw: Mapping[str, Any] | None) -> Cell:
    acts = None if raw is None else raw.get("activations")
    return Cell("float", None) if acts is None else Cell(f"a{int(acts)}", 0.6)
