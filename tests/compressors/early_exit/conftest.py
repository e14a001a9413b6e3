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
    from modelopt.compressors.early_exit.features import extract_features
    from modelopt.compressors.early_exit.heads import HeadSpec
    from modelopt.data.dataset import load_data
    from modelopt.model.backbone import split_backbone
    from modelopt.model.loader import load_model

    torch.set_num_threads(1)
    lm = load_model("cifar10_resnet20")
    bb = split_backbone(lm.module)
    data = load_data("cifar10-exact-sample")
    spec = HeadSpec((1, 2), (1,))

    def prepared(x: torch.Tensor) -> torch.Tensor:  # uint8 NHWC -> the model's normalised NCHW, as a Workload does
        mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (lm.mean, lm.std))
        return ((x.permute(0, 3, 1, 2).float() / 255 - mean) / std).contiguous()

    calib = extract_features(bb, prepared(data.calib.x[:160]), spec, labels=data.calib.y[:160])
    x_val = prepared(data.val.x[:96])
    val = extract_features(bb, x_val, spec, labels=data.val.y[:96])
    return lm, bb, calib, val, x_val
