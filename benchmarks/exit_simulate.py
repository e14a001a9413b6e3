"""The one-pass simulator of early exit (for benchmarks/early_exit.py): every sample's exit, hence accuracy,
retention, agreement and mean MACs.

Head logits at every candidate exit are computed once (`exit_table`); a policy (which exits are
active, one threshold each) is then scored without touching the backbone again. A sample leaves
at the first active exit, in backbone order, whose confidence (max softmax of logits /
temperature) is at least that exit's threshold; otherwise it runs the whole network: the plugin's
rule (`modelopt.compressors.early_exit.policy.first_confident`), which its evaluator applies to a
plan's own features and the deployable `EarlyExitNet` one sample at a time.

MACs counted per sample (docs/certification.md, Numbers: macs; Conv2d and Linear multiply-accumulates only, as
`modelopt.model.layers` counts them):

- leaving at active exit j: the backbone up to and including exit j's block, plus the heads of
  every active exit up to and including j (each was evaluated);
- not leaving: the full network (including its final linear layer), plus every active head.

`mean_macs` is the mean over the samples; `saving` = 1 - mean_macs / full-network MACs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from modelopt.compressors.early_exit.features import Features
from modelopt.compressors.early_exit.heads import ExitHead
from modelopt.compressors.early_exit.policy import ExitPolicy, first_confident
from modelopt.errors import ConfigError
from modelopt.model.backbone import Backbone

__all__ = ["NEVER", "ExitMetrics", "ExitTable", "assign_exits", "exit_table", "simulate"]

NEVER = float("inf")  # a threshold no confidence reaches: the exit is inactive


@dataclass(frozen=True, eq=False)
class ExitTable:
    """Everything a policy is scored on, for N samples and E candidate exits.

    Attributes:
        exits: Candidate exit names, in backbone order.
        head_pred: (E, N) top-1 of each head.
        confidence: (E, N) confidence of each head.
        head_macs: MACs of each head.
        point_macs: Backbone MACs up to and including each exit's block.
        full_pred: (N,) top-1 of the full model.
        labels: (N,) labels, or None.
        total_macs: MACs of the full network.
    """

    exits: tuple[str, ...]
    head_pred: torch.Tensor
    confidence: torch.Tensor
    head_macs: tuple[int, ...]
    point_macs: tuple[int, ...]
    full_pred: torch.Tensor
    labels: torch.Tensor | None
    total_macs: int

    def __len__(self) -> int:
        return int(self.full_pred.shape[0])


def exit_table(heads: Mapping[str, ExitHead], features: Features, backbone: Backbone) -> ExitTable:
    """Evaluates every head once on cached features.

    Args:
        heads: Fitted head per exit point name.
        features: One backbone pass over the samples (pooled with a superset of each head's grids).
        backbone: Gives the exit points' MACs.

    Example:
        >>> table = exit_table(heads, extract_features(bb, wl.split("val").x), bb)
    """
    exits = tuple(p.name for p in backbone.points if p.name in heads)
    preds, confs = [], []
    with torch.no_grad():
        for e in exits:
            head = heads[e]
            logits = head.logits_from_features(features.select(e, head.spec).float())
            preds.append(logits.argmax(1))
            confs.append(head.confidence(logits))
    return ExitTable(
        exits, torch.stack(preds), torch.stack(confs), tuple(heads[e].macs for e in exits),
        tuple(backbone.point(e).macs for e in exits), features.logits.argmax(1), features.labels,
        backbone.total_macs,
    )


@dataclass(frozen=True)
class ExitMetrics:
    """A policy's outcome on a set of samples (meanings: docs/certification.md, Numbers).

    Attributes:
        n: Samples.
        accuracy: Top-1 of the early-exit model (nan without labels).
        base_accuracy: Top-1 of the full model on the same samples.
        retention: accuracy / base_accuracy.
        agreement: Share whose prediction equals the full model's.
        mean_macs: Mean MACs per sample (see the module docstring).
        total_macs: MACs of the full network.
        exit_counts: Samples leaving at each active exit, then those that ran the whole network.
    """

    n: int
    accuracy: float
    base_accuracy: float
    retention: float
    agreement: float
    mean_macs: float
    total_macs: int
    exit_counts: tuple[int, ...]

    @property
    def saving(self) -> float:
        """1 - mean_macs / total_macs: the share of the full network's MACs saved."""
        return 1.0 - self.mean_macs / self.total_macs


def assign_exits(table: ExitTable, policy: ExitPolicy) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample: the position in `policy.exits` it leaves at (len(exits) = none), its prediction
    and its MACs (`first_confident` on the table's heads)."""
    rows = [table.exits.index(e) if e in table.exits else -1 for e in policy.exits]
    if -1 in rows:
        missing = [e for e, r in zip(policy.exits, rows, strict=True) if r < 0]
        raise ConfigError(f"policy names exits {missing} without heads; heads exist for {list(table.exits)}")
    if list(rows) != sorted(rows):
        raise ConfigError(f"policy exits must be in backbone order; got {list(policy.exits)}")
    exit_at, pred = first_confident([table.confidence[r] for r in rows], [table.head_pred[r] for r in rows],
                                    table.full_pred, policy.thresholds)
    head_cum = 0
    cum_macs = []
    for r in rows:
        head_cum += table.head_macs[r]
        cum_macs.append(table.point_macs[r] + head_cum)
    macs_of = torch.tensor([*cum_macs, table.total_macs + head_cum], dtype=torch.float64, device=exit_at.device)
    return exit_at, pred, macs_of[exit_at]


def simulate(table: ExitTable, policy: ExitPolicy) -> ExitMetrics:
    """Scores a policy on a table in one vectorised pass.

    Args:
        table: Head outputs on the samples (`exit_table`).
        policy: Active exits (a subset of the table's, in order) and their thresholds.

    Returns:
        Accuracy, retention, agreement, mean MACs and exit counts.

    Example:
        >>> m = simulate(table, ExitPolicy(("layer2.2", "layer3.0"), (0.95, 0.9)))
        >>> m.retention, m.saving
    """
    exit_at, pred, macs = assign_exits(table, policy)
    n = len(table)
    agreement = float((pred == table.full_pred).double().mean())
    if table.labels is not None:
        acc = float((pred == table.labels).double().mean())
        base = float((table.full_pred == table.labels).double().mean())
        retention = acc / base if base > 0 else float("nan")
    else:
        acc = base = retention = float("nan")
    counts = tuple(int(c) for c in torch.bincount(exit_at, minlength=len(policy.exits) + 1))
    return ExitMetrics(n, acc, base, retention, agreement, float(macs.mean()), table.total_macs, counts)
