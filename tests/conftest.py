"""Shared fixtures: the real ResNet-20 workload on the bundled CIFAR-10 sample, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "data" / "cifar10").is_dir():
        pytest.skip(f"needs the shared CIFAR-10 data and checkpoints in {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def resnet20_workload():
    from modelopt.api import build_workload

    return build_workload("cifar10_resnet20", "cifar10-sample", device="cpu")
