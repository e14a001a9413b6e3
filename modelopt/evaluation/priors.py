"""Measured priors: each choice's error, replacing the search space's data-free estimates.

Strategies read `SearchSpace.features` before any trial; `measure_errors` fills their `error`
with what the choices really do to each layer, and early exit's priors with what its heads do
on the float model (`PlanRoutes.priors`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from modelopt.compressors.contract import Storage
from modelopt.evaluation.coded import coded_bytes
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.plan import Plan

__all__ = ["measure_errors"]


def measure_errors(evaluator: Evaluator) -> None:
    """Replaces the space's estimated per-choice errors by measured ones: each choice's relative
    error on the layer's output, |(Q - W) X|^2 / |W X|^2 over calib inputs X, when the space has
    calibrated choices (their inputs are measured anyway); else the weight's, |Q - W|^2 / |W|^2.

    Every choice's tensors (clipping search, GPTQ) are computed here, once, and charged as
    `choice_tensors`; the layer-input pass inside is timed apart and charged with the first plan
    that needs it.
    """
    states = evaluator.states
    space, workload, one_time = states.space, states.workload, states.one_time
    t0 = time.perf_counter()
    images = max((n for d in space.decisions for c in d.choices
                  if (n := space.compressors[d.compressor].calibration(c).layer_inputs)), default=0)
    for d in space.decisions:
        layer = d.layer
        w = workload.original[layer].float()
        inputs = states.layers.layer_inputs(layer, images) if images else None
        h = None if inputs is None else inputs.hessian.to(w.device, torch.float32)

        def energy(e: torch.Tensor, h: torch.Tensor | None = h) -> float:
            e = e.reshape(e.shape[0], -1)
            if h is not None and h.dim() == 3:  # a grouped conv: each group's rows against its own inputs
                e = e.reshape(h.shape[0], -1, h.shape[-1])
            return float((e**2).sum()) if h is None else float(((e @ h) * e).sum())

        norm = energy(w) or 1.0
        feats = []
        for c, f in zip(d.choices, space.features[d.name], strict=True):
            if c is None:
                feats.append(dataclasses.replace(f, error=0.0))
                continue
            plan = space.plan({d.name: c})
            try:
                q = states.compressed_weights(plan)[layer].float()
            except Exception:  # noqa: BLE001 - a choice that crashes is a broken choice; trials record why
                feats.append(dataclasses.replace(f, error=1.0))
                continue
            err = energy(q - w) / norm
            saved = _measure_rate(evaluator, d.name, c, plan)
            # A choice that breaks the weight (non-finite) is as bad as losing it entirely.
            feats.append(dataclasses.replace(f, error=err if math.isfinite(err) else 1.0, bytes=f.bytes - saved))
        space.features[d.name] = tuple(feats)
    one_time.timed("choice_tensors", time.perf_counter() - t0 - sum(
        s for k, s in one_time.seconds.items() if k.startswith("layer_inputs:")))
    evaluator.routes.priors()


def _measure_rate(evaluator: Evaluator, decision: str, choice: object, plan: Plan) -> int:
    """The bits a stored value of the layer takes once coded under `choice` alone (dense integer codes only),
    for the cost model to price plans it has not built (`SearchSpace.value_rates`); returns the bytes coding
    saves on the choice's fixed-rate price (0 where nothing was measured)."""
    space = evaluator.space
    d = space.decision(decision)
    layer = space.layers[d.layer]
    storage = space.compressors[d.compressor].stored(layer, choice, Storage(layer.weight_shape))
    coded = coded_bytes(evaluator.states.layers, plan).get(d.layer)
    if coded is not None and storage.value_bits < 32 and storage.kept is None and storage.numel:
        space.value_rates[(decision, choice)] = coded * 8 / storage.numel
        return storage.bytes - dataclasses.replace(storage, coded=coded).bytes
    return 0
