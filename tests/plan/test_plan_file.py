"""The plan file module on its own: the functions `SearchSpace` delegates to, and the old import path."""

from __future__ import annotations

import pytest

import modelopt.plan.file as plan_file
import modelopt.plan.space
from modelopt.compressors import Granularity, Quantize, QuantSpec
from modelopt.compressors.contract import ChannelAnalysis, ChannelGroup
from modelopt.errors import ConfigError
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.space import SearchSpace

LAYERS = (
    Layer("conv1", LayerKind.CONV, (16, 3, 3, 3), 442_368, False),
    Layer("fc", LayerKind.LINEAR, (10, 64), 640, True),
)


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(LAYERS, [Quantize(bits=(8, 4), granularity=("per_channel",), rounding=("nearest",),
                                         norm_images=0)])


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


def test_a_default_applies_where_a_layer_can_take_it():
    """`default: {prune: {kind: structured}}` prunes every layer with a channel group and leaves the others; a
    default no layer takes is refused with the layer's own reason."""
    from modelopt.compressors import Prune, PruneKind, PruneSpec

    block = Layer("block.conv1", LayerKind.CONV, (32, 16, 3, 3), 1000, False).noted(
        {ChannelAnalysis.name: ChannelGroup((("block.conv1", True), ("block.conv2", False)), 2)})
    plain = Layer("block.conv2", LayerKind.CONV, (16, 32, 3, 3), 1000, False)
    space = SearchSpace([block, plain], [Prune(sparse_images=0, repair_images=0)])
    plan = space.parse_plan({"default": {"prune": {"sparsity": 0.25, "kind": "structured"}}})
    assert plan.get("block.conv1/prune") == PruneSpec(0.25, PruneKind.STRUCTURED)
    assert plan.get("block.conv2/prune") is None
    with pytest.raises(ConfigError, match="kind 'structured' needs a layer"):  # named for a layer: still refused
        space.parse_plan({"layers": {"block.conv2": {"prune": {"sparsity": 0.25, "kind": "structured"}}}})
    with pytest.raises(ConfigError, match=r"sparsity 1\.5 is not a share"):  # no layer takes it
        space.parse_plan({"default": {"prune": {"sparsity": 1.5}}})
    only_plain = SearchSpace([plain], [Prune(sparse_images=0, repair_images=0)])
    with pytest.raises(ConfigError, match="kind 'structured' needs a layer"):
        only_plain.parse_plan({"default": {"prune": {"sparsity": 0.25, "kind": "structured"}}})


def test_a_registered_compressor_the_run_does_not_use_is_named_with_the_flag_that_adds_it(small_data):
    """A plan naming `depth` with the default compressors read "unknown compressor ... 'depth'; valid: early_exit,
    prune, quantize", though `modelopt list` shows it."""
    import modelopt

    with pytest.raises(ConfigError, match=r"uses the 'depth' compressor, which this run does not use \(enabled: "
                                          r"early_exit, prune, quantize\); add it: --compressors "
                                          r"early_exit,prune,quantize,depth"):
        modelopt.evaluate("cifar10_resnet20", {"layers": {"layer1.0.conv1": {"depth": {"remove": True}}}},
                          small_data, device="cpu")


@pytest.mark.parametrize("doc,says", [
    ({"layers": {"layer1.0.conv9": {"quantize": {"bits": 4}}}}, "unknown layer 'layer1.0.conv9' (did you mean"),
    ({"default": {"quantise": {"bits": 4}}}, "unknown compressor in plan key 'default' 'quantise' (did you mean"),
    ({"layers": {"conv1": {"prune ": None}}}, "unknown compressor in plan key 'layers.conv1' 'prune '"),
    ({"layers": ["conv1"]}, "plan key 'layers' must map layer names"),
])
def test_plan_names_are_checked_before_the_data_are_decoded(doc, says, tmp_path):
    """`evaluate --plan` refused a typo in a plan only after decoding the data (9,154 images by default): the names
    are checked against the model's layers as soon as it loads; the data here do not even exist."""
    import modelopt

    with pytest.raises(ConfigError) as err:
        modelopt.evaluate("cifar10_resnet20", doc, tmp_path / "no-such-data.npz", device="cpu")
    assert says in str(err.value)
    plan_file.check_plan_names({"default": {"quantize": {"bits": 4}}, "layers": {"conv1": {"prune": None}}},
                               ["conv1"], ["quantize", "prune"])  # good names pass
