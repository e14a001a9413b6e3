"""Fixtures of the run tests: fewer real images for the runs that are about the journal, resume, faults and
processes, not about the figures (each trial, confirmation and test re-score then costs half as much)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fewer_data(tmp_path_factory, small_data) -> Path:
    """The first 400 of the 846 bundled CIFAR-10 test images (calib / val / confirm / test 80 / 80 / 80 / 160): val's
    80 images still certify a 90 % floor for a plan that agrees with the float model on (nearly) all of them."""
    import numpy as np

    path = tmp_path_factory.mktemp("fewer") / "cifar10_400.npz"
    with np.load(small_data) as f:
        np.savez(path, x=f["x"][:400], y=f["y"][:400])
    return path


@pytest.fixture(scope="session")
def fewer_workload(fewer_data):
    """ResNet-20 on `fewer_data`, built once per test process. Its caches (compressed weights by choice) are shared
    by the tests that use it, as `small_workload`'s are."""
    from modelopt.api import build_workload

    return build_workload("cifar10_resnet20", str(fewer_data), device="cpu")
