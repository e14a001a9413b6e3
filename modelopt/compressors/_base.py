"""The compressor plugin surface: a menu of choices per layer, apply, size accounting, export forms.

Export asks each compressor of a layer's chain, in order, for its part of the stored form
(`Compressor.pack` -> `WeightForm`): pruning adds the kept-weight mask, quantization the integer
codes and scales (`IntegerWeight`). The writers (`modelopt.exporters`) store those forms and never
ask which compressor made them, so a new compressor exports by implementing `pack`.
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import numpy as np
import torch
from torch import nn

from modelopt.compressors._surface import ReportColumn, Setting
from modelopt.errors import ConfigError
from modelopt.model.images import Images
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer

if TYPE_CHECKING:  # annotations only: the workload is built from modules that import this one's plugins
    from modelopt.model.workload import Workload

Choice = Hashable  # None means "this compressor leaves the layer alone"
SCALE_BYTES = 2  # float16 scales
SCALE_DTYPE = torch.float16
_MIN_SCALE = 2.0**-24  # smallest positive float16 (subnormal): a scale never rounds to zero
E = TypeVar("E", bound=Enum)


def enum_member(enum: type[E], value: object, what: str, where: str) -> E:
    """`value` as a member of `enum`; a ConfigError naming it and the valid values otherwise."""
    try:
        return enum(value)
    except ValueError:
        valid = ", ".join(m.value for m in enum)
        raise ConfigError(f"{where}: {what} {value!r} not offered; valid: {valid}") from None


def index_bytes_per_entry(numel: int) -> int:
    """Bytes of one position in an index list over `numel` weights (smallest unsigned int that fits)."""
    return 1 if numel <= 2**8 else 2 if numel <= 2**16 else 4


def sparse_index_bytes(numel: int, kept: int) -> int:
    """Bytes saying which of `numel` weights are kept: the cheaper of a bitmask and an index list."""
    return min(math.ceil(numel / 8), kept * index_bytes_per_entry(numel))


def sparse_encoding(numel: int, kept: int) -> str:
    """``mask`` (one bit per weight) or ``index`` (kept positions), whichever is smaller."""
    return "index" if kept * index_bytes_per_entry(numel) < math.ceil(numel / 8) else "mask"


def encode_mask(mask: torch.Tensor) -> np.ndarray:
    """The bytes saying which weights are kept: packed bits or little-endian positions."""
    flat = mask.reshape(-1).cpu().numpy()
    if sparse_encoding(flat.size, int(flat.sum())) == "mask":
        return np.packbits(flat, bitorder="little")
    width = index_bytes_per_entry(flat.size)
    return np.flatnonzero(flat).astype(f"<u{width}").view(np.uint8)


def decode_mask(buf: np.ndarray, shape: Sequence[int], kept: int) -> torch.Tensor:
    """Inverse of `encode_mask` (reads exactly `sparse_index_bytes(numel, kept)` bytes)."""
    numel = math.prod(shape)
    if sparse_encoding(numel, kept) == "mask":
        flat = np.unpackbits(buf[: math.ceil(numel / 8)], bitorder="little")[:numel].astype(bool)
    else:
        width = index_bytes_per_entry(numel)
        pos = buf[: kept * width].view(f"<u{width}").astype(np.int64)
        flat = np.zeros(numel, dtype=bool)
        flat[pos] = True
    return torch.from_numpy(flat).reshape(tuple(shape))


class Granularity(str, Enum):
    """Which weights share one scale: the tensor, an output channel, or `group_size` consecutive
    input weights of one output channel."""

    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"
    GROUP = "group"


def code_range(bits: int) -> tuple[int, int]:
    """The signed codes of `bits` bits: [-2^(bits-1), 2^(bits-1) - 1]."""
    return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1


def to_scale_dtype(s: torch.Tensor) -> torch.Tensor:
    """Rounds scales to what is stored (float16), returned as float32 for arithmetic."""
    return s.clamp(min=_MIN_SCALE, max=65504.0).to(SCALE_DTYPE).float()


def scale_units(weight: torch.Tensor, granularity: Granularity, group_size: int = 64) -> torch.Tensor:
    """The weight as (scale units, unit length), zero-padded for the last group."""
    w = weight.detach().float().reshape(weight.shape[0], -1)
    if granularity is Granularity.PER_TENSOR:
        return w.reshape(1, -1)
    if granularity is Granularity.PER_CHANNEL:
        return w
    n_groups = math.ceil(w.shape[1] / group_size)
    pad = n_groups * group_size - w.shape[1]
    if pad:
        w = torch.nn.functional.pad(w, (0, pad))
    return w.reshape(-1, group_size)


def pack_codes(codes: torch.Tensor, bits: int) -> np.ndarray:
    """Bit-packs signed codes into ceil(n * bits / 8) bytes (INT4: two per byte)."""
    offset = 2 ** (bits - 1)
    u = (codes.reshape(-1).cpu().to(torch.int16) + offset).numpy().astype(np.uint8)
    if bits == 8:
        return u
    bitplanes = np.unpackbits(u[:, None], axis=1, bitorder="little")[:, :bits]
    return np.packbits(bitplanes.reshape(-1), bitorder="little")


def unpack_codes(packed: np.ndarray, bits: int, shape: Sequence[int]) -> torch.Tensor:
    """Inverse of `pack_codes`."""
    n = int(np.prod(shape))
    offset = 2 ** (bits - 1)
    if bits == 8:
        u = packed[:n].astype(np.int16)
    else:
        bitplanes = np.unpackbits(packed, bitorder="little")[: n * bits].reshape(n, bits)
        u = (bitplanes.astype(np.int16) << np.arange(bits, dtype=np.int16)).sum(axis=1)
    return torch.from_numpy((u - offset).astype(np.int8)).reshape(tuple(shape))


@dataclass(frozen=True)
class IntegerWeight:
    """A weight stored as signed `bits`-bit codes times float16 scales (symmetric, zero point 0).

    The one integer layout every writer knows: the packed checkpoint stores the codes bit-packed
    with the scales and its `tag`; ONNX stores them behind a DequantizeLinear.
    """

    codes: torch.Tensor  # int8, the weight's (stored) shape
    scales: torch.Tensor  # float16: 1, one per output channel, or one per group of each channel
    bits: int
    granularity: Granularity = Granularity.PER_CHANNEL
    group_size: int = 64  # read only for GROUP

    @property
    def tag(self) -> str:
        """The layout as the packed index writes it: ``4/per_channel``, ``8/per_tensor``, ``4/g64``."""
        tail = f"g{self.group_size}" if self.granularity is Granularity.GROUP else self.granularity.value
        return f"{self.bits}/{tail}"

    @staticmethod
    def layout(tag: str) -> tuple[int, Granularity, int]:
        """(bits, granularity, group size) from a `tag`."""
        bits, tail = tag.split("/")
        if tail.startswith("g"):
            return int(bits), Granularity.GROUP, int(tail[1:])
        return int(bits), Granularity(tail), 64

    @staticmethod
    def n_scales(shape: Sequence[int], granularity: Granularity, group_size: int = 64) -> int:
        """Scales a weight of `shape` has under `granularity`."""
        if granularity is Granularity.PER_TENSOR:
            return 1
        if granularity is Granularity.PER_CHANNEL:
            return shape[0]
        return shape[0] * math.ceil(math.prod(shape[1:]) / group_size)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight: each code times its unit's scale."""
        codes = self.codes
        units = scale_units(codes.float(), self.granularity, self.group_size)
        flat = (units * self.scales.float().unsqueeze(1)).reshape(codes.shape[0], -1)
        return flat[:, : codes[0].numel()].reshape(codes.shape)


