"""The latency cost model the strategies' priors read: per-kind rates and a fixed cost per exit, fitted on
measured plans (figures given here, not timed: the fit is what is under test)."""

from __future__ import annotations

import dataclasses

import pytest

from modelopt import api
from modelopt.latency.cost_model import LatencyModel
from modelopt.plan.space import SearchSpace

INT8 = {"bits": 8, "activations": 8}


@pytest.fixture
def space(resnet20_workload) -> SearchSpace:
    comps = api.build_compressors(["quantize", "early_exit"], {"quantize": {"bits": [8], "activations": [8],
                                                                            "rounding": ["nearest"], "norm_images": 0}},
                                  model=resnet20_workload.model)
    space = SearchSpace(resnet20_workload.layers, comps)
    # Leavers at layer1.2's exit skip a quarter of the network's MACs (what `measure_errors` would estimate).
    name = "layer1.2.conv2/early_exit"
    total = sum(layer.macs for layer in space.layers.values())
    layer = space.layers["layer1.2.conv2"]
    space.features[name] = tuple(f if c is None else dataclasses.replace(f, macs=round(layer.macs - total / 4))
                                 for c, f in zip(space.decision(name).choices, space.features[name], strict=True))
    return space


def _int8(space: SearchSpace, **exits: float):
    return space.parse_plan({"default": {"quantize": INT8}, **({"early_exit": {"exits": exits}} if exits else {})})


def test_an_exit_that_costs_more_than_its_leavers_skip_is_priced_as_a_cost(space) -> None:
    model = LatencyModel(space)
    model.observe(space.plan(), 0.80)
    model.observe(_int8(space), 0.36)
    # One exit whose leavers should save a quarter of 0.36 ms (0.09), measured 0.45: the exit costs 0.18 ms.
    model.observe(_int8(space, **{"layer1.2": 0.9}), 0.45)
    assert model.predict(_int8(space, **{"layer1.2": 0.9})) == pytest.approx(0.45, rel=0.02)
    model.apply()
    exit_costs = [f.latency for f in space.features["layer1.2.conv2/early_exit"]]
    assert exit_costs[0] == 0.0 and all(c == pytest.approx(0.09, abs=0.01) for c in exit_costs[1:])


def test_an_exit_that_pays_is_priced_as_a_saving(space) -> None:
    model = LatencyModel(space)
    model.observe(space.plan(), 0.80)
    model.observe(_int8(space), 0.36)
    model.observe(_int8(space, **{"layer1.2": 0.9}), 0.30)  # saves 0.09 for an exit cost of 0.03
    model.apply()
    assert all(f.latency < -0.04 for f in space.features["layer1.2.conv2/early_exit"][1:])


def test_before_any_exit_is_measured_an_exit_costs_a_whole_plans_overhead(space) -> None:
    model = LatencyModel(space)
    model.observe(space.plan(), 0.80)
    model.observe(_int8(space), 0.36)
    assert model.coef is not None and model.coef[-1] == model.coef[0]
