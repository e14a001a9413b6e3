"""The module a packed checkpoint describes: its architecture rebuilt by name, its early-exit wrapper."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from modelopt.compressors.early_exit import EarlyExitNet, ExitHead, ExitPolicy, HeadSpec, split_backbone
from modelopt.errors import ConfigError, LoadError
from modelopt.model.loader import load_model
from modelopt.zoo import MODELS, ZooEntry

HEAD_TENSORS = ("weight", "bias", "temperature", "hidden_weight", "hidden_bias")  # an exit head's, in file order


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


def with_exits(module: nn.Module, entries: list[Any], floats: torch.Tensor, meta: dict[str, Any],
                path: str | Path) -> nn.Module:
    """The loaded model wrapped in the `EarlyExitNet` the plan's exits describe (heads from the file)."""
    heads, off = {}, 0
    for point, _, avg, mx, hidden, shapes in entries:
        t = {}
        for name, shape in shapes:
            n = math.prod(shape)
            t[name] = floats[off : off + n].reshape(shape).clone()
            off += n
        heads[point] = ExitHead(HeadSpec(tuple(avg), tuple(mx), int(hidden)), t["weight"], t["bias"],
                                t.get("hidden_weight"), t.get("hidden_bias"), t["temperature"])
    size = meta.get("input_size") or [32, 32]
    try:
        backbone = split_backbone(module, (int(size[-2]), int(size[-1])))
        policy = ExitPolicy(tuple(e[0] for e in entries), tuple(float(e[1]) for e in entries))
        return EarlyExitNet(backbone, heads, policy).eval()
    except ConfigError as exc:
        raise LoadError(f"{str(path)!r}: its early exits do not fit the model: {exc}") from None
