"""Layer fingerprints: what makes a layer of one model "the same kind of layer" as one of another.

A fingerprint is the layer's kind and weight shape, exactly, and three weight statistics quantised
coarsely: the scale (std, in half-octaves), the centre (mean / std, in quarters) and the tails
(abs-max / std, in half-octaves). Two fingerprints *match* when kind and shape agree and every
statistic lies within `TOLERANCE` bins: a copy of a layer matches itself, the same block of a
deeper sibling model (ResNet-20's and ResNet-56's 3x3 convolutions of one stage) usually matches,
a layer of another shape or a weight on another scale does not. The model family (the model's name
without its trailing depth: ``cifar10_resnet20`` -> ``cifar10_resnet``) is part of the store's key,
so layers of unrelated models never meet.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["TOLERANCE", "LayerPrint", "model_family"]

TOLERANCE = 1  # bins each statistic may differ by between matching layers


def model_family(model_name: str) -> str:
    """The model's name without its trailing depth or size digits (``cifar10_resnet56`` -> ``cifar10_resnet``).

    Example:
        >>> model_family("torchvision:resnet18")
        'torchvision:resnet'
    """
    return re.sub(r"[-_]?\d+$", "", model_name) or model_name


def _log_bin(x: float, per_octave: int) -> int:
    return round(per_octave * math.log2(x)) if x > 0 and math.isfinite(x) else -10_000


@dataclass(frozen=True)
class LayerPrint:
    """A layer's fingerprint (see the module docstring); frozen and hashable, so a store keys on it.

    Example:
        >>> a = LayerPrint.of("conv", conv.weight)
        >>> a.matches(LayerPrint.of("conv", copy.deepcopy(conv).weight))
        True
    """

    kind: str
    shape: tuple[int, ...]
    scale: int  # round(2 log2 std)
    centre: int  # round(4 mean / std)
    tails: int  # round(2 log2 (abs-max / std))

    @classmethod
    def of(cls, kind: str, weight: torch.Tensor) -> LayerPrint:
        w = weight.detach().float().reshape(-1)
        std = float(w.std()) if w.numel() > 1 else 0.0
        mean, peak = float(w.mean()), float(w.abs().max()) if w.numel() else 0.0
        centre = round(4 * mean / std) if std > 0 else 0
        return cls(str(kind), tuple(int(d) for d in weight.shape), _log_bin(std, 2), centre,
                   _log_bin(peak / std, 2) if std > 0 else -10_000)

    def distance(self, other: LayerPrint) -> int | None:
        """Bins between two fingerprints (summed over the statistics); None when they do not match."""
        if self.kind != other.kind or self.shape != other.shape:
            return None
        gaps = (abs(self.scale - other.scale), abs(self.centre - other.centre), abs(self.tails - other.tails))
        return None if max(gaps) > TOLERANCE else sum(gaps)

    def matches(self, other: LayerPrint) -> bool:
        return self.distance(other) is not None

    @property
    def key(self) -> str:
        """A stable text form, e.g. ``conv:16x16x3x3:s-9:c0:t4``."""
        shape = "x".join(map(str, self.shape))
        return f"{self.kind}:{shape}:s{self.scale}:c{self.centre}:t{self.tails}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape": list(self.shape), "scale": self.scale, "centre": self.centre,
                "tails": self.tails}

    @classmethod
    def from_json(cls, raw: Any) -> LayerPrint:
        """Raises ValueError when `raw` is not a fingerprint's JSON form (the store reader names the file)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("kind"), str):
            raise ValueError("a layer fingerprint needs a kind")
        shape, ints = raw.get("shape"), [raw.get(k) for k in ("scale", "centre", "tails")]
        if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
            raise ValueError("a layer fingerprint's shape must be a list of integers")
        scale, centre, tails = ints
        if not (_is_int(scale) and _is_int(centre) and _is_int(tails)):
            raise ValueError("a layer fingerprint's scale, centre and tails must be integers")
        return cls(raw["kind"], tuple(shape), int(scale), int(centre), int(tails))  # type: ignore[arg-type]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
