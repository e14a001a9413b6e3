"""The benchmarks' files: the held-out pool drops the exact images' copies; the feature cache is made once,
loads back equal and is never left half-written; saved heads and policy reload with weights_only."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from exit_files import cached_features, heads_state, heldout_indices, load_early_exit

from modelopt.compressors.early_exit.features import Features
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec
from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.errors import StorageError


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


def _features(seed: int) -> Features:
    g = torch.Generator().manual_seed(seed)
    return Features(HeadSpec((1, 2), (1,)), ("layer1", "layer2"),
                    (torch.randn(6, 5, generator=g), torch.randn(6, 7, generator=g)),
                    torch.randn(6, 10, generator=g), torch.arange(6))


def test_the_cache_is_made_once_and_loads_back_equal(tmp_path):
    path = tmp_path / "feats.pt"
    made = cached_features(path, lambda: _features(0))
    back = cached_features(path, None)
    assert back.points == made.points and back.spec == made.spec
    assert all(torch.equal(a, b) for a, b in zip(back.feats, made.feats, strict=True))
    assert torch.equal(back.logits, made.logits) and torch.equal(back.labels, made.labels)
    assert os.listdir(tmp_path) == ["feats.pt"]


def test_a_failed_write_leaves_no_file_a_later_call_would_load(tmp_path, monkeypatch):
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(StorageError, match=r"cannot write .*feats\.pt"):
        cached_features(tmp_path / "feats.pt", lambda: _features(0))
    assert os.listdir(tmp_path) == []  # neither a half cache nor a temporary
    monkeypatch.undo()
    assert torch.equal(cached_features(tmp_path / "feats.pt", lambda: _features(1)).logits, _features(1).logits)


def test_saved_heads_and_policy_reload_with_weights_only(tmp_path):
    g = torch.Generator().manual_seed(0)
    linear = ExitHead(HeadSpec((1, 2), (1,)), torch.randn(10, 96, generator=g), torch.randn(10, generator=g))
    mlp = ExitHead(HeadSpec((1,), (), 8), torch.randn(10, 8, generator=g), torch.randn(10, generator=g),
                   torch.randn(8, 16, generator=g), torch.randn(8, generator=g), torch.tensor(1.7))
    policy = ExitPolicy(("layer1.2", "layer2.0"), (0.9, 0.95))
    torch.save(heads_state({"layer1.2": linear, "layer2.0": mlp}, policy), tmp_path / "exits.pt")
    heads, back = load_early_exit(tmp_path / "exits.pt")
    assert back == policy and list(heads) == ["layer1.2", "layer2.0"]
    for name, head in (("layer1.2", linear), ("layer2.0", mlp)):
        assert heads[name].spec == head.spec
        saved, loaded = head.state_dict(), heads[name].state_dict()
        assert set(saved) == set(loaded) and all(torch.equal(saved[k], loaded[k]) for k in saved)
    torch.save(heads_state({"layer1.2": linear}), tmp_path / "heads.pt")
    assert load_early_exit(tmp_path / "heads.pt")[1] is None
