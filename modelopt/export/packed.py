"""The packed checkpoint: the bytes `size_bytes` counts, in one `torch.save` file that reloads safely.

The file holds only tensors, ints and strings, so `torch.load(weights_only=True)` reads it:

- ``codes``: uint8, every quantized layer's bit-packed codes (`pack_codes`) back to back;
- ``scales``: float16, every quantized layer's scales back to back;
- ``floats``: float32, float layers' weights, batch norms folded to scale and shift per channel,
  biases and any other float tensor, back to back;
- ``index``: compact JSON naming what lies where (layer, spec, shape), in storage order;
- ``plan``: the plan as YAML (`SearchSpace.dump_plan`), ``model``: JSON with the model's name and
  input normalisation, so `load` can rebuild zoo, torchvision and factory models by name.

Small tensors are concatenated because every tensor in a torch.save zip costs a record header and
64-byte alignment: ResNet-20 has ~80 of them, which alone would add ~10 % to an INT4 file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from modelopt.compressors.quantize import (
    Granularity,
    QuantSpec,
    dequantize,
    pack_codes,
    unpack_codes,
)
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluator import Evaluator
from modelopt.export._source import quantized_weights
from modelopt.layers import compressible_modules
from modelopt.plan import Plan

FORMAT = "modelopt.packed"
FORMAT_VERSION = 1
SUFFIX = ".pt"


def _spec_str(spec: QuantSpec) -> str:
    tail = f"g{spec.group_size}" if spec.granularity is Granularity.GROUP else spec.granularity.value
    return f"{spec.bits}/{tail}"


def _parse_spec(text: str) -> QuantSpec:
    bits, tail = text.split("/")
    if tail.startswith("g"):
        return QuantSpec(int(bits), Granularity.GROUP, int(tail[1:]))
    return QuantSpec(int(bits), Granularity(tail))


def export_packed(evaluator: Evaluator, plan: Plan, path: str | Path) -> Path:
    """Writes `plan` applied to the evaluator's model as a packed checkpoint.

    Args:
        evaluator: the evaluator that scored the plan (its workload holds the model).
        plan: the plan to export (quantize decisions only).
        path: the file to write.

    Returns:
        The path written. Its size is within a few percent of ``evaluator.size_bytes(plan)``.

    Example:
        >>> export_packed(ev, space.uniform("quantize", QuantSpec(4)), "r20-int4.pt")
        >>> model = modelopt.load("r20-int4.pt")
    """
    wl = evaluator.workload
    model = wl.model
    layers = compressible_modules(model)
    codes: list[np.ndarray] = []
    scales: list[torch.Tensor] = []
    floats: list[torch.Tensor] = []
    index: dict[str, list[Any]] = {"q": [], "f": []}
    for name, qw in quantized_weights(evaluator, plan).items():
        if qw is None:
            continue
        codes.append(pack_codes(qw.codes, qw.spec.bits))
        scales.append(qw.scales.reshape(-1))
        index["q"].append([name, _spec_str(qw.spec), list(qw.codes.shape)])
    quantized = {entry[0] for entry in index["q"]}
    for mname, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            if mod.running_mean is None or mod.running_var is None:
                raise ConfigError(f"batch norm {mname!r} keeps no running statistics; it cannot be folded for export")
            scale = torch.rsqrt(mod.running_var.float() + mod.eps)
            if mod.weight is not None:
                scale = scale * mod.weight.float()
            shift = -mod.running_mean.float() * scale
            if mod.bias is not None:
                shift = shift + mod.bias.float()
            floats += [scale, shift]
            index["f"].append([mname, "bn", mod.num_features])
            continue
        for pname, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            full = f"{mname}.{pname}" if mname else pname
            if pname == "weight" and layers.get(mname) is mod and mname in quantized:
                continue
            if t is not None and t.is_floating_point():
                floats.append(t.detach().float())
                index["f"].append([full, "t", list(t.shape)])
    space = evaluator.space
    meta = {"name": wl.source.name, "mean": list(wl.source.mean), "std": list(wl.source.std),
            "input_size": None if wl.source.input_size is None else list(wl.source.input_size),
            "num_classes": wl.num_outputs, "plan_key": plan.key}
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": json.dumps(meta, separators=(",", ":")),
        # Flow style ({quantize: {bits: 4}} per layer): half the bytes of block style, as readable.
        "plan": yaml.safe_dump(space.dump_plan(plan), sort_keys=False, default_flow_style=None),
        "index": json.dumps(index, separators=(",", ":")),
        "codes": torch.from_numpy(np.concatenate(codes) if codes else np.zeros(0, np.uint8)),
        "scales": torch.cat(scales).cpu() if scales else torch.zeros(0, dtype=torch.float16),
        "floats": torch.cat([f.reshape(-1).cpu() for f in floats]) if floats else torch.zeros(0),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


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
    if payload.get("version") != FORMAT_VERSION:
        raise LoadError(
            f"{str(path)!r} is packed format version {payload.get('version')!r}; this modelopt reads {FORMAT_VERSION}"
        )
    return payload


def load(path: str | Path, model: nn.Module | None = None) -> nn.Module:
    """Rebuilds the compressed model a packed checkpoint holds, in eval mode on the CPU.

    Quantized weights are dequantized from their codes and scales exactly as the evaluator did;
    batch norms get their folded scale and shift (with zero mean, unit variance and eps 0).

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
    index = json.loads(payload["index"])
    module = _rebuild(meta, path) if model is None else model
    module = module.cpu().float().eval()
    modules = dict(module.named_modules())
    state = module.state_dict(keep_vars=True)
    layers = compressible_modules(module)
    codes: np.ndarray = payload["codes"].numpy()
    scales: torch.Tensor = payload["scales"]
    floats: torch.Tensor = payload["floats"]
    c_off = s_off = f_off = 0
    for name, spec_text, shape in index["q"]:
        mod = layers.get(name)
        if mod is None or tuple(mod.weight.shape) != tuple(shape):
            got = "missing" if mod is None else f"shape {tuple(mod.weight.shape)}"
            raise LoadError(f"{str(path)!r}: layer {name!r} {tuple(shape)} does not fit the model ({got})")
        spec = _parse_spec(spec_text)
        n_codes = math.ceil(math.prod(shape) * spec.bits / 8)
        n_scales = _n_scales(shape, spec)
        q = unpack_codes(codes[c_off : c_off + n_codes], spec.bits, shape)
        w = dequantize(q, scales[s_off : s_off + n_scales], spec)
        mod.weight.data = w.to(mod.weight.dtype).contiguous()
        c_off, s_off = c_off + n_codes, s_off + n_scales
    for name, kind, shape in index["f"]:
        if kind == "bn":
            bn = modules.get(name)
            if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.num_features != shape:
                raise LoadError(f"{str(path)!r}: batch norm {name!r} ({shape} channels) does not fit the model")
            scale, shift = floats[f_off : f_off + shape], floats[f_off + shape : f_off + 2 * shape]
            _set_affine(bn, scale, shift)
            f_off += 2 * shape
            continue
        t = state.get(name)
        if t is None or tuple(t.shape) != tuple(shape):
            raise LoadError(f"{str(path)!r}: tensor {name!r} {tuple(shape)} does not fit the model")
        n = math.prod(shape)
        t.data = floats[f_off : f_off + n].reshape(shape).to(t.dtype).clone()
        f_off += n
    for p in module.parameters():
        p.requires_grad_(False)
    return module


