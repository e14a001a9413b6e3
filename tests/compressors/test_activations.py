"""Activation quantization against hand-computed oracles: ranges, qparams, fake quantization, hooks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from modelopt.compressors.contract import (
    Calibration,
    InputQParams,
    fake_quantize,
    fake_quantized_inputs,
    input_ranges,
)
from modelopt.errors import ConfigError


def _probe(width: int = 4) -> tuple[nn.Module, dict[str, nn.Module]]:
    """A model whose one layer's input is the model's input, so its range is the data's."""
    fc = nn.Linear(width, 2)
    return nn.Sequential(fc), {"fc": fc}


def _ranges(x: torch.Tensor, **calib) -> tuple[float, float]:
    model, modules = _probe(x.shape[1])
    return input_ranges(model, modules, x, Calibration(**calib), batch_size=64)["fc"]


# ---- qparams ---------------------------------------------------------------------------------


def test_minmax_is_the_exact_extremes_over_all_batches():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 4, generator=g)
    x[17, 2], x[251, 0] = -7.25, 9.5  # in different batches of 64
    assert _ranges(x, method="minmax") == (-7.25, 9.5)


def test_qparams_by_hand():
    qp = InputQParams.from_range(-1.0, 3.0)
    assert qp.scale == float(np.float32(4 / 255)) and qp.zero_point == 64  # round(63.75)
    relu = InputQParams.from_range(0.0, 2.55)
    assert relu.zero_point == 0 and relu.scale == float(np.float32(0.01))  # after a ReLU: zero point 0
    assert InputQParams.from_range(0.5, 2.0).zero_point == 0  # the grid is widened to hold 0
    assert InputQParams.from_range(-2.0, -0.5).zero_point == 255
    assert InputQParams.from_range(0.0, 0.0) == InputQParams(1.0, 0)  # a dead input


def test_fake_quantize_by_hand():
    qp = InputQParams.from_range(-1.0, 3.0)  # scale 4/255, zero point 64
    s = qp.scale
    x = torch.tensor([0.0, 0.5, -1.0, 3.0, -2.0, 10.0, 1.0])
    # code = clamp(round(x / s) + 64, 0, 255); x / s = 0, 31.875, -63.75, 191.25, -127.5, 637.5, 63.75
    codes = [64, 96, 0, 255, 0, 255, 128]
    expected = torch.tensor([(c - 64) * s for c in codes], dtype=torch.float32)
    assert torch.equal(fake_quantize(x, qp), expected)
    assert fake_quantize(torch.zeros(3), qp).eq(0).all()  # zero is exact


def test_percentile_clips_outliers_and_matches_numpy():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(500, 4, generator=g)  # 2000 values in [0, 1)
    x[3, 1], x[400, 2] = 50.0, -40.0
    lo, hi = _ranges(x, method="percentile", percentile=99.9)
    v = x.reshape(-1).double().numpy()
    assert lo == pytest.approx(np.percentile(v, 0.1), rel=1e-12)  # every value used: exact
    assert hi == pytest.approx(np.percentile(v, 99.9), rel=1e-12)
    assert -0.01 < lo < 0.01 and 0.99 < hi < 1.0  # both outliers clipped; minmax would keep them
    assert _ranges(x, method="minmax") == (-40.0, 50.0)


def test_percentile_on_a_subsample_is_close_and_seeded():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2000, 64, generator=g)  # 128,000 values, a subsample of 20,000
    got = _ranges(x, method="percentile", percentile=99.0, samples=20_000)
    assert got == _ranges(x, method="percentile", percentile=99.0, samples=20_000)  # same seed, same range
    exact = np.percentile(x.reshape(-1).numpy(), [1.0, 99.0])
    # std of the estimate ~0.03; the normal's 99th percentile is 2.33
    assert got == pytest.approx(tuple(exact), abs=0.1)
    assert got != _ranges(x, method="percentile", percentile=99.0, samples=20_000, seed=1)


def test_calibration_refuses_bad_settings_in_one_line():
    for bad, match in (({"method": "mse"}, "calibration 'mse' not offered; valid: minmax, percentile"),
                       ({"percentile": 40.0}, "percentile must be in"), ({"images": 0}, "images")):
        with pytest.raises(ConfigError, match=match) as info:
            Calibration(**bad)
        assert "\n" not in str(info.value)


# ---- hooks -----------------------------------------------------------------------------------


def test_fake_quantized_inputs_quantizes_inside_and_removes_hooks_after():
    torch.manual_seed(0)
    model, modules = _probe()
    x = torch.randn(8, 4)
    qp = InputQParams.from_range(-1.0, 1.0)
    with torch.inference_mode():
        plain = model(x)
        with fake_quantized_inputs(modules, {"fc": qp}):
            assert len(modules["fc"]._forward_pre_hooks) == 1
            inside = model(x)
        after = model(x)
        assert torch.equal(inside, modules["fc"](fake_quantize(x, qp)))
    assert not torch.equal(inside, plain)
    assert torch.equal(after, plain) and not modules["fc"]._forward_pre_hooks


def test_hooks_are_removed_when_the_block_raises():
    _, modules = _probe()
    with pytest.raises(RuntimeError, match="boom"), fake_quantized_inputs(modules, {"fc": InputQParams(0.1, 0)}):
        raise RuntimeError("boom")
    assert not modules["fc"]._forward_pre_hooks


def test_unknown_layer_is_refused_and_nothing_is_left_installed():
    _, modules = _probe()
    qparams = {"fc": InputQParams(0.1, 0), "conv9": InputQParams(0.1, 0)}
    with pytest.raises(ConfigError, match="no layer 'conv9'"), fake_quantized_inputs(modules, qparams):
        pass
    assert not modules["fc"]._forward_pre_hooks
