"""Early exit inside the evaluator, checked against the deployable module on the real ResNet-20 (and against
the benchmarks' one-pass simulator in tests/benchmarks/test_exit_simulate.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _norms import assert_norms_run_on_cuda

import modelopt
from modelopt.api import build_compressors, default_compressors
from modelopt.compressors import EarlyExit, ExitChoice, QuantSpec
from modelopt.compressors.early_exit.module import EarlyExitNet
from modelopt.compressors.early_exit.runtime import exit_layout
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.evaluation.priors import measure_errors
from modelopt.exporters.packed import CONTAINER_BYTES
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def ee(small_workload):
    wl = small_workload
    space = SearchSpace(wl.layers, build_compressors(["quantize", "early_exit"], model=wl.model))
    return Evaluator(wl, space)


def _exits(ev: Evaluator, thresholds: dict[str, float]) -> dict[str, ExitChoice]:
    return {f"{layer}/early_exit": ExitChoice(t) for layer, t in thresholds.items()}


PLAN = {"layer1.2.conv2": 0.97, "layer2.1.conv2": 0.9, "layer3.0.conv2": 0.8}


def test_candidate_exits_are_block_ends_but_the_last(ee):
    layers = [d.layer for d in ee.space.decisions if d.compressor == "early_exit"]
    assert layers == [f"layer{s}.{b}.conv2" for s in (1, 2, 3) for b in range(3)][:-1]


def test_no_exit_plan_is_scored_as_before(ee, small_workload):
    plain = Evaluator(small_workload, SearchSpace(small_workload.layers, build_compressors(["quantize"])))
    a = ee.scorer.evaluate(ee.space.plan())
    b = plain.scorer.evaluate(plain.space.plan())
    assert a.exited is None and (a.accuracy, a.macs, a.size_bytes, a.bitops) == (b.accuracy, b.macs, b.size_bytes,
                                                                               b.bitops)


@pytest.mark.slow
def test_exit_plan_matches_the_deployable_module(ee, small_workload):
    plan = ee.space.plan(_exits(ee, PLAN))
    m = ee.scorer.evaluate(plan)
    heads, cost = ee.routes.routing.heads()
    assert cost == 0.0  # fitted by the evaluation above, charged to it
    assert m.prep_cost > 0
    policy = ee.routes.route(plan)
    assert policy is not None and policy.exits == ("layer1.2", "layer2.1", "layer3.0")
    assert 0 < m.exited < 1 and m.macs < m.float_macs
    net = EarlyExitNet(ee.routes.routing.layout.backbone, heads, policy).eval()
    val = small_workload.split("val")
    with torch.inference_mode():
        logits, exit_at = net.forward_with_exits(val.x.tensor())
    assert float((logits.argmax(1) == val.y).double().mean()) == pytest.approx(m.accuracy, abs=1e-6)
    assert float((exit_at < len(policy.exits)).double().mean()) == pytest.approx(m.exited, abs=1e-6)


def test_heads_count_toward_size_and_bitops_follow_the_samples(ee):
    plan = ee.space.plan(_exits(ee, PLAN))
    heads, _ = ee.routes.routing.heads()
    policy = ee.routes.route(plan)
    added = ee.plan_cost(plan).size_bytes - ee.plan_cost(ee.space.plan()).size_bytes
    assert added == sum(heads[e].params * 4 for e in policy.exits)
    m = ee.scorer.evaluate(plan)
    assert m.bitops < m.float_bitops
    # The same exits on a quantized backbone: its heads read the quantized features.
    q = {d.name: QuantSpec(8) for d in ee.space.decisions if d.compressor == "quantize"}
    mq = ee.scorer.evaluate(ee.space.plan({**q, **_exits(ee, PLAN)}))
    assert mq.prep_cost == 0.0 and mq.exited is not None
    assert mq.bitops < m.bitops / 3


@pytest.mark.slow
def test_staged_scoring_keeps_the_exit_figures(small_workload):
    from modelopt.evaluation.fidelity import Fidelity

    # Each evaluator fits its own heads: a space whose one candidate is the plan's exit fits one head, not eight.
    wl = small_workload
    one_exit = {"early_exit": {"exits": ["layer2.0.conv2"], "blocks": ["layer2.0"]}}
    space = SearchSpace(wl.layers, build_compressors(["early_exit"], one_exit, model=wl.model))
    plan = space.plan({"layer2.0.conv2/early_exit": ExitChoice(0.95)})
    full = Evaluator(wl, space).scorer.evaluate(plan)
    staged = Evaluator(wl, space).scorer.evaluate_staged(plan, 0.5, Fidelity())
    assert full.exited is not None and (staged.accuracy, staged.macs, staged.exited) == (full.accuracy, full.macs,
                                                                                         full.exited)


def test_a_decision_that_ends_no_block_is_refused(small_workload):
    wl = small_workload
    space = SearchSpace(wl.layers, [EarlyExit(exits=("layer1.0.conv1",))])
    with pytest.raises(ConfigError, match="end no block"):
        exit_layout(wl.model, (32, 32), ["layer1.0.conv1"], [x.name for x in wl.layers])
    ev = Evaluator(wl, space)
    with pytest.raises(ConfigError, match=r"layer1\.0\.conv1"):
        ev.scorer.evaluate(space.plan({"layer1.0.conv1/early_exit": ExitChoice(0.9)}))


def test_default_compressors_follow_the_objective(small_workload):
    torchvision = pytest.importorskip("torchvision")
    assert default_compressors("size", small_workload.model) == ["prune", "quantize"]
    assert default_compressors("macs", small_workload.model) == ["early_exit", "prune"]
    assert "early_exit" in default_compressors("bitops", small_workload.model)
    # Any chain of convolutional blocks gets exits (torchvision's ResNet-18: layer1.0 ... layer4.1); a model early
    # exit cannot cut (a transformer's blocks give tokens, not feature maps) gets the others.
    assert default_compressors("latency", torchvision.models.resnet18()) == ["depth", "early_exit", "prune", "quantize"]
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=16,
                                               mlp_dim=32)
    assert default_compressors("latency", vit) == ["depth", "prune", "quantize"]  # depth: no branch, no decision


@pytest.mark.slow
def test_an_exit_plan_exports_and_loads_as_the_module_that_stops_early(ee, small_workload, tmp_path):
    from modelopt.exporters import export_packed, load

    q = {d.name: QuantSpec(8) for d in ee.space.decisions if d.compressor == "quantize"}
    plan = ee.space.plan({**q, **_exits(ee, PLAN)})
    m = ee.scorer.evaluate(plan)
    path = export_packed(ee, plan, tmp_path / "ee.pt")
    assert m.size_bytes <= path.stat().st_size <= m.size_bytes + CONTAINER_BYTES
    net = load(path)
    assert type(net).__name__ == "EarlyExitNet" and net.policy == ee.routes.route(plan)
    assert_norms_run_on_cuda(net)
    val = small_workload.split("val")
    with torch.inference_mode():
        logits, exit_at = net.forward_with_exits(val.x.cpu())
    assert float((logits.argmax(1) == val.y.cpu()).double().mean()) == pytest.approx(m.accuracy, abs=1e-6)
    assert float((exit_at < len(net.policy.exits)).double().mean()) == pytest.approx(m.exited, abs=1e-6)


def test_an_exit_plan_is_refused_as_one_onnx_file_in_one_line(ee, tmp_path):
    pytest.importorskip("onnx")
    from modelopt.exporters.onnx import export_onnx

    with pytest.raises(ConfigError, match=r"early_exit route .* cannot run in one ONNX file.*folder of segments"):
        export_onnx(ee, ee.space.plan(_exits(ee, PLAN)), tmp_path / "x.onnx")


def test_strategies_see_an_exit_cost_its_heads_bytes(ee):
    """The search's per-choice cost estimate of an exit is the head the evaluator will count."""
    plan = ee.space.plan(_exits(ee, {"layer2.1.conv2": 0.9}))
    extra = ee.plan_cost(plan).size_bytes - ee.plan_cost(ee.space.plan()).size_bytes
    feats = dict(zip(ee.space.decision("layer2.1.conv2/early_exit").choices,
                     ee.space.features["layer2.1.conv2/early_exit"], strict=True))
    assert feats[ExitChoice(0.9)].bytes - feats[None].bytes == extra > 0