@dataclass(frozen=True)
class WeightForm:
    """One layer's weight as export stores it, built by the layer's compressors in order (`Compressor.pack`)."""

    weight: torch.Tensor  # the float weight the evaluator runs, at the stored shape (structured pruning sliced)
    mask: torch.Tensor | None = None  # bool, the weights unstructured sparsity keeps (the rest are 0); None: dense
    integer: IntegerWeight | None = None  # the codes `weight` dequantizes from; None: stored in float32


@dataclass(frozen=True)
class Storage:
    """How a layer's weight is stored once a chain of compressors has run (docs/certification.md, size_bytes).

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

    A compressor offers one through `Compressor.routing`; the evaluator (`modelopt.evaluation.routes`)
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
    # How the off choice (None) reads in reports and the Optuna export ("float" for a quantizer).
    off_label: ClassVar[str] = "off"
    # What users may set by name (each a --flag, a sweep-file key, an `optimize` keyword; `_surface.Setting`).
    settings: ClassVar[tuple[Setting, ...]] = ()
    # Columns of the per-layer map in reports (`_surface.ReportColumn`); none: one generic column.
    report_columns: ClassVar[tuple[ReportColumn, ...]] = ()
    # Whether its choices route samples (`routing`: early exit); a graph export cuts them into segments (`taps`).
    routes: ClassVar[bool] = False
    # The key a packed checkpoint stores a route's entries under (`Routing.pack`); None: it stores none.
    packed_key: ClassVar[str | None] = None

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
        images (None where the evaluator has none, e.g. a grouped conv pruned within a group); default: `apply`."""
        return self.apply(weight, choice)

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

    def kept_channels(self, weight: torch.Tensor, choice: Choice,
                      reader: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        """Indices (ascending) of the output channels `choice` keeps, for choices that remove
        channels (structured pruning of a channel group's root, `Layer.prunable`); None otherwise.
        `reader`: the weight and input second moments of the group's one plain reader, when it has one and
        the choice asks for calibration inputs (`input_images`): those readers are refitted on the channels
        kept (`modelopt.model.reconstruct`), and the choice may pick the channels by that refit's cost."""
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
        `calibration` attribute (`modelopt.compressors._inputs.Calibration`; default percentile).
        """
        return 32

    def routing(self, workload: Workload, decisions: Sequence[tuple[str, tuple[Choice, ...]]]) -> Routing | None:
        """How this compressor's choices route samples when plans are scored on `workload`, for its
        `decisions` ((layer, choices) each); None (the default): its choices route nothing."""
        return None

    @classmethod
    def unpack(cls, module: nn.Module, entries: list[Any], floats: torch.Tensor, meta: Mapping[str, Any]) -> nn.Module:
        """The loaded `module` wrapped as the route stored under `packed_key` describes (`floats`: the
        tensors `Routing.pack` wrote, in order; `meta`: the file's model record)."""
        raise NotImplementedError(f"compressor {cls.name!r} stores no route")

    def options(self) -> dict[str, Any]:
        """The constructor options, for run records."""
        return {}
