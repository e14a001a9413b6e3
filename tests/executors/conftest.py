"""The Ray tests' data: fewer real CIFAR-10 images than `small_data`, because every process of a Ray run (the driver
and each worker, a dozen in test_ray.py) loads them, scores the float model on all of them and each plan on val."""

from __future__ import annotations

from pathlib import Path

import pytest

RAY_IMAGES = 300  # split 20/20/20/40 %: calib, val and confirm 60 images each, test 120


@pytest.fixture(scope="session")
def ray_data(small_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first RAY_IMAGES of `small_data`'s images (CIFAR-10's test order: every class about equally) as an .npz."""
    import numpy as np

    path = tmp_path_factory.mktemp("ray_data") / f"cifar10_{RAY_IMAGES}.npz"
    with np.load(small_data) as f:
        np.savez(path, x=f["x"][:RAY_IMAGES], y=f["y"][:RAY_IMAGES])
    return path
