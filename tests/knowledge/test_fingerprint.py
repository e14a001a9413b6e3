"""Layer fingerprints: a copy of a layer matches, other layers do not."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from modelopt.knowledge import LayerPrint, model_family


def _conv(cin: int = 16, cout: int = 16, seed: int = 0) -> nn.Conv2d:
    torch.manual_seed(seed)
    return nn.Conv2d(cin, cout, 3)


def test_a_copy_of_a_layer_matches_itself_exactly():
    conv = _conv()
    a, b = LayerPrint.of("conv", conv.weight), LayerPrint.of("conv", copy.deepcopy(conv).weight)
    assert a == b and a.key == b.key and a.distance(b) == 0


def test_a_sibling_layer_with_like_weights_matches():
    # Same shape and initialisation law, other draws: the statistics land in the same or next bins.
    a, b = LayerPrint.of("conv", _conv(seed=0).weight), LayerPrint.of("conv", _conv(seed=1).weight)
    assert a.matches(b)


@pytest.mark.parametrize("other", [
    lambda: LayerPrint.of("conv", _conv(16, 32).weight),  # another shape
    lambda: LayerPrint.of("conv", _conv().weight * 4),  # the same shape on another scale (two octaves)
    lambda: LayerPrint.of("conv", _conv().weight + 3 * _conv().weight.std()),  # off-centre
    lambda: LayerPrint.of("linear", _conv().weight),  # another kind
])
def test_different_layers_do_not_match(other):
    assert not LayerPrint.of("conv", _conv().weight).matches(other())


def test_fingerprint_json_round_trip_and_refusal():
    a = LayerPrint.of("conv", _conv().weight)
    assert LayerPrint.from_json(a.to_json()) == a
    with pytest.raises(ValueError, match="shape"):
        LayerPrint.from_json({**a.to_json(), "shape": "16x16"})


@pytest.mark.parametrize(("name", "family"), [("cifar10_resnet20", "cifar10_resnet"),
                                               ("cifar10_resnet56", "cifar10_resnet"),
                                               ("torchvision:resnet18", "torchvision:resnet"), ("vit", "vit")])
def test_model_family_drops_the_depth(name, family):
    assert model_family(name) == family
