"""Choosing which exits to use and their thresholds on the val split (for benchmarks/early_exit.py): the
most MACs saved under a retention floor.

The search is a Lagrangian relaxation solved by coordinate ascent. For a price `lam` on lost
accuracy it maximises  saving - lam * (1 - retention)  one exit at a time: with the other
thresholds fixed, every threshold of exit j (off, or just below each val confidence) is scored
at once from cumulative sums over the samples that reach j, sorted by confidence; rounds repeat
until nothing changes. Sweeping `lam` over a log grid gives a set of policies; the one that saves
the most while keeping the floor on the val samples is returned (the price is then bisected
between that grid point and the next, infeasible one). Thresholds sit half-way between
consecutive val confidences, so a sample's decision does not hinge on rounding.

`count_gains=False` makes the floor conservative: a sample the full model got wrong and an
exit gets right does not offset a lost one (on a few hundred val images such lucky fixes do
not carry over to new images).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from exit_simulate import NEVER, ExitTable, assign_exits  # this folder's sibling: the one-pass simulator

from modelopt.compressors.early_exit.policy import ExitPolicy
from modelopt.errors import ConfigError

__all__ = ["ChooserConfig", "choose_thresholds"]


@dataclass(frozen=True)
class ChooserConfig:
    """How thresholds are chosen.

    Attributes:
        floor: Minimum retention (accuracy / full model's) on the samples chosen on.
        count_gains: Whether samples fixed by an exit offset lost ones (plain retention) or not.
        lambdas: Number of prices on lost accuracy tried (log grid from 1e-2 to 1e3).
        rounds: Maximum coordinate-ascent rounds per price.
        bisect: Bisection steps on the price between a feasible and an infeasible grid point.
        agreement: Hold the floor on agreement with the full model instead of retention: every
            changed prediction counts, so the choice rests on about twice as many events.
        head_cost: Extra cost of evaluating one head, as a share of the full network's MACs, used
            only while choosing (reported MACs stay MACs): a head's pooling and launch overheads
            cost wall time that its multiply-accumulates do not show.
    """

    floor: float = 0.99
    count_gains: bool = True
    lambdas: int = 41
    rounds: int = 6
    bisect: int = 8
    agreement: bool = False
    head_cost: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 < self.floor <= 1.0 or self.lambdas < 1 or self.rounds < 1:
            raise ConfigError(f"chooser needs 0 < floor <= 1, lambdas >= 1, rounds >= 1; got {self}")


def _score(table: ExitTable, th: list[float], lam: float, correct_ref: torch.Tensor, count_gains: bool,
           base_correct: int) -> float:
    _, pred, macs = assign_exits(table, ExitPolicy(table.exits, tuple(th)))
    saving = 1.0 - float(macs.mean()) / table.total_macs
    return saving - lam * _loss(pred, table, correct_ref, count_gains) / base_correct


def _loss(pred: torch.Tensor, table: ExitTable, correct_ref: torch.Tensor, count_gains: bool) -> float:
    ok = pred == correct_ref
    base = table.full_pred == correct_ref
    if count_gains:
        return float(base.sum() - ok.sum())
    return float((base & ~ok).sum())


def _best_threshold(table: ExitTable, th: list[float], j: int, lam: float, correct_ref: torch.Tensor,
                    count_gains: bool, base_correct: int) -> float:
    """The threshold of exit j maximising the objective with the others fixed."""
    n = len(table)
    off = list(th)
    off[j] = NEVER
    _, pred_off, macs_off = assign_exits(table, ExitPolicy(table.exits, tuple(off)))
    # Which samples reach exit j: none of the active exits before it fired.
    reach = torch.ones(n, dtype=torch.bool)
    head_before = 0
    for i in range(j):
        if th[i] <= 1.0:
            reach &= table.confidence[i] < th[i]
            head_before += table.head_macs[i]
    hj = table.head_macs[j]
    macs_exit = table.point_macs[j] + head_before + hj
    base_ok = table.full_pred == correct_ref
    ok_off = pred_off == correct_ref
    ok_exit = table.head_pred[j] == correct_ref

    def lost(ok: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
        gained = (~base & ok).double() if count_gains else torch.zeros(len(ok), dtype=torch.float64)
        return (base & ~ok).double() - gained

    idx = torch.nonzero(reach).squeeze(1)
    conf = table.confidence[j][idx]
    order = torch.argsort(conf, descending=True)
    idx, conf = idx[order], conf[order]
    # Objective change vs exit j off, if exactly the top-m reaching samples leave at j (m = 0..len):
    # every reaching sample pays head j; the top m swap their later fate for exit j's.
    d_macs = (macs_exit - (macs_off[idx] + hj)).cumsum(0)
    d_lost = (lost(ok_exit[idx], base_ok[idx]) - lost(ok_off[idx], base_ok[idx])).cumsum(0)
    total = float(table.total_macs) * n
    gain = torch.cat([torch.zeros(1, dtype=torch.float64), -d_macs / total]) - hj * len(idx) / total
    gain -= lam * torch.cat([torch.zeros(1, dtype=torch.float64), d_lost]) / base_correct
    # Only cuts between distinct confidences are realisable.
    valid = torch.ones(len(idx) + 1, dtype=torch.bool)
    if len(idx) > 1:
        valid[1:-1] = conf[:-1] > conf[1:]
    gain[~valid] = -math.inf
    m = int(torch.argmax(gain))
    if len(idx) == 0 or gain[m] <= 1e-12:
        return NEVER
    if m == 0:
        # Head active, nobody leaves: never better than off (it only adds head MACs).
        return NEVER
    lower = float(conf[m]) if m < len(idx) else 0.0
    return (float(conf[m - 1]) + lower) / 2


def _ascend(table: ExitTable, ref: torch.Tensor, lam: float, config: ChooserConfig) -> list[float]:
    """Coordinate ascent on  saving - lam * loss / (samples ref gets right)  from all exits off."""
    base_correct = max(1, int((table.full_pred == ref).sum()))
    th = [NEVER] * len(table.exits)
    for _ in range(config.rounds):
        changed = False
        for j in range(len(table.exits)):
            t = _best_threshold(table, th, j, lam, ref, config.count_gains, base_correct)
            if t != th[j]:
                new = [*th[:j], t, *th[j + 1 :]]
                if _score(table, new, lam, ref, config.count_gains, base_correct) > _score(
                    table, th, lam, ref, config.count_gains, base_correct
                ) + 1e-12:
                    th, changed = new, True
        if not changed:
            break
    return th


def _prices(config: ChooserConfig) -> list[float]:
    lo, hi = math.log(1e-2), math.log(1e3)
    return [math.exp(hi - (hi - lo) * k / max(1, config.lambdas - 1)) for k in range(config.lambdas)]


def _pick(
    fit_on: ExitTable, ref: torch.Tensor, judge: ExitTable, judge_ref: torch.Tensor, config: ChooserConfig
) -> ExitPolicy:
    """Walks the price path fitted on `fit_on` (losses counted against `ref`); returns the policy saving most
    on `judge` within the floor, after bisecting the price between the last feasible and the next infeasible one."""
    base_correct = max(1, int((judge.full_pred == judge_ref).sum()))
    allowed = (1.0 - config.floor) * base_correct + 1e-9

    def judged(lam: float) -> tuple[bool, float, ExitPolicy]:
        policy = ExitPolicy(fit_on.exits, tuple(_ascend(fit_on, ref, lam, config)))
        _, pred, macs = assign_exits(judge, policy)
        ok = _loss(pred, judge, judge_ref, config.count_gains) <= allowed
        return ok, 1.0 - float(macs.mean()) / judge.total_macs, policy

    best = (0.0, ExitPolicy(judge.exits, tuple(NEVER for _ in judge.exits)))
    prices = _prices(config)
    results = [judged(lam) for lam in prices]
    for ok, saving, policy in results:
        if ok and saving > best[0]:
            best = (saving, policy)
    # The path is coarse: between a feasible price and the next (cheaper) infeasible one, bisect.
    for k in range(len(prices) - 1):
        if results[k][0] and not results[k + 1][0]:
            hi, lo = math.log(prices[k]), math.log(prices[k + 1])
            for _ in range(config.bisect):
                mid = (hi + lo) / 2
                ok, saving, policy = judged(math.exp(mid))
                if ok:
                    hi = mid
                    if saving > best[0]:
                        best = (saving, policy)
                else:
                    lo = mid
    return best[1]


def choose_thresholds(
    table: ExitTable, config: ChooserConfig = ChooserConfig(), shape: ExitTable | None = None
) -> ExitPolicy:
    """Per-exit thresholds saving the most MACs on `table`'s samples (val) under a retention floor.

    Without `shape`, every exit's threshold is fitted on `table` itself (a few hundred val images
    leave many degrees of freedom to chance). With `shape`, a large label-free held-out set, the
    per-exit thresholds along the price path are fitted there against the full model's
    predictions, and only the point on that path (one number) is chosen on `table`.

    Args:
        table: Head outputs on the val split, with labels (`exit_table`).
        config: Floor and search settings.
        shape: Optional head outputs on held-out images (no labels needed).

    Returns:
        The policy over the exits that fire (possibly none: then the full model is kept).

    Raises:
        ConfigError: The table has no labels.

    Example:
        >>> policy = choose_thresholds(exit_table(heads, val_features, bb), ChooserConfig(floor=0.99))
        >>> simulate(test_table, policy).retention
    """
    if table.labels is None:
        raise ConfigError("choosing thresholds under a retention floor needs labelled val samples")
    judge_ref = table.full_pred if config.agreement else table.labels
    extra = round(config.head_cost * table.total_macs)
    judge, shape = _with_head_cost(table, extra), None if shape is None else _with_head_cost(shape, extra)
    if shape is None:
        return _pick(judge, judge_ref, judge, judge_ref, config).active()
    return _pick(shape, shape.full_pred, judge, judge_ref, config).active()  # label-free: against the model


def _with_head_cost(table: ExitTable, extra: int) -> ExitTable:
    if not extra:
        return table
    return dataclasses.replace(table, head_macs=tuple(h + extra for h in table.head_macs))
