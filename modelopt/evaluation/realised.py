"""`Realised`: a plan applied to the model, as a value.

What a plan runs with depends on the plan and, once it is reconstructed, on its refitted weights (`Fitted`); on
nothing else. `Evaluator.realise(plan, fitted)` builds the record from the two, and every room that runs, prices,
exports or certifies a plan takes one: the scorer, the exporters, the latency engines, `modelopt.reconstruct` and
`modelopt.certify`. Its `key` names exactly what it is (the plan's key, and the refit's digest when there is one),
so the caches keyed by it never hold a stale answer and a plan scores the same whatever was scored before it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from modelopt.compressors.contract import Route, WeightForm
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.forms import Step
from modelopt.model.branches import Branch
from modelopt.model.channels import Removal
from modelopt.plan.plan import Plan

__all__ = ["Kept", "Realised", "Slices"]

Kept = dict[str, tuple[str, torch.Tensor]]  # {root layer: (decision, ascending kept output channels)}
Slices = dict[str, tuple[torch.Tensor | None, torch.Tensor | None]]  # {layer: (kept rows, kept columns)}


@dataclass(frozen=True, eq=False)
class Realised:
    """A plan as it runs on the workload's model.

    Attributes:
        plan: The plan.
        fitted: The reconstruction it runs with (`modelopt.reconstruct`); None: the plan as the search composed it.
        kept: Structured pruning's kept output channels, per root layer of a channel group.
        slices: Per layer structured pruning shrinks, (kept rows, kept columns) of its weight (None: all).
        removals: What structured pruning removes, module by module.
        skipped: The residual branches the plan removes, in model order.
        route: Where samples leave the forward pass (early exit); None: every sample runs the whole network.
        layer_keys: Per layer the plan changes, everything its compressed weight depends on (the key it is cached
            under); layers left float and whole are absent.
        weights: The weight each changed layer runs with, full shape (structurally removed channels zero): the
            refitted one where `fitted` has it.
        reference: The float tensors that stand in for removed branches (their repair), by state_dict name.
        steps: Per layer, its stored forms along its compressor chain (built on first read, then kept), the
            refitted weights last where the plan runs with them.

    Example:
        >>> r = ev.realise(plan)                 # as composed; ev.realise(plan, fitted): reconstructed
        >>> ev.evaluate(r, split="test").retention, r.forms["layer1.0.conv1"].integer.tag
    """

    plan: Plan
    fitted: Fitted | None
    kept: Kept
    slices: Slices
    removals: tuple[Removal, ...]
    skipped: tuple[Branch, ...]
    route: Route | None
    layer_keys: Mapping[str, tuple[Any, ...]]
    weights: Mapping[str, torch.Tensor]
    reference: Mapping[str, torch.Tensor]
    steps: Mapping[str, tuple[Step, ...]]

    @property
    def key(self) -> str:
        """What the record is: the plan's key, with the refit's digest when it runs reconstructed."""
        return self.plan.key if self.fitted is None else f"{self.plan.key}+fitted:{self.fitted.digest}"

    @property
    def forms(self) -> dict[str, WeightForm]:
        """Per layer, in model order: the form it is stored in, at the stored shape (the last of its `steps`)."""
        return {name: steps[-1].form for name, steps in self.steps.items()}

    @property
    def skipped_layers(self) -> frozenset[str]:
        """The compressible layers on the branches the plan removes: no engine runs them."""
        return frozenset(name for b in self.skipped for name in b.layers)

    def float_weight(self, layer: str, original: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """`layer`'s weight before compression: the float one (`original`), or the refit that stands in for a
        removed branch before it."""
        own = self.reference.get(f"{layer}.weight")
        return original[layer] if own is None else own