def _n_scales(shape: list[int], spec: QuantSpec) -> int:
    if spec.granularity is Granularity.PER_TENSOR:
        return 1
    if spec.granularity is Granularity.PER_CHANNEL:
        return shape[0]
    return shape[0] * math.ceil(math.prod(shape[1:]) / spec.group_size)


def _set_affine(bn: nn.modules.batchnorm._BatchNorm, scale: torch.Tensor, shift: torch.Tensor) -> None:
    """Makes `bn` compute x * scale + shift exactly: mean 0, variance 1, eps 0."""
    assert bn.running_mean is not None and bn.running_var is not None
    bn.eps = 0.0
    if bn.weight is not None and bn.bias is not None:
        bn.weight.data = scale.clone()
        bn.bias.data = shift.clone()
        bn.running_mean.data = torch.zeros_like(scale)
        bn.running_var.data = torch.ones_like(scale)
    else:  # no affine parameters: express the same map through the statistics
        bn.running_var.data = 1.0 / scale**2
        bn.running_mean.data = -shift / scale


def _rebuild(meta: dict[str, Any], path: str | Path) -> nn.Module:
    from modelopt.models import load_model
    from modelopt.zoo import MODELS, ZooEntry

    name = str(meta["name"])
    if name in MODELS.names():
        entry = MODELS.get(name)
        return entry.factory() if isinstance(entry, ZooEntry) else entry()  # type: ignore[operator]
    if name.startswith("torchvision:"):
        try:
            import torchvision
        except ImportError:
            raise LoadError(f"rebuilding {name!r} needs torchvision; install it with pip install 'modelopt[vision]'")
        return torchvision.models.get_model(name.removeprefix("torchvision:"), weights=None,
                                            num_classes=int(meta["num_classes"]))
    if ":" in name and "/" not in name and "\\" not in name:
        return load_model(name).module
    raise LoadError(
        f"{str(path)!r} was exported from model {name!r}, which cannot be rebuilt by name; "
        "pass the architecture: modelopt.load(path, model=your_module)"
    )
