"""One block of the column sweep GPTQ and SparseGPT share (`modelopt.solvers.gptq`, `modelopt.compressors.prune`).

Within a block of columns each column's code and error feedback depend on the columns before it, so the block is a
loop of a dozen operations on one column of a few dozen to a few hundred weights. torch spends ~5 us dispatching each
of them (and a GPU a kernel launch), numpy ~1 us: the loop runs in numpy on the host (GPTQ and SparseGPT over all of
ResNet-20's layers take half the time: `benchmarks/gptq_sweep.py`), and the block-to-block update, the one large
product, stays in torch on the weights' device. Only elementwise IEEE operations (divide, multiply, subtract, round
half to even, clip) happen in the loop, in the order the torch loop did them, so the codes are the same bits either
way (`tests/benchmarks/test_gptq_sweep.py` pins it against the torch loop).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["sweep_block"]


def sweep_block(wb: torch.Tensor, hb: torch.Tensor, keep: torch.Tensor, scales: torch.Tensor | None = None,
                qmin: int = 0, qmax: int = 0, pattern: tuple[int, int] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, errors), both (groups, rows, cols) on `wb`'s device, for one block of columns.

    Args:
        wb: the block's weights (groups, rows, cols), float64, with the earlier blocks' errors fed back; changed in
            place as the sweep feeds each column's error to the columns after it.
        hb: the block's square of the upper Cholesky factor of H^-1 (groups, cols, cols), float64.
        keep: the weights that may be non-zero (groups, rows, cols), bool; with `pattern`, changed in place.
        scales: per-weight scales (groups, rows, cols): codes are the rounded, clipped weight / scale; None: no
            rounding, the code is the weight itself (pruning alone: the Optimal Brain Surgeon update).
        pattern: (n, m): before each run of m columns, keep the n of every m consecutive weights of a row whose
            removal costs most (w^2 / d^2, d the factor's diagonal), dropping the rest.
    """
    device = wb.device
    w, h, k = (t.detach().cpu().numpy() for t in (wb, hb, keep))
    s = None if scales is None else scales.detach().cpu().numpy()
    codes, err = np.zeros_like(w), np.zeros_like(w)
    d = np.diagonal(h, axis1=1, axis2=2)  # (groups, cols)
    cols = w.shape[2]
    for j in range(cols):
        if pattern is not None and j % pattern[1] == 0:
            m = min(pattern[1], cols - j)
            cost = w[:, :, j : j + m] ** 2 / d[:, None, j : j + m] ** 2
            drop = np.argsort(cost, axis=2, kind="stable")[:, :, : m - pattern[0]]
            run = k[:, :, j : j + m]
            np.put_along_axis(run, drop, False, axis=2)
        x = w[:, :, j]
        q = x.copy() if s is None else np.clip(np.round(x / s[:, :, j]), qmin, qmax)
        q[~k[:, :, j]] = 0.0
        codes[:, :, j] = q
        e = (x - (q if s is None else q * s[:, :, j])) / d[:, j, None]
        w[:, :, j + 1 :] -= e[:, :, None] * h[:, None, j, j + 1 :]
        err[:, :, j] = e
    if device.type != "cpu":  # the host copies were changed, not the device's tensors
        wb.copy_(torch.from_numpy(w))
        keep.copy_(torch.from_numpy(k))
    return torch.from_numpy(codes).to(device), torch.from_numpy(err).to(device)
