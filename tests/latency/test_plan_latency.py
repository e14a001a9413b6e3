"""Measured plan latency, and latency as the objective, on the real ResNet-20."""

from __future__ import annotations

import pytest

from modelopt import api
from modelopt.compressors import Quantize
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency.measure import ROUNDS
from modelopt.latency.plan import PlanLatency
from modelopt.latency.spec import LatencySpec
from modelopt.plan.space import SearchSpace

QUICK = LatencySpec("torch", batch_size=8, threads=1, warmup=1, repeats=3)


def test_latency_is_measured_once_per_plan_and_named(resnet20_workload):
    quantize = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    ev = Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, [quantize]))
    lat = PlanLatency(ev, QUICK)
    first = lat.measure(ev.space.plan())
    assert first.median_ms > 0 and first.backend == "torch" and first.batch_size == 8
    assert lat.measure(ev.space.plan()) is first  # cached by plan key
    assert lat.name == "torch/cpu/fp32/b8"


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match=r"'tvm'.*onnxruntime, openvino, torch"):
        LatencySpec("tvm")


@pytest.mark.slow
def test_latency_objective_measures_every_plan(resnet20_workload, tmp_path):
    result = api.optimize(resnet20_workload, strategy="random", budget=3, objective="latency", out=tmp_path / "r",
                          progress=False, report=False, latency=QUICK, compressors=["quantize"], reconstruct=False)
    for t in result.trials:
        m = t.metrics
        assert m.stopped is None  # a plan stopped below the floor on part of val is not timed
        assert m.latency_ms > 0 and m.float_latency_ms > 0 and m.latency_backend == "torch/cpu/fp32/b8"
        if t.feasible:
            assert t.reward == pytest.approx(m.float_latency_ms / m.latency_ms)


@pytest.mark.slow
def test_final_pareto_set_gets_latency_by_default(resnet20_workload, tmp_path):
    result = api.optimize(resnet20_workload, strategy="random", budget=2, out=tmp_path / "r", progress=False,
                          report=False, latency=QUICK, compressors=["quantize"], reconstruct=False)
    assert all(t.metrics.latency_ms is None for t in result.trials)  # not during a size search
    assert all(test is not None and test.latency_ms > 0 for _, test in result.pareto)
    front_test = result.summary.pareto[0].test
    assert front_test is not None and front_test.metrics.latency_backend == "torch/cpu/fp32/b8"


@pytest.mark.slow
def test_exit_plan_latency_times_the_module_that_stops_early(resnet20_workload):
    """With exits, the torch backend times `EarlyExitNet` over every val image (its work depends on
    the input); the speed itself is for benchmarks/early_exit.py to show, not a timed unit test."""
    from modelopt.compressors import ExitChoice

    ev = Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers,
                                                  api.build_compressors(["early_exit"], model=resnet20_workload.model)))
    plan = ev.space.plan({"layer1.2.conv2/early_exit": ExitChoice(0.5)})
    lat = PlanLatency(ev, LatencySpec("torch", batch_size=1, warmup=1, repeats=30))
    assert ev.scorer.evaluate(plan).exited > 0.5
    assert type(ev.states.deployable(plan)).__name__ == "EarlyExitNet"
    assert lat.measure(plan).repeats == 3 and lat.measure(plan).median_ms > 0  # passes over the split
    onnx = PlanLatency(ev, LatencySpec("onnxruntime", batch_size=1, warmup=1, repeats=30))  # segments that return
    assert onnx.measure(plan).repeats == ROUNDS and onnx.measure(plan).median_ms > 0  # rounds over the val images
