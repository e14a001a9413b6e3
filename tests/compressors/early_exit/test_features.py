"""The feature cache: stored once, loaded back equal, and never left half-written."""

from __future__ import annotations

import os

import pytest
import torch

from modelopt.compressors.early_exit import Features, HeadSpec, cached_features
from modelopt.errors import StorageError


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
