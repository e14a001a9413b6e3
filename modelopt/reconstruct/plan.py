"""A whole plan reconstructed on its own inputs: `reconstruct(evaluator, plan) -> Fitted`.

The search composes plans from weights compressed one layer at a time on the float model's inputs (GPTQ,
SparseGPT, the least-squares refit), cached per (layer, choice); the plans that go to confirmation are then
refitted here, once each, on what their own compressed layers feed each layer (OBC's split: a per-layer
database to compose from, reconstruction of the chosen plan; `own_inputs.py`). Each layer keeps the code range,
the mask and the kept channels the plan stores (`Realised.forms`), so its bytes do not change.
Calibration images only, never labels.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping

import torch

from modelopt.compressors.contract import install_input_quantizers
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.fitted import Fitted
from modelopt.model.layers import compressible_modules
from modelopt.plan.plan import Plan
from modelopt.reconstruct.own_inputs import Grid, LayerGoal, refit_layers

__all__ = ["IMAGES", "calibration_images", "reconstruct", "targets"]

# Calibration images a plan is refitted on by default (docs/reconstruction.md#measured: past 512, more images barely
# change the answers changed, and cost more seconds).
IMAGES = 512
# The calibration images and four activations (a unit's input and output in each network) are
# held at once: at most this many bytes of them.
HELD_BYTES = 1 << 30


def targets(evaluator: Evaluator, plan: Plan | Realised) -> dict[str, LayerGoal]:
    """Per layer the plan compresses, what `own_inputs.refit_layers` refits it to, from the forms it stores (as
    composed)."""
    r = evaluator.realise(plan)
    gone = r.skipped_layers  # a removed branch's layers reach nothing
    out: dict[str, LayerGoal] = {}
    for layer in evaluator.workload.layers:
        if layer.name in gone:
            continue
        steps = r.steps[layer.name]
        final = steps[-1].form
        rows, cols = r.slices.get(layer.name, (None, None))
        if final.integer is None and final.mask is None and rows is None and cols is None:
            continue  # float and whole: the float layer itself
        grid = None if final.integer is None else Grid(final.integer)
        keep = None if final.mask is None else final.mask.bool()
        # The bits its choices price its arithmetic at: a rate grid's codes sit in int8 but carry its rate.
        space = evaluator.space
        bits = min((space.compressors[space.decision(s.decision).compressor].precision(s.choice).weight
                    for s in steps if s.decision), default=None)
        out[layer.name] = LayerGoal(r.float_weight(layer.name, evaluator.workload.original), rows, cols, keep, grid,
                                    bits)
    return out


def calibration_images(evaluator: Evaluator, images: int) -> torch.Tensor:
    """The first `images` calibration images, prepared; fewer where the refit's activations would pass
    `HELD_BYTES`."""
    wl = evaluator.workload
    calib = wl.split(Split.CALIB).x
    with torch.inference_mode():
        widest = _widest_activation(wl.model, calib[:1])
    n = max(1, min(images, len(calib), HELD_BYTES // max(1, 4 * widest)))
    return calib[:n]


def _widest_activation(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the largest output of any module for one image."""
    widest = [4 * x[0].numel()]

    def hook(_: torch.nn.Module, __: object, out: object) -> None:
        if isinstance(out, torch.Tensor):
            widest[0] = max(widest[0], 4 * out[0].numel())

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return widest[0]


def reconstruct(evaluator: Evaluator, plan: Plan, images: int = IMAGES,
                progress: Callable[[str], None] | None = None, goals: Mapping[str, LayerGoal] | None = None) -> Fitted:
    """The plan's layers refitted in forward order on their own compressed inputs (`own_inputs.refit_layers`).

    Args:
        evaluator: Scores plans on the workload; its cached per-layer weights are where the refit starts.
        plan: The plan to reconstruct.
        images: Calibration images refitted on (fewer where they would not fit `HELD_BYTES`).
        progress: Told one line per refitted layer.
        goals: `targets(evaluator, plan)`, when the caller has them already.

    Returns:
        The refitted weights (full shape) and stored forms: `evaluator.realise(plan, fitted)` runs the plan so.

    Example:
        >>> plan = ev.space.parse_plan({"default": {"quantize": {"bits": 3}}})
        >>> fitted = reconstruct(ev, plan)
        >>> ev.evaluate(ev.realise(plan, fitted), split="confirm")   # what the plan scores and exports as
    """
    t0 = time.perf_counter()
    wl = evaluator.workload
    r = evaluator.realise(plan)
    goals = targets(evaluator, r) if goals is None else goals
    state = evaluator.state(r)
    with wl.state(r.reference):  # removed branches: the repaired float model is the reference
        float_model = copy.deepcopy(wl.model)
    with wl.state(state):
        model = copy.deepcopy(wl.model)
    qparams = evaluator.input_qparams(r)
    if qparams:  # the layers after an activation-quantized one see its quantized input
        install_input_quantizers(compressible_modules(model), qparams)
    x = calibration_images(evaluator, images)
    fits = refit_layers(float_model, model, goals, x, wl.batch_size, progress)
    mods = dict(model.named_modules())
    changed = {n: f for n, f in fits.items() if f.after < f.before}
    weights = {n: mods[n].get_parameter("weight").detach().clone() for n in changed}
    integers = {n: f.integer for n, f in changed.items() if f.integer is not None}
    errors = {n: (f.before, f.after) for n, f in fits.items()}
    return Fitted(plan.key, weights, integers, errors, int(x.shape[0]), time.perf_counter() - t0)
