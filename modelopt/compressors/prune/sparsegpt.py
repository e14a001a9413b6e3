"""Unstructured pruning with error feedback (SparseGPT / OBS): which weights go, chosen by what losing them costs the
layer's output, and their loss pushed onto the weights kept.

Magnitude pruning zeroes the smallest weights and leaves the rest as they were. SparseGPT (Frantar & Alistarh, 2023)
walks the input columns in blocks of 128 as GPTQ does (`modelopt.solvers.gptq`): each block's mask is chosen by
the Optimal Brain Surgeon cost w^2 / [H^-1]_jj^2 on the weights as the earlier columns' feedback left them, and after
each column the error of its pruned weights is spread over the columns not yet fixed through the inverse of the
layer's input second moments H = X^T X. Kept weights stay float; a quantizer after it (GPTQ) rounds them, keeping the
zeros, and feeds its own rounding error forward the same way.

Exactly `n_kept` weights survive (the stored size depends on it): each block prunes its share of the total, rounded so
that the shares add up. An ``n:m`` pattern (2:4, what GPU sparse tensor cores run) instead keeps n of every m
consecutive weights along a row, chosen at the first column of each group of m.
"""

from __future__ import annotations

import torch

from modelopt.model.layer_inputs import LayerInputs
from modelopt.solvers.gptq import BLOCK, layer_factor
from modelopt.solvers.least_squares import RIDGE
from modelopt.solvers.sweep import sweep_block

__all__ = ["obs_prune"]


def obs_prune(weight: torch.Tensor, inputs: LayerInputs, pruned: int, pattern: tuple[int, int] | None = None,
              damping: float = RIDGE) -> tuple[torch.Tensor, torch.Tensor]:
    """(the weight with `pruned` of its entries zero and the error fed back, the bool mask of kept entries), both in
    `weight`'s shape; `pattern` (n, m): keep n of every m consecutive weights of a row instead (`pruned` is then
    ignored). A grouped conv's output channels are pruned group by group, each on its own group's inputs."""
    g = inputs.groups
    w = weight.detach().reshape(g, weight.shape[0] // g, -1).double().clone()
    hinv = layer_factor(inputs, w, damping)
    rows, n = w.shape[1], w.shape[2]
    keep = torch.ones_like(w, dtype=torch.bool)
    out = torch.zeros_like(w)
    total = g * rows * n
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        wb = w[:, :, b0:b1].clone()
        d = torch.diagonal(hinv[:, b0:b1, b0:b1], dim1=1, dim2=2)  # (g, cols)
        if pattern is None:
            # This block's share of the pruned count, rounded so the blocks' shares add up to `pruned` exactly.
            share = round(pruned * g * rows * b1 / total) - round(pruned * g * rows * b0 / total)
            if share:
                cost = (wb ** 2 / d[:, None, :] ** 2).reshape(-1)
                drop = torch.argsort(cost, stable=True)[:share]
                block = torch.ones(wb.numel(), dtype=torch.bool, device=w.device)  # no column of it is fixed yet
                block[drop] = False
                keep[:, :, b0:b1] = block.view_as(wb)
        out[:, :, b0:b1], err = sweep_block(wb, hinv[:, b0:b1, b0:b1], keep[:, :, b0:b1], pattern=pattern)
        w[:, :, b1:] -= err @ hinv[:, b0:b1, b1:]
    return out.to(weight.dtype).reshape(weight.shape), keep.reshape(weight.shape)
