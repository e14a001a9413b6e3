"""Tiny model factories for `package.module:factory` sources (imported by tests/model/test_models.py)."""

from __future__ import annotations

from torch import nn


class TinyNet(nn.Module):
    def __init__(self, classes: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, classes)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def tiny_net() -> nn.Module:
    return TinyNet()


def not_a_model() -> str:
    return "nope"


def needs_args(width: int) -> nn.Module:
    return TinyNet(width)
