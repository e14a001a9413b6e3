"""The packed checkpoint: the bytes `size_bytes` counts, in one `torch.save` file that reloads safely.

The file holds only tensors, ints and strings, so `torch.load(weights_only=True)` reads it:

- ``codes``: uint8, every quantized layer's code segment back to back (`encode_codes`: the
  codes entropy-coded with the layer's own histogram, or bit-packed where that is smaller); for a pruned layer
  only the kept weights' codes;
- ``scales``: float16, every quantized layer's scales back to back;
- ``masks``: uint8, which weights each unstructured-pruned layer keeps, one segment each: the mask's bits
  entropy-coded, or a bitmask or list of positions (`encode_mask`), whichever is smallest;
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
64-byte alignment: a small model's many small tensors would add a noticeable share to an INT4 file (measured:
docs/export-and-latency.md#measured).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from modelopt._files import save_atomic  # a failed or killed export leaves the old file, never half a zip
from modelopt.compressors.contract import Routes, WeightForm, encode_codes, encode_mask_segment, kept_codes
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.model.layers import compressible_modules
from modelopt.plan.plan import Plan

FORMAT = "modelopt.packed"
# 2: sparse and structurally pruned layers; 3: quantized inputs; 4: early-exit heads; 5: entropy-coded codes and
# masks (each segment's length in the index). Older files still load.
FORMAT_VERSION = 5
_READS = (1, 2, 3, 4, 5)
SUFFIX = ".pt"
# What the file holds beyond the bytes size_bytes counts (which it holds exactly, in its codes, scales, masks and
# floats): the zip's records and alignment, the index and the plan, a few KiB whatever the model's size.
CONTAINER_BYTES = 8192
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
        self.codes.append(encode_codes(kept_codes(form), q.bits))
        self.scales.append(q.scales.reshape(-1).cpu())
        mask = 0
        if form.mask is not None:
            self.masks.append(encode_mask_segment(form.mask))
            mask = int(self.masks[-1].size)
        self.index["q"].append([name, q.tag, list(q.codes.shape), kept, int(self.codes[-1].size), mask])

    def tensor(self, name: str, t: torch.Tensor, form: WeightForm | None) -> None:
        """A float tensor; a sparse layer weight as its kept values and mask."""
        if form is not None and form.mask is not None:
            self.floats.append(form.weight[form.mask].float())
            self.masks.append(encode_mask_segment(form.mask))
            self.index["f"].append([name, "s", list(t.shape), int(form.mask.sum()), int(self.masks[-1].size)])
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
            # zlib: layer names repeat; this is a fixed cost, a visible share of a small INT4 file (measured:
            # docs/export-and-latency.md#measured).
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
        The path written: ``evaluator.plan_cost(plan).size_bytes`` bytes of codes, scales, masks and floats, and
        the container's few KiB (`CONTAINER_BYTES` at most: zip records, index, plan).

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
