"""A timed curve run's claims: the floors' search sequences share the distinct plans the time affords, and each
floor's gate keeps its least compressed likely anchor (`modelopt.certify.confirm`)."""

from __future__ import annotations

from types import SimpleNamespace

from modelopt.certify.confirm import TIMED_GATE, _chains, _within
from modelopt.certify.sequence import Candidate


def _t(key: str) -> SimpleNamespace:
    return SimpleNamespace(plan=SimpleNamespace(key=key))


def _keys(chain) -> list[str]:
    return [t.plan.key for t in chain]


def test_a_floor_keeps_the_plans_already_chosen_and_no_more_new_ones_than_are_left():
    chain = [_t("a"), _t("b"), _t("c"), _t("d")]
    assert _keys(_within(chain, set(), 2)) == ["a", "b"]
    assert _keys(_within(chain, {"b", "c"}, 1)) == ["a", "b", "c"]  # b and c are refitted already: free
    assert _keys(_within(chain, {"a"}, 0)) == ["a"]  # nothing left: the chain ends at its first new plan
    assert _keys(_within(chain, set(), 0)) == ["a"]  # the first floor always tests one plan


ANCHORS = {"int8": Candidate(3.9, 1.0, True), "h15": Candidate(6.0, 0.9, True), "h11": Candidate(7.4, 0.9, True),
           "int4": Candidate(9.0, 0.8, True), "int3": Candidate(13.0, 0.2, True)}


def test_a_timed_curve_gate_keeps_its_least_compressed_likely_anchor_first():
    trials = [_t(k) for k in ANCHORS]
    one = _chains(trials, ANCHORS, set(ANCHORS), max_claims=2)[0]
    curve = _chains(trials, ANCHORS, set(ANCHORS), max_claims=2, curve=True)[0]
    assert len(one) == TIMED_GATE and _keys(one) == ["h11", "int4"]  # the one-floor run's gate: as before
    assert _keys(curve) == ["int8", "h11", "int4"]
    # The search's sequence is planned beyond the same gate in both: the least compressed anchor changes nothing there.
    assert _chains(trials, ANCHORS, set(ANCHORS), max_claims=2, curve=True)[1] == \
        _chains(trials, ANCHORS, set(ANCHORS), max_claims=2)[1]
    assert _chains(trials, ANCHORS, set(ANCHORS), curve=True)[0] == _chains(trials, ANCHORS, set(ANCHORS))[0]
