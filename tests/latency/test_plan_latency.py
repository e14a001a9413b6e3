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


# The two runs below: the small sample (846 images, not the exact sample's 2,846, which confirmation, test and the
# deployed check each pass over; its 169 val images certify a 90 % floor, not 99 %) and round-to-nearest codes
# (GPTQ's calibration pass and solves were a third of a run): what they check is which plans get a latency and
# how it is named, not the codes, the floor or the accuracy.
SMALL_FLOOR = 0.9


@pytest.mark.slow
def test_latency_objective_measures_every_plan(small_workload, tmp_path):
    result = api.optimize(small_workload, strategy="random", budget=3, objective="latency", out=tmp_path / "r",
                          progress=False, report=False, latency=QUICK, compressors=["quantize"], reconstruct=False,
                          rounding=["nearest"], min_retention=SMALL_FLOOR)
    for t in result.trials:
        m = t.metrics
        assert m.stopped is None  # a plan stopped below the floor on part of val is not timed
        assert m.latency_ms > 0 and m.float_latency_ms > 0 and m.latency_backend == "torch/cpu/fp32/b8"
        if t.feasible:
            assert t.reward == pytest.approx(m.float_latency_ms / m.latency_ms)


@pytest.mark.slow
def test_final_pareto_set_gets_latency_by_default(small_workload, tmp_path):
    result = api.optimize(small_workload, strategy="random", budget=2, out=tmp_path / "r", progress=False,
                          report=False, latency=QUICK, compressors=["quantize"], reconstruct=False,
                          rounding=["nearest"], min_retention=SMALL_FLOOR)
    assert all(t.metrics.latency_ms is None for t in result.trials)  # not during a size search
    assert all(test is not None and test.latency_ms > 0 for _, test in result.pareto)
    front_test = result.summary.pareto[0].test
    assert front_test is not None and front_test.metrics.latency_backend == "torch/cpu/fp32/b8"


@pytest.mark.slow
def test_exit_plan_latency_times_the_module_that_stops_early(resnet20_workload):
    """With exits, the torch backend times `EarlyExitNet` over every val image (its work depends on
    the input); the speed itself is for benchmarks/early_exit.py to show, not a timed unit test."""
    from modelopt.compressors import ExitChoice

    # The one exit the plan takes is the only candidate: one head is fitted, not eight (the fits were most of the
    # test). Batches of 8: a pass over the split is 52 calls of the module that stops early, not 423, and ONNX
    # Runtime's rounds are 32 calls, not 256 (a batch whose rows leave at different exits:
    # tests/compressors/early_exit/test_module.py, tests/exporters/test_onnx_exits.py).
    wl = resnet20_workload  # its 1,000 calib images and their mirror images fit a head most val images leave by
    one_exit = {"early_exit": {"exits": ["layer1.2.conv2"], "blocks": ["layer1.2"]}}
    exits = api.build_compressors(["early_exit"], one_exit, model=wl.model)
    ev = Evaluator(wl, SearchSpace(wl.layers, exits))
    plan = ev.space.plan({"layer1.2.conv2/early_exit": ExitChoice(0.5)})
    lat = PlanLatency(ev, LatencySpec("torch", batch_size=8, warmup=1, repeats=30))
    assert ev.scorer.evaluate(plan).exited > 0.5
    assert type(ev.states.deployable(plan)).__name__ == "EarlyExitNet"
    assert lat.measure(plan).repeats == 3 and lat.measure(plan).median_ms > 0  # passes over the split
    onnx = PlanLatency(ev, LatencySpec("onnxruntime", batch_size=8, warmup=1, repeats=30))  # segments that return
    assert onnx.measure(plan).repeats == ROUNDS and onnx.measure(plan).median_ms > 0  # rounds over the val images
