"""GPTQ rounding: the same codes as a dense OBQ reference, lower output error than nearest on a real
layer, pruned zeros kept, inputs measured and charged once, and exported bit for bit."""

from __future__ import annotations

import pytest
import torch

from modelopt.api import build_compressors
from modelopt.compressors import Granularity, Quantize, QuantSpec, Rounding
from modelopt.compressors.contract import scale_units
from modelopt.compressors.quantize.compressor import _code_range, _per_weight, dequantize, quantize, search_scales
from modelopt.compressors.quantize.gptq import gptq_round
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator
from modelopt.model.layer_inputs import LayerInputs, input_columns
from modelopt.plan.space import SearchSpace
from modelopt.solvers.least_squares import RIDGE

PC, GR = Granularity.PER_CHANNEL, Granularity.GROUP


def _obq_reference(w: torch.Tensor, s: torch.Tensor, qmin: int, qmax: int, h: torch.Tensor) -> torch.Tensor:
    """Optimal Brain Quantization, one column at a time with an explicit inverse Hessian that drops
    each quantized column (Frantar & Alistarh 2022): no Cholesky factor, no lazy blocks."""
    w = w.double().clone()
    h = h.double() + torch.eye(h.shape[0], dtype=torch.float64) * RIDGE * float(torch.diagonal(h).mean())
    hinv = torch.linalg.inv(h)
    codes = torch.zeros_like(w)
    for i in range(w.shape[1]):
        q = torch.clamp(torch.round(w[:, i] / s[:, i]), qmin, qmax)
        codes[:, i] = q
        err = (w[:, i] - q * s[:, i]) / hinv[i, i]
        w[:, i:] -= err[:, None] * hinv[i, i:][None, :]
        hinv = hinv - hinv[:, i : i + 1] @ hinv[i : i + 1, :] / hinv[i, i]
    return codes


