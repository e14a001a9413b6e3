"""Each layer's weight as a plan stores it (`WeightForm`), built by the layer's own compressors.

Every writer starts here, so what is written is what the evaluator scored: the chain runs on the
same structurally kept slice, with the same calibration inputs, in the same order as
`Evaluator.compressed_weights`, each compressor adding its part through `Compressor.pack`.
"""

from __future__ import annotations

import torch

from modelopt.compressors._base import WeightForm
from modelopt.evaluator import Evaluator
from modelopt.plan import Plan


def layer_forms(evaluator: Evaluator, plan: Plan) -> dict[str, WeightForm]:
    """Per layer, in model order: its stored form at the stored shape (kept channels only).

    Example:
        >>> forms = layer_forms(ev, plan)
        >>> forms["layer1.0.conv1"].integer.tag
        '4/per_channel'
    """
    kept = evaluator.kept_channels(plan)
    producer = {x.channel_consumer: x.name for x in evaluator.workload.layers if x.channel_consumer}
    space = evaluator.space
    out: dict[str, WeightForm] = {}
    for layer in evaluator.workload.layers:
        own, prod = kept.get(layer.name), kept.get(producer.get(layer.name, ""))
        w = evaluator.workload.original[layer.name]
        if own is not None:
            w = w[own[1].to(w.device)]
        cols: torch.Tensor | None = None if prod is None else prod[1]
        if cols is not None:
            w = w[:, cols.to(w.device)]
        form = WeightForm(w)
        for d in space.decisions:
            choice = plan.get(d.name)
            # Slicing already applied the structured decision, as in the evaluator's chain.
            if d.layer != layer.name or choice is None or (own is not None and d.name == own[0]):
                continue
            comp = space.compressors[d.compressor]
            inputs = evaluator.layer_inputs(layer.name, n, cols) if (n := comp.input_images(choice)) else None
            form = comp.pack(form, choice, inputs)
        out[layer.name] = form
    return out


def stored_weight(form: WeightForm) -> torch.Tensor:
    """The float weight a form decodes to (codes times scales, else the float weight; zeros kept)."""
    return form.weight if form.integer is None else form.integer.dequantize().to(form.weight.dtype)
