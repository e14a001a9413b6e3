"""ResNet-20 cut into blocks, with heads fitted on a small slice of the bundled sample (built once)."""

from __future__ import annotations

import pytest
import torch
from _threads import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="package")
def r20():
    """(loaded model, backbone, calib features, val features) on 160 + 96 bundled images."""
    from modelopt.compressors.early_exit import (
        HeadSpec,
        extract_features,
        normalise,
        split_backbone,
    )
    from modelopt.data.dataset import load_data
    from modelopt.model.loader import load_model

    torch.set_num_threads(1)
    lm = load_model("cifar10_resnet20")
    bb = split_backbone(lm.module)
    data = load_data("cifar10-exact-sample")
    spec = HeadSpec((1, 2), (1,))
    calib = extract_features(bb, normalise(data.calib.x[:160], lm.mean, lm.std), spec, labels=data.calib.y[:160])
    val = extract_features(bb, normalise(data.val.x[:96], lm.mean, lm.std), spec, labels=data.val.y[:96])
    x_val = normalise(data.val.x[:96], lm.mean, lm.std)
    return lm, bb, calib, val, x_val
