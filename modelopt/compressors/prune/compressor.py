"""Pruning: unstructured sparsity per layer (any weights, or 2:4), or structured removal of a channel group.

- ``unstructured``: a share of the layer's weights becomes exactly zero: with ``sparse_images`` (the tool's default),
  the ones whose loss costs the layer's output least, the loss pushed onto the weights kept (SparseGPT,
  `modelopt.compressors.prune.sparsegpt`); without, the smallest in magnitude. ``2:4`` keeps two of every four
  consecutive weights of a row, chosen the same way. The packed form stores which weights are kept (the cheaper of a
  bitmask and an index list) and the kept values (float32, or the quantizer's codes when the layer is also quantized:
  pruning runs first, so the quantizer's scales are searched on the pruned weight and zeros stay zero).
- ``structured``: a group root's output channels of smallest L1 (or L2) filter norm go, and with them
  everything the model's graph ties to them (`modelopt.model.channels`: the norm after it, a depthwise
  convolution, the layers reading them, a residual stream's other writers and readers, squeeze-excitation).
  Offered only on groups whose removal the evaluator's simulation (their weights, norms' scales and shifts and
  biases zeroed) computes exactly, checked on the model; the deployed model is physically smaller.

After pruning, the evaluator re-estimates batch-norm statistics on `bn_samples` calibration images
(forward passes only) and charges them to the trial.

Structured removal is repaired (``repair_images`` > 0, the default): each layer that reads removed channels is
refitted by least squares so that, from the channels left, it gives the float model's output on `repair_images`
calibration images (closed form from its input second moments, the ones GPTQ measures:
W_K = W H[:, K] H[K, K]^-1, K the kept input columns; `modelopt.solvers.least_squares`). Removal alone only deletes
what the kept channels cannot stand in for; the refit lets them stand in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.compressors._base import Choice, Compressor
from modelopt.compressors._calibration import CalibrationNeed
from modelopt.compressors._channels import RemovesChannels
from modelopt.compressors._packing import Storage, WeightForm
from modelopt.compressors._registry import COMPRESSORS
from modelopt.compressors._surface import Cell, ReportColumn
from modelopt.compressors.prune.options import Criterion, PruneKind, PruneOptions, prune_kind, sparsity_share
from modelopt.compressors.prune.sparsegpt import obs_prune
from modelopt.errors import ConfigError
from modelopt.model.channels import ChannelAnalysis
from modelopt.model.layer_inputs import LayerInputs
from modelopt.model.layers import Layer, LayerKind
from modelopt.solvers.least_squares import output_kept

_MIN_IN_CHANNELS = 4  # convs reading fewer channels (the stem on RGB, depthwise) are left alone


_PATTERN = (2, 4)  # what kind 2:4 keeps: two of every four


@dataclass(frozen=True)
class PruneSpec:
    """How one layer is pruned: the share of weights (unstructured) or output channels (structured) removed."""

    sparsity: float
    kind: PruneKind = PruneKind.UNSTRUCTURED

    def __str__(self) -> str:
        if self.kind is PruneKind.SEMI:
            return "sparse-2:4"
        return f"{'sparse' if self.kind is PruneKind.UNSTRUCTURED else 'channels'}-{self.sparsity:.0%}"


def n_kept(total: int, sparsity: float) -> int:
    """How many of `total` weights or channels survive `sparsity` (at least one)."""
    return max(1, total - math.floor(sparsity * total + 0.5))


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool mask (weight's shape) keeping exactly `n_kept` largest-magnitude weights; ties by position."""
    flat = weight.detach().reshape(-1).abs()
    keep = n_kept(flat.numel(), sparsity)
    if keep >= flat.numel():
        return torch.ones_like(weight, dtype=torch.bool)
    if not bool(torch.isfinite(flat).all()):  # a sort's order of NaNs is what the masks were defined by
        order = torch.argsort(flat, descending=True, stable=True)[:keep]
        mask = torch.zeros(flat.numel(), dtype=torch.bool, device=weight.device)
        mask[order] = True
        return mask.reshape(weight.shape)
    # The `keep` first of a stable descending sort, without sorting (a sort of a large layer's millions of weights
    # was most of the priors pass): every weight above the keep-th largest magnitude, then the first ones equal to it.
    kth = torch.kthvalue(flat.cpu(), flat.numel() - keep + 1).values.to(flat.device)
    mask = flat > kth
    ties = torch.nonzero(flat == kth).reshape(-1)[: keep - int(mask.sum())]
    mask[ties] = True
    return mask.reshape(weight.shape)


