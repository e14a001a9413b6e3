"""heldout_indices drops the pool's (re-encoded, reordered) copies of the exact images."""

from __future__ import annotations

import numpy as np

from modelopt.compressors.early_exit.pools import heldout_indices


def test_copies_are_found_despite_noise_and_order(tmp_path):
    rng = np.random.default_rng(0)
    exact = rng.integers(0, 256, (3, 8, 8, 3)).astype(np.uint8)
    y_exact = np.array([0, 1, 0])
    others = rng.integers(0, 256, (2, 8, 8, 3)).astype(np.uint8)
    noisy = np.clip(exact.astype(int) + rng.integers(-6, 7, exact.shape), 0, 255).astype(np.uint8)
    pool = np.concatenate([others[:1], noisy[2:], noisy[:1], others[1:], noisy[1:2]])  # copies at 1, 2, 4
    y_pool = np.array([0, 0, 0, 1, 1])
    np.savez(tmp_path / "exact.npz", x=exact, y=y_exact)
    np.savez(tmp_path / "pool.npz", x=pool, y=y_pool)
    assert heldout_indices(tmp_path / "exact.npz", tmp_path / "pool.npz").tolist() == [0, 3]
