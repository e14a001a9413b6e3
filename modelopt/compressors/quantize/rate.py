"""Rate grids (`RateSpec`): a uniform grid without clipping whose step is set for the codes' entropy, not their width.

Once codes are entropy coded a code costs its information, not a fixed `bits`. Rate-distortion theory then favours
a uniform grid that clips nothing, its step chosen so the codes carry the target rate, over a clipped fixed-rate
grid at the same bytes (measured: benchmarks/rate_grid_probe.py).

Each output channel's step is `c` times the channel's RMS, one `c` per layer, found by bisection on log `c` so that
the order-0 entropy of the layer's nearest-rounded codes is the rate. A step is never below max|w| / 127, so no
weight is clipped by the int8 container; that floor also makes the entropy fall monotonically as `c` grows, which
bisection needs (a grid finer than that clips the tails into two big bins, and the entropy falls again). Steps are
rounded to float16 before the codes are computed, as the INT-b path does, so what is stored dequantizes exactly.
"""

from __future__ import annotations

import torch

from modelopt.compressors._packing import SCALE_DTYPE, to_scale_dtype
from modelopt.compressors.quantize.gptq import Rounding, gptq_round
from modelopt.compressors.quantize.spec import RateSpec
from modelopt.model.layer_inputs import LayerInputs

__all__ = ["QMAX", "code_entropy", "quantize_rate", "rate_scales"]

QMAX = 127  # symmetric int8 codes: [-127, 127]
# Bisection bounds on c (the step in channel RMSs) and its iterations: 2^-12 RMS is finer than the floor max|w|/127
# for any channel, 2^6 RMS rounds every weight of a layer to 0; 30 halvings of that range leave c within 1e-8.
_LOG2_C = (-12.0, 6.0)
_ITERATIONS = 30


def code_entropy(codes: torch.Tensor) -> float:
    """Order-0 empirical entropy of integer `codes`, in bits per code (what an ideal coder of their histogram spends).

    Example:
        >>> code_entropy(torch.tensor([0, 0, 1, -1]))
        1.5
    """
    flat = codes.reshape(-1).to(torch.int64)
    if flat.numel() == 0:
        return 0.0
    counts = torch.bincount(flat - flat.min()).double()
    p = counts[counts > 0] / flat.numel()
    return float(-(p * p.log2()).sum())


def _rows(weight: torch.Tensor) -> torch.Tensor:
    return weight.detach().float().reshape(weight.shape[0], -1)


def _steps(rows: torch.Tensor, log2_c: float) -> torch.Tensor:
    """Each channel's stored (float16-rounded) step for the layer constant c = 2^log2_c."""
    rms = rows.pow(2).mean(dim=1).sqrt()
    rms = torch.where(rms > 0, rms, torch.ones_like(rms))  # a zero channel: any step gives code 0
    floor = rows.abs().amax(dim=1) / QMAX
    return to_scale_dtype(torch.maximum((2.0**log2_c) * rms, floor))


def _nearest(rows: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.round(rows / steps.unsqueeze(1)), -QMAX, QMAX)


def rate_scales(weight: torch.Tensor, rate: float) -> torch.Tensor:
    """Per-output-channel float16 steps whose nearest-rounded codes have an order-0 entropy of `rate` bits a weight.

    Where the layer cannot reach `rate` (a rate above what its finest unclipped grid carries, or a layer of a few
    weights), the steps are those that come closest.

    Example:
        >>> scales = rate_scales(torch.randn(64, 576), 3.0)  # one float16 step per output channel
    """
    rows = _rows(weight)
    lo, hi = _LOG2_C  # entropy(lo) >= rate >= entropy(hi): a larger c, a coarser grid, fewer bits
    for _ in range(_ITERATIONS):
        mid = 0.5 * (lo + hi)
        if code_entropy(_nearest(rows, _steps(rows, mid))) > rate:
            lo = mid
        else:
            hi = mid
    # Of the bracket's two ends, the one whose entropy is nearer the rate (the entropy moves in steps).
    ends = [(abs(code_entropy(_nearest(rows, _steps(rows, c))) - rate), c) for c in (lo, hi)]
    return _steps(rows, min(ends)[1]).to(SCALE_DTYPE)


def quantize_rate(weight: torch.Tensor, spec: RateSpec, inputs: LayerInputs | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Int8 codes (the weight's shape) and float16 per-channel scales of `weight` on `spec`'s rate grid.

    `inputs`: the layer's calibration inputs; with them a GPTQ spec picks its codes by GPTQ on the same steps
    (its error feedback moves the codes' entropy a little off the rate). Without them codes are rounded to nearest.
    """
    scales = rate_scales(weight, spec.rate)
    rows = _rows(weight)
    if spec.rounding is Rounding.GPTQ and inputs is not None:
        per_weight = scales.float().reshape(-1, 1).expand(rows.shape)
        codes = gptq_round(weight, per_weight, -QMAX, QMAX, inputs)
    else:
        codes = _nearest(rows, scales.float())
    return codes.reshape(weight.shape).to(torch.int8), scales

