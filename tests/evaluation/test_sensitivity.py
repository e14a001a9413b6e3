"""One-pass (Fisher) sensitivities: ordered as the damage they predict, charged once, and the
knapsack that uses them spends no trial on a sensitivity pass."""

from __future__ import annotations

import math

import pytest

from modelopt.api import build_compressors
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.sensitivity import BACKWARD_FACTOR, estimate_losses, fisher_diagonals
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import STRATEGIES


@pytest.fixture(scope="session")
def evaluator(small_workload) -> Evaluator:
    comps = build_compressors(["prune", "quantize"], {"quantize": {"bits": [8, 4, 2], "rounding": ["nearest"],
                                                                   "norm_images": 0},
                                                      "prune": {"sparse_images": 0, "repair_images": 0}})
    return Evaluator(small_workload, SearchSpace(small_workload.layers, comps))


@pytest.fixture(scope="session")
def estimates(evaluator) -> dict[tuple[str, int], float]:
    return estimate_losses(evaluator, images=64)


def test_fisher_is_nonnegative_and_covers_every_layer(evaluator):
    fisher = fisher_diagonals(evaluator, images=16)
    assert set(fisher) == set(evaluator.workload.original)
    for name, f in fisher.items():
        assert f.shape == evaluator.workload.original[name].shape
        assert bool((f >= 0).all()) and float(f.sum()) > 0, name


def test_fewer_bits_are_estimated_to_cost_more_on_every_layer(evaluator, estimates):
    for d in evaluator.space.decisions:
        if d.compressor != "quantize":
            continue
        by_bits = {c.bits: estimates[(d.name, j)] for j, c in enumerate(d.choices)
                   if c is not None and c.granularity.value == "per_channel"}
        assert 0 <= by_bits[8] < by_bits[4] < by_bits[2], (d.name, by_bits)


def test_every_weight_changing_choice_is_priced(evaluator, estimates):
    for d in evaluator.space.decisions:
        for j, c in enumerate(d.choices):
            if c is not None:
                assert math.isfinite(estimates[(d.name, j)]), (d.name, str(c))


def test_the_pass_is_charged_once_with_the_next_plan(evaluator, estimates):
    fresh = Evaluator(evaluator.workload, evaluator.space)
    fresh.states.add_pre_pass("fisher:64", 64 * BACKWARD_FACTOR / len(fresh.workload.split("val")))
    float_plan = fresh.space.plan()
    assert fresh.states.compressed_state(float_plan)[1] == pytest.approx(64 * 3 / len(fresh.workload.split("val")))
    assert fresh.states.compressed_state(float_plan)[1] == 0.0
    resumed = Evaluator(evaluator.workload, evaluator.space)
    resumed.states.add_pre_pass("fisher:64", 1.0)
    resumed.states.mark_paid(float_plan)  # a journal's trials imply the pass was charged already
    assert resumed.states.compressed_state(float_plan)[1] == 0.0


def test_the_one_pass_knapsack_asks_no_sensitivity_trials(evaluator, estimates):
    objective = Objective("size", 0.99)
    one_pass = STRATEGIES.get("knapsack")(evaluator.space, objective, seed=0)
    assert one_pass.wants_loss_estimates
    one_pass.use_loss_estimates(estimates)
    assert one_pass.phase == "knapsack"
    plans = one_pass.ask(3)
    assert all(sum(c is not None for _, c in p.choices) > 1 for p in plans)  # whole-model allocations
    measured = STRATEGIES.get("knapsack_measured")(evaluator.space, objective, seed=0)
    assert not measured.wants_loss_estimates and measured.phase == "sensitivity"
    assert sum(c is not None for _, c in measured.ask(1)[0].choices) == 1
