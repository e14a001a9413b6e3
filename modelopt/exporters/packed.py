"""The packed checkpoint: the bytes `size_bytes` counts, in one `torch.save` file that reloads safely.

The file holds only tensors, ints and strings, so `torch.load(weights_only=True)` reads it:

- ``codes``: uint8, every quantized layer's bit-packed codes (`pack_codes`) back to back; for a
  pruned layer only the kept weights' codes;
- ``scales``: float16, every quantized layer's scales back to back;
- ``masks``: uint8, which weights each unstructured-pruned layer keeps: a bitmask or a list of
  positions, whichever is smaller (`modelopt.compressors.contract.encode_mask`);
- ``floats``: float32, float layers' weights (only the kept values when pruned), batch norms folded
  to scale and shift per channel, biases and any other float tensor, back to back;
- ``index``: zlib-compressed JSON naming what lies where (layer, spec, shape, kept values), in storage order,
  and the channels each structurally pruned block keeps (its modules are stored at that size);
  for layers whose inputs are quantized (``activations: 8``), their input bits and uint8 zero
  point (``a``), their float32 input scales following the other floats, in that order;
- ``plan``: the plan (`SearchSpace.dump_plan`) as zlib-compressed JSON (`read_plan`; YAML in version 1),
  ``model``: JSON with the model's name and input normalisation, so `load` can rebuild zoo,
  torchvision and factory models by name.

Small tensors are concatenated because every tensor in a torch.save zip costs a record header and
64-byte alignment: ResNet-20 has ~80 of them, which alone would add ~10 % to an INT4 file.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from torch import nn

from modelopt._files import save_atomic  # a failed or killed export leaves the old file, never half a zip
from modelopt.compressors import COMPRESSORS
from modelopt.compressors.contract import (
    InputQParams,
    IntegerWeight,
    Routes,
    WeightForm,
    decode_mask,
    encode_mask,
    install_input_quantizers,
    pack_codes,
    sparse_index_bytes,
    unpack_codes,
)
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.exporters._rebuild import architecture
from modelopt.model.attention import unfuse_attention
from modelopt.model.channels import ChannelGroups  # rebuilds the smaller groups the index names
from modelopt.model.layers import compressible_modules
from modelopt.plan.plan import Plan

FORMAT = "modelopt.packed"
FORMAT_VERSION = 4  # 2: sparse and structurally pruned layers; 3: quantized inputs; 4: early-exit heads.
# Older files still load.
_READS = (1, 2, 3, 4)
SUFFIX = ".pt"
# eps of every folded batch norm: positive (CUDA refuses 0) and a power of two (exact in float32).
FOLDED_EPS = 2.0**-17


@dataclass
class _Sections:
    """The payload's streams as they are written, in storage order (`load` reads them in the same)."""

    index: dict[str, list[Any]]
    codes: list[np.ndarray] = field(default_factory=list)
    scales: list[torch.Tensor] = field(default_factory=list)
    masks: list[np.ndarray] = field(default_factory=list)
    floats: list[torch.Tensor] = field(default_factory=list)

    def integer(self, name: str, form: WeightForm) -> None:
        """An integer weight: its codes (of the kept weights only, when sparse), scales and mask."""
        q = form.integer
        assert q is not None
        kept = -1 if form.mask is None else int(form.mask.sum())
        self.codes.append(pack_codes(q.codes if form.mask is None else q.codes[form.mask.to(q.codes.device)], q.bits))
        self.scales.append(q.scales.reshape(-1).cpu())
        if form.mask is not None:
            self.masks.append(encode_mask(form.mask))
        self.index["q"].append([name, q.tag, list(q.codes.shape), kept])

    def tensor(self, name: str, t: torch.Tensor, form: WeightForm | None) -> None:
        """A float tensor; a sparse layer weight as its kept values and mask."""
        if form is not None and form.mask is not None:
            self.floats.append(form.weight[form.mask].float())
            self.masks.append(encode_mask(form.mask))
            self.index["f"].append([name, "s", list(t.shape), int(form.mask.sum())])
        elif t.is_floating_point():
            self.floats.append(t.detach().float())
            self.index["f"].append([name, "t", list(t.shape)])

    def norm(self, name: str, mod: nn.modules.batchnorm._BatchNorm) -> None:
        """A batch norm folded to one scale and shift per channel."""
        if mod.running_mean is None or mod.running_var is None:
            raise ConfigError(f"batch norm {name!r} keeps no running statistics; it cannot be folded for export")
        scale = torch.rsqrt(mod.running_var.float() + mod.eps)
        if mod.weight is not None:
            scale = scale * mod.weight.float()
        shift = -mod.running_mean.float() * scale
        if mod.bias is not None:
            shift = shift + mod.bias.float()
        self.floats += [scale, shift]
        self.index["f"].append([name, "bn", mod.num_features])

    def streams(self) -> dict[str, Any]:
        out = {
            # zlib: layer names repeat; this is a fixed cost that is ~2 % of a small INT4 file.
            "index": zlib.compress(json.dumps(self.index, separators=(",", ":")).encode(), 9),
            "codes": torch.from_numpy(np.concatenate(self.codes) if self.codes else np.zeros(0, np.uint8)),
            "scales": torch.cat(self.scales).cpu() if self.scales else torch.zeros(0, dtype=torch.float16),
            "floats": torch.cat([f.reshape(-1).cpu() for f in self.floats]) if self.floats else torch.zeros(0),
        }
        if self.masks:  # only when some layer is sparse: each stored tensor costs a zip record
            out["masks"] = torch.from_numpy(np.concatenate(self.masks))
        return out


