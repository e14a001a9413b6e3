"""The module a packed checkpoint describes: its architecture rebuilt by name (a routed plan's wrapper is its
compressor's: `Routes.unpack`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from modelopt.errors import LoadError
from modelopt.model.loader import load_model
from modelopt.zoo import MODELS, ZooEntry


def architecture(meta: dict[str, Any], path: str | Path) -> nn.Module:
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
