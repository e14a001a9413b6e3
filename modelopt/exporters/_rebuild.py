"""The module a packed checkpoint describes: its architecture rebuilt by name (a routed plan's wrapper is its
compressor's: `Routes.unpack`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelopt.errors import LoadError
from modelopt.model.loader import load_model
from modelopt.zoo import MODELS, ZooEntry

# The random initialisers modules call while they are built: their draws are overwritten by the file's tensors, and
# on ResNet-50 they took a third of `modelopt.load` (0.33 of 1.0 s, benchmarks/decode.py).
_INITIALISERS = ("uniform_", "normal_", "kaiming_uniform_", "kaiming_normal_", "trunc_normal_", "xavier_uniform_",
                 "xavier_normal_", "orthogonal_")


def _zero(tensor: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
    with torch.no_grad():
        return tensor.zero_()


@contextmanager
def _without_random_init() -> Iterator[None]:
    """Modules built inside start at zero instead of random draws (zeros, not uninitialised memory: a tensor the
    file did not overwrite stays a visible zero, never garbage)."""
    saved = {name: getattr(nn.init, name) for name in _INITIALISERS}
    try:
        for name in _INITIALISERS:
            setattr(nn.init, name, _zero)
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def architecture(meta: dict[str, Any], path: str | Path) -> nn.Module:
    with _without_random_init():
        return _build(meta, path)


def _build(meta: dict[str, Any], path: str | Path) -> nn.Module:
    name = str(meta["name"])
    if name in MODELS.names():
        entry = MODELS.get(name)
        return entry.factory() if isinstance(entry, ZooEntry) else entry()
    if name.startswith("torchvision:"):
        try:
            import torchvision
        except ImportError:
            raise LoadError(
                f"rebuilding {name!r} needs torchvision; install it with pip install 'modelopt[vision]'"
            ) from None
        return torchvision.models.get_model(name.removeprefix("torchvision:"), weights=None,
                                            num_classes=int(meta["num_classes"]))
    if ":" in name and "/" not in name and "\\" not in name:
        return load_model(name).module
    raise LoadError(
        f"{str(path)!r} was exported from model {name!r}, which cannot be rebuilt by name; "
        "pass the architecture: modelopt.load(path, model=your_module)"
    )
