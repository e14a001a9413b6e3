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

In a curve run (`use_floors`) each floor keeps its own bracket on L, and the knapsack plans asked aim at the floors
in turn (highest first), each plan's result moving the bracket of the floor it aimed at.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES
from modelopt.search.knapsack_options import LayerOptions

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
        # The sensitivity schedule: by decision, then choice.
        self._sens = [(i, j) for i, d in enumerate(decisions) for j, c in enumerate(d.choices) if c is not None]
        self.options = LayerOptions(space, objective, self.bins)  # costs, losses, the DP
        self._next_sens = 0
        self._seen: set[str] = set()
        self._order: list[str] = []  # _seen in insertion order, for state_dict
        self._known: dict[str, bool] = {}  # plan key -> feasible (failed counts as infeasible)
        self._L_of: dict[str, float] = {}  # knapsack plans asked: key -> the L that produced them
        self.floors: tuple[float, ...] = (objective.min_retention,)  # a curve's (`use_floors`), highest first
        # Per floor: [lo, hi], the largest L whose DP plan was feasible there and the smallest that was not.
        self.bounds: list[list[float | None]] = [[None, None]]
        self._aim_of: dict[str, int] = {}  # a curve's knapsack plans: key -> the floor (index) it aimed at
        self._meets: dict[str, list[bool]] = {}  # a curve's told plans: key -> whether it clears each floor
        self._asked = 0  # knapsack plans asked (a curve's: which floor the next aims at)
        self._best: tuple[float, str, list[int]] | None = None  # reward, key, choice indices

    @property
    def loss_estimator(self) -> str | None:
        """The one-pass estimates this knapsack prices choices with: the Fisher pass, or none (measured)."""
        return "fisher" if self.sensitivity == "fisher" else None

    def use_loss_estimates(self, estimates: Mapping[tuple[str, int], float]) -> None:
        """Takes estimated losses {(decision, choice index): loss} in place of sensitivity trials;
        choices without an estimate keep theirs. Call before `load_state_dict` (a resumed run)."""
        for (name, j), v in estimates.items():
            if name in self._index:
                self.options.loss[(self._index[name], j)] = float(v)
        self._sens = [(i, j) for i, j in self._sens if (i, j) not in self.options.loss]
        self.options.forget()

    def use_floors(self, floors: Sequence[float]) -> None:
        """A curve run: a bracket on L per floor, and the knapsack plans aimed at the floors in turn."""
        if len(floors) > 1:
            self.floors, self.bounds = tuple(floors), [[None, None] for _ in floors]

    @property
    def lo(self) -> float | None:
        """The search floor's (the lowest) largest L whose plan was feasible."""
        return self.bounds[-1][0]

    @property
    def hi(self) -> float | None:
        """The search floor's smallest L whose plan was infeasible."""
        return self.bounds[-1][1]

    def costs_changed(self) -> None:
        if self.objective.target is Target.LATENCY:
            self.options.costs_changed()

    def solve(self, L: float) -> Plan:
        """The knapsack plan for loss budget `L` under the sensitivities measured so far (`LayerOptions.solve`)."""
        return self.options.solve(L)

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
        if len(self.floors) == 1 and len(out) < n:
            out += self._knapsack_plans(n - len(out), len(self.floors) - 1)
        idle = 0  # floors in a row with nothing new to offer
        while len(self.floors) > 1 and len(out) < n and idle < len(self.floors):
            plans = self._knapsack_plans(1, self._asked % len(self.floors))
            self._asked += 1
            idle = 0 if plans else idle + 1
            out += plans
        while len(out) < n:
            plan = self._perturb()
            self._mark_seen(plan.key)
            out.append(plan)
        return out

    def _knapsack_plans(self, m: int, f: int) -> list[Plan]:
        """Up to `m` unseen plans: `solve(L)` at candidate budgets L, best first, moving floor `f`'s bracket."""
        out: list[Plan] = []
        solves = level = 0
        while len(out) < m and solves < _MAX_SOLVES and level <= _MAX_LEVEL:
            moved = found = False
            for L in self._candidates(m - len(out), level, f):
                solves += 1
                plan = self.solve(L)
                if plan.key not in self._seen:
                    self._mark_seen(plan.key)
                    self._L_of[plan.key] = L
                    if len(self.floors) > 1:
                        self._aim_of[plan.key] = f
                    out.append(plan)
                    found = True
                    if len(out) == m:
                        break
                elif plan.key in self._known and self._update_bounds(L, self._feasible(plan.key, f), f):
                    moved = True  # a plan already measured told us about this L: no trial needed
                    break
                if solves >= _MAX_SOLVES:
                    break
            level = 0 if moved or found else level + 1
        return out

    def _feasible(self, key: str, f: int) -> bool:
        """Whether told plan `key` cleared floor `f` (the search's floor: `_known`)."""
        return self._meets[key][f] if key in self._meets else self._known[key]

    def _candidates(self, m: int, level: int, f: int) -> list[float]:
        """Loss budgets to try next for floor `f`, best first: m << level of them (fewer once bracketed tight)."""
        k = m << level
        lo, hi = self.bounds[f]
        top = self.options.top()
        if hi is None:
            out = self._opening(k, f) if lo is None else [max(lo, self.options.floor()) / SHRINK**i
                                                       for i in range(1, k + 1)]
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

    def _opening(self, k: int, f: int) -> list[float]:
        """Before any bracket: floor `f`'s loss, then alternately below and above it."""
        base = max(0.0, 1.0 - self.floors[f]) or self.options.floor()
        out = [base]
        for i in itertools.count(1):
            if len(out) >= k:
                break
            out += [base * SHRINK**i, base / SHRINK**i]
        return out

    def _update_bounds(self, L: float, feasible: bool, f: int) -> bool:
        """Moves floor `f`'s bracket; returns whether it changed. The largest feasible L only grows."""
        bounds = self.bounds[f]
        before = tuple(bounds)
        lo, hi = bounds
        if feasible:
            if lo is None or L > lo:
                bounds[0] = L
                if hi is not None and hi <= L:
                    bounds[1] = None  # non-additivity made a smaller L fail: search above again
        elif (lo is None or L > lo) and (hi is None or L < hi):
            bounds[1] = L
        return tuple(bounds) != before

    def _perturb(self) -> Plan:
        """A seeded random neighbour (one or two decisions changed) of the best feasible plan."""
        decisions = self.space.decisions
        base = self._best[2] if self._best is not None else [0] * len(decisions)
        plan = self.options.plan_of(base)
        for _ in range(200):
            idx = list(base)
            for _ in range(1 + int(self.rng.integers(2))):
                i = int(self.rng.integers(len(decisions)))
                # Choices whose sensitivity trial failed would most likely fail again.
                others = [j for j in range(len(decisions[i].choices))
                          if j != idx[i] and self.options.loss.get((i, j)) != math.inf]
                if others:
                    idx[i] = others[int(self.rng.integers(len(others)))]
            plan = self.options.plan_of(idx)
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
        if len(self.floors) > 1:
            m = trial.metrics
            self._meets[key] = [bool(trial.ok and m is not None and self.objective.at(f).meets_floor(m))
                                for f in self.floors]
        active = [(name, c) for name, c in plan.choices if c is not None]
        if len(active) == 1 and active[0][0] in self._index:
            i = self._index[active[0][0]]
            choices = self.space.decisions[i].choices
            if active[0][1] in choices:
                m = trial.metrics
                ok = trial.ok and m is not None and not math.isnan(m.retention)
                # The drop as the floor judges it (broken answers only, by default).
                drop = 1.0 - self.objective.point_retention(m) if ok else math.inf  # type: ignore[arg-type]
                self.options.loss[(i, choices.index(active[0][1]))] = max(0.0, drop)
                self.options.forget()
        if key in self._L_of:
            f = self._aim_of.pop(key, len(self.floors) - 1)
            self._update_bounds(self._L_of[key], self._feasible(key, f), f)
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
            "losses": [[i, j, None if v == math.inf else v] for (i, j), v in sorted(self.options.loss.items())],
            "seen": list(self._order),
            "known": dict(self._known),
            "L_of": dict(self._L_of),
            "lo": self.lo,
            "hi": self.hi,
            "best": None if self._best is None else list(self._best),
            "rng": self.rng.bit_generator.state,
        } | ({} if len(self.floors) == 1 else {"floors": list(self.floors), "bounds": self.bounds,
                                                "aim_of": self._aim_of, "meets": self._meets, "asked": self._asked})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_sens = int(state["next_sensitivity"])
        self.options.loss = {(int(i), int(j)): math.inf if v is None else float(v) for i, j, v in state["losses"]}
        self._order = list(state["seen"])
        self._seen = set(self._order)
        self._known = {k: bool(v) for k, v in state["known"].items()}
        self._L_of = {k: float(v) for k, v in state["L_of"].items()}
        self.bounds[-1] = [state["lo"], state["hi"]]
        if len(self.floors) > 1 and [float(f) for f in state.get("floors", ())] == list(self.floors):
            self.bounds = [list(b) for b in state["bounds"]]
            self._aim_of = {str(k): int(v) for k, v in state["aim_of"].items()}
            self._meets = {str(k): [bool(b) for b in v] for k, v in state["meets"].items()}
            self._asked = int(state["asked"])
        best = state["best"]
        self._best = None if best is None else (float(best[0]), str(best[1]), [int(j) for j in best[2]])
        self.rng.bit_generator.state = state["rng"]
        self.options.forget()


@STRATEGIES.register("knapsack_measured")
class MeasuredKnapsackSearch(KnapsackSearch):
    """`knapsack` with every choice's sensitivity measured by a trial of its own (the old mode)."""

    name = "knapsack_measured"
    sensitivity = "measured"
