from __future__ import annotations

import torch
from torch import nn

from modelopt.model.layers import LayerKind, discover_layers


def test_macs_by_hand():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 3, stride=2, padding=1),
                          nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
    layers = discover_layers(model, torch.zeros(2, 3, 16, 16))
    assert [layer.name for layer in layers] == ["0", "2", "4"]
    assert [layer.kind for layer in layers] == [LayerKind.CONV, LayerKind.CONV, LayerKind.LINEAR]
    assert layers[0].macs == 16 * 16 * 8 * 3 * 9
    assert layers[1].macs == 8 * 8 * 4 * 8 * 9
    assert layers[2].macs == 256 * 10
    assert layers[1].fan_in == 72 and layers[2].params == 2560
