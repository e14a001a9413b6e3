"""The evaluator on the real ResNet-20 and the bundled CIFAR-10 sample."""

from __future__ import annotations

import math

import pytest
import torch

from modelopt.compressors import Granularity, Quantize, QuantSpec
from modelopt.compressors.contract import encode_codes
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.space import SearchSpace


@pytest.fixture(scope="session")
def evaluator(resnet20_workload):
    space = SearchSpace(resnet20_workload.layers, [Quantize(bits=(8, 4), granularity=("per_channel", "group"),
                                                            rounding=("nearest",), norm_images=0)])
    return Evaluator(resnet20_workload, space)


def _uniform(ev, bits, gran):
    return ev.space.uniform("quantize", QuantSpec(bits, Granularity(gran)))


def test_float_plan_is_the_baseline(evaluator):
    m = evaluator.scorer.evaluate(evaluator.space.plan(), split="all")
    assert m.n_samples == 846
    assert m.accuracy == pytest.approx(0.9173, abs=0.001)  # the published 91.73 % on these exact images
    assert m.retention == 1.0 and m.agreement == 1.0
    assert m.size_bytes == m.float_size_bytes and m.compression == 1.0
    assert m.bitops == m.macs * 32 * 32


def test_uniform_int8_per_channel_keeps_accuracy_at_4x(evaluator):
    plan = _uniform(evaluator, 8, "per_channel")
    m = evaluator.scorer.evaluate(plan, split="all")
    assert m.retention >= 0.995
    assert m.compression >= 3.9
    # Coded, INT8's codes take fewer than their 8 bits (the fixed-rate price: the cost model before any code).
    assert m.size_bytes < evaluator.costs.cost(plan).size_bytes


def test_uniform_int4_per_channel_keeps_98_percent_at_7_5x(evaluator):
    m = evaluator.scorer.evaluate(_uniform(evaluator, 4, "per_channel"), split="all")
    assert m.retention >= 0.98
    assert m.compression >= 7.5


def test_uniform_int4_group_keeps_99_percent(evaluator):
    m = evaluator.scorer.evaluate(_uniform(evaluator, 4, "group"), split="all")
    assert m.retention >= 0.99
    assert m.compression > 6.5


def test_size_adds_up_from_layers(evaluator):
    wl = evaluator.workload
    plan = _uniform(evaluator, 4, "per_channel")
    forms = evaluator.realise(plan).forms
    # Each layer: its codes' segment as the packed file writes it (entropy coded, or bit-packed where smaller: never
    # more than one byte over the fixed rate), and one float16 scale per output channel.
    segments = {x.name: encode_codes(forms[x.name].integer.codes, 4).size for x in wl.layers}
    assert all(segments[x.name] <= math.ceil(x.params / 2) + 1 for x in wl.layers)
    expected = wl.other_bytes + sum(segments[x.name] + 2 * x.out_channels for x in wl.layers)
    assert evaluator.plan_cost(plan).size_bytes == expected
    # ResNet-20: 268,346 conv/linear weights, 688 batch-norm channels folded to scale+shift, 10 biases.
    assert wl.other_bytes == 688 * 2 * 4 + 10 * 4
    assert wl.float_size_bytes == 268_336 * 4 + wl.other_bytes


def test_bitops_follow_weight_bits(evaluator):
    wl = evaluator.workload
    plan = _uniform(evaluator, 4, "per_channel")
    assert evaluator.plan_cost(plan).bitops() == wl.macs * 4 * 32
    assert wl.macs == 40_551_040  # ResNet-20 at 32x32: about 41 M multiply-accumulates


def test_results_are_cached_and_weights_restored(evaluator):
    wl = evaluator.workload
    before = {n: w.clone() for n, w in wl.original.items()}
    plan = _uniform(evaluator, 4, "group")
    a = evaluator.scorer.evaluate(plan, split="val", n=100)
    assert evaluator.scorer.evaluate(plan, split="val", n=100) is a
    assert a.n_samples == 100 and evaluator.scorer.cost("val", 100) == pytest.approx(100 / len(wl.split("val")))
    for name, mod in wl.modules.items():
        assert torch.equal(mod.weight.data, before[name]), f"{name} not restored"


