"""Option-A shortcuts found by what they compute and rewritten as one strided 1x1 conv, exactly."""

from __future__ import annotations

import copy

import torch
from torch import nn

from modelopt.exporters._subsample import Subsample, subsample_shortcuts
from modelopt.zoo.cifar_resnet import ShortcutA


class _Halve(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :, 1::2, 1::2]  # odd positions: not what a strided conv without padding reads


def test_subsample_equals_the_option_a_shortcut():
    x = torch.randn(3, 16, 32, 32)
    assert torch.equal(Subsample(16, 32, 8)(x), ShortcutA(32)(x))


def test_the_bundled_resnet20s_two_shortcuts_are_found_and_nothing_else(r20_evaluator):
    model = copy.deepcopy(r20_evaluator.workload.model).cpu().eval()
    x = r20_evaluator.workload.split("val").x.tensor()[:4].cpu()
    before = model(x)
    assert subsample_shortcuts(model, x) == ("layer2.0.shortcut", "layer3.0.shortcut")
    assert isinstance(model.layer2[0].shortcut, Subsample)
    assert torch.equal(model(x), before)


def test_a_module_that_reads_other_positions_is_left_alone():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), _Halve())
    assert subsample_shortcuts(model, torch.randn(2, 3, 8, 8)) == ()
    assert isinstance(model[1], _Halve)
