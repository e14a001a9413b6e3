"""Non-ResNet CIFAR-10 models: a MobileNetV2 (inverted residuals, depthwise convolutions) and a small vision
transformer (patch size 4), both torchvision's own architectures sized for 32x32 images. Their weights are
trained by `models/train_cifar.py` and kept outside the package, in the repository's `models/` folder (see
its README for how they were made and their accuracy): pass `--weights models/<name>.pt`.
"""

from __future__ import annotations

from torch import nn

from modelopt.zoo._registry import CIFAR10_MEAN, CIFAR10_STD, MODELS, ZooEntry

__all__ = ["mobilenetv2", "vit"]

# MobileNetV2's blocks (expansion t, channels c, repeats n, stride s): ImageNet's, with the stem at stride 1 for
# 32x32 images (its stride 2 there would leave 1x1 maps at the end): maps of 32, 16, 8, 4 and 2 pixels.
_CIFAR_SETTING = [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2],
                  [6, 320, 1, 1]]


def mobilenetv2(num_classes: int = 10, width_mult: float = 0.5) -> nn.Module:
    """torchvision's MobileNetV2 at `width_mult`, stride 1 in the stem (0.70 M parameters at width 0.5)."""
    from torchvision.models import MobileNetV2

    model = MobileNetV2(num_classes=num_classes, width_mult=width_mult, inverted_residual_setting=_CIFAR_SETTING)
    stem = model.features[0][0]
    assert isinstance(stem, nn.Conv2d)
    stem.stride = (1, 1)
    return model


def vit(num_classes: int = 10) -> nn.Module:
    """torchvision's VisionTransformer on 32x32 images: patches of 4x4 (64 tokens and a class token), 6 layers of
    width 128 with 4 heads and an MLP of 256 (0.81 M parameters)."""
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=4, num_layers=6, num_heads=4, hidden_dim=128, mlp_dim=256,
                             num_classes=num_classes)


for _name, _factory, _what in [
    ("cifar10_mobilenetv2", mobilenetv2, "MobileNetV2 (width 0.5, CIFAR strides)"),
    ("cifar10_vit", vit, "vision transformer (patch 4, 6 layers of 128)"),
]:
    MODELS.register(_name)(ZooEntry(name=_name, factory=_factory, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                                    input_size=(32, 32), num_classes=10, weights=None,
                                    description=f"{_what} for CIFAR-10; weights: models/{_name}.pt (train_cifar.py)"))
del _name, _factory, _what
