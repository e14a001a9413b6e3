"""Reading a packed checkpoint (`modelopt.exporters.packed` writes it): `load` rebuilds the module the plan ran as.

Only tensors, ints and strings are read (`torch.load(weights_only=True)`): codes are unpacked and dequantized with
their scales, masks decoded, batch norms unfolded from their scale and shift, structurally pruned blocks rebuilt at
their smaller size, quantized inputs and a routed plan's exits put back as the file says.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from modelopt.compressors import COMPRESSORS
from modelopt.compressors.contract import (
    InputQParams,
    IntegerWeight,
    Routes,
    decode_codes,
    decode_mask,
    decode_mask_segment,
    install_input_quantizers,
    sparse_index_bytes,
    unpack_codes,
)
from modelopt.errors import ConfigError, LoadError
from modelopt.exporters._rebuild import architecture
from modelopt.exporters.packed import _READS, FOLDED_EPS, FORMAT, FORMAT_VERSION
from modelopt.model.attention import unfuse_attention
from modelopt.model.channels import ChannelGroups  # rebuilds the smaller groups the index names
from modelopt.model.layers import compressible_modules

__all__ = ["load", "read_packed", "read_plan"]


def read_packed(path: str | Path) -> dict[str, Any]:
    """The raw payload of a packed checkpoint (weights_only: no code runs on load)."""
    path = Path(path)
    if not path.is_file():
        raise LoadError(f"no such packed checkpoint: {str(path)!r}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- a corrupt zip, a pickled object: torch raises many kinds
        raise LoadError(f"cannot read {str(path)!r} as a modelopt packed checkpoint: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise LoadError(f"{str(path)!r} is not a modelopt packed checkpoint (written by modelopt.export)")
    if payload.get("version") not in _READS:
        raise LoadError(
            f"{str(path)!r} is packed format version {payload.get('version')!r}; this modelopt reads {FORMAT_VERSION}"
        )
    return payload


def read_plan(path: str | Path) -> dict[str, Any]:
    """The plan a packed checkpoint was exported with, in its hand-writable form (the plan YAML's).

    Example:
        >>> yaml.safe_dump(read_plan("runs/r20/model-best.pt"))
    """
    raw = read_packed(path)["plan"]
    return json.loads(zlib.decompress(raw)) if isinstance(raw, bytes) else yaml.safe_load(raw)


def load(path: str | Path, model: nn.Module | None = None) -> nn.Module:
    """Rebuilds the compressed model a packed checkpoint holds, in eval mode on the CPU.

    Quantized weights are dequantized from their codes and scales exactly as the evaluator did;
    pruned weights are zero where the mask says so; structurally pruned blocks are rebuilt with
    their groups' smaller modules (`ChannelGroups`); batch norms get their folded scale and
    shift (zero mean, and variance plus a positive eps exactly 1), from re-estimated statistics after pruning.
    Layers whose inputs the plan quantizes get forward pre-hooks that quantize-dequantize them
    with the stored scale and zero point, as the evaluator did (`install_input_quantizers`).

    Args:
        path: a file written by `modelopt.export(..., format="modelopt")`.
        model: the architecture to load into (any weights); default: rebuilt from the model name
            recorded in the file (zoo names, ``torchvision:NAME``, ``package.module:factory``).

    Raises:
        LoadError: the file is not a packed checkpoint, its model cannot be rebuilt by name, or
            `model` does not have its layers.

    Example:
        >>> net = modelopt.load("runs/r20/model-best.pt")
        >>> net(torch.randn(1, 3, 32, 32)).shape
        torch.Size([1, 10])
    """
    payload = read_packed(path)
    meta = json.loads(payload["model"])
    raw = payload["index"]
    index = json.loads(zlib.decompress(raw) if isinstance(raw, bytes) else raw)  # version 1: plain JSON
    module = architecture(meta, path) if model is None else model
    module = unfuse_attention(module.cpu().float().eval())  # as every workload holds it (`modelopt.model.attention`)
    _shrink(module, [(str(name), int(k)) for name, k in index.get("c", [])], meta, path)
    stream = _Reader(payload, str(path))
    layers = compressible_modules(module)
    for name, tag, shape, *rest in index["q"]:
        _load_integer(stream, layers.get(name), name, tag, shape, [int(r) for r in rest])
    modules, state = dict(module.named_modules()), module.state_dict(keep_vars=True)
    for name, kind, shape, *rest in index["f"]:
        if kind == "bn":
            _load_norm(stream, modules.get(name), name, shape)
        else:
            _load_tensor(stream, state.get(name), name, shape, [int(r) for r in rest] if kind == "s" else [])
    acts = index.get("a", [])
    missing = [name for name, *_ in acts if name not in layers]
    if missing:
        raise LoadError(f"{str(path)!r}: layer {missing[0]!r} (quantized input) does not fit the model")
    scales_a = stream.floats(len(acts)).tolist()
    install_input_quantizers(layers, {name: InputQParams(scale, int(zp), int(bits))
                                      for (name, bits, zp), scale in zip(acts, scales_a, strict=True)})
    for p in module.parameters():
        p.requires_grad_(False)
    for name in COMPRESSORS.names():  # a routed plan (early exit): its compressor rebuilds the route
        cls = COMPRESSORS.get(name)
        if issubclass(cls, Routes) and cls.packed_key is not None and index.get(cls.packed_key):
            try:
                return cls.unpack(module, index[cls.packed_key], stream.floats(None), meta)
            except (ConfigError, LoadError) as exc:
                raise LoadError(f"{str(path)!r}: {exc}") from None
    return module


def _shrink(module: nn.Module, kept: list[tuple[str, int]], meta: dict[str, Any], path: str | Path) -> None:
    """The architecture at the sizes a structurally pruned plan left: each group root keeps `k` output channels,
    and its group shrinks with it (`modelopt.model.channels`); which channels go does not matter, their values
    are the file's."""
    if not kept:
        return
    size = meta.get("input_size") or [32, 32]
    layers = compressible_modules(module)
    try:
        groups = ChannelGroups(module, torch.zeros(1, 3, int(size[-2]), int(size[-1])), layers, check=False)
        for root, k in kept:
            if root not in groups.roots:
                raise ConfigError(f"layer {root!r} roots no channel group of this model; roots: "
                                  f"{', '.join(list(groups.roots)[:8])}")
            groups.remove(module, groups.removals(root, range(groups.roots[root] - k)))
    except ConfigError as exc:
        raise LoadError(f"{str(path)!r}: {exc}") from None


class _Reader:
    """The payload's streams, each read front to back in the order `_Sections` wrote them."""

    def __init__(self, payload: dict[str, Any], path: str) -> None:
        self.path = path
        self._codes: np.ndarray = payload["codes"].numpy()
        self._scales: torch.Tensor = payload["scales"]
        self._floats: torch.Tensor = payload["floats"]
        self._masks: np.ndarray = payload["masks"].numpy() if "masks" in payload else np.zeros(0, np.uint8)
        self._off = {"codes": 0, "scales": 0, "floats": 0, "masks": 0}
        self.coded = int(payload.get("version", 1)) >= 5  # segments (`decode_codes`), not raw

    def _take(self, stream: str, n: int | None) -> Any:
        data, start = getattr(self, f"_{stream}"), self._off[stream]
        self._off[stream] = len(data) if n is None else start + n
        return data[start : self._off[stream]]

    def codes(self, n: int) -> np.ndarray:
        return self._take("codes", n)

    def integer_codes(self, bits: int, shape: list[int] | tuple[int, ...], n: int) -> torch.Tensor:
        """The next codes of `shape`: a segment of `n` bytes (version 5), else bit-packed."""
        if self.coded:
            return decode_codes(self._take("codes", n), bits, shape)
        return unpack_codes(self._take("codes", math.ceil(math.prod(shape) * bits / 8)), bits, shape)

    def scales(self, n: int) -> torch.Tensor:
        return self._take("scales", n)

    def floats(self, n: int | None) -> torch.Tensor:
        """The next `n` floats (None: all that are left)."""
        return self._take("floats", n)

    def mask(self, shape: list[int], kept: int, n: int = 0) -> torch.Tensor:
        """The next mask: a segment of `n` bytes (version 5), else a bitmask or positions."""
        if self.coded:
            return decode_mask_segment(self._take("masks", n), shape, kept)
        return decode_mask(self._take("masks", sparse_index_bytes(math.prod(shape), kept)), shape, kept)


def _load_integer(stream: _Reader, mod: nn.Module | None, name: str, tag: str, shape: list[int],
                  rest: list[int]) -> None:
    """An integer weight: codes (of the kept weights only, when `kept` >= 0) times scales; `rest`: the index
    entry's kept count, then (version 5) its code and mask segments' bytes."""
    kept, code_bytes, mask_bytes = (rest + [-1, 0, 0][len(rest):])[:3]
    weight = None if mod is None else mod.weight
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(shape):
        got = "missing" if weight is None else f"shape {tuple(getattr(weight, 'shape', ()))}"
        raise LoadError(f"{stream.path!r}: layer {name!r} {tuple(shape)} does not fit the model ({got})")
    bits, granularity, group_size = IntegerWeight.layout(tag)
    if kept < 0:
        q = stream.integer_codes(bits, shape, code_bytes)
    else:  # pruned: codes of the kept weights only; the rest are zero
        kept_q = stream.integer_codes(bits, (kept,), code_bytes)
        q = torch.zeros(tuple(shape), dtype=torch.int8)
        q[stream.mask(shape, kept, mask_bytes)] = kept_q
    scales = stream.scales(IntegerWeight.n_scales(shape, granularity, group_size))
    w = IntegerWeight(q, scales, bits, granularity, group_size).dequantize()
    weight.data = w.to(weight.dtype).contiguous()


def _load_norm(stream: _Reader, bn: nn.Module | None, name: str, channels: int) -> None:
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.num_features != channels:
        raise LoadError(f"{stream.path!r}: batch norm {name!r} ({channels} channels) does not fit the model")
    scale, shift = stream.floats(channels), stream.floats(channels)
    _set_affine(bn, scale, shift)


def _load_tensor(stream: _Reader, t: torch.Tensor | None, name: str, shape: list[int], rest: list[int]) -> None:
    """A float tensor; `rest` [kept, (version 5) mask bytes]: a pruned weight, its kept values and where they go."""
    kept, mask_bytes = (rest + [-1, 0][len(rest):])[:2]
    if t is None or tuple(t.shape) != tuple(shape):
        raise LoadError(f"{stream.path!r}: tensor {name!r} {tuple(shape)} does not fit the model")
    if kept < 0:
        t.data = stream.floats(math.prod(shape)).reshape(shape).to(t.dtype).clone()
        return
    mask = stream.mask(shape, kept, mask_bytes)
    w = torch.zeros(tuple(shape), dtype=t.dtype)
    w[mask] = stream.floats(kept).to(t.dtype)
    t.data = w


def _set_affine(bn: nn.modules.batchnorm._BatchNorm, scale: torch.Tensor, shift: torch.Tensor) -> None:
    """Makes `bn` compute x * scale + shift, with a positive eps (CUDA's batch norm refuses eps 0)."""
    assert bn.running_mean is not None and bn.running_var is not None
    if bn.weight is not None and bn.bias is not None:
        # Mean 0 and variance 1 - eps: with eps a power of two, 1 - eps and var + eps = 1 are exact
        # in float32, so the norm multiplies by exactly rsqrt(1) = 1 on every device.
        bn.eps = FOLDED_EPS
        bn.weight.data = scale.clone()
        bn.bias.data = shift.clone()
        bn.running_mean.data = torch.zeros_like(scale)
        bn.running_var.data = torch.full_like(scale, 1.0 - FOLDED_EPS)
    else:  # no affine parameters: express the same map through the statistics, var + eps = 1 / scale^2
        inv = 1.0 / scale.double() ** 2
        # eps far below every channel's 1 / scale^2 (to about float32's precision), so var stays positive.
        bn.eps = min(FOLDED_EPS, 2.0 ** (math.floor(math.log2(float(inv.min()))) - 24))
        bn.running_var.data = (inv - bn.eps).float()
        bn.running_mean.data = -shift / scale
