"""Multi-fidelity: the stopping bound, and staged scoring on the real ResNet-20."""

from __future__ import annotations

import numpy as np
import pytest

from modelopt.compressors import Granularity, Quantize, QuantSpec
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.fidelity import Fidelity, max_correct
from modelopt.plan.space import SearchSpace


def test_a_plan_that_matches_the_baseline_is_never_stopped():
    # 100 scored, 90 right for both; 300 left, 270 of them right for the float model.
    bound = max_correct(90, base_right=90, lost=0, base_wrong=10, gained=0, base_right_rest=270, base_wrong_rest=30,
                        delta=0.01)
    assert bound >= 0.99 * 360


def test_a_plan_that_loses_a_third_is_stopped():
    bound = max_correct(60, base_right=90, lost=30, base_wrong=10, gained=0, base_right_rest=270, base_wrong_rest=30,
                        delta=0.01)
    assert bound < 0.99 * 360


def test_fidelity_validates_and_cuts():
    assert Fidelity().cuts(423) == [106, 212, 423]
    assert Fidelity((0.5,)).cuts(2) == [1, 2]
    with pytest.raises(ConfigError, match="increasing"):
        Fidelity((0.5, 0.25))
    with pytest.raises(ConfigError, match="delta"):
        Fidelity(delta=0.7)


@pytest.fixture(scope="session")
def evaluator(resnet20_workload):
    space = SearchSpace(resnet20_workload.layers,
                        [Quantize(bits=(8, 4, 2), granularity=("per_tensor", "per_channel"), rounding=("nearest",),
                                  norm_images=0)])
    return Evaluator(resnet20_workload, space)


def test_staged_scoring_of_a_good_plan_equals_full_scoring(evaluator):
    plan = evaluator.space.uniform("quantize", QuantSpec(8, Granularity.PER_CHANNEL))
    staged = evaluator.scorer.evaluate_staged(plan, 0.99, Fidelity())
    full = evaluator.scorer.evaluate(plan, "val")
    assert staged.stopped is None and staged.n_samples == full.n_samples == 423
    assert staged.accuracy == full.accuracy and staged.retention == full.retention


def test_a_broken_plan_stops_at_the_first_stage(evaluator):
    plan = evaluator.space.uniform("quantize", QuantSpec(2, Granularity.PER_TENSOR))
    m = evaluator.scorer.evaluate_staged(plan, 0.99, Fidelity())
    assert m.stopped == "infeasible" and m.n_samples == 106
    assert evaluator.scorer.evaluate(plan, "val").retention < 0.99  # and it really is infeasible


def test_a_plan_that_cannot_improve_stops_after_one_stage(evaluator):
    plan = evaluator.space.uniform("quantize", QuantSpec(4, Granularity.PER_CHANNEL))  # not yet scored in full
    m = evaluator.scorer.evaluate_staged(plan, 0.99, Fidelity(), finish=False)
    assert m.stopped == "dominated" and m.n_samples == 106


@pytest.mark.slow
def test_stopped_plans_are_really_infeasible_on_the_whole_split(evaluator):
    """Soundness on real plans: random mixed plans, staged vs full scoring."""
    rng = np.random.default_rng(1)
    space, n_stopped = evaluator.space, 0
    for _ in range(12):
        plan = space.plan({d.name: d.choices[int(rng.integers(len(d.choices)))] for d in space.decisions})
        m = evaluator.scorer.evaluate_staged(plan, 0.99, Fidelity())
        if m.stopped:
            n_stopped += 1
            assert evaluator.scorer.evaluate(plan, "val").retention < 0.99
    assert n_stopped >= 3  # random plans with 2-bit layers: most are far below the floor
