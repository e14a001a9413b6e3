"""Each layer's weight as a plan stores it (`WeightForm`), built by the layer's own compressors.

Every writer starts here, so what is written is what the evaluator scored: the chain runs on the
same structurally kept slice, with the same calibration inputs, in the same order as
`Evaluator.compressed_weights`, each compressor adding its part through `Compressor.pack`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modelopt.compressors.contract import Choice, WeightForm
from modelopt.evaluation.evaluator import Evaluator
from modelopt.plan.plan import Plan


@dataclass(frozen=True)
class Step:
    """The layer's form after one compressor of its chain ran (``decision`` "" : the start)."""

    decision: str
    choice: Choice
    form: WeightForm


def layer_steps(evaluator: Evaluator, plan: Plan, layer: str) -> list[Step]:
    """The layer's forms along its chain: first its float weight at the stored shape (the kept
    channels only, refitted where the plan repairs: `CompressedStates.sliced`), then after each compressor whose
    choice is not None, and last, for a reconstructed plan (`Evaluator.adopt`), the weights it was refitted to
    (same codes' grid, mask and shape; decision "reconstructed")."""
    rows, cols = evaluator.states.kept_slices(plan).get(layer, (None, None))
    key = evaluator.states.layer_keys(plan).get(layer)
    cached = None if key is None else evaluator.states.forms.get(key)
    steps = list(cached) if cached is not None else _chain(evaluator, plan, layer, (rows, cols))
    if key is not None and cached is None:  # the same choices on the same slice give the same forms: built once
        evaluator.states.forms[key] = tuple(steps)
    fitted = evaluator.states.fitted(plan)
    if fitted is not None and layer in fitted.weights:  # reconstructed: the weights the plan was certified with
        w = fitted.weights[layer]
        w = w if rows is None else w[rows.to(w.device)]
        w = w if cols is None else w[:, cols.to(w.device)]
        last = steps[-1]
        form = WeightForm(w.to(last.form.weight.dtype), last.form.mask, fitted.integers.get(layer))
        steps.append(Step("reconstructed", last.choice, form))
    return steps


def _chain(evaluator: Evaluator, plan: Plan, layer: str, kept: tuple[torch.Tensor | None, torch.Tensor | None]
           ) -> list[Step]:
    """The layer's forms along its chain of compressors (`layer_steps` before any reconstruction)."""
    own = evaluator.states.kept_channels(plan).get(layer)
    steps = [Step("", None, WeightForm(evaluator.states.sliced(layer, plan)))]
    space = evaluator.space
    for d in space.decisions:
        choice = plan.get(d.name)
        # Slicing already applied the structured decision, as in the evaluator's chain.
        if d.layer != layer or choice is None or (own is not None and d.name == own[0]):
            continue
        comp = space.compressors[d.compressor]
        n = comp.calibration(choice).layer_inputs
        inputs = evaluator.states.layer_inputs(layer, n, kept) if n else None
        steps.append(Step(d.name, choice, comp.pack(steps[-1].form, choice, inputs)))
    return steps


def layer_forms(evaluator: Evaluator, plan: Plan) -> dict[str, WeightForm]:
    """Per layer, in model order: its stored form, at the stored shape.

    Example:
        >>> forms = layer_forms(ev, plan)
        >>> forms["layer1.0.conv1"].integer.tag
        '4/per_channel'
    """
    return {x.name: layer_steps(evaluator, plan, x.name)[-1].form for x in evaluator.workload.layers}
