from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from modelopt.model.loader import load_model
from modelopt.zoo import MODELS
from modelopt.zoo.cifar_resnet import ShortcutA, resnet20, resnet56

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
CKPT = SHARED / "models" / "cifar10"
EXACT_TEST = SHARED / "data" / "cifar10" / "cifar10_exact_test.npz"


def _expected_params(depth: int, classes: int = 10) -> int:
    """Hand count: stem, n blocks per stage (two 3x3 convs + two BNs), linear head."""
    n = (depth - 2) // 6
    total = 3 * 16 * 9 + 2 * 16
    c_in = 16
    for c in (16, 32, 64):
        for _ in range(n):
            total += 9 * c_in * c + 9 * c * c + 4 * c
            c_in = c
    return total + 64 * classes + classes


def _top1(loaded, x: np.ndarray, y: np.ndarray) -> float:
    mean = torch.tensor(loaded.mean).view(1, 3, 1, 1)
    std = torch.tensor(loaded.std).view(1, 3, 1, 1)
    inputs = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255 - mean) / std
    with torch.inference_mode():
        pred = torch.cat([loaded.module(b).argmax(1) for b in inputs.split(256)])
    return 100.0 * (pred.numpy() == y).mean()


def test_resnet20_has_published_parameter_count():
    assert sum(p.numel() for p in resnet20().parameters()) == 269_722


@pytest.mark.parametrize("name", MODELS.names("cifar10_resnet*"))
def test_parameter_count_matches_hand_count(name):
    depth = int(name.removeprefix("cifar10_resnet"))
    assert sum(p.numel() for p in MODELS.get(name).factory().parameters()) == _expected_params(depth)


@pytest.mark.parametrize("name", MODELS.names())
def test_every_registered_model_builds_and_runs(name):
    entry = MODELS.get(name)
    assert entry.name == name
    model = entry.factory().eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, *entry.input_size))
    assert out.shape == (2, entry.num_classes)
    assert torch.isfinite(out).all()


def test_shortcut_a_subsamples_and_zero_pads():
    x = torch.randn(2, 16, 8, 8)
    out = ShortcutA(32)(x)
    assert out.shape == (2, 32, 4, 4)
    assert torch.equal(out[:, 8:24], x[:, :, ::2, ::2])
    assert not out[:, :8].any() and not out[:, 24:].any()
    assert list(ShortcutA(32).parameters()) == []


def test_model_deep_copies_and_traces():
    model = resnet20().eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        ref = model(x)
        assert torch.equal(copy.deepcopy(model)(x), ref)
        assert torch.allclose(torch.fx.symbolic_trace(model)(x), ref)


@pytest.mark.parametrize(("factory", "file"), [(resnet20, "resnet20-12fca82f.th"), (resnet56, "resnet56-4bfd9763.th")])
def test_upstream_checkpoints_load_strictly(factory, file):
    if not (CKPT / file).is_file():
        pytest.skip(f"shared checkpoint {file} absent")
    state = torch.load(CKPT / file, map_location="cpu", weights_only=True)["state_dict"]
    factory().load_state_dict({k.removeprefix("module."): v for k, v in state.items()}, strict=True)


@pytest.mark.parametrize(
    ("name", "weights", "expected"),
    [
        ("cifar10_resnet20", None, 91.73),  # bundled weights
        pytest.param("cifar10_resnet56", "resnet56-4bfd9763.th", 93.26, marks=pytest.mark.slow),
    ],
)
def test_reproduces_reference_top1_on_exact_test_images(name, weights, expected):
    if not EXACT_TEST.is_file() or (weights and not (CKPT / weights).is_file()):
        pytest.skip("shared CIFAR-10 data or checkpoint absent")
    data = np.load(EXACT_TEST)
    loaded = load_model(name, CKPT / weights if weights else None)
    assert _top1(loaded, data["x"], data["y"]) == pytest.approx(expected, abs=0.1)
