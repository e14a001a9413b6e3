"""Random plan documents and plan files: each parses to a plan that round-trips, or is one clean
`ModeloptError`; never another exception (a traceback on the CLI)."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from _props import FAST, SCALARS, yaml_values
from hypothesis import event, example, given
from hypothesis import strategies as st

from modelopt.api import build_compressors
from modelopt.errors import ModeloptError
from modelopt.model.layers import discover_layers
from modelopt.model.loader import load_model
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace, read_plan_file


@pytest.fixture(scope="module")
def space() -> SearchSpace:
    """ResNet-20 with every compressor (quantize with activations, prune, early exit): no data needed."""
    lm = load_model("cifar10_resnet20")
    layers = discover_layers(lm.module, torch.zeros(1, 3, 32, 32))
    comps = build_compressors(
        ["quantize", "prune", "early_exit"],
        {"quantize": {"bits": [8, 4, 3, 2], "granularity": ["per_channel", "group", "per_tensor"],
                      "activations": [None, 8], "rounding": ["nearest"], "norm_images": 0},
         "prune": {"sparse_images": 0, "repair_images": 0}},
        model=lm.module)
    return SearchSpace(layers, comps)


LAYERS = ("conv1", "layer1.0.conv1", "layer1.0.conv2", "layer2.1.conv1", "layer3.2.conv2", "linear", "layer2.1")
WORDS = ("version", "default", "layers", "quantize", "prune", "early_exit", "bits", "granularity", "group_size",
         "activations", "sparsity", "kind", "threshold", "exits", "per_channel", "group", "per_tensor",
         "unstructured", "structured", "null", *LAYERS)
VALUES = yaml_values(WORDS)
# The values a user would write in a setting, and their nearest mistakes.
NEAR = st.one_of(
    st.sampled_from([8, 4, 3, 2, 1, 16, 0, -1, 8.0, 4.5, "8", True, None, 32, 64, 128, 2**40]),
    st.floats(-1, 2), st.just(float("nan")), st.sampled_from(WORDS), SCALARS)

# Documents of the plan's shape with random content.
SETTINGS = st.dictionaries(st.sampled_from(["bits", "granularity", "group_size", "activations", "sparsity", "kind",
                                            "threshold"]), NEAR, max_size=3)
PER_COMPRESSOR = st.dictionaries(st.sampled_from(["quantize", "prune", "early_exit", "quantise"]),
                                 st.one_of(st.none(), SETTINGS, NEAR, VALUES), max_size=3)
EXIT_TOP = st.fixed_dictionaries({}, optional={
    "exits": st.one_of(st.lists(st.sampled_from(LAYERS), max_size=3),
                       st.dictionaries(st.sampled_from(LAYERS), NEAR, max_size=3), VALUES),
    "threshold": NEAR})
SHAPED = st.fixed_dictionaries({}, optional={
    "version": st.one_of(st.just(1), NEAR),
    "default": st.one_of(PER_COMPRESSOR, VALUES),
    "layers": st.one_of(st.dictionaries(st.one_of(st.sampled_from(LAYERS), st.text(max_size=6)),
                                        st.one_of(PER_COMPRESSOR, VALUES), max_size=3), VALUES),
    "early_exit": st.one_of(EXIT_TOP, VALUES),
    "extra": VALUES,
})

# Valid documents with a near miss here and there: these reach the round trip.
CONVS = tuple(f"layer{s}.{b}.conv{c}" for s in (1, 2, 3) for b in (0, 1, 2) for c in (1, 2))
EXITS = tuple(f"layer{s}.{b}" for s in (1, 2, 3) for b in (0, 1, 2))[:-1]  # the last block's end is no exit


def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """`valid`, but one time in eight a near miss instead."""
    return st.integers(0, 7).flatmap(lambda i: NEAR if i == 0 else valid)


QUANT = st.fixed_dictionaries({"bits": _mostly(st.sampled_from([8, 4, 3, 2]))}, optional={
    "granularity": _mostly(st.sampled_from(["per_channel", "group", "per_tensor"])),
    "group_size": _mostly(st.sampled_from([16, 32, 64, 128])), "activations": _mostly(st.sampled_from([None, 8]))})
PRUNE = st.fixed_dictionaries({"sparsity": _mostly(st.floats(0.01, 0.99))},
                              optional={"kind": _mostly(st.sampled_from(["unstructured", "structured"]))})
LAYER_SETTINGS = st.fixed_dictionaries({}, optional={
    "quantize": _mostly(QUANT), "prune": _mostly(PRUNE),
    "early_exit": _mostly(st.fixed_dictionaries({"threshold": st.floats(0.01, 1)}))})
VALIDISH = st.fixed_dictionaries({"default": LAYER_SETTINGS}, optional={
    "version": _mostly(st.just(1)),
    "layers": st.dictionaries(_mostly(st.sampled_from(("conv1", "linear", *CONVS))), LAYER_SETTINGS, max_size=4),
    "early_exit": st.one_of(
        st.fixed_dictionaries({"exits": st.lists(_mostly(st.sampled_from(EXITS)), max_size=3, unique_by=repr),
                               "threshold": _mostly(st.floats(0.01, 1))}),
        st.fixed_dictionaries({"exits": st.dictionaries(_mostly(st.sampled_from(EXITS)), _mostly(st.floats(0.01, 1)),
                                                        max_size=3)})),
})
PLAN_DOCS = st.integers(0, 3).flatmap(lambda i: VALIDISH if i < 2 else SHAPED if i == 2 else VALUES)


def _parse_or_clean_error(space: SearchSpace, doc: object) -> Plan | None:
    try:
        plan = space.parse_plan(doc)  # type: ignore[arg-type]
    except ModeloptError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))  # one line for the CLI
        event(f"refused: {type(exc).__name__}")
        return None
    event("parsed" if any(c is not None for _, c in plan.choices) else "parsed: no compression")
    return plan


def _round_trips(space: SearchSpace, plan: Plan) -> None:
    json.dumps(plan.to_flat(), allow_nan=False)  # the journal can hold it
    again = space.parse_plan(yaml.safe_load(yaml.safe_dump(space.dump_plan(plan), allow_unicode=True)))
    assert again.key == plan.key and again == plan
    assert space.plan_from_flat(plan.to_flat()) == plan


@FAST
@given(doc=PLAN_DOCS)
# What this test found (each was a TypeError, ValueError or OverflowError traceback before the fix):
@example(doc={"early_exit": {"exits": [[]], "threshold": 0.9}})
@example(doc={"early_exit": {"exits": ["layer1.0"], "threshold": "0.9"}})
@example(doc={"early_exit": {"exits": {"layer1.0": [0.9]}}})
@example(doc={"default": {"prune": {"sparsity": 10**400}}})
def test_a_random_plan_document_parses_and_round_trips_or_is_one_clean_error(space, doc):
    plan = _parse_or_clean_error(space, doc)
    if plan is not None:
        _round_trips(space, plan)


@FAST
@given(doc=PLAN_DOCS)
def test_a_random_plan_file_loads_or_is_one_clean_error(space, tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("plan") / "plan.yaml"
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    except yaml.YAMLError:
        return  # not representable as YAML (never a document a user has)
    try:
        plan = space.load_plan(path)
    except ModeloptError as exc:
        assert "\n" not in str(exc), repr(str(exc))
        return
    _round_trips(space, plan)


@FAST
@given(text=st.one_of(st.text(max_size=200),
                      st.lists(st.sampled_from(["default:", "layers:", "  quantize:", "    bits: 4", "- a", "{", "]",
                                                "&a x", "*a", "!!python/object:os.system", "? [a]", ": b", "\t",
                                                "%YAML 1.1", "---", "..."]),
                               max_size=8).map("\n".join)),
       raw=st.binary(max_size=64))
def test_random_text_or_bytes_as_a_plan_file_is_read_or_one_clean_error(space, tmp_path_factory, text, raw):
    folder = tmp_path_factory.mktemp("plan")
    for path, write in ((folder / "t.yaml", lambda p: p.write_text(text, encoding="utf-8")),
                        (folder / "b.yaml", lambda p: p.write_bytes(raw))):
        write(path)
        try:
            doc = read_plan_file(path)
        except ModeloptError:
            continue
        assert isinstance(doc, dict)
        plan = _parse_or_clean_error(space, doc)
        if plan is not None:
            _round_trips(space, plan)


def test_a_control_character_in_a_plan_file_is_one_line(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text("\x1f", encoding="utf-8")
    with pytest.raises(ModeloptError) as info:
        read_plan_file(path)
    assert "\n" not in str(info.value), str(info.value)