def export_packed(evaluator: Evaluator, plan: Plan | Realised, path: str | Path) -> Path:
    """Writes `plan` applied to the evaluator's model as a packed checkpoint.

    Each layer's weight is stored in the form its compressors give it (`Compressor.pack`):
    integer codes and scales, a sparse mask, or float32.

    Args:
        evaluator: the evaluator that scored the plan (its workload holds the model).
        plan: the plan to export, as composed or a `Realised` record (`Evaluator.realise`: a reconstructed plan
            is written with its refitted weights; routed, e.g. with early exits, `load` returns the module its
            compressor rebuilds: an `EarlyExitNet` that stops at the first confident exit).
        path: the file to write.

    Returns:
        The path written. Its size is within a few percent of ``evaluator.plan_cost(plan).size_bytes``.

    Example:
        >>> export_packed(ev, ev.space.load_plan("best_plan.yaml"), "r20.pt")
        >>> model = modelopt.load("r20.pt")
    """
    # The model as the plan runs it: compressed weights, norms (re-estimated statistics) and
    # structurally pruned blocks at their smaller size.
    r = evaluator.realise(plan)
    plan = r.plan
    model = evaluator.physical_model(r)
    forms = r.forms
    out = _Sections({"q": [], "f": [], "c": [[n, int(idx.numel())] for n, (_, idx) in r.kept.items()]})
    for name, layer_form in forms.items():
        if layer_form.integer is not None:
            out.integer(name, layer_form)
    layers = compressible_modules(model)
    for mname, mod in model.named_modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            out.norm(mname, mod)
            continue
        for pname, t in list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False)):
            form: WeightForm | None = forms.get(mname) if pname == "weight" and layers.get(mname) is mod else None
            if t is not None and (form is None or form.integer is None):
                out.tensor(f"{mname}.{pname}" if mname else pname, t, form)
    _add_inputs(out, evaluator, r)
    _add_route(out, evaluator, r)
    wl = evaluator.workload
    meta = {"name": wl.source.name, "mean": list(wl.source.mean), "std": list(wl.source.std),
            "input_size": None if wl.source.input_size is None else list(wl.source.input_size),
            "num_classes": wl.num_outputs, "plan_key": plan.key}
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": json.dumps(meta, separators=(",", ":")),
        # The plan YAML's document as zlib-compressed JSON: a pruned plan names many layers, and
        # on a small INT4 model every fixed byte counts against the 5 % (read it with `read_plan`).
        "plan": zlib.compress(json.dumps(evaluator.space.dump_plan(plan), separators=(",", ":")).encode(), 9),
        **out.streams(),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_atomic(path, lambda f: torch.save(payload, f))
    return path


def _add_inputs(out: _Sections, evaluator: Evaluator, r: Realised) -> None:
    """Quantized inputs: bits and zero point in the index, the float32 scale after the other floats
    (the `QPARAM_BYTES` size accounting counts); `load` puts the same fake quantization back."""
    qparams = evaluator.input_qparams(r)
    if qparams:
        out.index["a"] = [[name, qp.bits, qp.zero_point] for name, qp in qparams.items()]
        out.floats.append(torch.tensor([qp.scale for qp in qparams.values()], dtype=torch.float32))


