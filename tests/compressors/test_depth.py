"""Depth's menu and plan form: offered on a branch's last layer only, round-trips, clear errors."""

from __future__ import annotations

import pytest

from modelopt.api import build_compressors
from modelopt.compressors.contract import BranchAnalysis
from modelopt.compressors.depth import SKIP, Depth
from modelopt.errors import ConfigError
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.space import SearchSpace

END = Layer("layer1.0.conv2", LayerKind.CONV, (16, 16, 3, 3), 2_359_296, False).noted(
    {BranchAnalysis.name: ("layer1.0.conv1", "layer1.0.conv2")})
INNER = Layer("layer1.0.conv1", LayerKind.CONV, (16, 16, 3, 3), 2_359_296, False)


def test_offered_on_a_branch_end_only():
    assert Depth().menu(END) == (None, SKIP)
    assert Depth().menu(INNER) == ()


@pytest.mark.parametrize("raw", [{"skip": True}, True])
def test_parse_and_dump_round_trip(raw):
    d = Depth()
    choice = d.parse(raw, END)
    assert choice == SKIP and d.dump(choice) == {"skip": True}
    assert d.parse(None, END) is None and d.parse({"skip": False}, END) is None


@pytest.mark.parametrize(("raw", "layer", "says"), [
    ({"skip": "yes"}, END, "expected {skip: true}"),
    ({"drop": True}, END, "expected {skip: true}"),
    ({"skip": True}, INNER, "does not end a removable residual branch"),
])
def test_bad_forms_name_what_is_wrong(raw, layer, says):
    with pytest.raises(ConfigError, match=says.replace("{", r"\{").replace("}", r"\}")):
        Depth().parse(raw, layer)


def test_a_layer_no_block_removal_takes_is_named_with_those_it_can():
    space = SearchSpace([INNER, END], build_compressors(["depth", "quantize"]))
    says = r"'layer1.0.conv1' cannot be compressed by 'depth'; it can take: layer1.0.conv2$"
    with pytest.raises(ConfigError, match=says):
        space.parse_plan({"layers": {"layer1.0.conv1": {"depth": {"skip": True}}}})
