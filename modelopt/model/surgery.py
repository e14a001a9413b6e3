"""Structural surgery on a model: a block's internal channels physically removed.

Which channels to keep is a compressor's decision (`Compressor.kept_channels`, structured pruning);
removing them is the model's: each block's conv1, its norm and conv2 (`modelopt.model.layers.internal_channels`)
are replaced by smaller modules. The evaluator builds the deployable model with it, the packed loader
rebuilds the smaller blocks a checkpoint names with it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from modelopt.errors import ConfigError
from modelopt.model.layers import internal_channels

__all__ = ["remove_channels"]


def remove_channels(model: nn.Module, kept: Mapping[str, torch.Tensor | int]) -> nn.Module:
    """Replaces, in place, each named block conv1 and its norm and conv2 by smaller modules.

    Args:
        model: the model (its weights, norms and statistics are sliced into the new modules).
        kept: {conv1 name: ascending indices of the channels to keep, or a count (the first n)}.

    Returns:
        `model`, whose outputs equal the simulated pruning's (zeroed channels) for the same weights.

    Example:
        >>> small = remove_channels(copy.deepcopy(model), {"layer1.0.conv1": torch.tensor([0, 2, 5])})
    """
    blocks = internal_channels(model)
    modules = dict(model.named_modules())
    for conv1_name, idx in kept.items():
        if conv1_name not in blocks:
            raise ConfigError(f"layer {conv1_name!r} has no internal channels to remove; valid: {', '.join(blocks)}")
        norm_name, conv2_name = blocks[conv1_name]
        c1, bn, c2 = modules[conv1_name], modules[norm_name], modules[conv2_name]
        assert isinstance(c1, nn.Conv2d) and isinstance(bn, nn.BatchNorm2d) and isinstance(c2, nn.Conv2d)
        idx_t = torch.arange(idx) if isinstance(idx, int) else idx.to(torch.long).cpu()
        idx_t = idx_t.to(c1.weight.device)
        k = int(idx_t.numel())
        new1 = _conv_like(c1, c1.in_channels, k)
        new1.weight.data = c1.weight.data[idx_t].clone()
        if c1.bias is not None:
            new1.get_parameter("bias").data = c1.bias.data[idx_t].clone()
        new_bn = nn.BatchNorm2d(k, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
                                device=c1.weight.device, dtype=c1.weight.dtype)
        for attr in ("weight", "bias", "running_mean", "running_var"):
            t = getattr(bn, attr)
            if t is not None:
                getattr(new_bn, attr).data = t.data[idx_t].clone()
        if bn.num_batches_tracked is not None:
            new_bn.get_buffer("num_batches_tracked").data = bn.num_batches_tracked.data.clone()
        new2 = _conv_like(c2, k, c2.out_channels)
        new2.weight.data = c2.weight.data[:, idx_t].clone()
        if c2.bias is not None:
            new2.get_parameter("bias").data = c2.bias.data.clone()
        for name, new in ((conv1_name, new1), (norm_name, new_bn), (conv2_name, new2)):
            parent, _, attr = name.rpartition(".")
            new.train(modules[name].training)
            for p in new.parameters():
                p.requires_grad_(False)
            setattr(modules[parent] if parent else model, attr, new)
    return model


def _pair(t: tuple[int, ...]) -> tuple[int, int]:
    # Conv2d stores its geometry as 2-tuples; its attributes are annotated tuple[int, ...].
    h, w = t
    return h, w


def _conv_like(conv: nn.Conv2d, in_channels: int, out_channels: int) -> nn.Conv2d:
    """An ungrouped Conv2d with `conv`'s geometry, bias, device and dtype, and the given channels."""
    padding = conv.padding if isinstance(conv.padding, str) else _pair(conv.padding)
    return nn.Conv2d(in_channels, out_channels, _pair(conv.kernel_size), _pair(conv.stride), padding,
                     _pair(conv.dilation), 1, conv.bias is not None, conv.padding_mode,
                     device=conv.weight.device, dtype=conv.weight.dtype)
