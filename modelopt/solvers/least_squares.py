"""Layers refitted in closed form by least squares on second moments (label-free), with one ridge.

A layer's weight W (out rows, its inputs flattened per row as (in_channels, kh, kw)) meant to give the outputs
T = W' X^T from inputs A (one row per calibration row) is, in least squares, W = T A (A^T A)^-1: from the second
moments H = A^T A and the right-hand side T A alone, `least_squares(H, T A)`. Three refits are this one solve:

- a reader of channels structured pruning removed, refitted to give the float output from the kept input
  columns K (`refit_reader`): W_K = W H[:, K] H[K, K]^-1, and the channels chosen by what losing them costs that
  refit (`output_kept`);
- each layer of a reconstructed plan, refitted on its own compressed inputs X_q (`modelopt.reconstruct.own_inputs`):
  W* = W C H_q^-1 with C = X^T X_q;
- the branch after a removed residual block, refitted to give the float block's sum (`modelopt.model.skip_repair`).

H is damped before the solve (a ridge), so that a weak or dead input column does not make it singular.
"""

from __future__ import annotations

import torch

__all__ = ["RIDGE", "least_squares", "output_kept", "refit_reader", "ridged"]

# The ridge: this share of H's diagonal is added to it before a solve (GPTQ's percdamp, Frantar et al. 2023: 1 %
# keeps the factorisation stable and changes the solution little). GPTQ's sweep (`modelopt.solvers.gptq`) damps its H
# by the same share.
RIDGE = 0.01
# Per column (`ridged`), this share of the mean diagonal as well: a column that is all zero (a dead channel) still
# gets a ridge; and FLOOR, so that an all-zero H does too.
DEAD = 1e-8
FLOOR = 1e-12


def ridged(h: torch.Tensor, share: float = RIDGE, *, per_column: bool = False, floor: float = FLOOR) -> torch.Tensor:
    """`h` (n, n), or (groups, n, n) each damped alone, plus its ridge on the diagonal: `share` of its mean diagonal
    (GPTQ's), or, `per_column`, `share` of each column's own diagonal (scale-free: a weak input is not shrunk more than
    a strong one, as a share of the mean was, 42 % for an input at a tenth of the others' scale) and `DEAD` of the
    mean; `floor` on every column."""
    diag = torch.diagonal(h, dim1=-2, dim2=-1)
    mean = diag.mean(dim=-1, keepdim=True)
    ridge = share * diag + DEAD * mean + floor if per_column else share * mean.expand_as(diag) + floor
    return h + torch.diag_embed(ridge)


def least_squares(h: torch.Tensor, rhs: torch.Tensor, share: float = RIDGE, *, per_column: bool = False,
                  floor: float = FLOOR) -> torch.Tensor:
    """The weights W (out, n) that best give the targets T from inputs A, from H = A^T A (n, n) and `rhs` = T A
    (out, n): W = rhs (H + ridge)^-1, the ridge as `ridged` adds it. Batched over a leading groups dimension of both.

    Example:
        >>> w = least_squares(x.T @ x, y.T @ x)   # ~ torch.linalg.lstsq(x, y).solution.T
    """
    return torch.linalg.solve(ridged(h, share, per_column=per_column, floor=floor),
                              rhs.transpose(-2, -1)).transpose(-2, -1)  # H symmetric


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
        p = torch.linalg.inv(ridged(h[cols[:, None], cols[None, :]], per_column=True))
        wk = (target[:, cols] @ p).reshape(out, m, kernel)
        blocks = p.reshape(m, kernel, m, kernel)[torch.arange(m), :, torch.arange(m), :]  # (m, k, k)
        cost = torch.einsum("omk,mkl,oml->m", wk, torch.linalg.inv(blocks), wk)
        kept = torch.cat([kept[: int(cost.argmin())], kept[int(cost.argmin()) + 1 :]])
    return kept


def refit_reader(weight: torch.Tensor, hessian: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`weight` (out, in, ...) refitted to read only the input `columns` (of the weight flattened per output row,
    the order `hessian` = sum x x^T over calibration inputs has) and give, in least squares, the output it gave
    on all of them: W_K = W H[:, K] (H[K, K] + ridge)^-1, the ridge per column. Returns the (out, len(columns))
    rows."""
    w = weight.reshape(weight.shape[0], -1).double()
    h = hessian.to(w.device, torch.float64)
    k = columns.to(w.device)
    out = least_squares(h[k[:, None], k[None, :]], w @ h[:, k], per_column=True)
    return out.to(weight.dtype)
