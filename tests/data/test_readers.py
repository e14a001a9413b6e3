"""Image readers: what each kind of file decodes to, and the folders they refuse (issue 46)."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from modelopt.data.dataset import load_data
from modelopt.errors import LoadError


def _png16(path: Path, pixels: np.ndarray) -> None:
    """A 16-bit PNG written by hand (Pillow writes 16-bit grey but not 16-bit RGB): (H, W) grey or (H, W, 3)."""
    h, w = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[i].astype(">u2").tobytes() for i in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    colour = 0 if pixels.ndim == 2 else 2
    header = struct.pack(">IIBBBBB", w, h, 16, colour, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
                     + chunk(b"IEND", b""))


@pytest.mark.parametrize("channels", [1, 3], ids=["grey", "rgb"])
def test_16_bit_pngs_read_as_the_same_images_at_8_bits(tmp_path, channels):
    """16-bit grey PNGs (mode I;16) read as white images: convert("RGB") clipped every value above 255. Saved as
    uint16 x 257, each image must read as its 8-bit original (grey: the value in all three channels)."""
    rng = np.random.default_rng(0)
    shape = (6, 5) if channels == 1 else (6, 5, 3)
    eight = {c: [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(3)] for c in ("a", "b")}
    for c, images in eight.items():
        (tmp_path / c).mkdir()
        for i, image in enumerate(images):
            _png16(tmp_path / c / f"{i}.png", image.astype(np.uint16) * 257)
    assert Image.open(tmp_path / "a" / "0.png").mode == ("I;16" if channels == 1 else "RGB")
    data = load_data(tmp_path, calib_fraction=0.0, val_fraction=0.5, confirm_fraction=0.0)
    got = data.split("all")
    order = [image for c in ("a", "b") for image in eight[c]]  # files listed class by class, sorted
    for k, pos in enumerate(got.index.tolist()):
        want = order[pos] if channels == 3 else np.repeat(order[pos][..., None], 3, axis=2)
        np.testing.assert_array_equal(got.x[k].numpy(), want)


def test_grey_values_beyond_16_bits_are_refused_naming_the_image(tmp_path):
    """Pillow opens a file by its content: a 32-bit grey TIFF named .png is mode I with values past 65535."""
    for c in ("a", "b"):
        (tmp_path / c).mkdir()
        for i in range(2):
            Image.fromarray(np.full((4, 4), 70000, dtype=np.int32)).save(tmp_path / c / f"{i}.png", format="TIFF")
    assert Image.open(tmp_path / "a" / "0.png").mode == "I"
    with pytest.raises(LoadError, match=r"0\.png' is I grey with values 70000 to 70000, not 16-bit"):
        load_data(tmp_path)


def test_an_image_folder_with_one_class_folder_is_refused_naming_it(tmp_path):
    """One class folder was accepted and every image got label 0: a model scored on it scores one class."""
    (tmp_path / "cats").mkdir()
    (tmp_path / "empty").mkdir()  # a class folder without images does not count
    for i in range(6):
        Image.new("RGB", (4, 4), (i, i, i)).save(tmp_path / "cats" / f"{i}.png")
    with pytest.raises(LoadError) as info:
        load_data(tmp_path)
    message = str(info.value)
    assert "\n" not in message and f"image folder '{tmp_path}'" in message and "'cats'" in message
    assert "at least two class folders are needed" in message
    (tmp_path / "dogs").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "dogs" / "0.png")
    assert load_data(tmp_path, calib_fraction=0.0, val_fraction=0.5, confirm_fraction=0.0).num_classes == 2
