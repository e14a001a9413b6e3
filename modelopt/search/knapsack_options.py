"""The knapsack's model of the objective: per layer, its options, what each costs and what each is expected to lose.

A layer's option is one combination of its decisions' choices (decisions on the same layer are solved jointly),
priced by the one cost accounting (`modelopt.evaluation.cost`) as the evaluator stores the weight, or by the latency
model's estimates; its loss is the sum of its choices' measured or estimated losses. `solve(L)` is the cheapest plan
whose losses add up to at most L, exactly, by dynamic programming over a discretised loss axis
(`modelopt.search.mckp`). The strategy that searches over L is `modelopt.search.knapsack`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from modelopt.evaluation.cost import CostModel
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Decision, Plan
from modelopt.plan.space import SearchSpace
from modelopt.search.mckp import solve_mckp

__all__ = ["LayerOptions"]


class LayerOptions:
    """Each layer's options, their costs and their losses, and the knapsack over them.

    Example:
        >>> options = LayerOptions(space, Objective("size", 0.99), bins=2000)
        >>> options.loss[(0, 1)] = 0.004      # decision 0's choice 1 loses 0.4 % alone
        >>> options.forget(); options.solve(0.01)
    """

    def __init__(self, space: SearchSpace, objective: Objective, bins: int) -> None:
        self.space, self.objective, self.bins = space, objective, bins
        self._costs = CostModel(space)
        self.loss: dict[tuple[int, int], float] = {}  # (decision, choice) -> its loss; inf: its trial failed
        self._groups = self._build_groups()
        self._memo: dict[float, tuple[int, ...]] = {}  # L -> DP picks; both caches die with new losses (`forget`)
        self._olosses: list[np.ndarray] | None = None

    def costs_changed(self) -> None:
        """The costs moved (the latency model was refitted): price every option again."""
        self._groups = self._build_groups()
        self.forget()

    def _build_groups(self) -> list[tuple[list[int], list[tuple[int, ...]], np.ndarray]]:
        """Per layer: decision indices, option combinations, option costs."""
        by_key: dict[str, list[int]] = {}
        for i, d in enumerate(self.space.decisions):
            by_key.setdefault(d.layer, []).append(i)
        groups = []
        for idx in by_key.values():
            decs = [self.space.decisions[i] for i in idx]
            options = list(itertools.product(*(range(len(d.choices)) for d in decs)))
            costs = np.array([self._cost(decs, opt) for opt in options], dtype=float)
            groups.append((idx, options, costs))
        return groups

    def _cost(self, decs: list[Decision], opt: tuple[int, ...]) -> float:
        # Priced by the one cost accounting (modelopt.evaluation.cost), the layer alone: what its option
        # stores (the whole chain: pruned then quantized) and runs (structured pruning's MACs).
        choices = {d.name: d.choices[j] for d, j in zip(decs, opt, strict=True)}
        if self.objective.target is Target.LATENCY:  # the latency model's estimates (modelopt.latency.cost_model)
            est = [self.space.features[d.name][j].latency for d, j in zip(decs, opt, strict=True)]
            if all(math.isfinite(e) for e in est):
                return float(sum(est))
        cost = self._costs.choice_cost(self.space.layers[decs[0].layer], choices)
        if self.objective.target is Target.BITOPS:
            return float(cost.bitops)
        if self.objective.target is Target.MACS:
            return float(cost.macs)
        return float(cost.bytes)

    def option_losses(self) -> list[np.ndarray]:
        """Per group, each option's loss: the sum of its choices' (unmeasured counts as infinite)."""
        if self._olosses is not None:
            return self._olosses
        out = []
        for idx, options, _ in self._groups:
            per = [[0.0 if self.space.decisions[i].choices[j] is None else self.loss.get((i, j), math.inf)
                    for j in range(len(self.space.decisions[i].choices))] for i in idx]
            out.append(np.array([sum(per[k][j] for k, j in enumerate(opt)) for opt in options], dtype=float))
        self._olosses = out
        return out

    def forget(self) -> None:
        self._memo.clear()
        self._olosses = None

    def top(self) -> float:
        """Above this L every measured option fits: a larger L changes nothing."""
        return sum(float(ls[np.isfinite(ls)].max(initial=0.0)) for ls in self.option_losses())

    def floor(self) -> float:
        """The smallest positive measured loss: below it only loss-free options fit."""
        pos = [v for v in self.loss.values() if 0.0 < v < math.inf]
        return min(pos) if pos else 1e-4

    def solve(self, L: float) -> Plan:
        """The knapsack plan for loss budget `L` under the sensitivities measured so far.

        One `solve_mckp` per L (memoised until a loss changes), mapped back to decisions;
        the strategy searches over L, it does not solve the knapsack a second way."""
        picks = self._memo.get(L)
        if picks is None:
            losses = self.option_losses()
            picks = tuple(solve_mckp(losses, [g[2] for g in self._groups], L, self.bins))
            self._memo[L] = picks
        return self.plan_of(self._indices(picks))

    def _indices(self, picks: Sequence[int]) -> list[int]:
        idx = [0] * len(self.space.decisions)
        for (dec_idx, options, _), o in zip(self._groups, picks, strict=True):
            for i, j in zip(dec_idx, options[o], strict=True):
                idx[i] = j
        return idx

    def plan_of(self, idx: Sequence[int]) -> Plan:
        return self.space.plan({d.name: d.choices[j] for d, j in zip(self.space.decisions, idx, strict=True)})
