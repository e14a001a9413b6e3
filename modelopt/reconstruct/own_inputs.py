"""Each layer refitted, in forward order, on what the compressed network feeds it, against the float layer's output.

The per-layer repairs (GPTQ, SparseGPT, the least-squares refit) see the float model's inputs X. In the compressed
network layer l is fed X_q, which carries every error made before it. With both on the same calibration images
(rows: images x positions, columns: the weight's fan-in), the weights that best give the float layer's output
from the compressed input are, in least squares,

    W* = W C H_q^-1,    C = X^T X_q,    H_q = X_q^T X_q,

and ||W' X_q^T - W X^T||^2 = ||(W' - W*) X_q^T||^2 + const, so the plan's codes are then chosen for W* by GPTQ on
H_q, on the plan's fixed grid and mask (the asymmetric calibration of GPTAQ, Li et al. 2025; OBC's split: layers
compressed on float inputs to compose plans from, the chosen plan refitted on its own). A pruned layer left in
float gets W* with its fixed mask by the same column sweep without rounding (the OBS update). Layers are taken in
the order the network defines them, each pass running both networks up to the layer only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import torch
from torch import nn

from modelopt.compressors.contract import (
    SCALE_DTYPE,
    Granularity,
    IntegerWeight,
    code_range,
    to_scale_dtype,
)
from modelopt.errors import ConfigError
from modelopt.model.backbone import split_backbone
from modelopt.model.layer_inputs import UNFOLD_BYTES, LayerInputs, sampled_unfold, unfolded_bytes
from modelopt.solvers.gptq import gptq_round
from modelopt.solvers.least_squares import least_squares

__all__ = ["Grid", "LayerFit", "LayerGoal", "refit_layers"]

# A conv's moments are summed over at most about this many rows per column of its fan-in (output positions taken
# evenly): GPTQ's own calibration has 64 per column; every position of a CIFAR image would be thousands.
ROWS_PER_INPUT = 256


# Each row's scales may be rescaled by one of these before its codes are chosen: the scales the layer-wise search
# picked (by weight error) are not the ones that give the least output error. Never finer than picked: the packed
# file entropy codes the codes, and a finer grid spreads them over more levels (more bytes). With finer multipliers
# (down to 0.7) the refit chose them, and the default run's refitted finalists grew 3-11 % over the plans the
# search priced (INT3 anchor: 12.84x on val, 11.62x as refitted).
MULTIPLIERS = (1.0, 1.05, 1.1, 1.2)


def rescaled(integer: IntegerWeight, m: torch.Tensor) -> IntegerWeight:
    """`integer` with each row's scales times m[row] (a per-tensor scale: times m[0]), rounded to the stored
    scale type; the codes are left as they are."""
    rows = integer.codes.shape[0]
    if integer.granularity is Granularity.PER_TENSOR:
        scales = integer.scales.float() * m[0]
    else:
        scales = (integer.scales.float().reshape(rows, -1) * m.float().reshape(rows, 1)).reshape(-1)
    return replace(integer, scales=to_scale_dtype(scales).to(SCALE_DTYPE))


def scale_per_weight(integer: IntegerWeight) -> torch.Tensor:
    """Each stored weight's scale (float32, the codes' shape)."""
    ones = replace(integer, codes=torch.ones_like(integer.codes))
    return ones.dequantize()


@dataclass(frozen=True)
class Grid:
    """A quantized layer's stored form at its stored shape: its scales (rows may be rescaled) and code range."""

    integer: IntegerWeight

    @property
    def range(self) -> tuple[int, int]:
        return code_range(self.integer.bits)


@dataclass(frozen=True)
class LayerGoal:
    """One layer to refit: the float weight whose output is the target (full shape), the kept rows and columns
    of the stored shape (None: all), the mask of stored weights (stored shape; None: dense), the grid (None:
    float) and the bits its arithmetic is priced at (a rate grid's rate, rounded up, though its codes sit in int8;
    None: the grid's width)."""

    weight: torch.Tensor
    rows: torch.Tensor | None
    cols: torch.Tensor | None
    keep: torch.Tensor | None
    grid: Grid | None
    bits: int | None = None


