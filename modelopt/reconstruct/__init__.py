"""The chosen plans refitted on their own compressed inputs, so that what is certified changes fewer answers.

- `plan.py`: `reconstruct(evaluator, plan) -> Fitted`, the one entry: each layer's target from the form the plan
  stores (its code range, mask and kept channels), the refit, the refitted weights a plan runs with
  (`Evaluator.realise(plan, fitted)`).
- `own_inputs.py`: each layer, in forward order, refitted on what the compressed network feeds it against the
  float layer's output (least squares, then GPTQ's codes on the plan's grid with each row's scales re-chosen).
- `store.py`: a run folder's reconstructions, fitted once and read back by export, evaluate and resume.
"""

from modelopt.reconstruct.plan import IMAGES, reconstruct

__all__ = ["IMAGES", "reconstruct"]
