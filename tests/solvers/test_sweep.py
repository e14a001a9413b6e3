"""The numpy column sweep gives the same bits as the torch loop GPTQ and SparseGPT ran before it (kept here as the
oracle), for rounding, masks, grouped layers, blocks and N:M patterns."""

from __future__ import annotations

import pytest
import torch

from modelopt.solvers.sweep import sweep_block


def _torch_sweep(wb, hb, keep, scales, qmin, qmax, pattern):
    """The loop as `gptq_round` and `obs_prune` ran it in torch (one block)."""
    codes, err = torch.zeros_like(wb), torch.zeros_like(wb)
    s = torch.ones_like(wb) if scales is None else scales
    d = torch.diagonal(hb, dim1=1, dim2=2)
    for j in range(wb.shape[2]):
        if pattern is not None and j % pattern[1] == 0:
            m = min(pattern[1], wb.shape[2] - j)
            cost = wb[:, :, j : j + m] ** 2 / d[:, None, j : j + m] ** 2
            drop = torch.argsort(cost, dim=2, stable=True)[:, :, : m - pattern[0]]
            keep[:, :, j : j + m].scatter_(2, drop, False)
        q = wb[:, :, j] if scales is None else torch.clamp(torch.round(wb[:, :, j] / s[:, :, j]), qmin, qmax)
        q = torch.where(keep[:, :, j], q, torch.zeros_like(q))
        codes[:, :, j] = q
        e = (wb[:, :, j] - q * s[:, :, j]) / hb[:, j, j, None]
        wb[:, :, j + 1 :] -= e[:, :, None] * hb[:, None, j, j + 1 :]
        err[:, :, j] = e
    return codes, err


def _case(groups: int, rows: int, cols: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(groups, 4 * cols, cols, generator=g, dtype=torch.float64)
    h = x.transpose(1, 2) @ x + 0.1 * torch.eye(cols, dtype=torch.float64)
    hb = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    w = 0.1 * torch.randn(groups, rows, cols, generator=g, dtype=torch.float64)
    w[torch.rand(w.shape, generator=g) < 0.15] = 0.0
    scales = (w.abs().amax(dim=2, keepdim=True) / 7).expand_as(w).clone()
    return w, hb, scales


@pytest.mark.parametrize("groups,rows,cols", [(1, 16, 144), (4, 8, 27), (1, 3, 10)])
@pytest.mark.parametrize("kind", ["round", "mask", "pattern"])
def test_the_numpy_sweep_gives_the_torch_loops_bits(groups, rows, cols, kind):
    w, hb, scales = _case(groups, rows, cols, seed=rows + cols)
    keep = w != 0 if kind != "pattern" else torch.ones_like(w, dtype=torch.bool)
    scales = scales if kind == "round" else None
    pattern = (2, 4) if kind == "pattern" else None
    want_keep, got_keep = keep.clone(), keep.clone()
    want = _torch_sweep(w.clone(), hb, want_keep, scales, -8, 7, pattern)
    got = sweep_block(w.clone(), hb, got_keep, scales, -8, 7, pattern)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and torch.equal(got_keep, want_keep)
    if kind == "round":  # codes are integers in range, and the masked weights are code 0
        assert torch.equal(got[0], got[0].round()) and got[0].abs().max() <= 8 and (got[0][~keep] == 0).all()
    if kind == "pattern":  # 2 of every 4 consecutive weights of a row are kept
        assert int(got_keep[:, :, : cols // 4 * 4].sum()) == groups * rows * (cols // 4) * 2


@pytest.mark.gpu
def test_the_sweep_on_a_cuda_block_returns_cuda_tensors_with_the_cpu_bits():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    w, hb, _ = _case(1, 16, 64, seed=0)
    keep = torch.ones_like(w, dtype=torch.bool)
    want = sweep_block(w.clone(), hb, keep.clone(), None, 0, 0, (2, 4))
    wc, kc = w.cuda(), keep.cuda()
    got = sweep_block(wc, hb.cuda(), kc, None, 0, 0, (2, 4))
    assert got[0].is_cuda and torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    assert not bool(kc.all())  # the device's mask was updated with the pattern's drops
