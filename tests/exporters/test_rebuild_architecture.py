"""The architecture a packed file names, rebuilt without the random draws its tensors overwrite."""

from __future__ import annotations

import torch
from torch import nn

from modelopt.exporters._rebuild import architecture


def test_a_rebuilt_architecture_starts_at_zero_and_leaves_torch_initialisers_as_they_were():
    before = nn.init.kaiming_uniform_
    module = architecture({"name": "torchvision:resnet18", "num_classes": 10}, "x.pt")
    assert nn.init.kaiming_uniform_ is before
    weights = [p for p in module.parameters() if p.dim() > 1]
    assert weights and all(torch.count_nonzero(p) == 0 for p in weights)
    assert nn.Conv2d(3, 4, 3).weight.abs().sum() > 0  # a module built afterwards is initialised as torch does
