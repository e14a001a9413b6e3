"""How decoded images are brought to the size a model was trained at: the shorter side resized, then a centre crop
(torchvision's ``Resize(r)`` then ``CenterCrop(c)``), applied to each image as it is decoded, so a folder of
differently sized photographs becomes one uint8 array at the model's resolution; and, when given, the mean and std
the model's inputs are normalised with (else the model's own).

Example:
    >>> prep = Preprocess(resize=256, crop=224)
    >>> prep.apply(np.zeros((480, 640, 3), np.uint8)).shape
    (224, 224, 3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from modelopt.data import memory
from modelopt.errors import ConfigError

__all__ = ["DEFAULT_INTERPOLATION", "INTERPOLATIONS", "Preprocess"]

INTERPOLATIONS = {"bicubic": Image.Resampling.BICUBIC, "bilinear": Image.Resampling.BILINEAR,
                  "lanczos": Image.Resampling.LANCZOS, "box": Image.Resampling.BOX, "nearest": Image.Resampling.NEAREST}
# Bicubic by default: a 64-pixel CIFAR-10 folder brought back to 32 pixels kept the bundled ResNet-20's exact-pixel
# accuracy with it and lost points with bilinear, whose antialiasing blurs (measured: docs/models-and-data.md#measured).
DEFAULT_INTERPOLATION = "bicubic"


@dataclass(frozen=True)
class Preprocess:
    """Resize (shorter side to `resize` pixels, aspect kept) then centre-crop to `crop` x `crop`; None: that step is
    left out. `interpolation`: bicubic (the default), bilinear, lanczos, box or nearest (Pillow's, antialiased)."""

    resize: int | None = None
    crop: int | None = None
    interpolation: str = DEFAULT_INTERPOLATION
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("mean", "std"):
            v = getattr(self, name)
            if v is not None:
                object.__setattr__(self, name, _per_channel(name, v))
        for name in ("resize", "crop"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"--{name} must be a positive number of pixels like 32 or 224, got {v!r}")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"--interpolation {self.interpolation!r} is not offered; valid: "
                              f"{', '.join(INTERPOLATIONS)}")

    @property
    def active(self) -> bool:
        return self.resize is not None or self.crop is not None

    def over(self, authors: Preprocess) -> Preprocess:
        """What images are read with when this is what the user gave and `authors` what the model's authors
        trained with: the user's resize and crop when either is given, else the authors'; each of mean and std
        the user's when given, else the authors'."""
        size = self if self.active else authors
        return Preprocess(size.resize, size.crop, size.interpolation, self.mean if self.mean is not None else
                          authors.mean, self.std if self.std is not None else authors.std)

    def apply(self, image: np.ndarray) -> np.ndarray:
        """One HWC uint8 image, resized and cropped."""
        if not self.active:
            return image
        im = Image.fromarray(image)
        if self.resize is not None:
            w, h = im.size
            scale = self.resize / min(w, h)
            size = (max(1, round(w * scale)), max(1, round(h * scale)))
            if size != (w, h):
                im = im.resize(size, INTERPOLATIONS[self.interpolation])
        if self.crop is not None:
            w, h = im.size
            if self.crop > min(w, h):
                raise ConfigError(f"--crop {self.crop} is larger than an image of {w}x{h} (after --resize); "
                                  "pass a smaller crop or a larger resize")
            left, top = round((w - self.crop) / 2), round((h - self.crop) / 2)
            im = im.crop((left, top, left + self.crop, top + self.crop))
        return np.asarray(im)

    def apply_all(self, images: np.ndarray) -> np.ndarray:
        """An NHWC uint8 array, each image resized and cropped."""
        if not self.active or len(images) == 0:
            return images
        self.check_memory(len(images))
        first = self.apply(images[0])  # images of one size come out at one size: written into one array
        out = np.empty((len(images), *first.shape), dtype=np.uint8)
        out[0] = first
        for i in range(1, len(images)):
            out[i] = self.apply(images[i])
        return out

    def check_memory(self, n: int, where: str | None = None) -> None:
        """Refuses, before any is decoded, `n` images at this size that cannot fit in the memory this process can
        still take: uint8 RGB, side x side (the crop, else the resize: the shorter side, so at least that), held
        once (the model reads them in float batches). ConfigError naming the size and one that leaves half the
        memory to the model and its batches."""
        side, flag = (self.crop, "--crop") if self.crop is not None else (self.resize, "--resize")
        room = memory.available_bytes()
        if side is None or room is None or n * 3 * side * side <= room:
            return
        fits = math.isqrt(room // 2 // (3 * n)) if n else side
        fits -= fits % 8 if fits >= 8 else 0
        smaller = f"{flag} {fits} or smaller" if fits >= 1 else "fewer images"
        of = "" if where is None else f" of {where}"
        raise ConfigError(f"{flag} {side} makes the {n} images{of} {side}x{side} pixels: "
                          f"{_gib(n * 3 * side * side)} decoded ({n} x 3 x {side}^2 bytes), more than the "
                          f"{_gib(room)} of memory this process can still take; pass {smaller}")

    def to_json(self) -> dict[str, Any] | None:
        if not self.active and self.mean is None and self.std is None:
            return None
        return {"resize": self.resize, "crop": self.crop, "interpolation": self.interpolation,
                "mean": None if self.mean is None else list(self.mean),
                "std": None if self.std is None else list(self.std)}

    @classmethod
    def from_json(cls, raw: Any) -> Preprocess:
        if raw is None:
            return cls()
        if not isinstance(raw, dict) or set(raw) - {"resize", "crop", "interpolation", "mean", "std"}:
            raise ConfigError(f"preprocess must be a mapping of resize, crop, interpolation, mean, std; got {raw!r}")
        return cls(raw.get("resize"), raw.get("crop"), raw.get("interpolation", DEFAULT_INTERPOLATION),
                   raw.get("mean"), raw.get("std"))

    def describe(self) -> str:
        """E.g. "resized to 256, centre-cropped to 224 (bilinear)"."""
        parts = ([f"resized to {self.resize}"] if self.resize else []) + (
            [f"centre-cropped to {self.crop}"] if self.crop else [])
        return f"{', '.join(parts)} ({self.interpolation})" if parts else "as they are"


def _per_channel(name: str, v: object) -> tuple[float, ...]:
    """--mean or --std as three finite numbers on the [0, 1] scale (std positive); ConfigError naming the form."""
    try:
        values = tuple(float(a) for a in v)  # type: ignore[attr-defined]  # any iterable; else the error below
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3 or not all(math.isfinite(a) for a in values) or (name == "std" and min(values) <= 0):
        form = "three positive numbers" if name == "std" else "three numbers"
        raise ConfigError(f"--{name} must be {form}, one per RGB channel, like 0.485,0.456,0.406; got {v!r}")
    if max(abs(a) for a in values) > 1:  # pixels are scaled to [0, 1] first: a 0-255 figure wrecks every input
        scaled = ",".join(f"{a / 255:.4g}" for a in values)
        raise ConfigError(f"--{name} {','.join(f'{a:g}' for a in values)} is on the 0-255 scale; images are "
                          f"scaled to [0, 1] before it: give {scaled}")
    return values


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def check_resampling(resize: int | None, crop: int | None, interpolation: str | None) -> None:
    """An interpolation given without a resize or crop would be ignored (the images keep their size, or the model's
    authors' resize applies with their interpolation): refused in one line instead."""
    if interpolation is not None and resize is None and crop is None:
        raise ConfigError(f"--interpolation {interpolation} resamples a resize: give --resize (and --crop) with it; "
                          "without them the images keep their size, or the weights' own resize and interpolation apply")