def _correlated_inputs(n: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(k, k, generator=g, dtype=torch.float64) / k**0.5
    return torch.randn(n, k, generator=g, dtype=torch.float64) @ mix + 0.3 * torch.randn(n, k, generator=g,
                                                                                         dtype=torch.float64)


@pytest.mark.parametrize(("rows", "k", "bits", "gran"), [(12, 40, 4, PC), (8, 300, 3, GR), (5, 129, 2, GR)])
def test_same_codes_as_a_dense_obq_reference(rows, k, bits, gran):
    g = torch.Generator().manual_seed(rows * k)
    w = torch.randn(rows, k, generator=g)
    x = _correlated_inputs(4 * k, k, seed=k)
    h = x.T @ x
    spec = QuantSpec(bits, gran, 64)
    s = _per_weight(search_scales(scale_units(w, spec.granularity, spec.group_size), bits), spec, w).double()
    qmin, qmax = _code_range(bits)
    got = gptq_round(w, s, qmin, qmax, LayerInputs(h, x.shape[0]))
    want = _obq_reference(w, s, qmin, qmax, h).float()
    assert torch.equal(got, want)  # k = 300 and 129 cross the lazy-update blocks of 128 columns


def _output_error(q: torch.Tensor, w: torch.Tensor, h: torch.Tensor) -> float:
    e = (q - w).reshape(w.shape[0], -1).double()
    return float(((e @ h) * e).sum())


@pytest.fixture(scope="session")
def gptq_evaluator(small_workload) -> Evaluator:
    comps = build_compressors(["quantize"], {"quantize": {"bits": [4, 3, 2], "granularity": ["per_channel", "group"],
                                                          "rounding": ["gptq", "nearest"], "calib_images": 64,
                                                          "norm_images": 0}})
    return Evaluator(small_workload, SearchSpace(small_workload.layers, comps))


@pytest.mark.parametrize("spec", [QuantSpec(4), QuantSpec(3), QuantSpec(2, GR, 64)])
def test_lower_output_error_than_nearest_on_every_real_layer(gptq_evaluator, spec):
    wl = gptq_evaluator.workload
    comp = gptq_evaluator.space.compressors["quantize"]
    for name, w in wl.original.items():
        inputs = gptq_evaluator.states.layers.layer_inputs(name, 64)
        assert inputs is not None and inputs.rows > 0
        near = comp.apply_calibrated(w, spec, inputs)
        calibrated = comp.apply_calibrated(w, spec.with_rounding(Rounding.GPTQ), inputs)
        h = inputs.hessian.to(w.device)
        assert _output_error(calibrated, w, h) < _output_error(near, w, h), (name, str(spec))


def test_pruned_zeros_stay_zero_and_scales_are_nearest_ones(gptq_evaluator):
    wl = gptq_evaluator.workload
    name = "layer2.0.conv2"
    w = wl.original[name].clone()
    w[w.abs() < w.abs().median()] = 0.0  # half the weights pruned
    spec = QuantSpec(3, rounding=Rounding.GPTQ)
    inputs = gptq_evaluator.states.layers.layer_inputs(name, 64)
    codes, scales = quantize(w, spec, inputs=inputs)
    assert torch.all(codes[w == 0] == 0)
    assert torch.equal(scales, quantize(w, QuantSpec(3))[1])  # GPTQ changes codes, never what a scale costs
    assert not torch.equal(codes, quantize(w, QuantSpec(3))[0])


def test_without_inputs_a_gptq_spec_rounds_to_nearest():
    w = torch.randn(6, 100)
    assert torch.equal(quantize(w, QuantSpec(4, rounding=Rounding.GPTQ))[0], quantize(w, QuantSpec(4))[0])


def test_kept_input_channels_select_their_columns():
    k, kernel = 4, 9
    h = torch.arange((k * kernel) ** 2, dtype=torch.float64).reshape(k * kernel, k * kernel)
    cols = input_columns(torch.tensor([1, 3]), kernel)
    assert cols.tolist() == [*range(9, 18), *range(27, 36)]
    assert torch.equal(LayerInputs(h, 5).select(cols).hessian, h[cols][:, cols])


@pytest.mark.parametrize(("groups", "cin", "cout"), [(24, 24, 24), (4, 32, 16)])  # depthwise; 4 groups of 8 -> 4
def test_a_grouped_conv_is_rounded_group_by_group_on_its_own_inputs(groups, cin, cout):
    from torch import nn

    from modelopt.model.layer_inputs import input_hessians

    torch.manual_seed(groups)
    conv = nn.Conv2d(cin, cout, 3, padding=1, groups=groups)
    x = torch.relu(torch.randn(32, cin, 8, 8) + torch.randn(32, cin, 1, 1))  # channels correlated over positions
    inputs = input_hessians(nn.Sequential(conv), {"c": conv}, x)["c"]
    assert inputs.groups == groups and inputs.hessian.shape == (groups, cin // groups * 9, cin // groups * 9)
    w = conv.weight.detach()
    spec = QuantSpec(3)
    s = _per_weight(search_scales(scale_units(w, spec.granularity), 3), spec, w)
    got = gptq_round(w, s, -4, 3, inputs)
    per = cout // groups  # each group alone, through the plain (one-matrix) path
    want = torch.cat([gptq_round(w[i * per : (i + 1) * per], s[i * per : (i + 1) * per], -4, 3,
                                 LayerInputs(inputs.hessian[i], inputs.rows)) for i in range(groups)])
    assert torch.equal(got, want)
    near = torch.clamp(torch.round(w.reshape(cout, -1) / s), -4, 3)

    def output_error(codes: torch.Tensor) -> float:
        delta = (codes.reshape(cout, -1) * s).reshape(w.shape) - w
        return float(nn.functional.conv2d(x, delta, padding=1, groups=groups).pow(2).sum())

    assert output_error(got) < output_error(near)
    kept = inputs.select_groups(torch.tensor([0, 2]))
    assert torch.equal(kept.hessian, inputs.hessian[[0, 2]])


def test_inputs_are_measured_once_and_charged_to_the_first_plan(gptq_evaluator):
    space = gptq_evaluator.space
    plan = space.parse_plan({"default": {"quantize": {"bits": 4, "rounding": "gptq"}}})
    other = space.parse_plan({"default": {"quantize": {"bits": 3, "rounding": "gptq"}}})
    nearest = space.parse_plan({"default": {"quantize": {"bits": 4, "rounding": "nearest"}}})
    ev = Evaluator(gptq_evaluator.workload, space)  # a fresh run on the same workload: its own charges
    val = len(ev.workload.split("val"))
    assert ev.states.compressed_state(nearest)[1] == 0.0
    assert ev.states.compressed_state(plan)[1] == pytest.approx(64 / val)
    assert ev.states.compressed_state(other)[1] == 0.0
    resumed = Evaluator(gptq_evaluator.workload, space)
    resumed.states.mark_paid(plan)  # a resumed run whose journal holds a GPTQ plan does not pay again
    assert resumed.states.compressed_state(other)[1] == 0.0


def test_gptq_plans_keep_accuracy_where_nearest_collapses(gptq_evaluator):
    space = gptq_evaluator.space
    int3 = {r: space.parse_plan({"default": {"quantize": {"bits": 3, "rounding": r}}}) for r in ("nearest", "gptq")}
    got = {r: gptq_evaluator.scorer.evaluate(p, "val").agreement for r, p in int3.items()}
    assert got["gptq"] > got["nearest"] + 0.05, got


def test_export_writes_the_gptq_codes_that_were_scored(gptq_evaluator, tmp_path):
    from modelopt.exporters import load
    from modelopt.exporters.packed import export_packed
    from modelopt.model.layers import compressible_modules

    space = gptq_evaluator.space
    plan = space.parse_plan({"default": {"quantize": {"bits": 3, "granularity": "group", "rounding": "gptq"}}})
    net = load(export_packed(gptq_evaluator, plan, tmp_path / "gptq.pt"))
    layers = compressible_modules(net)
    for lname, w in gptq_evaluator.states.compressed_weights(plan).items():
        assert torch.equal(layers[lname].weight.cpu(), w.cpu()), lname


def test_plan_files_name_the_rounding_and_refuse_a_bad_one(gptq_evaluator):
    comp = Quantize(bits=(4,), rounding=("gptq",), norm_images=0)
    layer = gptq_evaluator.workload.layers[3]
    assert comp.parse({"bits": 4}, layer).rounding is Rounding.GPTQ  # the first offered
    assert comp.dump(comp.parse({"bits": 4}, layer))["rounding"] == "gptq"
    nearest = Quantize(bits=(8, 4), rounding=("nearest",), norm_images=0)
    assert nearest.parse({"bits": 4}, layer).rounding is Rounding.NEAREST
    with pytest.raises(ConfigError, match=r"rounding 'adaround' not offered; valid: nearest, gptq"):
        comp.parse({"bits": 4, "rounding": "adaround"}, layer)
    with pytest.raises(ConfigError, match="rounding"):
        Quantize(rounding=("best",), bits=(8, 4), norm_images=0)
    assert str(QuantSpec(4, rounding=Rounding.GPTQ)) == "int4/per_channel/gptq"
    w = torch.randn(4, 8)
    assert torch.equal(dequantize(*quantize(w, QuantSpec(8)), QuantSpec(8)), nearest.apply(w, QuantSpec(8)))
