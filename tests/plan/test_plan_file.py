"""The plan file module on its own: the functions `SearchSpace` delegates to, and the old import path."""

from __future__ import annotations

import pytest

import modelopt.plan.file as plan_file
import modelopt.plan.space
from modelopt.compressors import Granularity, Quantize, QuantSpec
from modelopt.errors import ConfigError
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.space import SearchSpace

LAYERS = (
    Layer("conv1", LayerKind.CONV, (16, 3, 3, 3), 442_368, False),
    Layer("fc", LayerKind.LINEAR, (10, 64), 640, True),
)


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(LAYERS, [Quantize(bits=(8, 4), granularity=("per_channel",))])


def test_space_still_exports_read_plan_file():
    assert modelopt.plan.space.read_plan_file is plan_file.read_plan_file


def test_module_functions_round_trip_a_plan_through_a_file(space, tmp_path):
    plan = space.plan({"conv1/quantize": QuantSpec(4, Granularity.PER_CHANNEL), "fc/quantize": QuantSpec(8)})
    path = tmp_path / "plan.yaml"
    plan_file.save_plan(space, plan, path)
    doc = plan_file.read_plan_file(path)
    assert doc == plan_file.dump_plan(space, plan) == space.dump_plan(plan)
    assert plan_file.parse_plan(space, doc) == plan_file.load_plan(space, path) == space.load_plan(path) == plan


def test_a_yaml_list_is_not_a_plan_file(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- default\n- layers\n")
    with pytest.raises(ConfigError, match=r"holds a list, not a plan"):
        plan_file.read_plan_file(path)