@pytest.mark.slow
def test_exit_priors_give_strategies_mac_savings_and_a_loss_proxy(resnet20_workload):
    # The bundled sample's 1,000 calib images: heads fitted on the small sample's 169 are rarely confident enough to
    # exit at 0.8 on its val images, and the loss proxy is 0 at every threshold. One candidate exit (the one read
    # below), so one head is fitted, not eight; pruning by magnitude, unrepaired: its priors here are read for
    # their MACs, which SparseGPT's masks and the readers' refit do not change (those were half of the test).
    wl = resnet20_workload
    options = {"early_exit": {"exits": ["layer1.2.conv2"], "blocks": ["layer1.2"]},
               "prune": {"sparse_images": 0, "repair_images": 0}}
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["early_exit", "prune"], options, model=wl.model)))
    measure_errors(ev)
    name = "layer1.2.conv2/early_exit"
    feats = dict(zip(ev.space.decision(name).choices, ev.space.features[name], strict=True))
    low, high = feats[ExitChoice(0.8)], feats[ExitChoice(0.995)]
    assert low.macs < feats[None].macs and low.macs < high.macs  # lower thresholds: more leave, more saved
    assert low.error > high.error >= 0  # (an exit nobody takes costs its head and loses nothing)
    # The fit and the val pass are charged to the next trial, once.
    first = ev.scorer.evaluate(ev.space.plan())
    calib, val = (len(wl.split(s).y) for s in ("calib", "val"))  # heads fit on calib and its mirror image
    assert first.prep_cost == pytest.approx(ev.scorer.cost() * (2 * calib + val) / val + 1.0)
    assert Evaluator(wl, ev.space).scorer.evaluate(ev.space.plan()).prep_cost == 0.0
    # A structured choice's MACs estimate is what the evaluator counts for it alone.
    d = ev.space.decision("layer2.0.conv1/prune")
    for c, f in zip(d.choices, ev.space.features[d.name], strict=True):
        saved_by_plan = ev.plan_cost(ev.space.plan()).macs() - ev.plan_cost(ev.space.plan({d.name: c})).macs()
        assert wl.layers[[x.name for x in wl.layers].index("layer2.0.conv1")].macs - f.macs == saved_by_plan


