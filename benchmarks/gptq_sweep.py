"""Time GPTQ's and SparseGPT's column sweep on ResNet-20's real layers, numpy against the torch loop it replaced.

The sweep (`modelopt.solvers.sweep`) is a dozen small operations per weight column; torch spends most of their time
dispatching. This script rounds every compressible layer of the bundled ResNet-20 by GPTQ at 4 bits per channel and
prunes it 2:4 by SparseGPT on the bundled calibration images, both ways, checks the codes are the same bits, and
prints the seconds each took (one thread).

    python benchmarks/gptq_sweep.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from modelopt.api import build_workload
from modelopt.compressors.prune.sparsegpt import obs_prune
from modelopt.compressors.quantize import Granularity, QuantSpec, Rounding, quantize
from modelopt.model.layer_inputs import input_hessians
from modelopt.model.layers import compressible_modules
from modelopt.solvers import gptq, sweep


def torch_sweep(wb, hb, keep, scales=None, qmin=0, qmax=0, pattern=None):
    """The torch loop `gptq_round` and `obs_prune` ran before `modelopt.solvers.sweep` (the reference:
    tests/benchmarks/test_gptq_sweep.py checks the numpy sweep gives its bits)."""
    codes, err = torch.zeros_like(wb), torch.zeros_like(wb)
    s = torch.ones_like(wb) if scales is None else scales
    d = torch.diagonal(hb, dim1=1, dim2=2)
    for j in range(wb.shape[2]):
        if pattern is not None and j % pattern[1] == 0:
            m = min(pattern[1], wb.shape[2] - j)
            drop = torch.argsort(wb[:, :, j : j + m] ** 2 / d[:, None, j : j + m] ** 2, dim=2, stable=True)
            keep[:, :, j : j + m].scatter_(2, drop[:, :, : m - pattern[0]], False)
        q = wb[:, :, j] if scales is None else torch.clamp(torch.round(wb[:, :, j] / s[:, :, j]), qmin, qmax)
        q = torch.where(keep[:, :, j], q, torch.zeros_like(q))
        codes[:, :, j] = q
        e = (wb[:, :, j] - q * s[:, :, j]) / hb[:, j, j, None]
        wb[:, :, j + 1 :] -= e[:, :, None] * hb[:, None, j, j + 1 :]
        err[:, :, j] = e
    return codes, err


def _run_all(layers, inputs, spec) -> list[torch.Tensor]:
    out = []
    for name, module in layers.items():
        w = module.weight.detach()
        out.extend(quantize(w, spec, inputs=inputs[name]))  # the clipping search's scales, GPTQ's codes
        out.extend(obs_prune(w, inputs[name], 0, pattern=(2, 4)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    wl = build_workload("cifar10_resnet20", "cifar10-exact-sample", device="cpu")
    layers = dict(compressible_modules(wl.model))
    inputs = input_hessians(wl.model, layers, wl.split("calib").x)
    spec = QuantSpec(bits=4, granularity=Granularity.PER_CHANNEL, rounding=Rounding.GPTQ)
    timings: dict[str, float] = {}
    results: dict[str, list[torch.Tensor]] = {}
    for label, fn in (("numpy", sweep.sweep_block), ("torch", torch_sweep)):
        gptq.sweep_block = fn  # type: ignore[attr-defined]  # both callers read it from their module
        import modelopt.compressors.prune.sparsegpt as sg
        sg.sweep_block = fn  # type: ignore[attr-defined]
        best = float("inf")
        for _ in range(args.repeat):
            t = time.perf_counter()
            results[label] = _run_all(layers, inputs, spec)
            best = min(best, time.perf_counter() - t)
        timings[label] = best
    same = all(torch.equal(a, b) for a, b in zip(results["numpy"], results["torch"], strict=True))
    print(f"{len(layers)} layers, GPTQ INT4 per channel + SparseGPT 2:4, best of {args.repeat}, 1 thread")
    print(f"numpy sweep {timings['numpy']:.2f} s   torch loop {timings['torch']:.2f} s   "
          f"speed-up {timings['torch'] / timings['numpy']:.2f}x   same bits: {same}")


if __name__ == "__main__":
    main()
