"""Confirmation: finalists re-scored on the confirm split, confirmed in a fixed sequence."""

from __future__ import annotations

import dataclasses

import pytest

from modelopt.certify.confirm import confirm_plans, finalists
from modelopt.certify.evidence import certifiable_retention
from modelopt.compressors.quantize import Granularity, QuantSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.trial import Trial, TrialStatus
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def evaluator(small_workload):
    from modelopt.api import build_compressors

    comps = build_compressors(["quantize"], {"quantize": {"bits": [8, 4, 2], "granularity": ["per_channel"],
                                                          "rounding": ["nearest"], "norm_images": 0}})
    return Evaluator(small_workload, SearchSpace(small_workload.layers, comps))


def _trial(ev: Evaluator, number: int, bits: int, objective: Objective) -> Trial:
    plan = ev.space.uniform("quantize", QuantSpec(bits, Granularity.PER_CHANNEL))
    m = ev.scorer.evaluate(plan, "val")
    return Trial(number, plan, TrialStatus.COMPLETE, m, objective.reward(m), objective.feasible(m), 1.0, 0.0,
                 "test", 0, "test")


def test_the_smallest_plan_confirmed_in_turn_is_the_best_and_the_sequence_stops_at_a_failure(evaluator):
    obj = Objective("size", 0.9, 0.95)
    int8, int4, int2 = (_trial(evaluator, i, b, obj) for i, b in enumerate((8, 4, 2)))
    c = confirm_plans(evaluator, obj, [int2, int8, int4])  # any order in: tested largest first
    assert c.usable and c.split == "confirm"
    assert [t.number for t, _ in c.finalists][:2] == [0, 1]
    confirm_int2 = evaluator.scorer.evaluate(int2.plan, "confirm")
    assert not obj.meets_floor(confirm_int2)  # INT2 everywhere collapses
    assert c.best is int4 and c.confirmed == 2
    # INT2's val counts give it no chance on confirm: the planned sequence does not spend images on it.
    assert len(c.finalists) == 2 and c.chances[1] > 0.5
    # A failure ends the sequence: a plan after it is not claimed even when it would pass.
    c2 = confirm_plans(evaluator, obj, [int8, dataclasses.replace(int2, plan=int2.plan, number=5), int4])
    assert c2.best is int4


def test_a_curve_certifies_a_plan_per_floor_each_at_least_as_small_as_the_floor_above(evaluator):
    obj = Objective("size", 0.9, 0.95, floors=(0.95, 0.9, 0.8))
    trials = [_trial(evaluator, i, b, obj.search) for i, b in enumerate((8, 4, 2))]
    c = confirm_plans(evaluator, obj, trials)
    assert [f for f, _ in c.curve] == [0.95, 0.9, 0.8]
    points = [t for _, t in c.curve]
    assert points[1] is c.best is not None  # the reported plan is the curve's point at min_retention
    sizes = [t.scored.size_bytes for t in points if t is not None]
    assert sizes == sorted(sizes, reverse=True)  # a lower floor's point is no larger
    for (f, t) in c.curve:
        if t is not None:
            assert t.plan.key in c.held_at(f)
    assert {f for _, f, _ in c.claims} <= {0.95, 0.9, 0.8} and len({f for _, f, _ in c.claims}) >= 2
    assert c.confirmed == len(c.held_at(0.9))


def test_a_confirm_split_too_small_to_certify_the_floor_confirms_nothing_and_says_so(evaluator):
    obj = Objective("size", 0.99, 0.95)
    ceiling = certifiable_retention(evaluator.workload, "confirm", 0.95)
    n = len(evaluator.workload.split("confirm"))
    assert n < 300 and ceiling < 0.99  # ~170 images: a perfect plan is certified only near 98 %
    c = confirm_plans(evaluator, obj, [_trial(evaluator, 0, 8, obj)])
    assert not c.usable and c.finalists == () and c.best is None and c.ceiling == pytest.approx(ceiling)


def test_without_a_confirm_split_nothing_is_confirmed():
    from modelopt.api import build_compressors
    from modelopt.data.dataset import load_data
    from modelopt.model.loader import load_model
    from modelopt.model.workload import Workload

    wl = Workload(load_model("cifar10_resnet20"), load_data("cifar10-exact-sample", confirm_fraction=0.0), device="cpu")
    assert "confirm" not in wl.splits
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize"])))
    obj = Objective("size", 0.9, 0.95)
    c = confirm_plans(ev, obj, [_trial(ev, 0, 8, obj)])
    assert c.split is None and not c.usable and c.best is None


def test_finalists_are_the_plans_of_the_fronts_feasible_or_not(evaluator):
    obj = Objective("size", 0.9, 0.95)
    trials = [_trial(evaluator, i, b, obj) for i, b in enumerate((8, 4, 2))]
    f = finalists(trials, obj)
    assert f.search_best is trials[1]  # INT4: the smallest val-feasible plan
    # INT2 misses the floor on val but is on the front: the sequence weighs its chance (near 0) and skips it.
    assert {t.number for t in f.candidates} == {0, 1, 2}
    assert not obj.feasible(trials[2].metrics)
    c = confirm_plans(evaluator, obj, list(f.candidates))
    assert 2 not in {t.number for t, _ in c.finalists} and c.best is trials[1]
