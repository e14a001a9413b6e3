"""Layers refitted to the float model's output from fewer inputs, in closed form (label-free): what structured
pruning uses to repair the readers of the channels it removes and to choose which channels go.

A layer's weight W (out rows, its inputs flattened per row as (in_channels, kh, kw)) and the second moments of its
inputs in the float model, H = sum x x^T over calibration rows (`modelopt.model.layer_inputs`), give, for a kept set
K of input columns, the weights that best reproduce W x from x_K: W_K = W H[:, K] H[K, K]^-1.
"""

from __future__ import annotations

import torch

__all__ = ["output_kept", "refit_reader"]

# Ridge on H[K, K]: a share of each column's own diagonal (scale-free: a weak input is not shrunk more than a strong
# one, as a share of the mean diagonal did, 42 % for an input at a tenth of the others' scale), and a trace of the
# mean for columns that are all zero (a dead channel).
_REPAIR_DAMP = 0.01


def _damped(hkk: torch.Tensor) -> torch.Tensor:
    diag = hkk.diagonal()
    return hkk + torch.diag(_REPAIR_DAMP * diag + 1e-8 * float(diag.mean()) + 1e-12)


def output_kept(reader: torch.Tensor, hessian: torch.Tensor, keep: int) -> torch.Tensor:
    """Ascending indices of the `keep` input channels of `reader` (out, in, ...) to keep so that, refitted on them
    (`refit_reader`), it gives its output on the inputs whose second moments are `hessian` best: backward
    elimination, each step dropping the channel whose columns cost least to lose. With P the inverse of the kept
    columns' H and W_K the refitted weights, losing channel c's columns adds tr(W_c P_cc^-1 W_c^T) to the output
    error (the Optimal Brain Surgeon cost of a block; channel pruning by reconstruction, He et al. 2017)."""
    out, n_in = reader.shape[0], reader.shape[1]
    kernel = reader[0, 0].numel()
    w = reader.reshape(out, -1).double()
    h = hessian.to(w.device, torch.float64)
    target = w @ h  # the refit's right-hand side, column by column
    kept = torch.arange(n_in, device=w.device)
    while kept.numel() > keep:
        m = kept.numel()
        cols = (kept[:, None] * kernel + torch.arange(kernel, device=w.device)).reshape(-1)
        p = torch.linalg.inv(_damped(h[cols[:, None], cols[None, :]]))
        wk = (target[:, cols] @ p).reshape(out, m, kernel)
        blocks = p.reshape(m, kernel, m, kernel)[torch.arange(m), :, torch.arange(m), :]  # (m, k, k)
        cost = torch.einsum("omk,mkl,oml->m", wk, torch.linalg.inv(blocks), wk)
        kept = torch.cat([kept[: int(cost.argmin())], kept[int(cost.argmin()) + 1 :]])
    return kept


def refit_reader(weight: torch.Tensor, hessian: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in, ...) refitted to read only the input `columns` (of the weight flattened per output row,
    the order `hessian` = sum x x^T over calibration inputs has) and give, in least squares, the output it gave
    on all of them: W_K = W H[:, K] (H[K, K] + damp)^-1. Returns the (out, len(columns)) rows."""
    w = weight.reshape(weight.shape[0], -1).double()
    h = hessian.to(w.device, torch.float64)
    k = columns.to(w.device)
    rhs = w @ h[:, k]  # (out, |K|)
    out = torch.linalg.solve(_damped(h[k[:, None], k[None, :]]), rhs.T).T  # H[K, K] symmetric
    return out.to(weight.dtype)
