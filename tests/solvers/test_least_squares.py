"""The least-squares refits: the one solve and its ridge, readers refitted on fewer inputs, and the inputs chosen by
what losing them costs."""

from __future__ import annotations

import torch

from modelopt.model.layer_inputs import input_columns
from modelopt.solvers.least_squares import RIDGE, least_squares, output_kept, refit_reader


def test_output_selection_drops_the_channel_its_reader_can_do_without():
    """Channel 2 of the reader's input is a copy of channel 0: refitted on the others the reader loses nothing
    without one of them, so `output_kept` drops one of the pair, not channel 3, whose input is the weakest but
    whose weights make it matter; the refit then gives the full output (to the ridge's 1 %)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 4, generator=g)
    x[:, 2] = x[:, 0]
    x[:, 3] *= 0.1
    w = torch.randn(6, 4, generator=g)
    w[:, 3] *= 10.0
    h = (x.T @ x).double()
    kept = output_kept(w, h, 3)
    assert kept.tolist() in ([0, 1, 3], [1, 2, 3])
    refit = refit_reader(w, h, input_columns(kept, 1))
    full = x @ w.T
    assert float(((x[:, kept] @ refit.T - full) ** 2).sum() / (full**2).sum()) < 0.02 ** 2


def test_least_squares_is_the_ridge_regression_of_its_moments():
    """Against the normal equations written out: (A^T A + ridge) W^T = A^T T, per group, the ridge a share of the
    mean diagonal (or of each column's own); at no ridge, lstsq's answer."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(2, 500, 6, generator=g, dtype=torch.float64)
    t = torch.randn(2, 500, 3, generator=g, dtype=torch.float64)
    h, rhs = a.transpose(1, 2) @ a, t.transpose(1, 2) @ a
    mean = torch.diagonal(h, dim1=1, dim2=2).mean(dim=1)
    want = torch.stack([torch.linalg.solve(h[i] + torch.eye(6, dtype=h.dtype) * (RIDGE * mean[i] + 1e-12),
                                           rhs[i].T).T for i in range(2)])
    assert torch.allclose(least_squares(h, rhs), want, rtol=1e-12, atol=0)
    own = torch.linalg.solve(h[0] + torch.diag(RIDGE * h[0].diagonal() + 1e-8 * mean[0] + 1e-12), rhs[0].T).T
    assert torch.allclose(least_squares(h[0], rhs[0], per_column=True), own, rtol=1e-12, atol=0)
    exact = torch.linalg.lstsq(a[0], t[0]).solution.T
    assert torch.allclose(least_squares(h[0], rhs[0], 0.0, floor=0.0), exact, rtol=1e-9, atol=1e-12)
    assert not torch.allclose(least_squares(h[0], rhs[0], 0.5), exact, rtol=1e-3, atol=0)  # the ridge is there
