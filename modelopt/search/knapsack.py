"""Sensitivity plus knapsack: the per-layer allocation HAWQ-V3 and NVIDIA ModelOpt's auto_quantize use.

1. Sensitivity, two ways:
   - `knapsack` (one pass, as HAWQ and auto_quantize do): every choice that changes a weight is
     priced by the loss increase a gradient pass over calibration images predicts,
     1/2 sum F dW^2 with F the empirical Fisher (`modelopt.evaluation.sensitivity`); the pass is charged
     to the budget once. Choices that change no weight (exits) are measured as below.
   - `knapsack_measured`: one plan per (decision, non-None choice), everything else float; the
     measured loss is max(0, 1 - retention). These are ordinary trials, so the pass is
     charged to the budget like any other; with pruning in the menu it can eat the budget.
   The loss is 1 - retention as the objective's floor judges it (`Objective.point_retention`:
   the share of the float model's right answers broken, unless gains count).
2. Knapsack: assuming losses add up, pick one option per layer minimising the target
   (bytes, or bitops) with total loss <= L, exactly, by dynamic programming over a
   discretised loss axis (`modelopt.search.mckp`). L starts at 1 - min_retention and adapts to how wrong the
   additivity assumption is: shrink (x0.7) after an infeasible result, grow (/0.7) after a
   feasible one, bisect once both are known.
3. When no L gives an unseen plan, seeded random neighbours of the best feasible plan.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelopt.evaluation.cost import CostModel
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Decision, Plan
from modelopt.plan.space import SearchSpace
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES
from modelopt.search.mckp import solve_mckp

STATE_VERSION = 1
_MIN_L = 1e-6  # loss budgets below this are zero: one image in a million
SHRINK = 0.7  # L step after an infeasible result (and 1/SHRINK after a feasible one) until bracketed
_MAX_SOLVES = 200  # DP solves one ask may spend looking for an unseen plan before perturbing
_MAX_LEVEL = 4  # candidate-L refinement rounds (2**level more L values each round)


@STRATEGIES.register("knapsack")
class KnapsackSearch(Strategy):
    """Per-choice sensitivities, then an exact knapsack over them with an adaptive loss budget.

    Decisions on the same layer are solved jointly (their option is the combination of
    their choices, costed the way the evaluator stores the weight); global decisions
    (no layer) cost nothing, so they get their least-loss choice.

    Args:
        space: the decisions and their choices.
        objective: each layer's option is priced by `modelopt.evaluation.cost` (`CostModel.choice_cost`): its
            bytes for `size` (and `latency`), MACs for `macs`, MACs x weight bits x input bits for
            `bitops`. Exits save MACs only at run time, so here they only add their heads' bytes.
        seed: seeds the perturbations once the knapsack has nothing new to offer.
        bins: resolution of the DP's loss axis (per solve, over [0, L]).

    Example:
        >>> s = KnapsackSearch(space, Objective("size", 0.99), seed=0)
        >>> plans = s.ask(4)  # the first sensitivity plans
    """

    name = "knapsack"
    sensitivity = "fisher"  # "fisher": one gradient pass prices the choices; "measured": a trial each

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0, bins: int = 2000) -> None:
        super().__init__(space, objective, seed=seed)
        self.bins = int(bins)
        self.rng = np.random.default_rng(seed)
        decisions = space.decisions
        self._index = {d.name: i for i, d in enumerate(decisions)}
        self._costs = CostModel(space)
        # The sensitivity schedule: by decision, then choice.
        self._sens = [(i, j) for i, d in enumerate(decisions) for j, c in enumerate(d.choices) if c is not None]
        self._groups = self._build_groups()
        self._next_sens = 0
        self._loss: dict[tuple[int, int], float] = {}  # inf: the single-choice plan failed
        self._seen: set[str] = set()
        self._order: list[str] = []  # _seen in insertion order, for state_dict
        self._known: dict[str, bool] = {}  # plan key -> feasible (failed counts as infeasible)
        self._L_of: dict[str, float] = {}  # knapsack plans asked: key -> the L that produced them
        self.lo: float | None = None  # largest L whose DP plan was feasible
        self.hi: float | None = None  # smallest L whose DP plan was infeasible
        self._best: tuple[float, str, list[int]] | None = None  # reward, key, choice indices
        self._memo: dict[float, tuple[int, ...]] = {}  # L -> DP picks; both caches die with new losses
        self._olosses: list[np.ndarray] | None = None

    @property
    def loss_estimator(self) -> str | None:
        """The one-pass estimates this knapsack prices choices with: the Fisher pass, or none (measured)."""
        return "fisher" if self.sensitivity == "fisher" else None

    def use_loss_estimates(self, estimates: Mapping[tuple[str, int], float]) -> None:
        """Takes estimated losses {(decision, choice index): loss} in place of sensitivity trials;
        choices without an estimate keep theirs. Call before `load_state_dict` (a resumed run)."""
        for (name, j), v in estimates.items():
            if name in self._index:
                self._loss[(self._index[name], j)] = float(v)
        self._sens = [(i, j) for i, j in self._sens if (i, j) not in self._loss]
        self._forget()

    # ---- the model of the objective --------------------------------------------------------

    def costs_changed(self) -> None:
        if self.objective.target is Target.LATENCY:
            self._groups = self._build_groups()
            self._forget()

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

    def _option_losses(self) -> list[np.ndarray]:
        """Per group, each option's loss: the sum of its choices' (unmeasured counts as infinite)."""
        if self._olosses is not None:
            return self._olosses
        out = []
        for idx, options, _ in self._groups:
            per = [[0.0 if self.space.decisions[i].choices[j] is None else self._loss.get((i, j), math.inf)
                    for j in range(len(self.space.decisions[i].choices))] for i in idx]
            out.append(np.array([sum(per[k][j] for k, j in enumerate(opt)) for opt in options], dtype=float))
        self._olosses = out
        return out

    def _forget(self) -> None:
        self._memo.clear()
        self._olosses = None

    def _top(self, losses: list[np.ndarray]) -> float:
        """Above this L every measured option fits: a larger L changes nothing."""
        return sum(float(ls[np.isfinite(ls)].max(initial=0.0)) for ls in losses)

    def _floor(self) -> float:
        """The smallest positive measured loss: below it only loss-free options fit."""
        pos = [v for v in self._loss.values() if 0.0 < v < math.inf]
        return min(pos) if pos else 1e-4

    def solve(self, L: float) -> Plan:
        """The knapsack plan for loss budget `L` under the sensitivities measured so far.

        One `solve_mckp` per L (memoised until a loss changes), mapped back to decisions;
        `_knapsack_plans` searches over L, it does not solve the knapsack a second way."""
        picks = self._memo.get(L)
        if picks is None:
            losses = self._option_losses()
            picks = tuple(solve_mckp(losses, [g[2] for g in self._groups], L, self.bins))
            self._memo[L] = picks
        return self._plan_of(self._indices(picks))

    def _indices(self, picks: Sequence[int]) -> list[int]:
        idx = [0] * len(self.space.decisions)
        for (dec_idx, options, _), o in zip(self._groups, picks, strict=True):
            for i, j in zip(dec_idx, options[o], strict=True):
                idx[i] = j
        return idx

    def _plan_of(self, idx: Sequence[int]) -> Plan:
        return self.space.plan({d.name: d.choices[j] for d, j in zip(self.space.decisions, idx, strict=True)})

    # ---- ask -------------------------------------------------------------------------------

    @property
    def phase(self) -> str:
        return "sensitivity" if self._next_sens < len(self._sens) else "knapsack"

    def ask(self, n: int = 1) -> list[Plan]:
        out: list[Plan] = []
        while len(out) < n and self._next_sens < len(self._sens):
            i, j = self._sens[self._next_sens]
            self._next_sens += 1
            d = self.space.decisions[i]
            plan = self.space.plan({d.name: d.choices[j]})
            if plan.key not in self._seen:  # a told foreign plan may already have measured it
                self._mark_seen(plan.key)
                out.append(plan)
        if len(out) < n:
            out += self._knapsack_plans(n - len(out))
        while len(out) < n:
            plan = self._perturb()
            self._mark_seen(plan.key)
            out.append(plan)
        return out

    def _knapsack_plans(self, m: int) -> list[Plan]:
        """Up to `m` unseen plans: `solve(L)` at candidate budgets L, best first, moving the bracket."""
        out: list[Plan] = []
        solves = level = 0
        while len(out) < m and solves < _MAX_SOLVES and level <= _MAX_LEVEL:
            moved = found = False
            for L in self._candidates(m - len(out), level):
                solves += 1
                plan = self.solve(L)
                if plan.key not in self._seen:
                    self._mark_seen(plan.key)
                    self._L_of[plan.key] = L
                    out.append(plan)
                    found = True
                    if len(out) == m:
                        break
                elif plan.key in self._known and self._update_bounds(L, self._known[plan.key]):
                    moved = True  # a plan already measured told us about this L: no trial needed
                    break
                if solves >= _MAX_SOLVES:
                    break
            level = 0 if moved or found else level + 1
        return out

    def _candidates(self, m: int, level: int) -> list[float]:
        """Loss budgets to try next, best first: m << level of them (fewer once bracketed tight)."""
        k = m << level
        lo, hi = self.lo, self.hi
        top = self._top(self._option_losses())
        if hi is None:
            out = self._opening(k) if lo is None else [max(lo, self._floor()) / SHRINK**i for i in range(1, k + 1)]
        elif lo is None:
            if hi < _MIN_L:
                return []  # even the least lossy plans failed: nothing left to solve for
            out = [hi * SHRINK**i for i in range(1, k + 1)] + [0.0]
        else:
            if hi - lo <= hi / self.bins:
                return []  # bracket below the DP's resolution
            out = []
            for j in itertools.count(1):  # dyadic points: midpoint, then quarters, ...
                out += [lo + (hi - lo) * t / 2**j for t in range(1, 2**j, 2)]
                if len(out) >= k:
                    break
        return [min(max(L, 0.0), top) for L in out[: k + 1]]

    def _opening(self, k: int) -> list[float]:
        """Before any bracket: the floor's loss, then alternately below and above it."""
        base = max(0.0, 1.0 - self.objective.min_retention) or self._floor()
        out = [base]
        for i in itertools.count(1):
            if len(out) >= k:
                break
            out += [base * SHRINK**i, base / SHRINK**i]
        return out

    def _update_bounds(self, L: float, feasible: bool) -> bool:
        """Moves the bracket; returns whether it changed. The largest feasible L only grows."""
        before = (self.lo, self.hi)
        if feasible:
            if self.lo is None or L > self.lo:
                self.lo = L
                if self.hi is not None and self.hi <= L:
                    self.hi = None  # non-additivity made a smaller L fail: search above again
        elif (self.lo is None or L > self.lo) and (self.hi is None or L < self.hi):
            self.hi = L
        return (self.lo, self.hi) != before

    def _perturb(self) -> Plan:
        """A seeded random neighbour (one or two decisions changed) of the best feasible plan."""
        decisions = self.space.decisions
        base = self._best[2] if self._best is not None else [0] * len(decisions)
        plan = self._plan_of(base)
        for _ in range(200):
            idx = list(base)
            for _ in range(1 + int(self.rng.integers(2))):
                i = int(self.rng.integers(len(decisions)))
                # Choices whose sensitivity trial failed would most likely fail again.
                others = [j for j in range(len(decisions[i].choices))
                          if j != idx[i] and self._loss.get((i, j)) != math.inf]
                if others:
                    idx[i] = others[int(self.rng.integers(len(others)))]
            plan = self._plan_of(idx)
            if plan.key not in self._seen:
                return plan
        return plan  # the neighbourhood is exhausted (a tiny space): repeat rather than stall

    def _mark_seen(self, key: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            self._order.append(key)

    # ---- tell ------------------------------------------------------------------------------

    def tell(self, trial: Trial) -> None:
        plan = trial.plan
        key = plan.key
        self._mark_seen(key)
        feasible = trial.meets_floor
        self._known[key] = feasible
        active = [(name, c) for name, c in plan.choices if c is not None]
        if len(active) == 1 and active[0][0] in self._index:
            i = self._index[active[0][0]]
            choices = self.space.decisions[i].choices
            if active[0][1] in choices:
                m = trial.metrics
                ok = trial.ok and m is not None and not math.isnan(m.retention)
                # The drop as the floor judges it (broken answers only, by default).
                drop = 1.0 - self.objective.point_retention(m) if ok else math.inf  # type: ignore[arg-type]
                self._loss[(i, choices.index(active[0][1]))] = max(0.0, drop)
                self._forget()
        if key in self._L_of:
            self._update_bounds(self._L_of[key], feasible)
        if feasible and trial.reward is not None:
            idx = self._choice_indices(plan)
            if idx is not None and (self._best is None or trial.reward > self._best[0]):
                self._best = (float(trial.reward), key, idx)

    def _choice_indices(self, plan: Plan) -> list[int] | None:
        try:
            return [d.choices.index(plan.get(d.name)) for d in self.space.decisions]
        except ValueError:
            return None  # a plan from another space: it cannot seed perturbations

    # ---- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "phase": self.phase,
            "next_sensitivity": self._next_sens,
            # [decision index, choice index, loss]; loss null: the trial failed (never picked)
            "losses": [[i, j, None if v == math.inf else v] for (i, j), v in sorted(self._loss.items())],
            "seen": list(self._order),
            "known": dict(self._known),
            "L_of": dict(self._L_of),
            "lo": self.lo,
            "hi": self.hi,
            "best": None if self._best is None else list(self._best),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_sens = int(state["next_sensitivity"])
        self._loss = {(int(i), int(j)): math.inf if v is None else float(v) for i, j, v in state["losses"]}
        self._order = list(state["seen"])
        self._seen = set(self._order)
        self._known = {k: bool(v) for k, v in state["known"].items()}
        self._L_of = {k: float(v) for k, v in state["L_of"].items()}
        self.lo = state["lo"]
        self.hi = state["hi"]
        best = state["best"]
        self._best = None if best is None else (float(best[0]), str(best[1]), [int(j) for j in best[2]])
        self.rng.bit_generator.state = state["rng"]
        self._forget()


@STRATEGIES.register("knapsack_measured")
class MeasuredKnapsackSearch(KnapsackSearch):
    """`knapsack` with every choice's sensitivity measured by a trial of its own (the old mode)."""

    name = "knapsack_measured"
    sensitivity = "measured"
