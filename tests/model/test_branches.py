"""Residual branches: found on real blocks, and a removed branch's block computes what the simulation does."""

from __future__ import annotations

import torch
from torch import nn

from modelopt.model.backbone import split_backbone
from modelopt.model.branches import residual_branches, skipped_block
from modelopt.model.layers import compressible_modules
from modelopt.zoo.cifar_mobile import mobilenetv2
from modelopt.zoo.cifar_resnet import resnet20


def _branches(model: nn.Module) -> dict:
    return residual_branches(split_backbone(model.eval()).blocks, compressible_modules(model))


def test_every_resnet_block_offers_its_branch():
    found = _branches(resnet20())
    assert len(found) == 9
    b = found["layer2.0.conv2"]
    assert (b.block, b.layers, b.end) == ("layer2.0", ("layer2.0.conv1", "layer2.0.conv2"), "layer2.0.bn2")


def test_inverted_residuals_offer_their_branch_and_the_others_none():
    model = mobilenetv2()
    found = _branches(model)
    residual = [n for n, m in model.features.named_children() if getattr(m, "use_res_connect", False)]
    assert sorted(b.block for b in found.values()) == sorted(f"features.{n}" for n in residual)
    b = found["features.3.conv.2"]
    assert b.layers == ("features.3.conv.0.0", "features.3.conv.1.0", "features.3.conv.2")
    assert b.end == "features.3.conv.3"


def test_a_chain_without_additions_has_no_branch():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3))
    blocks = (("0", model[0]), ("2", model[2]))
    assert residual_branches(blocks, compressible_modules(model)) == {}


def test_the_skipped_block_runs_only_its_shortcut_and_equals_a_zero_scale_norm():
    torch.manual_seed(0)
    model = resnet20().eval()
    block = model.layer2[0]
    with torch.no_grad():
        block.bn2.weight.zero_()  # the simulation: the branch's end gives its shift whatever reaches it
        block.bn2.bias.copy_(torch.randn(32))
    x = torch.relu(torch.randn(4, 16, 32, 32))
    lean = skipped_block(block, block.bn2.bias)
    with torch.no_grad():
        torch.testing.assert_close(lean(x), block(x))
    assert not any(isinstance(m, (nn.Conv2d, nn.BatchNorm2d)) for m in lean.modules())
