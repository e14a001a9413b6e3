"""Removed residual branches (depth) on the real ResNet-20: what the evaluator scores is what engines run, the
removed layers cost no MACs, and the repair keeps answers the branch's mean alone loses."""

from __future__ import annotations

import pytest
import torch

from modelopt.api import build_compressors
from modelopt.compressors import QuantSpec
from modelopt.compressors.contract import BranchAnalysis
from modelopt.compressors.depth import SKIP
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator
from modelopt.latency.cost_model import LatencyModel
from modelopt.model.skip_repair import skip_state
from modelopt.plan.space import SearchSpace

REMOVED = ("layer1.0.conv2", "layer3.1.conv2")


@pytest.fixture(scope="session")
def depth_evaluator(resnet20_workload) -> Evaluator:
    comps = build_compressors(["depth", "quantize"], {"quantize": {"bits": [8], "activations": [None, 8]}})
    return Evaluator(resnet20_workload, SearchSpace(resnet20_workload.layers, comps))


def _removing(ev: Evaluator, base=None, removed=REMOVED):
    choices = dict(base.choices) if base is not None else {}
    return ev.space.plan({**choices, **{f"{name}/depth": SKIP for name in removed}})


def test_depth_is_offered_once_per_residual_block(depth_evaluator):
    offered = [d.layer for d in depth_evaluator.space.decisions if d.compressor == "depth"]
    assert offered == [f"layer{s}.{b}.conv2" for s in (1, 2, 3) for b in range(3)]


@pytest.mark.slow
def test_the_engine_model_runs_without_the_branches_and_computes_what_is_scored(depth_evaluator):
    ev = depth_evaluator
    plan = _removing(ev)
    x = ev.workload.split(Split.VAL).x[:64]
    scored = ev.states.logits(plan, x)
    engine = ev.states.engine_model(plan).eval()
    with torch.inference_mode():
        ran = engine(x)
    torch.testing.assert_close(ran, scored, rtol=1e-4, atol=1e-4)
    names = {n for n, _ in engine.named_modules()}
    assert "layer1.0.conv1" not in names and "layer3.1.conv2" not in names and "layer1.1.conv1" in names


def test_removed_layers_cost_no_macs_and_the_latency_model_prices_them_out(depth_evaluator):
    ev = depth_evaluator
    plan = _removing(ev)
    gone = {"layer1.0.conv1", "layer1.0.conv2", "layer3.1.conv1", "layer3.1.conv2"}
    layers = ev.space.layers
    assert ev.plan_cost(plan).macs() == ev.workload.macs - sum(layers[n].macs for n in gone)
    assert ev.plan_cost(plan).size_bytes == ev.plan_cost(ev.space.plan()).size_bytes  # the packed form keeps them
    model = LatencyModel(ev.space)
    float_macs = model.features(ev.space.plan())[1]
    assert model.features(plan)[1] == pytest.approx(float_macs - sum(layers[n].macs for n in gone))


@pytest.mark.slow
def test_the_repair_keeps_answers_the_mean_alone_loses(resnet20_workload):
    wl = resnet20_workload
    val = wl.split(Split.VAL)
    removed = [wl.analyses.get(BranchAnalysis).branches["layer1.0.conv2"]]

    def agreement(state):
        with wl.state(state):
            return float((wl.predict(val.x) == val.base_pred).float().mean())

    mean_only, repaired = agreement(skip_state(wl, removed, 0)), agreement(skip_state(wl, removed, 512))
    assert repaired > mean_only + 0.05, (mean_only, repaired)
    assert repaired > 0.93


@pytest.mark.slow
def test_activation_ranges_are_measured_with_the_branches_removed(depth_evaluator):
    ev = depth_evaluator
    w8a8 = ev.space.uniform("quantize", QuantSpec(8).with_activations(8))
    plain, removing = ev.states.input_qparams(w8a8)[0], ev.states.input_qparams(_removing(ev, w8a8))[0]
    assert "layer1.0.conv1" not in removing and "layer1.0.conv1" in plain  # a removed layer sees nothing
    assert removing["layer1.1.conv1"].scale != plain["layer1.1.conv1"].scale  # after the removed block: its own range
    assert removing["conv1"].scale == plain["conv1"].scale  # before it: the float model's