def _add_route(out: _Sections, evaluator: Evaluator, r: Realised) -> None:
    """A routed plan (early exit): what its routing stores (`Routing.pack`: index entries under its compressor's
    `packed_key`, float32 tensors after those above); `load` asks the compressor to rebuild it (`unpack`)."""
    routes, route = evaluator.routes, r.route
    if route is None or routes.routing is None or routes.owner is None:
        return
    owner = evaluator.space.compressors[routes.owner]
    key = owner.packed_key if isinstance(owner, Routes) else None
    if key is None:
        raise ConfigError(f"compressor {routes.owner!r} cannot store its route in a packed checkpoint; "
                          "export a plan without it")
    entries, floats = routes.routing.pack(route)
    out.index[key] = entries
    out.floats += floats


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
        _load_integer(stream, layers.get(name), name, tag, shape, int(rest[0]) if rest else -1)
    modules, state = dict(module.named_modules()), module.state_dict(keep_vars=True)
    for name, kind, shape, *rest in index["f"]:
        if kind == "bn":
            _load_norm(stream, modules.get(name), name, shape)
        else:
            _load_tensor(stream, state.get(name), name, shape, int(rest[0]) if kind == "s" else -1)
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

    def _take(self, stream: str, n: int | None) -> Any:
        data, start = getattr(self, f"_{stream}"), self._off[stream]
        self._off[stream] = len(data) if n is None else start + n
        return data[start : self._off[stream]]

    def codes(self, n: int) -> np.ndarray:
        return self._take("codes", n)

    def scales(self, n: int) -> torch.Tensor:
        return self._take("scales", n)

    def floats(self, n: int | None) -> torch.Tensor:
        """The next `n` floats (None: all that are left)."""
        return self._take("floats", n)

    def mask(self, shape: list[int], kept: int) -> torch.Tensor:
        return decode_mask(self._take("masks", sparse_index_bytes(math.prod(shape), kept)), shape, kept)


def _load_integer(stream: _Reader, mod: nn.Module | None, name: str, tag: str, shape: list[int], kept: int) -> None:
    """An integer weight: codes (of the kept weights only, when `kept` >= 0) times scales."""
    weight = None if mod is None else mod.weight
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != tuple(shape):
        got = "missing" if weight is None else f"shape {tuple(getattr(weight, 'shape', ()))}"
        raise LoadError(f"{stream.path!r}: layer {name!r} {tuple(shape)} does not fit the model ({got})")
    bits, granularity, group_size = IntegerWeight.layout(tag)
    packed = stream.codes(math.ceil((math.prod(shape) if kept < 0 else kept) * bits / 8))
    if kept < 0:
        q = unpack_codes(packed, bits, shape)
    else:  # pruned: codes of the kept weights only; the rest are zero
        q = torch.zeros(tuple(shape), dtype=torch.int8)
        q[stream.mask(shape, kept)] = unpack_codes(packed, bits, (kept,))
    scales = stream.scales(IntegerWeight.n_scales(shape, granularity, group_size))
    w = IntegerWeight(q, scales, bits, granularity, group_size).dequantize()
    weight.data = w.to(weight.dtype).contiguous()


def _load_norm(stream: _Reader, bn: nn.Module | None, name: str, channels: int) -> None:
    if not isinstance(bn, nn.modules.batchnorm._BatchNorm) or bn.num_features != channels:
        raise LoadError(f"{stream.path!r}: batch norm {name!r} ({channels} channels) does not fit the model")
    scale, shift = stream.floats(channels), stream.floats(channels)
    _set_affine(bn, scale, shift)


def _load_tensor(stream: _Reader, t: torch.Tensor | None, name: str, shape: list[int], kept: int) -> None:
    """A float tensor; `kept` >= 0: a pruned weight, its kept values and where they go."""
    if t is None or tuple(t.shape) != tuple(shape):
        raise LoadError(f"{stream.path!r}: tensor {name!r} {tuple(shape)} does not fit the model")
    if kept < 0:
        t.data = stream.floats(math.prod(shape)).reshape(shape).to(t.dtype).clone()
        return
    mask = stream.mask(shape, kept)
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
