"""The search space over synthetic layers (no model) and the YAML plan format."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from modelopt.compressors import Compressor, Granularity, Quantize, QuantSpec
from modelopt.errors import ConfigError, LoadError, ModeloptError, UnknownNameError
from modelopt.model.layers import Layer, LayerKind
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

PC, GR = Granularity.PER_CHANNEL, Granularity.GROUP

LAYERS = (
    Layer("conv1", LayerKind.CONV, (16, 3, 3, 3), 442_368, False),  # fan_in 27: group folds to per-channel
    Layer("layer1.0.conv1", LayerKind.CONV, (16, 16, 3, 3), 2_359_296, False),  # fan_in 144
    Layer("layer2.0.conv1", LayerKind.CONV, (64, 32, 3, 3), 1_179_648, False),  # fan_in 288
    Layer("fc", LayerKind.LINEAR, (10, 64), 640, True),  # fan_in 64: exactly one group
)
NAMES = [layer.name for layer in LAYERS]
SMALL = (None, QuantSpec(8, PC), QuantSpec(4, PC))
BIG = (None, QuantSpec(8, PC), QuantSpec(8, GR, 64), QuantSpec(4, PC), QuantSpec(4, GR, 64))


def quantize() -> Quantize:
    return Quantize(bits=(8, 4), granularity=("per_channel", "group"), rounding=("nearest",), norm_images=0)


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace(LAYERS, [quantize()])


class Halve(Compressor):
    """A toy second compressor that only handles linear layers (never registered)."""

    name = "halve"

    def menu(self, layer: Layer) -> tuple[Any, ...]:
        return (None, "half") if layer.kind is LayerKind.LINEAR else ()

    def parse(self, raw: Mapping[str, Any] | None, layer: Layer) -> Any:
        if raw is None:
            return None
        if raw != {"on": True}:
            raise ConfigError(f"halve for {layer.name}: expected {{on: true}} or null, got {raw!r}")
        return "half"

    def dump(self, choice: Any) -> dict[str, Any] | None:
        return None if choice is None else {"on": True}

    def apply(self, weight, choice):
        return weight if choice is None else weight * 0.5

    def weight_bytes(self, layer: Layer, choice: Any) -> int:
        return layer.params * (4 if choice is None else 2)


def random_plans(space: SearchSpace, n: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    plans = [space.plan(), space.plan({d.name: d.choices[-1] for d in space.decisions})]
    plans += [space.plan({d.name: rng.choice(d.choices) for d in space.decisions}) for _ in range(n)]
    return plans


# ---- decisions -------------------------------------------------------------------------------


def test_decisions_names_menus_and_cardinality(space):
    assert [d.name for d in space.decisions] == [f"{n}/quantize" for n in NAMES]
    assert [d.layer for d in space.decisions] == NAMES
    assert {d.compressor for d in space.decisions} == {"quantize"}
    assert [d.choices for d in space.decisions] == [SMALL, BIG, BIG, SMALL]
    assert len(space) == 4
    assert space.cardinality == 3 * 5 * 5 * 3


def test_only_layers_a_compressor_handles_get_its_decision():
    space = SearchSpace(LAYERS, [quantize(), Halve()])
    assert [d.name for d in space.decisions] == [f"{n}/quantize" for n in NAMES[:3]] + ["fc/quantize", "fc/halve"]
    assert space.cardinality == 225 * 2


def test_empty_plan_is_all_off(space):
    p = space.plan()
    assert [c for _, c in p.choices] == [None] * 4
    assert space.parse_plan({}) == p and space.parse_plan({"version": 1, "default": None, "layers": None}) == p
    with pytest.raises(ConfigError, match="plan version True is not supported"):
        space.parse_plan({"version": True})  # True == 1 in Python, not in a plan file


def test_plan_from_choices_fills_the_rest_with_off(space):
    p = space.plan({"fc/quantize": QuantSpec(8)})
    assert p.choices == (("conv1/quantize", None), ("layer1.0.conv1/quantize", None),
                         ("layer2.0.conv1/quantize", None), ("fc/quantize", QuantSpec(8)))


def test_uniform_canonicalises_per_layer(space):
    p = space.uniform("quantize", QuantSpec(4, GR, 64))
    assert [c for _, c in p.choices] == [QuantSpec(4, PC), QuantSpec(4, GR, 64), QuantSpec(4, GR, 64), QuantSpec(4, PC)]
    for name, c in p.choices:
        assert c in space.decision(name).choices


# ---- the plan file format: default + per-layer overrides --------------------------------------


def test_default_with_merged_overrides(space):
    p = space.parse_plan({
        "default": {"quantize": {"bits": 4, "granularity": "group"}},
        "layers": {
            "conv1": {"quantize": {"bits": 8}},  # keeps granularity group, which folds to per-channel here
            "layer2.0.conv1": {"quantize": {"bits": 8}},  # keeps granularity group
            "fc": {"quantize": None},  # float
        },
    })
    assert p["conv1/quantize"] == QuantSpec(8, PC)
    assert p["layer1.0.conv1/quantize"] == QuantSpec(4, GR, 64)
    assert p["layer2.0.conv1/quantize"] == QuantSpec(8, GR, 64)
    assert p["fc/quantize"] is None


def test_override_replaces_keys_it_names_only(space):
    p = space.parse_plan({
        "default": {"quantize": {"bits": 4, "granularity": "group", "group_size": 32}},
        "layers": {"layer1.0.conv1": {"quantize": {"granularity": "per_tensor"}}, "fc": {}},
    })
    assert p["layer1.0.conv1/quantize"] == QuantSpec(4, Granularity.PER_TENSOR)
    assert p["layer2.0.conv1/quantize"] == QuantSpec(4, GR, 32)
    assert p["fc/quantize"] == QuantSpec(4, GR, 32)  # fan_in 64 > 32: stays grouped
    assert p["conv1/quantize"] == QuantSpec(4, PC)  # fan_in 27 <= 32


def test_override_without_default(space):
    p = space.parse_plan({"layers": {"fc": {"quantize": {"bits": 8}}}})
    assert [c for _, c in p.choices] == [None, None, None, QuantSpec(8, PC)]


def test_dump_plan_uses_most_common_choice_as_default(space):
    p = space.plan({"conv1/quantize": QuantSpec(8), "layer1.0.conv1/quantize": QuantSpec(4, GR, 64),
                    "layer2.0.conv1/quantize": QuantSpec(4, GR, 64), "fc/quantize": QuantSpec(4)})
    assert space.dump_plan(p) == {
        "version": 1,
        "default": {"quantize": {"bits": 4, "granularity": "group", "group_size": 64}},
        "layers": {"conv1": {"quantize": {"bits": 8, "granularity": "per_channel"}},
                   "fc": {"quantize": {"bits": 4, "granularity": "per_channel"}}},
    }
    assert space.dump_plan(space.plan()) == {"version": 1, "default": {}, "layers": {}}
    # Off is the most common: no default, only the compressed layers are listed.
    assert space.dump_plan(space.plan({"fc/quantize": QuantSpec(8)})) == {
        "version": 1, "default": {}, "layers": {"fc": {"quantize": {"bits": 8, "granularity": "per_channel"}}}}
    # Compressed is the most common: the float layers are listed as null.
    mostly = space.plan({d.name: QuantSpec(8) for d in space.decisions[1:]})
    assert space.dump_plan(mostly)["layers"] == {"conv1": {"quantize": None}}


@pytest.mark.parametrize("with_halve", [False, True])
def test_random_plans_round_trip_through_the_yaml_form(with_halve):
    space = SearchSpace(LAYERS, [quantize(), Halve()] if with_halve else [quantize()])
    for p in random_plans(space, 300, seed=7):
        doc = space.dump_plan(p)
        assert space.parse_plan(doc) == p
        text = yaml.safe_dump(doc, sort_keys=False)
        assert space.parse_plan(yaml.safe_load(text)) == p


def test_random_plans_round_trip_through_files(space, tmp_path):
    for i, p in enumerate(random_plans(space, 20, seed=1)):
        path = tmp_path / f"plan{i}.yaml"
        space.save_plan(p, path)
        assert space.load_plan(path) == p
        assert space.load_plan(str(path)).key == p.key


def test_saved_plan_is_readable_yaml(space, tmp_path):
    path = tmp_path / "plan.yaml"
    space.save_plan(space.plan({"fc/quantize": QuantSpec(8), "conv1/quantize": QuantSpec(4)}), path)
    text = path.read_text()
    assert text.startswith("version: 1\n") and "bits: 8" in text and "!!" not in text


def test_hand_written_yaml_file(space, tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("default:\n  quantize: {bits: 4, granularity: group}\nlayers:\n  fc:\n    quantize: null\n")
    assert [c for _, c in space.load_plan(path).choices] == [QuantSpec(4, PC), QuantSpec(4, GR, 64),
                                                             QuantSpec(4, GR, 64), None]
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert space.load_plan(empty) == space.plan()


def test_random_plans_round_trip_through_the_journal_form(space):
    for p in random_plans(space, 300, seed=3):
        assert space.plan_from_flat(p.to_flat()) == p
        assert space.plan_from_flat(json.loads(json.dumps(p.to_flat()))) == p


# ---- errors ----------------------------------------------------------------------------------


def _error(space: SearchSpace, doc: Any) -> ModeloptError:
    with pytest.raises(ModeloptError) as exc:
        space.parse_plan(doc)
    assert "\n" not in str(exc.value)
    return exc.value


def test_unknown_layer_lists_valid_layers(space):
    err = _error(space, {"layers": {"layer1.0.conv2": {"quantize": {"bits": 8}}}})
    assert isinstance(err, UnknownNameError)
    msg = str(err)
    assert "'layer1.0.conv2'" in msg and all(n in msg for n in NAMES)
    assert "did you mean 'layer1.0.conv1'" in msg


@pytest.mark.parametrize("where", ["default", "layer"])
def test_unknown_compressor_key(space, where):
    doc = {"default": {"quantise": {"bits": 8}}} if where == "default" else {"layers": {"fc": {"quantise": {}}}}
    err = _error(space, doc)
    assert isinstance(err, UnknownNameError)
    assert "'quantise'" in str(err) and "valid: quantize" in str(err)


def test_unknown_top_level_key(space):
    err = _error(space, {"defaults": {"quantize": {"bits": 8}}})
    assert isinstance(err, ConfigError)
    assert "'defaults'" in str(err) and "version, default, layers" in str(err)


@pytest.mark.parametrize(
    "doc, bad",
    [
        ({"default": {"quantize": {"bits": 16}}}, "16"),
        ({"layers": {"fc": {"quantize": {"bits": 1}}}}, "1"),
        ({"default": {"quantize": {"bits": 4, "granularity": "per_row"}}}, "'per_row'"),
        ({"default": {"quantize": {"bitz": 4}}}, "'bitz'"),
        ({"default": {"quantize": 4}}, "4"),
        ({"version": 2}, "2"),
        (["conv1"], "list"),
        ({"default": ["quantize"]}, "['quantize']"),
        ({"layers": ["fc"]}, "'layers'"),
        ({"layers": {"fc": "int8"}}, "'int8'"),
    ],
)
def test_malformed_plans_raise_config_error_naming_the_value(space, doc, bad):
    err = _error(space, doc)
    assert isinstance(err, ConfigError) and bad in str(err)


def test_bit_width_not_offered_lists_valid_ones(space):
    err = _error(space, {"default": {"quantize": {"bits": 16}}})
    assert "bits 16" in str(err) and "2, 3, 4, 5, 6, 7, 8" in str(err)


def test_override_for_a_compressor_that_does_not_handle_the_layer():
    space = SearchSpace(LAYERS, [quantize(), Halve()])
    err = _error(space, {"layers": {"conv1": {"halve": {"on": True}}}})
    assert isinstance(err, ConfigError) and "'conv1'" in str(err) and "'halve'" in str(err)
    # a default for it is fine: it applies where it can
    p = space.parse_plan({"default": {"halve": {"on": True}}})
    assert p["fc/halve"] == "half" and p["fc/quantize"] is None


def test_unknown_decision_names(space):
    with pytest.raises(UnknownNameError, match=r"'fc/prune'.*valid: .*fc/quantize"):
        space.plan({"fc/prune": None})
    with pytest.raises(UnknownNameError, match=r"'fc'"):
        space.decision("fc")
    with pytest.raises(UnknownNameError, match=r"'fc/prune'"):
        space.plan_from_flat({"fc/prune": None})


@pytest.mark.parametrize(
    "text, line",
    [
        ("default:\n  quantize: {bits: 4\nlayers:\n  fc: {quantize: null}\n", 3),
        ("default:\n  quantize:\n    bits: 4\n   granularity: group\n", 4),
        ("version: 1\nlayers:\n\t- fc\n", 3),
    ],
)
def test_malformed_yaml_file_names_the_line(space, tmp_path, text, line):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        space.load_plan(path)
    msg = str(exc.value)
    assert f"at line {line}:" in msg and str(path) in msg and "\n" not in msg


def test_missing_plan_file_is_a_load_error(space, tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(LoadError) as exc:
        space.load_plan(path)
    assert str(path) in str(exc.value) and "does not exist" in str(exc.value)
    with pytest.raises(LoadError):
        space.load_plan(tmp_path)  # a folder is not a plan file
