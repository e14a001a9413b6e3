"""The cut into blocks computes the model's function; exit-point MACs against a hand count."""

from __future__ import annotations

import pytest
import torch

from modelopt.errors import ConfigError
from modelopt.model.backbone import split_backbone
from modelopt.model.layers import discover_layers


def test_cut_is_exact(r20):
    lm, bb, *_ = r20
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(bb.forward(x), lm.module(x))


def test_exit_point_macs_by_hand(r20):
    lm, bb, *_ = r20
    stem = 3 * 9 * 16 * 32 * 32  # conv1: fan-in 27, 16 maps of 32x32
    block1 = 2 * 16 * 9 * 16 * 32 * 32  # two 16->16 3x3 convs at 32x32
    block2_first = 16 * 9 * 32 * 16 * 16 + 32 * 9 * 32 * 16 * 16  # stride-2 16->32, then 32->32 at 16x16
    assert bb.point("layer1.0").macs == stem + block1
    assert bb.point("layer1.2").macs == stem + 3 * block1
    assert bb.point("layer2.0").macs == stem + 3 * block1 + block2_first
    assert [p.name for p in bb.points] == [f"layer{s}.{i}" for s in (1, 2, 3) for i in range(3)]
    assert bb.points[4].channels == 32 and bb.points[4].size == (16, 16)
    full = sum(layer.macs for layer in discover_layers(lm.module, torch.zeros(1, 3, 32, 32)))
    assert bb.total_macs == full == bb.points[-1].macs + 64 * 10  # plus the final linear


def test_unknown_point_and_layout_are_config_errors(r20):
    _, bb, *_ = r20
    with pytest.raises(ConfigError, match=r"layer9\.9"):
        bb.point("layer9.9")
    with pytest.raises(ConfigError, match=r"needs a chain of blocks .* Linear: it has no nn\.Sequential of blocks"):
        split_backbone(torch.nn.Linear(3, 3))
