"""Decoded images gathered into one uint8 array: JPEG bytes end to end (an `.npz`'s `jpeg` and `offsets`) and
opened image files, each as 8-bit RGB (16-bit grey scaled, not clipped), written one by one so a large set is held
once; images of another size are resized to the most common one."""

from __future__ import annotations

import io
import logging
from collections import Counter

import numpy as np
from PIL import Image, UnidentifiedImageError

from modelopt.errors import LoadError

__all__ = ["Stacker", "decode_jpegs", "rgb"]

logger = logging.getLogger("modelopt.data.dataset")  # the name its warnings have always carried


def decode_jpegs(data: np.ndarray, offsets: np.ndarray, where: str, keep: np.ndarray | None = None) -> np.ndarray:
    """uint8 (N, H, W, 3) RGB images from JPEG files end to end (image i is data[offsets[i]:offsets[i + 1]]),
    only those at `keep` (default: all)."""
    order = range(len(offsets) - 1) if keep is None else keep
    images = Stacker(len(order), where)
    for i in order:
        try:
            im = Image.open(io.BytesIO(data[offsets[i] : offsets[i + 1]].tobytes()))
            images.add(rgb(im, f"image {i} in {where}"))
        except Image.DecompressionBombError as e:
            raise LoadError(f"image {i} in {where} is too large to decode safely ({e}); shrink or remove it") from None
        except (UnidentifiedImageError, OSError, ValueError) as e:
            raise LoadError(f"image {i} in {where} is not a readable JPEG: {e}") from None
    return images.stacked()


# Pillow opens a 16-bit grey PNG as mode I;16 (older Pillow: I), and convert("RGB") clips every value above 255:
# the image reads white. 16-bit RGB(A) PNGs open as 8-bit RGB(A) already (the high byte: x * 257 >> 8 == x).
_WIDE_GREY = frozenset({"I", "I;16", "I;16B", "I;16L", "I;16N"})
_U16 = 65535


def rgb(im: Image.Image, what: str) -> np.ndarray:
    """uint8 (H, W, 3) RGB of a decoded image; 16-bit grey scaled to 0-255 as 8-bit grey is read (value / 257)."""
    if im.mode not in _WIDE_GREY:
        return np.asarray(im.convert("RGB"))
    grey = np.asarray(im).astype(np.int64)
    if grey.size and (grey.min() < 0 or grey.max() > _U16):
        raise LoadError(f"{what} is {im.mode} grey with values {int(grey.min())} to {int(grey.max())}, not 16-bit "
                        "(0 to 65535); save it as an 8-bit or 16-bit image")
    scaled = ((grey * 255 + _U16 // 2) // _U16).astype(np.uint8)
    return np.repeat(scaled[..., None], 3, axis=2)



class Stacker:
    """Decoded HWC images written one by one into a single uint8 array, so a large folder is held once: a list of
    the images then a stack of them held every image twice (and the allocator kept the freed list). Images of
    another size than the first are kept aside and, at the end, resized to the most common size (`_stack`)."""

    def __init__(self, n: int, where: str) -> None:
        self.n, self.where = n, where
        self.out: np.ndarray | None = None
        self.odd: dict[int, np.ndarray] = {}
        self.count = 0

    def add(self, image: np.ndarray) -> None:
        if self.out is None:
            self.out = np.empty((self.n, *image.shape[:2], 3), dtype=np.uint8)
        if image.shape[:2] == self.out.shape[1:3]:
            self.out[self.count] = image
        else:
            self.odd[self.count] = image
        self.count += 1

    def stacked(self) -> np.ndarray:
        if self.out is None:
            return np.empty((0, 0, 0, 3), dtype=np.uint8)
        if not self.odd:
            return self.out
        return _stack([self.odd.get(i, self.out[i]) for i in range(self.n)], self.where)


def _stack(images: list[np.ndarray], where: str) -> np.ndarray:
    """Stack HWC images; ones whose size differs from the most common are resized to it."""
    sizes = Counter(a.shape[:2] for a in images)
    (h, w), count = sizes.most_common(1)[0]
    logger.warning(
        "%d of %d images in %s are not %dx%d (HxW), the most common size; resized them to it",
        len(images) - count, len(images), where, h, w,
    )
    return np.stack([
        a if a.shape[:2] == (h, w) else np.asarray(Image.fromarray(a).resize((w, h), Image.Resampling.BILINEAR))
        for a in images
    ])