@dataclass(frozen=True)
class LayerFit:
    """A refitted layer: its weight at the stored shape (codes times scales, or float) and the output error on the
    calibration images, relative to the float layer's output energy, before and after."""

    name: str
    weight: torch.Tensor
    before: float
    after: float
    integer: IntegerWeight | None = None  # the codes and scales `weight` dequantizes from; None: float


class _Stop(Exception):
    """Raised by the capture hook once the layer's input is read: the rest of the network need not run."""


def _capture(model: nn.Module, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`module`'s input when `model` runs on `x`, running the model only up to it."""
    seen: list[torch.Tensor] = []

    def hook(_: nn.Module, inp: tuple[torch.Tensor, ...]) -> None:
        seen.append(inp[0].detach().float())
        raise _Stop

    handle = module.register_forward_pre_hook(hook)
    try:
        with torch.inference_mode():
            model(x)
    except _Stop:
        pass
    finally:
        handle.remove()
    return seen[0]


def _rows(module: nn.Module, x: torch.Tensor, stride: int = 1) -> torch.Tensor:
    """The input as (groups, rows, fan-in) in the weight's column order; a conv's output positions taken every
    `stride`-th (the same positions for every input of the same shape)."""
    if not isinstance(module, nn.Conv2d):
        return x.reshape(1, -1, x.shape[-1])
    if isinstance(module.padding, str):  # unfold takes numbers; a conv built with padding="same"/"valid"
        raise ConfigError(f"reconstruction needs a conv's padding as numbers; this one has padding={module.padding!r}")
    cols = sampled_unfold(module, x, stride)  # (n, fan_in*g, positions)
    g = module.groups
    return cols.reshape(cols.shape[0], g, -1, cols.shape[2]).permute(1, 0, 3, 2).reshape(g, -1, cols.shape[1] // g)


def paired_moments(floats: tuple[nn.Module, nn.Module, torch.Tensor], owns: tuple[nn.Module, nn.Module, torch.Tensor],
                   batch: int, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(H_q, C) per group, (groups, fan_in, fan_in) in float64: X_q^T X_q and X^T X_q, the layer's inputs when
    each network (float, own) runs its unit on its input; and the float output's energy ||W X^T||^2 for the
    weight rows `w` (groups, rows, fan_in)."""
    float_model, fmodule, xf = floats
    model, module, x = owns
    hq: torch.Tensor | None = None
    c: torch.Tensor | None = None
    energy = 0.0
    wt = w.float().transpose(1, 2)
    step, stride = batch, 1
    if isinstance(module, nn.Conv2d):
        one = _capture(model, module, x[:1])
        per_image = unfolded_bytes(module, one)
        positions = per_image // (4 * max(1, w.shape[-1] * w.shape[0]))  # output positions per image
        # an integer stride: a layer with fewer than twice the rows keeps them all (cut to an even count, its refits
        # changed more answers; measured: docs/reconstruction.md#measured)
        stride = max(1, (x.shape[0] * positions) // (ROWS_PER_INPUT * w.shape[-1]))
        step = max(1, min(batch, UNFOLD_BYTES * stride // max(1, 2 * per_image)))
    for i in range(0, x.shape[0], step):
        rf = _rows(module, _capture(float_model, fmodule, xf[i:i + step]), stride)
        rq = _rows(module, _capture(model, module, x[i:i + step]), stride)
        h1, c1 = (rq.transpose(1, 2) @ rq).double(), (rf.transpose(1, 2) @ rq).double()
        hq, c = (h1, c1) if hq is None or c is None else (hq + h1, c + c1)
        energy += float((rf @ wt.to(rf.device)).double().pow(2).sum())
    assert hq is not None and c is not None, "at least one image"
    return hq, c, energy


def _error(w: torch.Tensor, hq: torch.Tensor, c: torch.Tensor, w_float: torch.Tensor, energy: float) -> float:
    """||W' X_q^T - W X^T||^2 / ||W X^T||^2 from the moments (`energy`: ||W X^T||^2)."""
    cross = torch.einsum("goi,gij,goj->", w_float, c, w)
    quad = torch.einsum("goi,gij,goj->", w, hq, w)
    return float((quad - 2 * cross + energy) / max(energy, 1e-30))


def refit_layers(float_model: nn.Module, model: nn.Module, targets: Mapping[str, LayerGoal], x: torch.Tensor,
                 batch: int = 128, progress: Callable[[str], None] | None = None) -> dict[str, LayerFit]:
    """Refits each target layer of `model` on its own inputs, in forward order, and leaves the refitted weight in
    `model` where it fits better than the one it had. `float_model`: the float network; `x`: prepared calibration
    images.

    The network is walked unit by unit (`modelopt.model.backbone`: stem, each block, tail), both networks' unit
    inputs held, so a layer's inputs cost one pass of its unit; a network that cannot be cut is run whole per layer.
    """
    out: dict[str, LayerFit] = {}
    for unit, funit, xq, xf in _units(float_model, model, x, batch):
        fmods = {id(m): fm for m, fm in zip(unit.modules(), funit.modules(), strict=True)}
        names = {id(m): n for n, m in model.named_modules()}
        for module in unit.modules():
            name = names.get(id(module), "")
            if name not in targets or name in out:
                continue
            t = targets[name]
            if isinstance(module, nn.Conv2d) and (isinstance(module.padding, str) or (
                    module.groups > 1 and (t.rows is not None or t.cols is not None))):
                continue  # padding unfold cannot take, or a grouped conv whose groups were cut: its own fit stays
            out[name] = _refit(name, t, (funit, fmods[id(module)], xf), (unit, module, xq), batch)
            if progress:
                progress(f"{name}: relative output error {out[name].before:.4f} -> {out[name].after:.4f}")
    return out


def _units(float_model: nn.Module, model: nn.Module, x: torch.Tensor, batch: int
           ) -> Iterator[tuple[nn.Module, nn.Module, torch.Tensor, torch.Tensor]]:
    """(unit, float unit, its input in the compressed network, in the float network) in forward order; a unit's
    input is computed after the units before it were refitted."""
    size = (int(x.shape[-2]), int(x.shape[-1])) if x.dim() == 4 else (1, 1)
    try:
        cut, fcut = split_backbone(model, size), split_backbone(float_model, size)
    except (ConfigError, ValueError):
        yield model, float_model, x, x
        return
    pairs = [(cut.stem, fcut.stem), *zip((b for _, b in cut.blocks), (b for _, b in fcut.blocks), strict=True),
             (cut.tail, fcut.tail)]
    xq = xf = x
    for unit, funit in pairs:
        yield unit, funit, xq, xf
        xq, xf = _outputs(unit, xq, batch), _outputs(funit, xf, batch)


def _outputs(unit: nn.Module, x: torch.Tensor, batch: int) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat([unit(x[i:i + batch]) for i in range(0, x.shape[0], batch)])


def _refit(name: str, t: LayerGoal, floats: tuple[nn.Module, nn.Module, torch.Tensor],
           owns: tuple[nn.Module, nn.Module, torch.Tensor], batch: int) -> LayerFit:
    """One layer refitted: `floats` and `owns` are (unit, the layer in it, the unit's input) of each network."""
    float_model, fmodule, xf = floats
    model, module, x = owns
    weight = module.get_parameter("weight")
    g = module.groups if isinstance(module, nn.Conv2d) else 1
    full = t.weight.detach().double()
    k = full[0].numel()
    rows = torch.arange(full.shape[0], device=full.device) if t.rows is None else t.rows.to(full.device)
    cols = torch.arange(full.shape[1], device=full.device) if t.cols is None else t.cols.to(full.device)
    kernel = full[0, 0].numel() if full.dim() > 2 else 1
    col_idx = (cols[:, None] * kernel + torch.arange(kernel, device=full.device)).reshape(-1)
    w_rows = full.reshape(full.shape[0], k)[rows].reshape(g, -1, k)  # the kept rows' float weights, per group
    hq, c, energy = paired_moments((float_model, fmodule, xf), (model, module, x), batch, w_rows)
    hq, c = hq[:, col_idx[:, None], col_idx[None, :]], c[:, :, col_idx]
    stored = (len(rows), len(cols), *full.shape[2:])
    current = weight.detach().double().reshape(full.shape[0], k)[rows][:, col_idx]
    before = _error(current.reshape(g, -1, len(col_idx)), hq, c, w_rows, energy)
    w_star = least_squares(hq, w_rows @ c).reshape(stored)  # W* = W C H_q^-1 per group
    inputs = LayerInputs(hq, x.shape[0])
    integer = None
    if t.grid is None:
        new = gptq_round(w_star, None, 0, 0, inputs, keep=t.keep)
    else:
        integer = _codes(w_star, t.grid, inputs, t.keep)
        new = integer.dequantize()
    new = new.reshape(stored).to(weight.dtype)
    after = _error(new.double().reshape(g, -1, len(col_idx)), hq, c, w_rows, energy)
    if after >= before:  # the layer-wise solution fits its own inputs at least as well: it stays
        return LayerFit(name, current.reshape(stored).to(weight.dtype), before, before,
                        None if t.grid is None else t.grid.integer)
    placed = weight.detach().clone()
    placed[rows.to(placed.device)[:, None], cols.to(placed.device)[None, :]] = new.to(placed.device)
    weight.data = placed
    return LayerFit(name, new, before, after, integer)

def _codes(w: torch.Tensor, grid: Grid, inputs: LayerInputs, keep: torch.Tensor | None) -> IntegerWeight:
    """GPTQ's codes for `w` on `grid`, each row's scales rescaled by the multiplier (`MULTIPLIERS`) that gives
    that row the least output error (one for the whole tensor under a per-tensor scale)."""
    qmin, qmax = grid.range
    rows, g = w.shape[0], inputs.groups
    h = inputs.hessian.reshape(g, -1, inputs.hessian.shape[-1])
    scales = [scale_per_weight(rescaled(grid.integer, torch.full((rows,), m, device=w.device))) for m in MULTIPLIERS]
    if g == 1:  # rows are independent given H: every multiplier's rows in one sweep
        k = len(MULTIPLIERS)
        reps = (k,) + (1,) * (w.dim() - 1)
        stacked = gptq_round(w.repeat(reps), torch.cat(scales), qmin, qmax, inputs,
                             keep=None if keep is None else keep.repeat(reps))
        all_codes = list(stacked.chunk(k))
    else:
        all_codes = [gptq_round(w, sc, qmin, qmax, inputs, keep=keep) for sc in scales]
    best_err = torch.full((rows,), float("inf"), dtype=torch.float64, device=w.device)
    best_m = torch.ones(rows, device=w.device)
    best_codes = grid.integer.codes.clone()
    for m, scale, codes in zip(MULTIPLIERS, scales, all_codes, strict=True):
        d = (codes * scale - w).double().reshape(g, rows // g, -1)
        err = torch.einsum("goi,gij,goj->go", d, h, d).reshape(rows)
        if grid.integer.granularity is Granularity.PER_TENSOR:
            err = err.sum().expand(rows)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_m = torch.where(better, torch.full_like(best_m, m), best_m)
        best_codes[better] = codes.to(torch.int8)[better]
    return replace(rescaled(grid.integer, best_m), codes=best_codes)
