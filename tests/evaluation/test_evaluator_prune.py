"""The evaluator on pruned plans: exact structured simulation, MACs, chain sizes, batch-norm re-estimation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from modelopt.api import build_compressors
from modelopt.compressors.contract import ChannelAnalysis, ChannelGroup
from modelopt.compressors.prune import n_kept
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def ev_no_bn(small_workload) -> Evaluator:
    comps = build_compressors(["prune", "quantize"], {"prune": {"bn_samples": 0, "sparse_images": 0,
                                                                "repair_images": 0},
                                                      "quantize": {"clip_ratios": [1.0], "bits": [8, 4],
                                                                   "rounding": ["nearest"], "norm_images": 0}})
    return Evaluator(small_workload, SearchSpace(small_workload.layers, comps))


def _blocks(ev: Evaluator) -> list[str]:
    return [layer.name for layer in ev.space.layers.values() if ChannelAnalysis.of(layer).members]


def _structured(ev: Evaluator, sparsity: float = 0.5, quantize: dict | None = None):
    doc = {"layers": {n: {"prune": {"sparsity": sparsity, "kind": "structured"}} for n in _blocks(ev)}}
    if quantize:
        doc["default"] = {"quantize": quantize}
    return ev.space.parse_plan(doc)


def test_every_resnet20_block_has_internal_channels(small_workload):
    """The graph's channel groups that zeroing simulates exactly, on ResNet-20: each block's conv1 outputs (its
    norm's two entries a channel, conv2's columns). The residual stream's group is not offered: option-A
    shortcuts pad it with zeros, which removal does not reproduce."""
    layers = small_workload.layers.analysed(ChannelAnalysis)
    blocks = [(x.name, ChannelAnalysis.of(x)) for x in layers if ChannelAnalysis.of(x).members]
    assert len(blocks) == 9
    assert blocks[0] == ("layer1.0.conv1", ChannelGroup((("layer1.0.conv1", True), ("layer1.0.conv2", False)), 2))


@pytest.mark.parametrize("quantize", [None, {"bits": 4, "granularity": "group", "group_size": 64}])
def test_physical_model_equals_the_simulated_one(ev_no_bn, quantize):
    ev = ev_no_bn
    plan = _structured(ev, 0.5, quantize)
    small = ev.states.physical_model(plan)
    mods = dict(small.named_modules())
    for name in _blocks(ev):
        k = n_kept(ev.workload.original[name].shape[0], 0.5)
        block = name.rsplit(".", 1)[0]
        assert mods[name].out_channels == mods[f"{block}.bn1"].num_features == mods[f"{block}.conv2"].in_channels == k
    x = ev.workload.split("val").x[:32]
    state, cost = ev.states.compressed_state(plan)
    assert cost == 0.0  # no re-estimation; the float pass the refit reads was charged building the physical model
    with ev.workload.state(state), torch.inference_mode():
        simulated = ev.workload.model(x)
        # The simulation really zeroes the removed channels after the ReLU (not merely shrinks weights).
        acts = {}
        h = ev.workload.model.layer1[0].bn1.register_forward_hook(lambda m, i, o: acts.setdefault("bn", o))
        ev.workload.model(x[:2])
        h.remove()
    with torch.inference_mode():
        physical = small(x)
    torch.testing.assert_close(physical, simulated, rtol=1e-4, atol=1e-4)
    kept = ev.realise(plan).kept["layer1.0.conv1"][1]
    dropped = sorted(set(range(16)) - set(kept.tolist()))
    assert torch.all(acts["bn"][:, dropped] == 0)
    # Swapping restored everything: the resident model holds its original tensors again.
    bn = ev.workload.model.layer1[0].bn1
    assert bool(bn.weight.abs().min() > 0) and ev.workload.model.layer1[0].conv1.weight is not None


def test_macs_bitops_and_size_follow_the_kept_channels(ev_no_bn):
    ev = ev_no_bn
    wl = ev.workload
    plan = _structured(ev, 0.5)
    layers = {x.name: x for x in wl.layers}
    expected = 0
    for x in wl.layers:
        out_frac = 0.5 if ChannelAnalysis.of(ev.space.layers[x.name]).members else 1.0
        in_frac = 0.5 if x.name.endswith("conv2") else 1.0
        expected += int(x.macs * out_frac * in_frac)
    assert ev.plan_cost(plan).macs() == expected < 0.6 * wl.macs
    assert ev.plan_cost(plan).bitops() == expected * 32 * 32
    removed = sum(layers[n].params // 2 + layers[n.replace("conv1", "conv2")].params // 2 for n in _blocks(ev))
    norms = sum(layers[n].out_channels // 2 * 8 for n in _blocks(ev))  # folded scale + shift per channel
    assert ev.plan_cost(plan).size_bytes == wl.float_size_bytes - removed * 4 - norms
    m = ev.scorer.evaluate(plan, split="val", n=8)
    assert m.macs == expected and m.float_macs == wl.macs


def test_batch_norm_re_estimation_is_charged_once_and_restored(small_workload):
    wl = small_workload
    options = {"prune": {"bn_samples": 128, "sparse_images": 0, "repair_images": 0},
               "quantize": {"bits": [8, 4], "rounding": ["nearest"], "norm_images": 0}}
    ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["quantize", "prune"], options)))
    before = {k: v.clone() for k, v in wl.model.state_dict().items()}
    plan = ev.space.parse_plan({"layers": {n: {"prune": {"sparsity": 0.5}} for n in _blocks(ev)}})
    m = ev.scorer.evaluate(plan, split="val", n=64)
    # 128 calibration images for the plan, plus the original model's reference pass (once).
    assert m.prep_cost == pytest.approx(2 * 128 / len(wl.split("val")))
    assert ev.scorer.trial_cost(m) == pytest.approx(64 / len(wl.split("val")) + m.prep_cost)
    again = ev.scorer.evaluate(plan, split="test", n=16)
    assert again.prep_cost == 0.0  # statistics cached by plan key
    other = ev.space.parse_plan({"layers": {n: {"prune": {"sparsity": 0.25}} for n in _blocks(ev)}})
    assert ev.scorer.evaluate(other, split="val", n=16).prep_cost == pytest.approx(128 / len(wl.split("val")))
    assert ev.scorer.evaluate(ev.space.plan(), split="val", n=16).prep_cost == 0.0  # nothing pruned, nothing to do
    state, _ = ev.states.compressed_state(plan)
    assert "layer3.2.bn2.running_var" in state
    assert not torch.equal(state["layer3.2.bn2.running_var"], before["layer3.2.bn2.running_var"])
    after = wl.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert all(not m.training for m in wl.model.modules() if isinstance(m, nn.BatchNorm2d))


@pytest.mark.parametrize("sparsity", [0.25, 0.5])
def test_the_readers_of_removed_channels_are_refitted_to_the_float_output(small_workload, sparsity):
    """Each block's conv2 refitted by least squares on its kept input channels (`repair_images`, 256 by default) gives
    logits far nearer the float model's than removal alone, batch norms re-estimated in both."""
    wl = small_workload
    x = wl.split("val").x.tensor()
    with torch.inference_mode():
        ref = wl.model(x)
    errors = {}
    for repair in (False, True):
        options = {"prune": {"repair_images": 256 if repair else 0, "sparse_images": 0}}
        ev = Evaluator(wl, SearchSpace(wl.layers, build_compressors(["prune"], options)))
        plan = _structured(ev, sparsity)
        state, _ = ev.states.compressed_state(plan)
        with wl.state(state), torch.inference_mode():
            errors[repair] = float(((wl.model(x) - ref) ** 2).mean() / (ref**2).mean())
        if repair:  # the removed columns stay zero: the physical model still drops them
            w = ev.states.compressed_weights(plan)["layer1.0.conv2"]
            kept = ev.realise(plan).kept["layer1.0.conv1"][1]
            dropped = sorted(set(range(16)) - set(kept.tolist()))
            assert torch.all(w[:, dropped] == 0) and not torch.equal(w[:, kept], wl.original["layer1.0.conv2"][:, kept])
    print(f"\n{sparsity:.0%} of every block's channels: relative logit error {errors[False]:.4f} removed, "
          f"{errors[True]:.4f} refitted")
    assert errors[True] < 0.6 * errors[False]
