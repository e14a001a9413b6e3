"""The refit on own inputs, against hand-computed least squares and the plan's fixed grid and mask."""

from __future__ import annotations

import copy

import torch
from torch import nn

from modelopt.compressors.contract import Granularity, IntegerWeight, code_range
from modelopt.compressors.quantize import QuantSpec, quantize
from modelopt.reconstruct.own_inputs import MULTIPLIERS, Grid, LayerGoal, refit_layers, rescaled, scale_per_weight
from modelopt.solvers.least_squares import RIDGE


def _nets(seed: int = 0) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """A float two-layer net, a copy whose first layer is perturbed (what the second layer is fed changes), and
    inputs."""
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 5)).eval()  # 8 of 12 directions: H well posed
    for p in net.parameters():
        p.requires_grad_(False)
    own = copy.deepcopy(net)
    own[0].weight.add_(0.2 * torch.randn_like(own[0].weight))
    return net, own, torch.randn(600, 12)


def test_a_float_layer_is_refitted_to_the_least_squares_solution_on_its_own_inputs():
    net, own, x = _nets()
    target = LayerGoal(net[2].weight.clone(), None, None, None, None)
    fits = refit_layers(net, own, {"2": target}, x)
    xf, xq = torch.tanh(net[0](x)), torch.tanh(own[0](x))  # the second layer's input in each network
    # min ||X_q W'^T - X_f W^T||^2 + lam ||W'||^2 (the refit's ridge) by torch's least squares on the stacked
    # system [X_q; sqrt(lam) I] W'^T = [X_f W^T; 0], as an oracle
    lam = RIDGE * float((xq.double() ** 2).sum(0).mean())
    a = torch.cat([xq.double(), lam**0.5 * torch.eye(xq.shape[1], dtype=torch.float64)])
    b = torch.cat([(xf @ net[2].weight.T).double(), torch.zeros(xq.shape[1], 5, dtype=torch.float64)])
    want = torch.linalg.lstsq(a, b).solution.T.float()
    got = own[2].weight
    assert torch.allclose(got, want, atol=1e-4 * float(want.abs().max())), (got - want).abs().max()
    assert fits["2"].after < fits["2"].before
    out_f = net(x)
    composed = copy.deepcopy(own)
    composed[2].weight.copy_(net[2].weight)
    assert (own(x) - out_f).pow(2).mean() < (composed(x) - out_f).pow(2).mean()


def test_a_quantized_layer_keeps_its_code_range_scale_count_and_mask():
    net, own, x = _nets(1)
    w = net[2].weight.clone()
    keep = torch.rand_like(w) > 0.3
    codes, scales = quantize(w * keep, QuantSpec(3))
    integer = IntegerWeight(codes, scales, 3, Granularity.PER_CHANNEL)
    own[2].weight.copy_(integer.dequantize())
    fits = refit_layers(net, own, {"2": LayerGoal(w, None, None, keep, Grid(integer))}, x)
    fit = fits["2"]
    assert fit.integer is not None and fit.integer.scales.dtype == scales.dtype
    assert fit.integer.scales.shape == scales.shape  # the same bytes: one float16 scale per row
    qmin, qmax = code_range(3)
    assert int(fit.integer.codes.min()) >= qmin and int(fit.integer.codes.max()) <= qmax
    assert torch.equal(fit.integer.dequantize(), own[2].weight)  # what runs is what the codes say
    assert not own[2].weight[~keep].any()  # pruned weights stay pruned
    ratio = fit.integer.scales.float() / scales.float()
    assert all(any(abs(float(r) - m) < 2e-3 for m in MULTIPLIERS) for r in ratio)
    assert fit.after <= fit.before


def test_rescaled_scales_per_row_and_per_tensor():
    codes = torch.ones(3, 4, dtype=torch.int8)
    per_row = IntegerWeight(codes, torch.tensor([1.0, 2.0, 4.0], dtype=torch.float16), 4)
    got = scale_per_weight(rescaled(per_row, torch.tensor([0.5, 1.0, 2.0])))
    assert torch.equal(got, torch.tensor([[0.5] * 4, [2.0] * 4, [8.0] * 4]))
    per_tensor = IntegerWeight(codes, torch.tensor([2.0], dtype=torch.float16), 4, Granularity.PER_TENSOR)
    assert torch.equal(scale_per_weight(rescaled(per_tensor, torch.tensor([0.75, 9.0, 9.0]))), torch.full((3, 4), 1.5))


def test_a_layer_whose_refit_would_fit_worse_keeps_its_weights():
    net, own, x = _nets(2)
    own = copy.deepcopy(net)  # its inputs are the float ones: the float weight is already the best fit
    w = net[2].weight.clone()
    target = LayerGoal(w, None, None, None, None)
    fits = refit_layers(net, own, {"2": target}, x)
    assert fits["2"].after <= fits["2"].before + 1e-9
    assert torch.allclose(own[2].weight, w, atol=1e-3)
