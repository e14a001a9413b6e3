"""Measured latency: the protocol (warm-up, median of repeats, fixed threads) on both backends."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch
from torch import nn

from modelopt.errors import ConfigError
from modelopt.latency import Latency, LatencySpec, onnx_latency, torch_latency


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(8, 10)).eval()


def test_torch_latency_record():
    threads = torch.get_num_threads()
    rec = torch_latency(_net(), torch.randn(3, 3, 16, 16), batch_size=8, threads=1, warmup=2, repeats=7)
    assert isinstance(rec, Latency) and rec.backend == "torch" and rec.device == "cpu"
    assert rec.batch_size == 8 and rec.threads == 1 and rec.repeats == 7 and rec.warmup == 2
    assert 0 < rec.min_ms <= rec.median_ms <= rec.max_ms
    assert torch.get_num_threads() == threads  # restored
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.median_ms = 0.0  # type: ignore[misc]


def test_onnxruntime_latency_scales_with_batch():
    pytest.importorskip("onnxruntime")
    net = _net()
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(1, 3, 16, 16),), buf, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    x = torch.randn(1, 3, 16, 16)
    small = onnx_latency(buf.getvalue(), x, batch_size=1, threads=1, warmup=2, repeats=15)
    big = onnx_latency(buf.getvalue(), x, batch_size=256, threads=1, warmup=2, repeats=15)
    assert small.backend == big.backend == "onnxruntime" and big.batch_size == 256
    assert big.median_ms > small.median_ms  # 256 images cost more than one: the batch was really run


def test_bad_arguments():
    with pytest.raises(ConfigError, match=r"unknown latency backend 'tvm'; valid: .*onnxruntime"):
        LatencySpec("tvm")  # backends are the engines' registry's names: the one door by name
    with pytest.raises(ConfigError, match="threads must be an integer >= 1"):
        torch_latency(_net(), torch.randn(1, 3, 8, 8), threads=0)