def pattern_mask(weight: torch.Tensor, n: int = _PATTERN[0], m: int = _PATTERN[1]) -> torch.Tensor:
    """Bool mask (weight's shape) keeping the `n` largest-magnitude of every `m` consecutive weights of a row (the
    weight flattened per output channel; its length a multiple of `m`); ties by position."""
    groups = weight.detach().reshape(weight.shape[0], -1, m).abs()
    top = torch.argsort(groups, dim=2, descending=True, stable=True)[:, :, :n]
    return torch.zeros_like(groups, dtype=torch.bool).scatter_(2, top, True).reshape(weight.shape)


def channel_order(weight: torch.Tensor, criterion: Criterion = Criterion.L1) -> torch.Tensor:
    """Output channels by decreasing filter norm (ties by position)."""
    rows = weight.detach().float().reshape(weight.shape[0], -1)
    norms = rows.abs().sum(1) if criterion is Criterion.L1 else rows.pow(2).sum(1)
    return torch.argsort(norms, descending=True, stable=True)


def kept_filters(weight: torch.Tensor, sparsity: float, criterion: Criterion = Criterion.L1) -> torch.Tensor:
    """Ascending indices of the output channels structured pruning keeps."""
    keep = channel_order(weight, criterion)[: n_kept(weight.shape[0], sparsity)]
    return torch.sort(keep).values



