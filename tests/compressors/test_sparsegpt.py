"""SparseGPT: exactly the pruned count (or n of every m), lower output error than magnitude on correlated inputs,
the same answer as a dense OBS reference, and grouped convs pruned on their own groups' inputs."""

from __future__ import annotations

import pytest
import torch

from modelopt.compressors.prune.sparsegpt import obs_prune
from modelopt.model.layer_inputs import LayerInputs
from modelopt.solvers.least_squares import RIDGE


def _inputs(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g, dtype=torch.float64) / k**0.5
    return torch.randn(n, k, generator=g, dtype=torch.float64) @ mix + 0.3 * torch.randn(n, k, generator=g,
                                                                                         dtype=torch.float64)


def _output_error(w: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> float:
    return float(((w.double() - q.double()) @ x.T).pow(2).sum())


@pytest.mark.parametrize(("rows", "k", "pruned"), [(12, 40, 240), (8, 300, 1200), (5, 129, 1)])
def test_prunes_exactly_and_beats_magnitude(rows, k, pruned):
    w = torch.randn(rows, k, generator=torch.Generator().manual_seed(k))
    x = _inputs(4 * k, k, seed=k)
    out, keep = obs_prune(w, LayerInputs(x.T @ x, x.shape[0]), pruned)
    assert int((~keep).sum()) == pruned and torch.all(out[~keep] == 0)
    mag = w.abs().reshape(-1).argsort(stable=True)[:pruned]
    by_magnitude = w.clone().reshape(-1)
    by_magnitude[mag] = 0
    assert _output_error(w, out, x) < _output_error(w, by_magnitude.reshape(w.shape), x)


@pytest.mark.parametrize("k", [24, 200])
def test_feedback_is_the_dense_obs_reference(k):
    # Given the mask it chose, every column's pruned weights' error is spread over the columns after it through an
    # explicit inverse Hessian that drops each fixed column (OBS, Frantar & Alistarh 2022): no Cholesky factor, no
    # lazy blocks (k = 200 crosses the blocks of 128 columns).
    rows = 6
    w = torch.randn(rows, k, generator=torch.Generator().manual_seed(1)).double()
    x = _inputs(3 * k, k, seed=3)
    h = x.T @ x
    out, keep = obs_prune(w, LayerInputs(h.clone(), x.shape[0]), rows * k // 2)
    ref = w.clone()
    hinv = torch.linalg.inv(h + torch.eye(k, dtype=torch.float64) * RIDGE * float(torch.diagonal(h).mean()))
    for i in range(k):
        q = torch.where(keep[:, i], ref[:, i], torch.zeros_like(ref[:, i]))
        err = (ref[:, i] - q) / hinv[i, i]
        ref[:, i:] -= err[:, None] * hinv[i, i:][None, :]
        ref[:, i] = q
        hinv = hinv - hinv[:, i : i + 1] @ hinv[i : i + 1, :] / hinv[i, i]
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-8)


def test_two_of_every_four():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(0))
    x = _inputs(256, 64, seed=0)
    out, keep = obs_prune(w, LayerInputs(x.T @ x, 256), 0, pattern=(2, 4))
    assert torch.equal(keep.reshape(8, 16, 4).sum(2), torch.full((8, 16), 2))
    assert torch.all(out[~keep] == 0)


def test_a_grouped_conv_is_pruned_group_by_group():
    groups, cin, cout = 4, 8, 8
    w = torch.randn(cout, cin // groups, 3, 3, generator=torch.Generator().manual_seed(2))
    x = torch.stack([_inputs(300, (cin // groups) * 9, seed=s) for s in range(groups)]).float()
    h = torch.einsum("gnk,gnl->gkl", x.double(), x.double())
    out, keep = obs_prune(w, LayerInputs(h, 300), 72)
    for g in range(groups):
        rows = slice(g * cout // groups, (g + 1) * cout // groups)
        alone, _ = obs_prune(w[rows], LayerInputs(h[g], 300), int((~keep[rows]).sum()))
        # Each group's rows depend only on its own inputs: pruning the group alone, as many weights, agrees.
        torch.testing.assert_close(alone, out[rows])
