from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from modelopt.data.sample import SAMPLE_PATH
from modelopt.zoo.make_sample import build

CIFAR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "cifar10"


def test_bundled_sample_is_small_and_well_formed() -> None:
    assert SAMPLE_PATH.stat().st_size < 12 * 2**20  # kept under 12 MiB (the package under about 15 MB)
    with np.load(SAMPLE_PATH) as f:
        assert sorted(f.files) == ["calib_x", "calib_y", "confirm_x", "confirm_y", "jpeg", "jpeg_index",
                                   "jpeg_offsets", "jpeg_y", "test_x", "test_y"]
        assert len(f["jpeg_y"]) == len(f["jpeg_index"]) == len(f["jpeg_offsets"]) - 1 == 9154
        assert len(set(f["jpeg_index"].tolist())) == 9154 and f["jpeg_index"].max() < 10000
        assert f["test_x"].shape == (846, 32, 32, 3) and f["calib_x"].shape == (1000, 32, 32, 3)
        assert f["confirm_x"].shape == (1000, 32, 32, 3)
        assert f["test_x"].dtype == f["calib_x"].dtype == f["confirm_x"].dtype == np.uint8
        assert f["test_y"].dtype == f["calib_y"].dtype == f["confirm_y"].dtype == np.int64


@pytest.mark.slow
@pytest.mark.skipif(not CIFAR.is_dir(), reason=f"needs real CIFAR-10 files in {CIFAR}")
def test_bundled_sample_holds_the_documented_images(tmp_path: Path) -> None:
    with np.load(CIFAR / "cifar10_exact_test.npz") as t, np.load(CIFAR / "cifar10_exact_train.npz") as tr:
        test_x, test_y, train_x, train_y = t["x"], t["y"], tr["x"], tr["y"]
    with np.load(SAMPLE_PATH) as f:
        np.testing.assert_array_equal(f["test_x"], test_x)
        np.testing.assert_array_equal(f["test_y"], test_y)
        # The first 200 of each training batch; the shared file stores 932 per batch.
        idx = np.concatenate([b * 932 + np.arange(200) for b in range(5)])
        np.testing.assert_array_equal(f["calib_x"], train_x[idx])
        np.testing.assert_array_equal(f["calib_y"], train_y[idx])
        # Confirmation: the next 200 of each batch, disjoint from calib.
        conf = np.concatenate([b * 932 + 200 + np.arange(200) for b in range(5)])
        np.testing.assert_array_equal(f["confirm_x"], train_x[conf])
        np.testing.assert_array_equal(f["confirm_y"], train_y[conf])
        # The JPEG images: the test file's entries at jpeg_index, none a re-encoding of an exact test image.
        with np.load(CIFAR / "cifar10_jpeg_test.npz") as j:
            np.testing.assert_array_equal(f["jpeg_y"], j["y"][f["jpeg_index"]])
    rebuilt = build(CIFAR, tmp_path / "s.npz")
    with np.load(rebuilt) as a, np.load(SAMPLE_PATH) as b:
        for k in b.files:
            np.testing.assert_array_equal(a[k], b[k])
