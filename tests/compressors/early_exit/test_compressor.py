"""The early_exit compressor: registered, conformant on ResNet-20's block-ending layers, plans map
to exit policies, and it leaves weights and their storage to the other compressors."""

from __future__ import annotations

import pytest
import torch
import yaml

from modelopt.compressors import COMPRESSORS, Quantize, Storage
from modelopt.compressors.early_exit.compressor import EarlyExit, ExitChoice, exit_layers
from modelopt.compressors.early_exit.heads import HeadSpec
from modelopt.compressors.early_exit.runtime import ExitLayout
from modelopt.errors import ConfigError
from modelopt.model.backbone import split_backbone
from modelopt.model.layers import discover_layers
from modelopt.model.loader import load_model
from modelopt.plan.space import SearchSpace
from modelopt.testing.compressors import check_compressor


@pytest.fixture(scope="module")
def r20():
    lm = load_model("cifar10_resnet20")
    bb = split_backbone(lm.module)
    return bb, discover_layers(lm.module, torch.zeros(1, 3, 32, 32))


def test_registered():
    assert COMPRESSORS.get("early_exit") is EarlyExit


def test_conformance_on_real_block_ends(r20):
    bb, layers = r20
    ee = EarlyExit(exits=tuple(exit_layers(bb)))
    check_compressor(ee, layers)
    offered = [layer.name for layer in layers if len(ee.menu(layer)) > 1]
    assert offered == [f"layer{s}.{i}.conv2" for s in (1, 2, 3) for i in range(3)]


def test_plan_yaml_to_policy(r20):
    bb, layers = r20
    ee = EarlyExit(thresholds=(0.9, 0.99), exits=tuple(exit_layers(bb)))
    space = SearchSpace(layers, [Quantize(bits=(8,), rounding=("nearest",), norm_images=0), ee])
    doc = yaml.safe_load("""
    layers:
      layer3.0.conv2: {early_exit: {threshold: 0.99}}
      layer2.1.conv2: {early_exit: {threshold: 0.9}, quantize: {bits: 8}}
    """)
    plan = space.parse_plan(doc)
    assert space.parse_plan(space.dump_plan(plan)) == plan
    choices = {d.layer: plan.get(d.name) for d in space.decisions if d.compressor == "early_exit"}
    policy = ExitLayout(bb, exit_layers(bb), {}, HeadSpec(), bb.classes).policy(choices)  # as the evaluator reads it
    assert policy.exits == ("layer2.1", "layer3.0") and policy.thresholds == (0.9, 0.99)
    with pytest.raises(ConfigError, match="cannot be compressed by 'early_exit'"):
        space.parse_plan({"layers": {"layer2.1.conv1": {"early_exit": {"threshold": 0.9}}}})
    with pytest.raises(ConfigError, match="threshold"):
        space.parse_plan({"layers": {"layer2.1.conv2": {"early_exit": {"threshold": 1.5}}}})


def test_weights_and_storage_untouched(r20):
    _, layers = r20
    layer = next(x for x in layers if x.name == "layer2.1.conv2")
    ee = EarlyExit(exits=("layer2.1.conv2",))
    inner = Storage((32, 32, 3, 3), None, 4, 1234)  # e.g. what quantize made of the weight
    assert ee.stored(layer, ExitChoice(0.9), inner) is inner
    w = torch.randn(32, 32, 3, 3)
    assert torch.equal(ee.apply(w, ExitChoice(0.9)), w)


def test_top_level_plan_form(r20):
    """The issue's plan form: `early_exit: {exits: [NAME, ...], threshold: T}` at the top level,
    or one threshold per exit; plans are written in it and read back equal."""
    bb, layers = r20
    space = SearchSpace(layers, [Quantize(bits=(8,), rounding=("nearest",), norm_images=0),
                                 EarlyExit(exits=tuple(exit_layers(bb)))])
    shared = space.parse_plan(yaml.safe_load("early_exit: {exits: [layer1.2, layer2.1.conv2], threshold: 0.9}"))
    assert shared.get("layer1.2.conv2/early_exit") == ExitChoice(0.9) == shared.get("layer2.1.conv2/early_exit")
    assert sum(shared.get(d.name) is not None for d in space.decisions) == 2
    assert space.dump_plan(shared)["early_exit"] == {"exits": ["layer1.2", "layer2.1"], "threshold": 0.9}
    # `layers` overrides the top-level form for its layer.
    mixed = space.parse_plan(yaml.safe_load("""
    early_exit: {exits: [layer1.2, layer2.1], threshold: 0.9}
    layers: {layer2.1.conv2: {early_exit: {threshold: 0.99}}}
    """))
    dumped = space.dump_plan(mixed)
    assert dumped["early_exit"] == {"exits": {"layer1.2": 0.9, "layer2.1": 0.99}}
    assert "early_exit" not in str(dumped["layers"]) and space.parse_plan(dumped) == mixed
    assert "early_exit" not in space.dump_plan(space.plan())
    for bad, match in [({"exits": ["layer9.9"], "threshold": 0.9}, "no candidate exit 'layer9.9'"),
                       ({"exits": ["layer1.2"]}, "no 'threshold'"),
                       ({"exits": {"layer1.2": 0.9}, "threshold": 0.9}, "not both"),
                       ({"exits": ["layer1.2"], "threshold": 2}, "threshold"),
                       (3, "plan key 'early_exit' takes")]:
        with pytest.raises(ConfigError, match=match):
            space.parse_plan({"early_exit": bad})
    quant_only = SearchSpace(layers, [Quantize(bits=(8,), rounding=("nearest",), norm_images=0)])
    with pytest.raises(ConfigError, match="needs the 'early_exit' compressor"):
        quant_only.parse_plan({"early_exit": {"exits": ["layer1.2"], "threshold": 0.9}})


@pytest.mark.parametrize("changes, needle", [
    ({"thresholds": ()}, "at least one threshold"),
    ({"thresholds": ("abc",)}, "threshold must be a number in (0, 1]; got 'abc'"),
    ({"thresholds": (0.9, 1.5)}, "got 1.5"),
    ({"exits": ("layer1.2", "layer2.2"), "blocks": ("layer1",)}, "one block per exit (2)"),
    ({"classes": 0}, "classes must be a positive integer"),
    ({"exit_data": ""}, "exit_data must be the path"),
    ({"exit_images": 0}, "exit_images must be a positive number"),
])
def test_the_options_record_refuses_a_bad_value_when_it_is_built(changes, needle):
    from modelopt.compressors.early_exit.options import EarlyExitOptions
    from modelopt.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        EarlyExitOptions(**changes)
    assert needle in str(err.value)
