"""Second moments of every layer's inputs in the float model: H = X^T X over calibration images.

A model-level measurement: a compressor that picks codes with the layer's inputs (GPTQ,
`modelopt.compressors.quantize.gptq`) asks for them in its `CalibrationNeed.layer_inputs`, and the evaluator
measures them once per image count for every layer (`modelopt.evaluation.compressed_state`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from modelopt.errors import ConfigError
from modelopt.model.images import Images
from modelopt.model.layers import feed_inputs

__all__ = ["LayerInputs", "input_columns", "input_hessians"]


@dataclass(frozen=True)
class LayerInputs:
    """Second moments of one layer's inputs: H = sum of x x^T over calibration rows (float64).

    Columns are ordered as the layer's weight flattened per output channel (in_channels, kh, kw).
    A grouped convolution (depthwise included) has one matrix per group, (groups, fan_in, fan_in):
    each group's output channels see only that group's inputs.
    """

    hessian: torch.Tensor  # (fan_in, fan_in), or (groups, fan_in, fan_in) for a grouped conv
    rows: int  # input rows (images x output positions) it was summed over

    @property
    def groups(self) -> int:
        """How many input groups the matrices are for (1 but for a grouped conv)."""
        return self.hessian.shape[0] if self.hessian.dim() == 3 else 1

    def select(self, columns: torch.Tensor) -> LayerInputs:
        """The second moments of a subset of the columns (structured pruning removed the others)."""
        idx = columns.to(self.hessian.device)
        return LayerInputs(self.hessian[..., idx[:, None], idx[None, :]], self.rows)

    def select_groups(self, groups: torch.Tensor) -> LayerInputs:
        """The matrices of a subset of a grouped conv's groups (structured pruning removed the others)."""
        return LayerInputs(self.hessian[groups.to(self.hessian.device)], self.rows)


def input_columns(kept_inputs: torch.Tensor, kernel: int) -> torch.Tensor:
    """Columns of H that a conv keeps when only `kept_inputs` input channels remain (kernel = kh*kw)."""
    return (kept_inputs[:, None] * kernel + torch.arange(kernel, device=kept_inputs.device)).reshape(-1)


# Unfolded conv inputs above this size are taken a few images at a time: at 224 pixels a batch of a 3x3 conv's
# columns fills gigabytes (every CIFAR-10 model's fit whole, so their sums are unchanged).
UNFOLD_BYTES = 256 * 2**20


def _second_moments(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """X^T X of the module's input x, X as rows x fan_in in the weight's column order (float64; one
    matrix per group for a grouped conv), and X's row count."""
    if not isinstance(module, nn.Conv2d):
        r = x.reshape(-1, x.shape[-1])
        return (r.T @ r).double(), r.shape[0]
    if isinstance(module.padding, str):  # unfold takes numbers; a conv built with padding="same"/"valid"
        raise ConfigError(f"GPTQ needs a conv's padding as numbers; this one has padding={module.padding!r}")
    per_image = unfolded_bytes(module, x[:1])
    if x.shape[0] > 1 and per_image * x.shape[0] > UNFOLD_BYTES:
        step = max(1, UNFOLD_BYTES // per_image)
        parts = [_second_moments(module, x[i : i + step]) for i in range(0, x.shape[0], step)]
        return sum((h for h, _ in parts[1:]), parts[0][0]), sum(n for _, n in parts)
    cols = sampled_unfold(module, x, 1)  # F.unfold's columns, gathered (see there)
    if module.groups == 1:
        r = cols.transpose(1, 2).reshape(-1, cols.shape[1])
        return (r.T @ r).double(), r.shape[0]
    g = cols.reshape(cols.shape[0], module.groups, -1, cols.shape[2])  # (n, groups, fan_in, positions)
    return torch.einsum("ngip,ngjp->gij", g, g).double(), cols.shape[0] * cols.shape[2]


def _dims(module: nn.Conv2d) -> list[tuple[int, ...]]:
    """The conv's kernel size, stride, padding and dilation, as numbers."""
    return [tuple(int(v) for v in t) for t in (module.kernel_size, module.stride, module.padding, module.dilation)]


def output_size(module: nn.Conv2d, x: torch.Tensor) -> tuple[int, int]:
    """The conv's output height and width for input `x`."""
    h, w = x.shape[-2:]
    out = [(size + 2 * p - d * (k - 1) - 1) // s + 1 for size, k, s, p, d in zip((h, w), *_dims(module), strict=True)]
    return out[0], out[1]


def unfolded_bytes(module: nn.Conv2d, x: torch.Tensor) -> int:
    """Bytes of one image's unfolded input to `module` (fan-in x output positions, float32)."""
    oh, ow = output_size(module, x)
    k = _dims(module)[0]
    return 4 * int(x.shape[1]) * k[0] * k[1] * max(1, oh * ow)


def sampled_unfold(module: nn.Conv2d, x: torch.Tensor, stride: int) -> torch.Tensor:
    """`F.unfold(...)[:, :, ::stride]`: the columns (n, fan_in x groups, positions) at every `stride`-th output
    position of each image in row-major order, gathered without unfolding the rest (an unfold of every position
    is most of a moment's cost when few are kept). Gathered at stride 1 too, bit for bit the same: `F.unfold`'s
    parallel loop stalls whenever another torch process runs beside it, the gather hardly slows (measured:
    docs/models-and-data.md#measured)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _dims(module)
    stride = max(1, stride)
    oh, ow = output_size(module, x)
    p = torch.arange(0, oh * ow, stride, device=x.device)
    oy, ox = p // ow, p % ow
    ky, kx = torch.meshgrid(torch.arange(kh, device=x.device), torch.arange(kw, device=x.device), indexing="ij")
    iy = oy[None, :] * sh + ky.reshape(-1, 1) * dh  # (kh*kw, positions), in the padded input
    ix = ox[None, :] * sw + kx.reshape(-1, 1) * dw
    padded = F.pad(x, (pw, pw, ph, ph))
    cols = padded[:, :, iy, ix]  # (n, channels, kh*kw, positions): unfold's column order
    return cols.reshape(x.shape[0], -1, p.numel())


def input_hessians(model: nn.Module, modules: Mapping[str, nn.Module], x: torch.Tensor | Images,
                   batch_size: int = 128) -> dict[str, LayerInputs]:
    """H = X^T X of every module's input over images `x`, from one pass of `model` as it is (the
    float model); a grouped conv's one per group."""
    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = dict.fromkeys(modules, 0)

    def hook(name: str, m: nn.Module, inp: torch.Tensor) -> None:
        h, n = _second_moments(m, inp.detach().float())
        sums[name] = h if name not in sums else sums[name] + h
        rows[name] += n

    feed_inputs(model, modules, x, batch_size, hook)
    return {n: LayerInputs(sums[n], rows[n]) for n in sums}
