"""A conv's unfolded input at every stride-th output position, gathered without unfolding the rest."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from modelopt.model.layer_inputs import sampled_unfold, unfolded_bytes


@pytest.mark.parametrize("conv", [
    nn.Conv2d(4, 6, 3, padding=1),
    nn.Conv2d(4, 6, 3, stride=2, padding=1),
    nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4),
    nn.Conv2d(4, 6, 1),
    nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2)),
], ids=["3x3", "stride2", "depthwise-dilated", "1x1", "3x5"])
@pytest.mark.parametrize("stride", [1, 2, 7, 1000])
def test_sampled_columns_are_unfolds_columns_at_every_stride_th_position(conv, stride):
    x = torch.randn(3, 4, 11, 9, generator=torch.Generator().manual_seed(0))
    full = F.unfold(x, conv.kernel_size, conv.dilation, conv.padding, conv.stride)
    assert torch.equal(sampled_unfold(conv, x, stride), full[:, :, ::stride])
    assert unfolded_bytes(conv, x[:1]) == 4 * full.shape[1] * full.shape[2]
