"""GPTQ / OBQ's column sweep: codes chosen column by column with second-order error feedback.

Nearest rounding picks each weight's code alone. GPTQ (Frantar et al., 2023) picks them one input
column at a time and, after each column, spreads its rounding error over the columns not yet
quantized, weighted by the inverse of the layer's input second-moment matrix H = X^T X (X: the
layer's inputs on calibration images, one row per output position, one column per weight of a
channel). This minimises the layer's output error ||W X^T - Q X^T||^2 greedily instead of the
weight error ||W - Q||^2, which is what the next layer sees.

Scales are fixed before the codes (GPTQ's "static groups"): the same error-minimising scales as
nearest rounding, so a GPTQ layer stores exactly what a nearest one does (codes and one float16 scale
per unit) and the packed export decodes it the same way. A weight that is exactly zero (pruned) keeps
code 0; its neighbours absorb the error instead.

A layer-level solver (it reads only a weight, its scales and its inputs' second moments): the `quantize` plugin calls
it on the float model's inputs, SparseGPT (`prune`) for its masks, reconstruction (`modelopt.reconstruct`) on a plan's
own inputs.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Protocol

import torch

from modelopt.solvers.least_squares import RIDGE
from modelopt.solvers.sweep import sweep_block

__all__ = ["BLOCK", "SecondMoments", "gptq_round", "inverse_factor", "layer_factor"]

BLOCK = 128  # columns updated lazily together (GPTQ's block size; exact, only faster)


# The factors of the layers' second moments last computed, kept for the next choice of the same layer (every width and
# sparsity of a layer reads the same H; its factorisation was most of GPTQ's and SparseGPT's time at 224 pixels), up to
# this many bytes.
FACTOR_BYTES = 512 * 2**20
_factors: OrderedDict[tuple[int, float, str], tuple[weakref.ref[torch.Tensor], torch.Tensor, torch.Tensor]] = (
    OrderedDict())
_lock = threading.Lock()


class SecondMoments(Protocol):
    """A layer's input second moments as the sweep reads them (`modelopt.model.layer_inputs.LayerInputs`)."""

    @property
    def hessian(self) -> torch.Tensor:
        """H = sum of x x^T over calibration rows: (n, n), or (groups, n, n) for a grouped conv."""

    @property
    def groups(self) -> int:
        """How many input groups H is for."""


def inverse_factor(h: torch.Tensor, w: torch.Tensor, damping: float = RIDGE) -> torch.Tensor:
    """The upper Cholesky factor of the damped H^-1 per group (row i: the update direction for column i's error),
    from H (groups, n, n), changed in place (`damping`: the share of its mean diagonal added to its diagonal); the
    weights `w` (groups, rows, n) of inputs that are always zero (they do not matter) are set to zero."""
    diag = torch.diagonal(h, dim1=1, dim2=2)
    dead = diag == 0
    diag[dead] = 1.0
    w[dead[:, None, :].expand_as(w)] = 0.0
    diag += damping * diag.mean(dim=1, keepdim=True)
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


def layer_factor(inputs: SecondMoments, w: torch.Tensor, damping: float = RIDGE) -> torch.Tensor:
    """`inverse_factor` of `inputs`' second moments for the weights `w` (groups, rows, n; float64, changed in place as
    there), computed once per second-moment tensor and damping and reused while it is among the last few."""
    g, n = w.shape[0], w.shape[2]
    source = inputs.hessian
    key = (id(source), damping, str(w.device))
    with _lock:
        hit = _factors.get(key)
        if hit is not None and hit[0]() is source:
            _factors.move_to_end(key)
            _, hinv, dead = hit
            w[dead[:, None, :].expand_as(w)] = 0.0
            return hinv
    h = source.to(w.device, torch.float64).reshape(g, n, n).clone()
    dead = torch.diagonal(h, dim1=1, dim2=2) == 0
    hinv = inverse_factor(h, w, damping)
    with _lock:
        _factors[key] = (weakref.ref(source), hinv, dead)
        while sum(f[1].numel() * f[1].element_size() for f in _factors.values()) > FACTOR_BYTES and len(_factors) > 1:
            _factors.popitem(last=False)
    return hinv


def gptq_round(weight: torch.Tensor, scales: torch.Tensor | None, qmin: int, qmax: int, inputs: SecondMoments,
               damping: float = RIDGE, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Integer codes (float tensor, weight's shape) for `weight` with per-weight `scales` (same shape
    as the weight flattened per output channel), chosen by GPTQ on the inputs' second moments. A
    grouped conv's output channels are rounded group by group, each on its own group's inputs.

    `keep`: the weights that may be non-zero (the rest get code 0 and their neighbours absorb the error, as
    SparseGPT does); None: those that are not exactly zero. `scales` None: no rounding, only the mask (the
    float weights with the mask's error spread over the kept ones: the Optimal Brain Surgeon update)."""
    g = inputs.groups
    w = weight.detach().reshape(g, weight.shape[0] // g, -1).double().clone()
    s = None if scales is None else scales.double().reshape(w.shape)
    kept = w != 0 if keep is None else keep.reshape(w.shape).to(w.device, torch.bool)
    hinv = layer_factor(inputs, w, damping)
    codes = torch.zeros_like(w)
    n = w.shape[2]
    for b0 in range(0, n, BLOCK):
        b1 = min(b0 + BLOCK, n)
        codes[:, :, b0:b1], err = sweep_block(w[:, :, b0:b1].clone(), hinv[:, b0:b1, b0:b1], kept[:, :, b0:b1],
                                              None if s is None else s[:, :, b0:b1], qmin, qmax)
        w[:, :, b1:] -= err @ hinv[:, b0:b1, b1:]
    return codes.float().reshape(weight.shape)
