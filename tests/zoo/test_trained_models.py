"""The trained non-ResNet models in the repository's `models/` load safely and score what they say they do
(`models/README.md`) on the 846 exact-pixel CIFAR-10 test images bundled with the package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from modelopt.data.sample import SAMPLE_PATH
from modelopt.model.loader import load_model

MODELS = Path(__file__).resolve().parents[2] / "models"


@pytest.mark.parametrize("name", ["cifar10_mobilenetv2", "cifar10_vit"])
def test_a_trained_model_reproduces_its_recorded_accuracy(name):
    path = MODELS / f"{name}.pt"
    recorded = torch.load(path, map_location="cpu", weights_only=True)["accuracy"]["exact_test"]
    lm = load_model(name, weights=path)
    with np.load(SAMPLE_PATH) as f:
        x, y = f["test_x"], f["test_y"]
    mean, std = torch.tensor(lm.mean).view(1, 3, 1, 1), torch.tensor(lm.std).view(1, 3, 1, 1)
    inputs = (torch.from_numpy(x).permute(0, 3, 1, 2).float() / 255.0 - mean) / std
    with torch.inference_mode():
        predicted = lm.module.eval()(inputs).argmax(1).numpy()
    assert float((predicted == y).mean()) == pytest.approx(recorded, abs=1.5 / len(y))  # one image of slack
    assert recorded > {"cifar10_mobilenetv2": 0.78, "cifar10_vit": 0.57}[name]  # the table in models/README.md
