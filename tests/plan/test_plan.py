"""Plans: frozen, hashable, JSON-ready, with a key that never changes for the same choices."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import pytest

from modelopt.compressors import Granularity, QuantSpec
from modelopt.plan.plan import Decision, Plan, decision_name, jsonable

GR = Granularity.GROUP


Q8, Q4G64 = QuantSpec(8), QuantSpec(4, GR, 64)


def make(conv1=Q8, layer1=Q4G64, fc=None) -> Plan:
    return Plan((("conv1/quantize", conv1), ("layer1.0.conv1/quantize", layer1), ("fc/quantize", fc)))


def test_known_plan_key_is_pinned():
    # Journals and caches from earlier runs are keyed by this: changing it breaks resume.
    assert make().key == "e3a0438bcbc67f42"
    assert Plan(()).key == "97d170e1550eee4a"  # sha1 of "[]"


def test_same_choices_same_key():
    a, b = make(), make()
    assert a is not b and a.key == b.key
    assert make(QuantSpec(8, Granularity.PER_CHANNEL, 64)).key == a.key  # equal specs built differently
    assert len(a.key) == 16 and int(a.key, 16) >= 0


@pytest.mark.parametrize(
    "changed",
    [
        make(conv1=QuantSpec(4)),
        make(conv1=None),
        make(conv1=QuantSpec(8, Granularity.PER_TENSOR)),
        make(layer1=QuantSpec(4, GR, 32)),
        make(fc=QuantSpec(8)),
        Plan((("conv1/quantize", QuantSpec(8)), ("layer1.0.conv1/quantize", QuantSpec(4, GR, 64)))),
        Plan((("conv2/quantize", QuantSpec(8)), ("layer1.0.conv1/quantize", QuantSpec(4, GR, 64)),
              ("fc/quantize", None))),
    ],
)
def test_one_changed_choice_changes_key_and_equality(changed):
    assert changed.key != make().key
    assert changed != make()


def test_hashable_and_equal():
    a, b, c = make(), make(), make(fc=QuantSpec(4))
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2
    cache = {a: 1}
    assert cache[b] == 1
    _ = a.key  # a cached key must not change equality or hashing
    assert a == b and hash(a) == hash(b)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make().choices = ()  # type: ignore[misc]


def test_lookup():
    p = make()
    assert p["conv1/quantize"] == QuantSpec(8)
    assert p["fc/quantize"] is None
    assert p.get("nope/quantize") is None and p.get("nope/quantize", 3) == 3
    with pytest.raises(KeyError):
        p["nope/quantize"]


def test_to_flat_is_json_and_keeps_order():
    p = make()
    flat = p.to_flat()
    assert list(flat) == ["conv1/quantize", "layer1.0.conv1/quantize", "fc/quantize"]
    assert json.loads(json.dumps(flat, allow_nan=False)) == flat
    assert flat == {
        "conv1/quantize": {"bits": 8, "granularity": "per_channel", "group_size": 64, "rounding": "nearest"},
        "layer1.0.conv1/quantize": {"bits": 4, "granularity": "group", "group_size": 64, "rounding": "nearest"},
        "fc/quantize": None,
    }
    assert type(flat["conv1/quantize"]["granularity"]) is str  # the enum's value, not the enum


def test_journals_name_the_rounding_but_nearest_keeps_the_old_key():
    gptq = make(layer1=QuantSpec(4, GR, 64).with_rounding("gptq"))
    assert gptq.to_flat()["layer1.0.conv1/quantize"]["rounding"] == "gptq"
    assert gptq.key != make().key  # a calibrated plan is another plan
    assert make().key == "e3a0438bcbc67f42"  # pinned before rounding existed


def test_repr_names_key_and_active_count():
    assert repr(make()) == "Plan(key=e3a0438bcbc67f42, 2/3 decisions active)"


@dataclass(frozen=True)
class _Nested:
    threshold: float
    heads: tuple[int, ...]
    gran: Granularity


def test_jsonable_handles_scalars_tuples_and_nested_dataclasses():
    assert jsonable(None) is None and jsonable(3) == 3 and jsonable(0.5) == 0.5 and jsonable(True) is True
    assert jsonable("x") == "x" and jsonable(GR) == "group"
    assert jsonable((1, QuantSpec(2))) == [1, {"bits": 2, "granularity": "per_channel", "group_size": 64,
                                               "rounding": "nearest"}]
    assert jsonable(QuantSpec(2), for_key=True) == {"bits": 2, "granularity": "per_channel", "group_size": 64}
    assert jsonable(_Nested(0.9, (1, 2), GR)) == {"threshold": 0.9, "heads": [1, 2], "gran": "group"}


def test_jsonable_rejects_unserialisable_choice():
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        jsonable(frozenset({1}))


def test_decision_name_and_decision_value():
    assert decision_name("layer1.0.conv1", "quantize") == "layer1.0.conv1/quantize"
    d = Decision("fc/quantize", "quantize", "fc", (None, QuantSpec(8)))
    assert d == Decision("fc/quantize", "quantize", "fc", (None, QuantSpec(8))) and hash(d) == hash(
        Decision("fc/quantize", "quantize", "fc", (None, QuantSpec(8)))
    )
