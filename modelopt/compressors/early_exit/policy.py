"""A plan's exits (`ExitPolicy`: which are active, one threshold each) and the rule that applies them.

A sample leaves at the first active exit, in backbone order, whose confidence (max softmax of
logits / temperature) is at least that exit's threshold; otherwise it runs the whole network.
The evaluator (`runtime.decide`) and the deployable `EarlyExitNet` apply this same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from modelopt.errors import ConfigError

__all__ = ["ExitPolicy", "first_confident"]


@dataclass(frozen=True)
class ExitPolicy:
    """Which exits are active and the confidence each needs; hashable, so caches can key on it.

    Attributes:
        exits: Exit point names, in backbone order.
        thresholds: One confidence threshold per exit, in (0, 1]; `inf` keeps an exit off.
    """

    exits: tuple[str, ...]
    thresholds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.exits) != len(self.thresholds):
            raise ConfigError(f"policy has {len(self.exits)} exits but {len(self.thresholds)} thresholds")

    def active(self) -> ExitPolicy:
        """The same policy without the exits that can never fire."""
        keep = [(e, t) for e, t in zip(self.exits, self.thresholds, strict=True) if t <= 1.0]
        return ExitPolicy(tuple(e for e, _ in keep), tuple(t for _, t in keep))


def first_confident(confidence: Sequence[torch.Tensor], head_pred: Sequence[torch.Tensor], full_pred: torch.Tensor,
                    thresholds: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """The exit rule: each sample leaves at the first active exit, in order, whose confidence reaches
    its threshold, with that head's prediction; otherwise it runs the whole network.

    Args:
        confidence: Per active exit, in backbone order, each sample's confidence there.
        head_pred: Per active exit, each sample's top-1 there.
        full_pred: Each sample's top-1 from the whole network.
        thresholds: Per active exit, the confidence a sample needs to leave.

    Returns:
        Per sample, the position of the exit it left at (len(thresholds): none), and its prediction.
    """
    n, k = full_pred.shape[0], len(thresholds)
    exit_at = torch.full((n,), k, dtype=torch.long, device=full_pred.device)
    pred = full_pred.clone()
    left = torch.ones(n, dtype=torch.bool, device=full_pred.device)
    for j, (conf, hp, thr) in enumerate(zip(confidence, head_pred, thresholds, strict=True)):
        fire = left & (conf >= thr)
        exit_at[fire] = j
        pred = torch.where(fire, hp, pred)
        left &= ~fire
    return exit_at, pred
