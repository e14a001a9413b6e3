"""One-pass sensitivities: each choice's loss increase estimated from gradients on calibration images.

What HAWQ and NVIDIA Model Optimizer's `auto_quantize` use instead of one evaluation per (layer,
choice): a second-order Taylor estimate of the loss a choice adds,

    loss(W + dW) - loss(W) ~ 1/2 * sum_i F_ii * dW_i^2,

with F the Fisher (the mean squared gradient of the cross-entropy loss against the float model's own
top-1 answer, an estimate of the loss Hessian's diagonal at a trained model that needs no labels)
measured in one forward and backward pass over calibration images, and dW the weight change the
choice makes. One pass prices every choice.

Choices that change no weight (an early exit) get no estimate; the knapsack measures those.
"""

from __future__ import annotations

import math
import time

import torch
from torch.nn import functional as F

from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator

DEFAULT_IMAGES = 256
BATCH = 8  # images per gradient: the squared batch gradient / BATCH estimates the per-image Fisher
BACKWARD_FACTOR = 3.0  # a forward and backward pass costs about three forward passes


def fisher_diagonals(evaluator: Evaluator, images: int = DEFAULT_IMAGES) -> dict[str, torch.Tensor]:
    """Per compressible layer, the empirical Fisher diagonal of its weight over `images` calib images."""
    wl = evaluator.workload
    data = wl.split(Split.CALIB)
    # The float model's own answers stand for labels: calib images need none (they may be unlabeled).
    x, y = data.x[:images], data.base_pred[:images]
    weights = {n: m.get_parameter("weight") for n, m in wl.modules.items()}
    fisher = {n: torch.zeros_like(w, dtype=torch.float32) for n, w in weights.items()}
    with wl.weights(wl.original):
        for w in weights.values():
            w.requires_grad_(True)
        try:
            for i in range(0, x.shape[0], BATCH):
                loss = F.cross_entropy(wl.model(x[i : i + BATCH]), y[i : i + BATCH], reduction="sum")
                grads = torch.autograd.grad(loss, list(weights.values()))
                for (name, _), g in zip(weights.items(), grads, strict=True):
                    fisher[name] += g.float() ** 2
        finally:
            for w in weights.values():
                w.requires_grad_(False)
    n = max(1, x.shape[0])
    return {name: f / n for name, f in fisher.items()}


def estimate_losses(evaluator: Evaluator, images: int = DEFAULT_IMAGES) -> dict[tuple[str, int], float]:
    """{(decision, choice index): estimated loss increase per image (nats)} for every choice that
    changes its layer's weight, from one gradient pass; charges that pass once to the run's budget
    (images x BACKWARD_FACTOR / len(val), with the first plan scored after it)."""
    space = evaluator.space
    t0 = time.perf_counter()
    fisher = fisher_diagonals(evaluator, images)
    n = min(images, len(evaluator.workload.split(Split.CALIB)))
    evaluator.states.add_pre_pass(f"fisher:{n}", n * BACKWARD_FACTOR / len(evaluator.workload.split(Split.VAL)))
    out: dict[tuple[str, int], float] = {}
    for d in space.decisions:
        w = evaluator.workload.original[d.layer]
        for j, c in enumerate(d.choices):
            if c is None:
                continue
            try:
                q = evaluator.states.compressed_weights(space.plan({d.name: c})).get(d.layer, w)
            except Exception:  # noqa: BLE001 - a choice that crashes is as bad as it gets
                out[(d.name, j)] = math.inf
                continue
            dw = (q.float() - w.float()) ** 2
            if not bool(dw.any()):
                continue  # no weight change (e.g. an exit): the knapsack measures it
            est = 0.5 * float((fisher[d.layer] * dw).sum())
            out[(d.name, j)] = est if math.isfinite(est) else math.inf
    evaluator.one_time.timed(f"fisher:{n}", time.perf_counter() - t0)
    return out
