"""Pooling against a hand computation; heads save and load with weights_only; MACs."""

from __future__ import annotations

import pytest
import torch

from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec, pool_features
from modelopt.errors import ConfigError


def test_pooling_by_hand():
    fmap = torch.arange(16.0).view(1, 1, 4, 4)  # rows 0-3, 4-7, 8-11, 12-15
    got = pool_features(fmap, HeadSpec(avg_grids=(1, 2), max_grids=(1, 2)))
    # avg 1x1; avg 2x2 quadrants (top-left 0,1,4,5 ...); max 1x1; max 2x2 quadrants.
    want = torch.tensor([[7.5, 2.5, 4.5, 10.5, 12.5, 15.0, 5.0, 7.0, 13.0, 15.0]])
    assert torch.equal(got, want)
    assert HeadSpec((1, 2), (1, 2)).features(1) == 10


def test_head_macs_and_spec_checks():
    spec = HeadSpec((1, 2), (1,), hidden=8)
    assert spec.features(16) == 16 * 6
    assert spec.macs(16, 10) == 96 * 8 + 8 * 10
    assert HeadSpec((1,), ()).macs(64, 10) == 64 * 10
    with pytest.raises(ConfigError):
        HeadSpec((), ())
    with pytest.raises(ConfigError):
        HeadSpec((0,))


def test_state_dict_round_trip_weights_only(tmp_path):
    g = torch.Generator().manual_seed(0)
    spec = HeadSpec((1, 2), (1,), hidden=4)
    head = ExitHead(spec, torch.randn(10, 4, generator=g), torch.randn(10, generator=g),
                    torch.randn(4, 16 * 6, generator=g), torch.randn(4, generator=g), torch.tensor(2.0))
    torch.save(head.state_dict(), tmp_path / "h.pt")
    back = ExitHead.from_state_dict(torch.load(tmp_path / "h.pt", weights_only=True))
    x = torch.randn(3, 16, 8, 8, generator=g)
    assert back.spec == spec and torch.equal(back(x), head(x))
    assert torch.equal(back.confidence(back(x)), head.confidence(head(x)))
    assert head.macs == spec.macs(16, 10)