def test_evaluation_matches_an_independent_quantized_copy(evaluator):
    """Oracle: a deep copy with weights replaced by Quantize.apply gives the same predictions."""
    import copy

    wl = evaluator.workload
    plan = _uniform(evaluator, 4, "per_channel")
    model = copy.deepcopy(wl.model)
    q = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    for name, mod in model.named_modules():
        if name in wl.modules:
            mod.weight.data = q.apply(mod.weight.data, plan[f"{name}/quantize"])
    x = wl.split("test").x.tensor()
    with torch.inference_mode():
        pred = model(x).argmax(1)
    m = evaluator.scorer.evaluate(plan, split="test")
    assert m.accuracy == pytest.approx(float((pred == wl.split("test").y).float().mean()))


@pytest.mark.slow
def test_uniform_w8a8_keeps_99_percent_at_8x8_bitops(resnet20_workload):
    """Quantized inputs: static ranges calibrated once on the float model, charged to the first plan."""
    from modelopt.compressors.contract import (
        Calibration,
        InputQParams,
        fake_quantize,
        input_ranges,
    )

    wl = resnet20_workload
    ev = Evaluator(wl, SearchSpace(wl.layers, [Quantize(bits=(8, 4), activations=(None, 8), rounding=("nearest",),
                                                        norm_images=0)]))
    w8a8 = ev.space.uniform("quantize", QuantSpec(8).with_activations(8))
    m = ev.scorer.evaluate(w8a8, split="val")
    assert m.retention >= 0.99  # measured: 1.003 (val), 0.997 (test)
    assert m.bitops == sum(layer.macs * 8 * 8 for layer in wl.layers) == m.float_bitops // 16
    assert m.size_bytes == ev.plan_cost(ev.space.uniform("quantize", QuantSpec(8))).size_bytes + 5 * len(wl.layers)
    assert m.prep_cost == pytest.approx(256 / len(wl.split("val")))  # the calibration pass, once
    w4a8 = ev.scorer.evaluate(ev.space.uniform("quantize", QuantSpec(4).with_activations(8)), split="val", n=50)
    assert w4a8.prep_cost == 0.0 and w4a8.bitops == wl.macs * 4 * 8
    assert all(not m._forward_pre_hooks for m in wl.modules.values())  # hooks gone after scoring

    # Oracle: a copy of the model with quantized weights and hand-written input quantization.
    import copy

    ranges = input_ranges(wl.model, wl.modules, wl.split("calib").x[:256], Calibration(), wl.batch_size)
    model = copy.deepcopy(wl.model)
    q = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    for name, mod in model.named_modules():
        if name in wl.modules:
            mod.weight.data = q.apply(mod.weight.data, QuantSpec(8))
            qp = InputQParams.from_range(*ranges[name])
            mod.register_forward_pre_hook(lambda m, i, qp=qp: (fake_quantize(i[0], qp),))
    x = wl.split("val").x.tensor()
    with torch.inference_mode():
        pred = model(x).argmax(1)
    assert m.accuracy == pytest.approx(float((pred == wl.split("val").y).float().mean()))
    # ... and the input quantization is not a no-op: the logits move against weight-only INT8.
    state, _ = ev.states.compressed_state(w8a8)
    with wl.state(state):
        w8 = wl.logits(x[:64])
        with ev.states.activation_quant(w8a8):
            a8 = wl.logits(x[:64])
    assert (w8 - a8).abs().max() > 1e-3


def test_mixed_activation_plan_counts_bitops_per_layer(resnet20_workload):
    wl = resnet20_workload
    ev = Evaluator(wl, SearchSpace(wl.layers, [Quantize(bits=(8, 4), activations=(None, 8), rounding=("nearest",),
                                                        norm_images=0)]))
    plan = ev.space.parse_plan({"default": {"quantize": {"bits": 4, "activations": 8}},
                                "layers": {"conv1": {"quantize": {"bits": 8, "activations": None}},
                                           "linear": {"quantize": None}}})
    first, last = wl.layers[0], wl.layers[-1]
    cost = ev.plan_cost(plan)
    assert cost.layer("conv1").activation_bits == 32 and cost.layer("linear").activation_bits == 32
    expected = first.macs * 8 * 32 + last.macs * 32 * 32 + sum(x.macs * 4 * 8 for x in wl.layers[1:-1])
    assert ev.plan_cost(plan).bitops() == expected
    assert set(ev.states.input_qparams(plan)[0]) == {x.name for x in wl.layers[1:-1]}
    assert all(qp.zero_point == 0 for qp in ev.states.input_qparams(plan)[0].values())  # inputs after a ReLU