@COMPRESSORS.register("prune")
class Prune(Compressor, RemovesChannels):
    """Magnitude pruning (unstructured) and internal-channel pruning (structured), per layer.

    Takes its options as a record (`PruneOptions`, the tool's defaults when None) or as its fields by keyword,
    which change that record; the record checked every value when it was built, and `Prune` reads it
    (`self.opts`: `shares`, `kinds` and `ranking` are the offers in the types plans use).

    Offered on every conv reading at least 4 channels (not the stem that reads the image) and on
    linear layers; structured choices on the root of a channel group (`ChannelAnalysis.of(layer)`: the model's
    graph says which channels go together, `modelopt.model.channels`).

    Args:
        sparsity: shares offered: of the weights (unstructured) or of conv1's output channels (structured).
        kind: kinds offered: ``unstructured``, ``structured``, ``2:4``.
        criterion: how structured pruning ranks channels: ``output`` (what losing them costs the refitted reader's
            output, `output_kept`; L1 where that is not defined), ``l1`` or ``l2`` (filter norms).
        bn_samples: calibration images batch-norm statistics are re-estimated on after pruning (0: off).
        sparse_images: calibration images unstructured and 2:4 pruning choose their mask on and feed the pruned
            weights' error back with (SparseGPT, `modelopt.compressors.prune.sparsegpt`; 0: magnitude).
        repair_images: calibration images removed channels' readers are refitted on (0: none).
        channel_multiple: structured choices are offered only where the channels kept are a multiple of it.

    Example:
        >>> p = Prune(sparsity=(0.5,), kind=("unstructured",))
        >>> p.parse({"sparsity": 0.5, "kind": "structured"}, layer)
        PruneSpec(sparsity=0.5, kind=<PruneKind.STRUCTURED: 'structured'>)
    """

    order = 10  # before quantization
    report_columns = (ReportColumn("pruned", "Purples", lambda raw: _prune_cell(raw)),)
    record = PruneOptions
    opts: PruneOptions

    reduces = frozenset({"size", "bitops", "macs", "latency"})

    def calibration(self, choice: Choice) -> CalibrationNeed:
        """Layer inputs: for structured removal, the images the readers of the removed channels are refitted on
        (0: no repair); for unstructured and 2:4, the images their mask and error feedback are computed on (0:
        magnitude). Batch norms: re-estimated on `bn_samples` images after any pruning."""
        if not isinstance(choice, PruneSpec):
            return CalibrationNeed()
        o = self.opts
        inputs = o.repair_images if choice.kind is PruneKind.STRUCTURED else o.sparse_images
        return CalibrationNeed(layer_inputs=inputs, norm_images=o.bn_samples)

    def handles(self, layer: Layer) -> bool:
        return layer.kind is LayerKind.LINEAR or layer.in_channels >= _MIN_IN_CHANNELS

    def menu(self, layer: Layer) -> tuple[Choice, ...]:
        o = self.opts
        specs: list[Choice] = [None]
        if PruneKind.UNSTRUCTURED in o.kinds and self.handles(layer):
            specs += [PruneSpec(s) for s in o.shares]
        if PruneKind.SEMI in o.kinds and _fits_pattern(layer):
            specs.append(PruneSpec(0.5, PruneKind.SEMI))
        if PruneKind.STRUCTURED in o.kinds and ChannelAnalysis.of(layer).members:
            specs += [PruneSpec(s, PruneKind.STRUCTURED) for s in o.shares
                      if n_kept(layer.out_channels, s) % o.channel_multiple == 0]
        return tuple(specs) if len(specs) > 1 else ()

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Choice:
        if raw is None:
            return None
        where = f"prune for {layer.name}"
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{where}: expected a mapping like {{sparsity: 0.5, kind: unstructured}} or null, got {raw!r}"
            )
        unknown = set(raw) - {"sparsity", "kind"}
        if unknown:
            raise ConfigError(f"{where}: unknown key {min(unknown)!r}; valid: sparsity, kind")
        if "sparsity" not in raw:
            raise ConfigError(f"{where}: 'sparsity' is required (a share in (0, 1), e.g. 0.5)")
        share = sparsity_share(raw["sparsity"], where)
        spec = PruneSpec(share, prune_kind(raw.get("kind", PruneKind.UNSTRUCTURED)))
        if spec.kind is PruneKind.SEMI and spec.sparsity != 0.5:
            raise ConfigError(f"{where}: sparsity {spec.sparsity:g} is not what kind '2:4' prunes: 2:4 keeps two of "
                              "every four weights of a row, which is sparsity 0.5; write sparsity: 0.5, or kind: "
                              f"unstructured for sparsity {spec.sparsity:g}")
        if spec.kind is PruneKind.SEMI and not _fits_pattern(layer):
            raise ConfigError(f"{where}: kind '2:4' keeps two of every four weights of a row (sparsity 0.5) and "
                              f"needs a layer reading >= {_MIN_IN_CHANNELS} channels whose rows are a multiple of "
                              "4 weights long; use kind: unstructured here")
        if spec.kind is PruneKind.UNSTRUCTURED and not self.handles(layer):
            raise ConfigError(f"{where}: this layer reads {layer.in_channels} channels; prune only layers reading "
                              f">= {_MIN_IN_CHANNELS} (not the stem)")
        if spec.kind is PruneKind.STRUCTURED and not ChannelAnalysis.of(layer).members:
            raise ConfigError(f"{where}: kind 'structured' needs a layer whose output channels a checked channel "
                              "group removes (a block's conv1, an expansion conv, ...); use kind: unstructured here")
        return spec

    def dump(self, choice: Choice) -> dict[str, Any] | None:
        if choice is None:
            return None
        assert isinstance(choice, PruneSpec)
        return {"sparsity": choice.sparsity, "kind": choice.kind.value}

    def apply(self, weight: torch.Tensor, choice: Choice) -> torch.Tensor:
        if choice is None:
            return weight
        assert isinstance(choice, PruneSpec)
        if choice.kind is not PruneKind.STRUCTURED:
            return weight * self._mask(weight, choice).to(weight.dtype)
        out = torch.zeros_like(weight)
        keep = kept_filters(weight, choice.sparsity, self.opts.ranking)
        out[keep] = weight[keep]
        return out

    def apply_calibrated(self, weight: torch.Tensor, choice: Choice, inputs: LayerInputs | None) -> torch.Tensor:
        if not isinstance(choice, PruneSpec) or choice.kind is PruneKind.STRUCTURED:
            return self.apply(weight, choice)
        return self._sparse(weight, choice, inputs)[0]

    def _mask(self, weight: torch.Tensor, choice: PruneSpec) -> torch.Tensor:
        return pattern_mask(weight) if choice.kind is PruneKind.SEMI else magnitude_mask(weight, choice.sparsity)

    def _sparse(self, weight: torch.Tensor, choice: PruneSpec, inputs: LayerInputs | None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the pruned weight, its kept-weight mask) of an unstructured or 2:4 choice: SparseGPT's where there are
        inputs, magnitude's otherwise."""
        if inputs is None:
            mask = self._mask(weight, choice)
            return weight * mask.to(weight.dtype), mask
        pattern = _PATTERN if choice.kind is PruneKind.SEMI else None
        return obs_prune(weight, inputs, weight.numel() - n_kept(weight.numel(), choice.sparsity), pattern)

    def kept_channels(self, weight: torch.Tensor, choice: Choice,
                      reader: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor | None:
        if not isinstance(choice, PruneSpec) or choice.kind is not PruneKind.STRUCTURED:
            return None
        if self.opts.ranking is Criterion.OUTPUT and reader is not None:
            return output_kept(reader[0], reader[1], n_kept(weight.shape[0], choice.sparsity)).to(weight.device)
        return kept_filters(weight, choice.sparsity, self.opts.ranking)

    def pack(self, form: WeightForm, choice: Choice, inputs: LayerInputs | None = None) -> WeightForm:
        """Unstructured: the kept-weight mask (export stores the kept values and the mask's encoding).
        Structured: nothing to add, the weight handed over is already the kept channels' slice."""
        if not isinstance(choice, PruneSpec) or choice.kind is PruneKind.STRUCTURED:
            return form
        return WeightForm(*self._sparse(form.weight, choice, inputs))

    def stored(self, layer: Layer, choice: Choice, inner: Storage) -> Storage:
        # Structured pruning is already in `layer`'s (the stored) shape: the evaluator slices first.
        if not isinstance(choice, PruneSpec) or choice.kind is PruneKind.STRUCTURED:
            return inner
        return Storage(inner.shape, n_kept(inner.numel, choice.sparsity), inner.value_bits, inner.extra_bytes)

    def weight_bytes(self, layer: Layer, choice: Choice) -> int:
        if choice is None:
            return layer.params * 4
        assert isinstance(choice, PruneSpec)
        shape = layer.weight_shape
        if choice.kind is PruneKind.STRUCTURED:
            shape = (n_kept(shape[0], choice.sparsity), *shape[1:])
        return self.stored(layer, choice, Storage(shape)).bytes

    def macs_saved(self, layer: Layer, choice: Choice, layers: Mapping[str, Layer]) -> int:
        """Structured pruning removes its share of the MACs of every layer of the group (rows or columns)."""
        if not isinstance(choice, PruneSpec) or choice.kind is not PruneKind.STRUCTURED:
            return 0
        removed = 1.0 - n_kept(layer.out_channels, choice.sparsity) / layer.out_channels
        return round(removed * sum(layers[m].macs for m, _ in ChannelAnalysis.of(layer).members if m in layers))


def _fits_pattern(layer: Layer) -> bool:
    """2:4 is offered on layers pruning handles whose rows (weight flattened per output channel) split into fours."""
    return (layer.kind is LayerKind.LINEAR or layer.in_channels >= _MIN_IN_CHANNELS) and \
        math.prod(layer.weight_shape[1:]) % _PATTERN[1] == 0


def _prune_cell(raw: Mapping[str, Any] | None) -> Cell:
    if raw is None:
        return Cell("dense", None)
    share = float(raw["sparsity"])
    if raw.get("kind") == PruneKind.SEMI.value:
        return Cell("sparse 2:4", share)
    kind = "channels" if raw.get("kind") == "structured" else "sparse"
    return Cell(f"{kind} {share:.0%}", share)
