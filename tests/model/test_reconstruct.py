"""Readers refitted on fewer inputs in closed form, and the inputs chosen by what losing them costs."""

from __future__ import annotations

import torch

from modelopt.model.layer_inputs import input_columns
from modelopt.model.reconstruct import output_kept, refit_reader


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
