"""The packed checkpoint: the bytes `size_bytes` counts, in one `torch.save` file that reloads safely.

The file holds only tensors, ints and strings, so `torch.load(weights_only=True)` reads it:

- ``codes``: uint8, every quantized layer's bit-packed codes (`pack_codes`) back to back; for a
  pruned layer only the kept weights' codes;
- ``scales``: float16, every quantized layer's scales back to back;
- ``masks``: uint8, which weights each unstructured-pruned layer keeps: a bitmask or a list of
  positions, whichever is smaller (`modelopt.compressors.prune.encode_mask`);
- ``floats``: float32, float layers' weights (only the kept values when pruned), batch norms folded
  to scale and shift per channel, biases and any other float tensor, back to back;
- ``index``: zlib-compressed JSON naming what lies where (layer, spec, shape, kept values), in storage order,
  and the channels each structurally pruned block keeps (its modules are stored at that size);
  for layers whose inputs are quantized (``activations: 8``), their input bits and uint8 zero
  point (``a``), their float32 input scales following the other floats, in that order;
- ``plan``: the plan (`SearchSpace.dump_plan`) as zlib-compressed JSON (`read_plan`; YAML in version 1), ``model``: JSON with the model's name and
  input normalisation, so `load` can rebuild zoo, torchvision and factory models by name.

Small tensors are concatenated because every tensor in a torch.save zip costs a record header and
64-byte alignment: ResNet-20 has ~80 of them, which alone would add ~10 % to an INT4 file.
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

from modelopt.compressors._base import sparse_index_bytes
from modelopt.compressors.activations import InputQParams, install_input_quantizers
from modelopt.compressors.early_exit import EarlyExit
from modelopt.compressors.prune import (
    Prune,
    PruneKind,
    PruneSpec,
    decode_mask,
    encode_mask,
    magnitude_mask,
    remove_channels,
)
from modelopt.compressors.quantize import (
    Granularity,
    Quantize,
    QuantSpec,
    dequantize,
    pack_codes,
    unpack_codes,
)
from modelopt.errors import ConfigError, LoadError
from modelopt.evaluator import Evaluator
from modelopt.layers import compressible_modules
from modelopt.plan import Plan

FORMAT = "modelopt.packed"
FORMAT_VERSION = 4  # 2: sparse and structurally pruned layers; 3: quantized inputs; 4: early-exit heads.
# Older files still load.
_READS = (1, 2, 3, 4)
SUFFIX = ".pt"
# eps of every folded batch norm: positive (CUDA refuses 0) and a power of two (exact in float32).
FOLDED_EPS = 2.0**-17


def _spec_str(spec: QuantSpec) -> str:
    tail = f"g{spec.group_size}" if spec.granularity is Granularity.GROUP else spec.granularity.value
    return f"{spec.bits}/{tail}"


def _parse_spec(text: str) -> QuantSpec:
    bits, tail = text.split("/")
    if tail.startswith("g"):
        return QuantSpec(int(bits), Granularity.GROUP, int(tail[1:]))
    return QuantSpec(int(bits), Granularity(tail))


def _layer_forms(evaluator: Evaluator, plan: Plan) -> dict[str, tuple[Any, ...]]:
    """Per layer: (stored weight, kept-weight mask, quantizer spec, codes, scales), None where unused,
    computed by the same calls on the same (structurally kept) slice as the evaluator."""
    out: dict[str, Any] = {}
    kept = evaluator.kept_channels(plan)
    producer = {layer.channel_consumer: layer.name for layer in evaluator.workload.layers if layer.channel_consumer}
    for layer in evaluator.workload.layers:
        own, prod = kept.get(layer.name), kept.get(producer.get(layer.name, ""))
        w = evaluator.workload.original[layer.name]
        if own is not None:
            w = w[own[1].to(w.device)]
        if prod is not None:
            w = w[:, prod[1].to(w.device)]
        mask = spec = codes = scales = None
        for d in evaluator.space.decisions:
            c = plan.get(d.name)
            if d.layer != layer.name or c is None:
                continue
            comp = evaluator.space.compressors[d.compressor]
            if isinstance(comp, Prune) and isinstance(c, PruneSpec):
                if c.kind is PruneKind.UNSTRUCTURED:
                    mask = magnitude_mask(w, c.sparsity)
                    w = comp.apply(w, c)
            elif isinstance(comp, Quantize) and isinstance(c, QuantSpec):
                spec = c
                cols = None if prod is None else prod[1]
                inputs = evaluator.layer_inputs(layer.name, n, cols) if (n := comp.input_images(c)) else None
                codes, scales = comp.encode(w, c, inputs)
                w = dequantize(codes, scales, c).to(w.dtype)
            elif isinstance(comp, EarlyExit):
                continue  # an exit changes no weight; its head is written apart (index "e")
            else:
                raise ConfigError(f"layer {layer.name!r} uses compressor {d.compressor!r}; the packed export "
                                  "supports 'quantize', 'prune' and 'early_exit'")
        out[layer.name] = (w, mask, spec, codes, scales)
    return out


def export_packed(evaluator: Evaluator, plan: Plan, path: str | Path) -> Path:
    """Writes `plan` applied to the evaluator's model as a packed checkpoint.

    Args:
        evaluator: the evaluator that scored the plan (its workload holds the model).
        plan: the plan to export (quantize, prune and early-exit decisions; with exits, `load`
            returns the `EarlyExitNet` that stops at the first confident exit).
        path: the file to write.

    Returns:
        The path written. Its size is within a few percent of ``evaluator.size_bytes(plan)``.

    Example:
        >>> export_packed(ev, space.uniform("quantize", QuantSpec(4)), "r20-int4.pt")
        >>> model = modelopt.load("r20-int4.pt")
    """
    wl = evaluator.workload
    # The model as the plan runs it: compressed weights, norms (re-estimated statistics) and
    # structurally pruned blocks at their smaller size.
    model = evaluator.physical_model(plan)
    layers = compressible_modules(model)
    forms = _layer_forms(evaluator, plan)
    codes: list[np.ndarray] = []
    scales: list[torch.Tensor] = []
    masks: list[np.ndarray] = []
    floats: list[torch.Tensor] = []
    index: dict[str, list[Any]] = {"q": [], "f": [],
                                   "c": [[n, int(idx.numel())] for n, (_, idx) in evaluator.kept_channels(plan).items()]}
    for name, (_, mask, spec, q, sc) in forms.items():
        if spec is None or q is None or sc is None:
            continue
        n_kept = -1 if mask is None else int(mask.sum())
        codes.append(pack_codes(q.cpu() if mask is None else q[mask].cpu(), spec.bits))
        scales.append(sc.reshape(-1).cpu())
        if mask is not None:
            masks.append(encode_mask(mask))
        index["q"].append([name, _spec_str(spec), list(q.shape), n_kept])
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
            if pname == "weight" and layers.get(mname) is mod and forms[mname][1] is not None:
                mask = forms[mname][1]
                assert mask is not None
                floats.append(forms[mname][0][mask].float())
                masks.append(encode_mask(mask))
                index["f"].append([full, "s", list(t.shape), int(mask.sum())])
                continue
            if t is not None and t.is_floating_point():
                floats.append(t.detach().float())
                index["f"].append([full, "t", list(t.shape)])
    # Quantized inputs: bits and zero point in the index, the float32 scale after the other floats
    # (the 5 bytes `Quantize.weight_bytes` counts); `load` puts the same fake quantization back.
    qparams, _ = evaluator.input_qparams(plan)
    if qparams:
        index["a"] = [[name, qp.bits, qp.zero_point] for name, qp in qparams.items()]
        floats.append(torch.tensor([qp.scale for qp in qparams.values()], dtype=torch.float32))
    # Early exits: each active head's tensors (float32, what size_bytes counts) after those.
    policy = evaluator.exit_policy(plan)
    if policy is not None:
        heads, _ = evaluator.exit_heads()
        index["e"] = []
        for point, threshold in zip(policy.exits, policy.thresholds):
            tensors = heads[point].state_dict()
            names = [n for n in _HEAD_TENSORS if n in tensors]
            spec = heads[point].spec
            index["e"].append([point, threshold, list(spec.avg_grids), list(spec.max_grids), spec.hidden,
                               [[n, list(tensors[n].shape)] for n in names]])
            floats += [tensors[n].float().reshape(-1) for n in names]
    space = evaluator.space
    meta = {"name": wl.source.name, "mean": list(wl.source.mean), "std": list(wl.source.std),
            "input_size": None if wl.source.input_size is None else list(wl.source.input_size),
            "num_classes": wl.num_outputs, "plan_key": plan.key}
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "model": json.dumps(meta, separators=(",", ":")),
        # The plan YAML's document as zlib-compressed JSON: a pruned plan names many layers, and
        # on a small INT4 model every fixed byte counts against the 5 % (read it with `read_plan`).
        "plan": zlib.compress(json.dumps(space.dump_plan(plan), separators=(",", ":")).encode(), 9),
        # zlib: layer names repeat; this is a fixed cost that is ~2 % of a small INT4 file.
        "index": zlib.compress(json.dumps(index, separators=(",", ":")).encode(), 9),
        "codes": torch.from_numpy(np.concatenate(codes) if codes else np.zeros(0, np.uint8)),
        "scales": torch.cat(scales).cpu() if scales else torch.zeros(0, dtype=torch.float16),
        "floats": torch.cat([f.reshape(-1).cpu() for f in floats]) if floats else torch.zeros(0),
    }
    if masks:  # only when some layer is sparse: each stored tensor costs a zip record
        payload["masks"] = torch.from_numpy(np.concatenate(masks))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from modelopt._files import save_atomic  # a failed or killed export leaves the old file, never half a zip
    save_atomic(path, lambda f: torch.save(payload, f))
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
    their smaller conv1 / norm / conv2 (`remove_channels`); batch norms get their folded scale and
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
    module = _rebuild(meta, path) if model is None else model
    module = module.cpu().float().eval()
    try:
        remove_channels(module, {name: int(k) for name, k in index.get("c", [])})
    except ConfigError as exc:
        raise LoadError(f"{str(path)!r}: {exc}") from None
    modules = dict(module.named_modules())
    state = module.state_dict(keep_vars=True)
    layers = compressible_modules(module)
    codes: np.ndarray = payload["codes"].numpy()
    scales: torch.Tensor = payload["scales"]
    floats: torch.Tensor = payload["floats"]
    masks: np.ndarray = payload["masks"].numpy() if "masks" in payload else np.zeros(0, np.uint8)
    c_off = s_off = f_off = m_off = 0
    for name, spec_text, shape, *rest in index["q"]:
        kept = int(rest[0]) if rest else -1
        mod = layers.get(name)
        if mod is None or tuple(mod.weight.shape) != tuple(shape):
            got = "missing" if mod is None else f"shape {tuple(mod.weight.shape)}"
            raise LoadError(f"{str(path)!r}: layer {name!r} {tuple(shape)} does not fit the model ({got})")
        spec = _parse_spec(spec_text)
        n_codes = math.ceil((math.prod(shape) if kept < 0 else kept) * spec.bits / 8)
        n_scales = _n_scales(shape, spec)
        if kept < 0:
            q = unpack_codes(codes[c_off : c_off + n_codes], spec.bits, shape)
        else:  # pruned: codes of the kept weights only; the rest are zero
            mask = decode_mask(masks[m_off:], shape, kept)
            m_off += sparse_index_bytes(math.prod(shape), kept)
            q = torch.zeros(tuple(shape), dtype=torch.int8)
            q[mask] = unpack_codes(codes[c_off : c_off + n_codes], spec.bits, (kept,))
        w = dequantize(q, scales[s_off : s_off + n_scales], spec)
        mod.weight.data = w.to(mod.weight.dtype).contiguous()
        c_off, s_off = c_off + n_codes, s_off + n_scales
    for name, kind, shape, *rest in index["f"]:
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
        if kind == "s":  # pruned float weight: the kept values and where they go
            kept = int(rest[0])
            mask = decode_mask(masks[m_off:], shape, kept)
            m_off += sparse_index_bytes(math.prod(shape), kept)
            w = torch.zeros(tuple(shape), dtype=t.dtype)
            w[mask] = floats[f_off : f_off + kept].to(t.dtype)
            t.data = w
            f_off += kept
            continue
        n = math.prod(shape)
        t.data = floats[f_off : f_off + n].reshape(shape).to(t.dtype).clone()
        f_off += n
    acts = index.get("a", [])
    missing = [name for name, *_ in acts if name not in layers]
    if missing:
        raise LoadError(f"{str(path)!r}: layer {missing[0]!r} (quantized input) does not fit the model")
    scales_a = floats[f_off : f_off + len(acts)].tolist()
    install_input_quantizers(layers, {name: InputQParams(scale, int(zp), int(bits))
                                      for (name, bits, zp), scale in zip(acts, scales_a)})
    f_off += len(acts)
    for p in module.parameters():
        p.requires_grad_(False)
    if index.get("e"):
        return _with_exits(module, index["e"], floats[f_off:], meta, path)
    return module


_HEAD_TENSORS = ("weight", "bias", "temperature", "hidden_weight", "hidden_bias")


def _with_exits(module: nn.Module, entries: list[Any], floats: torch.Tensor, meta: dict[str, Any],
                path: str | Path) -> nn.Module:
    """The loaded model wrapped in the `EarlyExitNet` the plan's exits describe (heads from the file)."""
    from modelopt.early_exit import EarlyExitNet, ExitHead, ExitPolicy, HeadSpec, split_backbone

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


def _n_scales(shape: list[int], spec: QuantSpec) -> int:
    if spec.granularity is Granularity.PER_TENSOR:
        return 1
    if spec.granularity is Granularity.PER_CHANNEL:
        return shape[0]
    return shape[0] * math.ceil(math.prod(shape[1:]) / spec.group_size)


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