@pytest.mark.slow
def test_heads_can_fit_on_extra_unlabeled_images_which_are_charged(small_workload, tmp_path):
    import numpy as np

    from modelopt.compressors.early_exit.pools import load_exit_images
    from modelopt.errors import LoadError

    wl = small_workload
    src = np.load(Path(modelopt.__file__).parent / "zoo" / "assets" / "cifar10_sample.npz")
    np.savez(tmp_path / "extra.npz", x=src["calib_x"][:100], y=src["calib_y"][:100])
    x = load_exit_images(wl, tmp_path / "extra.npz", 64)
    assert x.shape == (64, 3, 32, 32) and x.dtype == torch.float32
    # One candidate exit: what is charged counts images, whatever the number of heads fitted on them.
    options = {"early_exit": {"exit_data": str(tmp_path / "extra.npz"), "exit_images": 64,
                              "exits": ["layer2.1.conv2"], "blocks": ["layer2.1"]}}
    space = SearchSpace(wl.layers, build_compressors(["early_exit"], options, model=wl.model))
    ev = Evaluator(wl, space)  # the compressor's own setting: its routing loads the images
    _, cost = ev.routes.routing.heads()
    calib, val = (len(wl.split(s).y) for s in ("calib", "val"))  # calib, its mirror image, the 64 extra, val
    assert cost == pytest.approx((2 * calib + 64 + val) / val)
    with pytest.raises(LoadError, match="is not a file"):
        load_exit_images(wl, tmp_path / "missing.npz")
    with pytest.raises(ConfigError, match="positive number"):
        load_exit_images(wl, tmp_path / "extra.npz", 0)
