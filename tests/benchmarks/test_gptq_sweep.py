"""The numpy column sweep (`modelopt/solvers/sweep.py`) gives the same bits as the torch loop GPTQ and SparseGPT ran
before it (`torch_sweep` in benchmarks/gptq_sweep.py, the oracle the benchmark times), for rounding, masks, grouped
layers and N:M patterns."""

from __future__ import annotations

import pytest
import torch
from gptq_sweep import torch_sweep  # benchmarks/, on the path (tests/benchmarks/conftest.py)

from modelopt.solvers.sweep import sweep_block


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
    want = torch_sweep(w.clone(), hb, want_keep, scales, -8, 7, pattern)
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
