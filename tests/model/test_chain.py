"""Early exits anywhere a chain of blocks runs: torchvision's classifiers are cut by tracing, exactly."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelopt.errors import ConfigError
from modelopt.model.backbone import exit_layers, split_backbone
from modelopt.model.layers import discover_layers

torchvision = pytest.importorskip("torchvision")

# (model, exit points, the first three, stem layers): stages opened up into their blocks, and torchvision's
# ResNet chained across its stages.
CUTS = {
    "mobilenet_v2": (19, ["features.0", "features.1", "features.2"], set()),
    "efficientnet_b0": (18, ["features.0", "features.1.0", "features.2.0"], set()),
    "resnet18": (8, ["layer1.0", "layer1.1", "layer2.0"], {"conv1"}),
    "regnet_x_400mf": (22, ["trunk_output.block1.block1-0", "trunk_output.block2.block2-0",
                            "trunk_output.block2.block2-1"], {"stem.0"}),
}


@pytest.mark.parametrize("name", sorted(CUTS))
def test_a_torchvision_classifier_is_cut_into_its_blocks_exactly(name):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, num_classes=10).eval()
    n, first, stem = CUTS[name]
    bb = split_backbone(model)
    assert len(bb.points) == n and [p.name for p in bb.points[:3]] == first and bb.stem_layers == stem
    assert bb.classes == 10
    x = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(bb.forward(x), model(x))
    layers = {x.name: x.macs for x in discover_layers(model, torch.zeros(1, 3, 32, 32))}
    assert bb.total_macs == sum(layers.values())
    assert bb.points[-1].macs == bb.total_macs - sum(m for n, m in layers.items()  # all but the tail's layers
                                                      if not any(n.startswith(b + ".") for b, _ in bb.blocks)
                                                      and n not in bb.stem_layers)
    ends = exit_layers(bb)
    assert list(ends.values()) == [p.name for p in bb.points] and all(e in layers for e in ends)


def test_a_transformer_is_refused_in_one_line_that_says_why():
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=3, num_heads=2, hidden_dim=16,
                                               mlp_dim=32)
    with pytest.raises(ConfigError, match=r"encoder_layer_0\.\.encoder\.layers\.encoder_layer_2: its blocks give "
                                          r"\(2, 17, 16\)-shaped outputs") as why:
        split_backbone(vit)
    assert "\n" not in str(why.value)


class _SkipAround(nn.Module):
    """A residual connection around the whole chain: the tail reads the stem's output as well."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(*[nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()) for _ in range(3)])
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        return self.fc((self.body(h) + h).mean((2, 3)))


def test_a_skip_around_the_chain_is_refused():
    with pytest.raises(ConfigError, match=r"reads stem, computed before it \(a skip around the chain from body\.0\)"):
        split_backbone(_SkipAround().eval())


def test_the_cut_shares_the_models_modules_and_leaves_its_mode():
    model = torchvision.models.get_model("mobilenet_v2", weights=None, num_classes=10).train()
    bb = split_backbone(model)
    assert model.training
    assert bb.blocks[0][1] is model.features[0]
    with torch.no_grad():
        model.classifier[1].bias.add_(1.0)  # the tail runs the model's own classifier, not a copy
    model.eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        assert torch.equal(bb.forward(x), model(x))
