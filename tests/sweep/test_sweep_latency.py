"""A sweep file's `latency`: the engine each cell times its reported plans in, or none (no cell times any)."""

from __future__ import annotations

import re

import pytest
from _one_cell import one_cell_sweep

from modelopt.errors import ConfigError
from modelopt.latency.spec import LatencySpec
from modelopt.sweep import load_sweep


def _load(tmp_path, latency: str):
    return load_sweep(one_cell_sweep(tmp_path, "latency", latency))


@pytest.mark.parametrize("latency", ["none", "None", "null"])
def test_latency_none_times_no_plan_and_is_recorded(tmp_path, latency):
    sweep = _load(tmp_path, latency)
    assert sweep.settings["latency"] is None and sweep.config.latency is None
    assert sweep.to_json()["given"]["latency"] is None  # what sweep.json keeps for a resumed sweep to compare


def test_latency_names_the_engine_every_cell_times_in(tmp_path):
    sweep = _load(tmp_path, "onnxruntime")
    assert sweep.config.latency == LatencySpec("onnxruntime")


@pytest.mark.parametrize("latency,why", [
    ("tvm", "unknown latency backend 'tvm'; valid: onnxruntime, openvino, torch"),
    ("[torch]", "expected a latency engine: torch, onnxruntime, openvino or none"),
    ("4", "expected a latency engine: torch, onnxruntime, openvino or none"),
])
def test_a_bad_latency_names_the_line_and_what_is_right(tmp_path, latency, why):
    with pytest.raises(ConfigError, match="line 10, key 'latency': " + re.escape(why)):
        _load(tmp_path, latency)


def test_an_objective_of_latency_needs_an_engine(tmp_path):
    with pytest.raises(ConfigError, match=r"key 'latency': objective 'latency' needs a latency engine"):
        load_sweep(one_cell_sweep(tmp_path, "latency", "none", extra="objective: latency\n"))
