"""One-time preparation is charged once per run, and a resumed run does not pay it again."""

from __future__ import annotations

import pytest

from modelopt.api import build_compressors
from modelopt.compressors import PruneSpec
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.prep_costs import OneTimeCosts
from modelopt.plan.space import SearchSpace


def test_a_key_is_charged_once_or_not_at_all_once_marked_paid():
    costs = OneTimeCosts()
    assert (costs.charge("a", 2.0), costs.charge("a", 2.0)) == (2.0, 0.0)
    costs.mark_paid(["b"])
    assert costs.charge("b", 1.0) == 0.0


def test_the_batch_norm_reference_pass_is_not_charged_again_after_resume(resnet20_workload):
    wl = resnet20_workload
    space = SearchSpace(wl.layers, build_compressors(["prune"], {"prune": {"bn_samples": 64, "sparse_images": 0,
                                                                           "repair_images": 0}},
                                                     model=wl.model))
    first = space.plan({"layer2.0.conv2/prune": PruneSpec(0.5)})
    second = space.plan({"layer3.0.conv2/prune": PruneSpec(0.5)})
    one = 64 / len(wl.split("val"))
    live = Evaluator(wl, space)
    assert live.scorer.evaluate(first).prep_cost == pytest.approx(2 * one)  # its own pass and the reference pass
    assert live.scorer.evaluate(second).prep_cost == pytest.approx(one)
    resumed = Evaluator(wl, space)
    resumed.states.mark_paid(first)  # the journal holds `first`
    assert resumed.scorer.evaluate(second).prep_cost == pytest.approx(one)
