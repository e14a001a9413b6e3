"""Unlabeled images for calibration (`load_data(unlabeled=...)`, `--unlabeled`), and the default sample's evidence."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from modelopt.cli.app import app
from modelopt.data.dataset import MIN_UNLABELED, UNLABELED_IMAGES, load_data
from modelopt.errors import ConfigError, LoadError


def _images(n: int, size: int = 32, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def labeled(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("labeled") / "labeled.npz"
    np.savez(path, x=_images(400, seed=1), y=np.arange(400) % 10)
    return path


def test_the_default_sample_searches_and_confirms_on_jpeg_images_and_tests_on_exact_ones() -> None:
    data = load_data()
    assert [len(data.split(s)) for s in ("calib", "val", "confirm", "test")] == [1000, 2000, 7154, 846]
    assert set(data.val.index.tolist()).isdisjoint(data.confirm.index.tolist())
    assert (data.calib.y == -1).all()  # training images the model learned: their labels are not used
    exact = load_data("cifar10-exact-sample")
    assert torch.equal(data.test.x, exact.split("all").x)  # all 846 exact test images, held out


def test_unlabeled_npz_becomes_calib_and_every_labeled_image_is_evidence(tmp_path, labeled, caplog) -> None:
    path = tmp_path / "u.npz"
    np.savez(path, x=_images(3000), y=np.zeros(3000, dtype=np.int64))
    with caplog.at_level(logging.WARNING, logger="modelopt.data.dataset"):
        data = load_data(labeled, unlabeled=path)
    assert "labels (y)" in caplog.text and "ignored" in caplog.text  # said so
    assert len(data.calib) == UNLABELED_IMAGES and (data.calib.y == -1).all()
    assert (len(data.val), len(data.confirm), len(data.test)) == (80, 200, 120)  # 20 / 50 / 30 % of 400
    ours = {tuple(img.flatten()[:8].tolist()) for img in _images(3000)}
    assert all(tuple(img.flatten()[:8].tolist()) in ours for img in data.calib.x.numpy())


def test_unlabeled_jpeg_npz_and_nested_folder(tmp_path, labeled) -> None:
    parts = []
    for img in _images(300, seed=3):
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG")
        parts.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
    np.savez(tmp_path / "j.npz", jpeg=np.concatenate(parts), offsets=offsets)
    assert len(load_data(labeled, unlabeled=tmp_path / "j.npz").calib) == 300
    for i, img in enumerate(_images(260, seed=4)):
        folder = tmp_path / "imgs" / f"part{i % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(folder / f"{i}.png")
    assert len(load_data(labeled, unlabeled=tmp_path / "imgs").calib) == 260


def _falling_offsets(p):
    """A JPEG .npz whose third offset falls back: the message names the first offset that falls."""
    offsets = np.arange(0, 9 * 301, 9)
    offsets[2] = 5
    np.savez(p / "fall.npz", jpeg=np.zeros(9 * 300, dtype=np.uint8), offsets=offsets)
    return p / "fall.npz"


@pytest.mark.parametrize(("make", "match"), [
    (lambda p: p / "nowhere.npz", r"'.*nowhere.npz' do not exist; pass an .npz"),
    (lambda p: (p / "a.txt").write_text("x") and p / "a.txt", r"are not an .npz or a folder"),
    (lambda p: np.savez(p / "few.npz", x=_images(MIN_UNLABELED - 1)) or p / "few.npz",
     rf"hold {MIN_UNLABELED - 1} images; calibration needs at least {MIN_UNLABELED}"),
    (lambda p: np.savez(p / "big.npz", x=_images(300, size=28)) or p / "big.npz",
     r"shape \(28, 28, 3\) per image but the data's are \(32, 32, 3\)"),
    (lambda p: np.savez(p / "labels.npz", y=np.zeros(5)) or p / "labels.npz", r"expected 'x', or 'jpeg' and 'offsets'"),
    (lambda p: (p / "empty").mkdir() or p / "empty", r"no images in"),
    (lambda p: _falling_offsets(p), r"offsets\[2\] is 5, below offsets\[1\] = 9"),
])
def test_bad_unlabeled_images_are_one_clear_error(tmp_path, labeled, make, match) -> None:
    with pytest.raises(LoadError, match=match) as info:
        load_data(labeled, unlabeled=make(tmp_path))
    assert "\n" not in str(info.value)


def test_unlabeled_loader_beside_file_data_is_refused(labeled) -> None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(300, 3, 32, 32)), batch_size=100)
    with pytest.raises(ConfigError, match="preprocessed float tensors but the data are uint8 images"):
        load_data(labeled, unlabeled=loader)


def test_cli_refuses_a_missing_unlabeled_path_in_one_line(tmp_path) -> None:
    result = CliRunner().invoke(app, ["optimize",
        "--reconstruct", "off", "--unlabeled", str(tmp_path / "none.npz"), "--out",
                                      str(tmp_path / "r"), "--no-progress"])
    assert result.exit_code != 0 and "none.npz" in result.output and "Traceback" not in result.output
