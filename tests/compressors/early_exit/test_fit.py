"""Head fitting: folded standardisation, labels or the full model's softmax as targets, temperature recovery."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from modelopt.compressors.early_exit.fit import FitConfig, fit_exit_heads, fit_head, fit_temperature, soft_targets
from modelopt.compressors.early_exit.heads import ExitHead, HeadSpec


def _blobs(n: int = 600, d: int = 6, k: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 3
    y = torch.randint(0, k, (n,), generator=g)
    x = centres[y] + torch.randn(n, d, generator=g) + 5.0  # offset: standardisation must be folded right
    return x, y


@pytest.mark.parametrize("hidden", [0, 8])
def test_fit_to_labels_separates_blobs(hidden):
    x, y = _blobs()
    head = fit_head(x, y, FitConfig(HeadSpec((1,), (), hidden), l2=1e-3, max_iter=40))
    assert (head.logits_from_features(x).argmax(1) == y).float().mean() > 0.97
    assert head.weight.shape == (3, hidden or 6)


def test_label_free_fit_follows_the_teacher():
    x, _ = _blobs(seed=1)
    g = torch.Generator().manual_seed(2)
    teacher = x @ torch.randn(6, 3, generator=g)  # a "full model": logits linear in the features
    head = fit_head(x, soft_targets(teacher), FitConfig(HeadSpec((1,), ()), l2=1e-6, max_iter=400))
    agree = (head.logits_from_features(x).argmax(1) == teacher.argmax(1)).float().mean()
    assert agree > 0.97


def test_temperature_is_recovered():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4000, 5, generator=g) * 3
    y = torch.multinomial(F.softmax(logits / 2.5, dim=1), 1, generator=g).squeeze(1)  # true temperature 2.5
    head = ExitHead(HeadSpec((1,), ()), torch.eye(5), torch.zeros(5))
    t = float(fit_temperature(head, logits, y).temperature)
    assert math.isclose(t, 2.5, rel_tol=0.1)


def test_fit_exit_heads_on_resnet20_features(r20):
    _, _, calib, val, _ = r20
    heads = fit_exit_heads(calib, ["layer2.2", "layer3.2"], FitConfig(HeadSpec((1, 2), (1,)), l2=1e-2), val)
    assert list(heads) == ["layer2.2", "layer3.2"]
    last = heads["layer3.2"].logits_from_features(val.select("layer3.2", HeadSpec((1, 2), (1,))))
    # The last block's pooled features hold the full model's own input: the head agrees with it mostly.
    assert (last.argmax(1) == val.logits.argmax(1)).float().mean() > 0.8
    assert all(float(h.temperature) > 0 for h in heads.values())
