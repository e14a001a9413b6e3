"""Monte Carlo Tree Search over per-layer decisions, with priors, RAVE and model-based rollouts.

A node is a partial plan: the first d decisions (in impact order, largest layers first) fixed. Each `ask` walks the
tree by PUCT (value + prior-weighted exploration), expands one new child, and completes the plan with a *rollout*
that solves a knapsack under a learned additive model of accuracy loss:

    retention drop(plan) ** power ~= sum over decisions of delta[d, choice]

Quantization noise adds up across layers roughly as variance. Where accuracy falls with the square of the total
noise (clean images: one square-root slope fits uniform INT4 and INT3, a linear one does not) the power is 1/2;
where it falls with the noise itself (JPEG images, many answers near a boundary) it is 2; the loss model picks it
from the trials (measured: docs/search.md#measured). The cost side is bytes priced with the layer's other decisions
at the INT4 anchor. `delta` is fitted by ridge regression on every trial so far, shrunk toward a prior (kappa x the
choice's error, kappa fitted too). The error is, when the budget affords the probes, the KL of the answers the
choice causes (`modelopt.evaluation.output_sensitivity`: one label-free probe per layer; layers' gains differ
widely), else its relative output error. Rollouts draw delta from its posterior (Thompson sampling): they explore
where the model is unsure and exploit where it is sure, spending evaluations only on accuracy. Model:
`search/loss_model.py`; rollout: `search/rollout.py` (knapsack DP: `search/mckp.py`).

A trial's raw value is 1 + log(reduction) when feasible, below 1 by how far it misses the floor when infeasible, 0
when it failed. For UCB, values are normalised to [0, 1] between the median and the best raw value seen so far, so
that the differences that matter (8.5x against 9x) are not lost in the gap between feasible and infeasible plans. A
node's value mixes the mean and the best found below it. Statistics are also shared across the tree per (decision,
choice) (RAVE), a transposition table by plan key means no plan is paid twice, and virtual loss lets `ask(n)` return
n different plans for parallel evaluation.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from modelopt.compressors.contract import Routes
from modelopt.data.split import Split
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, Target
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace
from modelopt.search._base import Strategy
from modelopt.search._registry import STRATEGIES
from modelopt.search.loss_model import LossModel, loss_model_for, rescale_to_estimates
from modelopt.search.mcts_floors import Aim
from modelopt.search.mcts_tree import Node, Record, Tree, norm_value, trial_weight
from modelopt.search.rollout import choice_costs, complete, neighbour

C_PUCT = 0.5
RAVE_K = 60.0  # visits at which a node's own value and the shared (RAVE) value weigh the same
MAX_ROLLOUT_TRIES = 16
PRIOR_ROLLOUTS = 12  # rollouts whose choices at a node form its children's prior
PRIOR_MIX = 0.75  # share of the rollout policy in a prior (the rest: data-free saving vs loss)
# The rollouts aim at no less than this share of the drop the floor allows, however many plans miss it: when
# every plan that changes anything breaks some answers (JPEG images, docs/search.md#measured), aiming lower only
# yields plans that leave layers in float.
MIN_MARGIN = 0.4

@STRATEGIES.register("mcts")
class MCTS(Strategy):
    """MCTS with PUCT priors, RAVE, best-below backup and Thompson-sampled knapsack rollouts.

    Example:
        >>> strategy = MCTS(space, Objective("size", 0.99), seed=0)
        >>> plan, = strategy.ask()
    """

    name = "mcts"

    def __init__(self, space: SearchSpace, objective: Objective, *, seed: int = 0) -> None:
        super().__init__(space, objective, seed=seed)
        self.rng = np.random.default_rng(seed)
        self.decisions = space.decisions
        self.n_dec = len(self.decisions)
        feats = [space.features[d.name] for d in self.decisions]
        self._price()
        self.exits = [i for i, d in enumerate(self.decisions) if isinstance(space.compressors[d.compressor], Routes)]
        self.error = [np.nan_to_num(np.array([f.error for f in fs], dtype=float), nan=1.0, posinf=1.0) for fs in feats]
        # Impact order: decisions whose choices move the cost most come first (largest layers).
        spread = [c.max() - c.min() for c in self.cost]
        self.order = sorted(range(self.n_dec), key=lambda i: (-spread[i], i))
        self.estimated = False  # whether `error` holds output estimates (use_loss_estimates)
        self.model = self._loss_model()
        self.tree = Tree([len(d.choices) for d in self.decisions])
        self.records: list[Record] = []
        self.seen: dict[str, float] = {}  # transposition table: plan key -> value
        self.pending: dict[str, list[tuple[int, ...]]] = {}  # plan key -> tree paths awaiting tell
        # The floors rollouts aim at (one, or a curve's: `use_floors`), each with the share of its allowed drop
        # rollouts aim at (its margin), which adapts to the model's calibration.
        self.aim = Aim((objective.min_retention,))
        self.val_split: tuple[int, int] | None = None  # (images, float-right) of val, from a full score
        self.swaps = [0, 0]  # answers fixed, broken over plans scored on all of val (see gain_ratio)
        self.prior_trials: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # see use_prior_trials
        self._fit()

    def _loss_model(self) -> LossModel:
        return loss_model_for(self.decisions, self.error, estimated=self.estimated)

    @property
    def loss_estimator(self) -> str | None:
        """MCTS prices choices by what they do to the answers (`modelopt.evaluation.output_sensitivity`)."""
        return "output"

    def use_loss_estimates(self, estimates: Mapping[tuple[str, int], float]) -> None:
        """Takes each choice's estimated KL of the answers {(decision, choice index): nats} as the error its
        loss model's prior scales (per-layer gains differ widely where the weight's own error cannot tell layers
        apart), rescaled so the median layer keeps the scale of its relative error (the loss model's kappa
        prior is in those units); choices without an estimate keep their error. Call before the first `ask`
        and before `load_state_dict` (a resumed run)."""
        if not rescale_to_estimates(self.decisions, self.error, estimates):
            return
        self.estimated = True
        self.model = self._loss_model()
        for node in self.tree.values():
            node.prior = None
        self._fit()

    def use_floors(self, floors: Sequence[float]) -> None:
        """A curve run: rollouts aim at each floor in turn, and a plan is valued by its share of the curve's area
        (`modelopt.search.mcts_floors`)."""
        if len(floors) > 1:
            self.aim = Aim(tuple(floors))

    def costs_changed(self) -> None:
        """Prices the choices again (the decisions' order in the tree stays as it was)."""
        if self.objective.target is Target.LATENCY:
            self._price()

    def _price(self) -> None:
        """Each choice's cost (`cost`; `_costmat`, decisions x widest menu: `rollout.choice_costs`)."""
        self.cost, self._costmat = choice_costs(self.space, self.objective)

    # ---- the learned loss model -----------------------------------------------------------

    def _fit(self) -> None:
        """Refits the loss model on every completed trial (failed ones teach it nothing), then, when
        warm-started, once more with the prior trials at the scale (kappa) this run's own trials show."""
        ok = [r for r in self.records if r.retention is not None]
        idx = np.array([r.idx for r in ok], dtype=int).reshape(len(ok), self.n_dec)
        retention = np.array([r.retention for r in ok], dtype=float)
        weight = np.array([r.weight for r in ok], dtype=float)
        self.model.fit(idx, retention, weight)
        if self.prior_trials is not None:
            p_idx, rel, p_weight = self.prior_trials
            y = rel * self.model.kappa  # drop^power, at this run's scale (KAPPA0 before any trial)
            self.model.fit(np.concatenate([idx, p_idx]), np.concatenate([retention, 1.0 - y ** (1 / self.model.power)]),
                           np.concatenate([weight, p_weight]))

    def use_prior_trials(self, idx: np.ndarray, rel_loss: np.ndarray, weight: np.ndarray) -> None:
        """Warm start (`modelopt.knowledge.warm_start`): pseudo-trials only the loss model sees.

        Row t is a plan (choice indices in space order) whose sqrt(drop) earlier runs put at `rel_loss[t]` x kappa,
        kappa this run's own fitted scale, worth `weight[t]` trials. They shape the loss model's prior, hence rollouts
        and node priors; they are not trials: no budget, no tree or RAVE statistics, not seen. Saved with the state,
        so a resumed run keeps the priors it started with. Call before the first `ask`."""
        self.prior_trials = (np.asarray(idx, dtype=int).reshape(-1, self.n_dec), np.asarray(rel_loss, dtype=float),
                             np.asarray(weight, dtype=float))
        for node in self.tree.values():
            node.prior = None
        self._fit()

    # ---- rollout: knapsack under the (sampled) model --------------------------------------

    def _rollouts(self, prefix: tuple[int, ...], rng: np.random.Generator, aims: Sequence[int]) -> np.ndarray:
        """A completion of `prefix` (`modelopt.search.rollout.complete`) per entry of `aims` (the index of the floor
        it aims at), each under losses drawn from the model's posterior and the floor's allowed loss jittered around
        its margin. Returns (draws x decisions) indices."""
        draws = len(aims)
        deltas = self.model.deltas(rng, draws)  # (R, n, C)
        base = np.array([self._allowed(self.aim.floors[i]) for i in aims])
        margin = np.array([self.aim.margins[i] for i in aims])
        allowed = base * (margin * rng.uniform(0.8, 1.1, size=draws)) ** self.model.power
        return complete(prefix, deltas, allowed, self.order, self._costmat, self.exits)

    # ---- the tree -------------------------------------------------------------------------

    def _priors(self, path: tuple[int, ...]) -> np.ndarray:
        """Mostly what the model-based rollout would choose here; partly data-free saving vs loss.

        Stored on the node and refreshed as the number of trials doubles (saved with the tree, so a restored search
        sees the same priors)."""
        node = self.tree[path]
        n = len(self.records)
        if node.prior is not None and n < max(2 * node.prior_at, node.prior_at + 4):
            return np.asarray(node.prior)
        i = self.order[len(path)]
        # A private generator keyed by (seed, history, node): priors never shift the search's own random stream.
        rng = np.random.default_rng([self.seed, n, *path])
        aims = [k % len(self.aim.floors) for k in range(PRIOR_ROLLOUTS)]  # the floors' rollouts alike
        counts = np.bincount(self._rollouts(path, rng, aims)[:, i], minlength=len(self.decisions[i].choices))
        prior = PRIOR_MIX * counts / counts.sum() + (1 - PRIOR_MIX) * self._static_prior(i)
        node.prior, node.prior_at = [float(p) for p in prior], n
        return prior

    def _allowed(self, floor: float | None = None) -> float:
        """The retention floor (the search's, or `floor`) in the model's units: the largest drop still certified, to
        the model's power, on the val split (known from the first plan scored on all of it; the floor's until then)."""
        power = self.model.power
        objective = self.objective if floor is None else self.objective.at(floor)
        if self.val_split is None:
            return max(1.0 - objective.min_retention, 1e-6) ** power
        return max(objective.allowed_drop(*self.val_split, gain_ratio=self.gain_ratio), 1e-6) ** power

    @property
    def gain_ratio(self) -> float:
        """Answers fixed per answer broken so far (half of each as prior): with gains counted, a plan
        that breaks more is still certified."""
        return (self.swaps[0] + 0.5) / (self.swaps[1] + 0.5) if self.swaps[1] else 0.0

    def _static_prior(self, i: int) -> np.ndarray:
        allowed = self._allowed()
        loss = self.model.deltas(None)[i, : len(self.decisions[i].choices)]
        saving = 1.0 - self.cost[i] / max(self.cost[i].max(), 1e-12)
        z = 2.0 * saving - 2.0 * loss / allowed
        p = np.exp(z - z.max())
        return p / p.sum()

    def _select(self) -> tuple[int, ...]:
        """Descends by PUCT to a node not yet in the tree (or a full plan), adding it."""
        path: tuple[int, ...] = ()
        values = [r.value for r in self.records]
        lo, hi = (float(np.median(values)), max(values)) if values else (0.0, 1.0)
        while len(path) < self.n_dec:
            parent = self.tree[path]
            i = self.order[len(path)]
            prior = self._priors(path)
            sqrt_n = math.sqrt(parent.n + parent.virtual + 1)
            scores = []
            for j in range(len(prior)):
                child = self.tree.get((*path, j))
                n_child = 0 if child is None else child.n + child.virtual
                amaf_n = self.tree.amaf_n[i][j]
                # A choice never tried anywhere starts at the lowest value (AlphaZero's first-play value): the
                # prior alone draws the search to it. At the parent's value every untried choice looked as good
                # as the best line so far, and the tree tried what every rollout priced as ruinous (docs/search.md).
                q_amaf = norm_value(self.tree.amaf_w[i][j] / amaf_n, lo, hi) if amaf_n else 0.0
                if child is None or n_child == 0:
                    q = q_amaf
                else:
                    beta = math.sqrt(RAVE_K / (3 * n_child + RAVE_K))
                    q = (1 - beta) * child.q(lo, hi) + beta * q_amaf
                scores.append(q + C_PUCT * prior[j] * sqrt_n / (1 + n_child))
            j = int(np.argmax(scores))
            path = (*path, j)
            if path not in self.tree:
                self.tree[path] = Node()
                return path
        return path

    def _plan(self, idx: list[int]) -> Plan:
        return self.space.plan({d.name: d.choices[j] for d, j in zip(self.decisions, idx, strict=True)})

    # ---- ask / tell -----------------------------------------------------------------------

    def ask(self, n: int = 1) -> list[Plan]:
        plans = []
        for _ in range(n):
            aim = self.aim.next()
            for _attempt in range(MAX_ROLLOUT_TRIES):
                path = self._select()
                idx = [int(j) for j in self._rollouts(path, self.rng, [aim])[0]]
                plan = self._plan(idx)
                if plan.key in self.seen:
                    self.tree.backup(path, self.seen[plan.key])  # known: costs nothing, teaches the tree
                    continue
                if plan.key in self.pending:
                    continue
                break
            else:
                path, plan = self._neighbour(path, idx)
            self.tree.walk(path, lambda node: setattr(node, "virtual", node.virtual + 1))
            self.pending.setdefault(plan.key, []).append(path)
            self.aim.asked_for(plan.key, aim)
            plans.append(plan)
        return plans

    def _neighbour(self, path: tuple[int, ...], idx: list[int]) -> tuple[tuple[int, ...], Plan]:
        """A plan not yet seen near the rollouts' own (which all came back known: `rollout.neighbour`), else a
        uniformly random one."""
        new = neighbour(idx, self.order[len(path):] or self.order, [len(d.choices) for d in self.decisions],
                        self.exits, set(self.order[: len(path)]), self._costmat, self.rng, MAX_ROLLOUT_TRIES,
                        lambda key: key in self.seen or key in self.pending, lambda new: self._plan(new).key)
        if new is None:
            new = [int(self.rng.integers(len(d.choices))) for d in self.decisions]
        path = tuple(new[i] for i in self.order[: len(path)])
        self.tree.setdefault(path, Node())
        return path, self._plan(new)

    def tell(self, trial: Trial) -> None:
        idx = [d.choices.index(trial.plan.get(d.name)) for d in self.decisions]
        value = self.aim.value(trial, self.objective)
        paths = self.pending.get(trial.plan.key)
        if paths:
            path = paths.pop(0)
            if not paths:
                del self.pending[trial.plan.key]
            self.tree.walk(path, lambda node: setattr(node, "virtual", max(node.virtual - 1, 0)))
        else:
            path = self.tree.deepest(idx, self.order)  # a plan not asked: credit the deepest matching path
        if trial.plan.key in self.seen:
            self.aim.aimed.pop(trial.plan.key, None)
            return
        self.seen[trial.plan.key] = value
        self.tree.backup(path, value)
        self.tree.amaf(idx, value)
        m = trial.metrics
        retention = None if m is None or trial.reward is None else self.objective.point_retention(m)
        if self.val_split is None and m is not None and m.stopped is None and m.split == Split.VAL and m.counts():
            self.val_split = (m.n_samples, m.base_right)  # type: ignore[assignment]
        if m is not None and m.stopped is None and m.lost is not None and m.gained is not None:
            self.swaps = [self.swaps[0] + m.gained, self.swaps[1] + m.lost]
        self.records.append(Record(idx, retention, value, trial_weight(trial)))
        self.aim.told(trial, self.objective, MIN_MARGIN, learn=retention is not None)
        self._fit()

    # ---- state ----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "rng": self.rng.bit_generator.state,
            "tree": [[list(k), v.n, v.w, v.best, v.prior, v.prior_at] for k, v in self.tree.items()],
            "records": [[r.idx, r.retention, r.value, r.weight] for r in self.records],
            "seen": self.seen,
            "margin": self.aim.margins[-1],
            "val_split": None if self.val_split is None else list(self.val_split),
            "swaps": list(self.swaps),
            # Plans asked and not yet told (in flight on other workers): their virtual losses come back with them.
            "pending": {key: [list(path) for path in paths] for key, paths in self.pending.items()},
        } | ({} if self.prior_trials is None else {"prior_trials": [a.tolist() for a in self.prior_trials]}) \
          | ({"aim": self.aim.state_dict()} if self.aim.curve else {})

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.tree = Tree([len(d.choices) for d in self.decisions],
                         {tuple(k): Node(n, w, best, 0, prior, at) for k, n, w, best, prior, at in state["tree"]})
        self.records = [Record(list(rec[0]), rec[1], rec[2], *rec[3:]) for rec in state["records"]]
        self.seen = dict(state["seen"])
        self.aim = Aim.restored(state["aim"], self.aim.floors) if self.aim.curve and "aim" in state else self.aim
        if not self.aim.curve:
            self.aim.margins[0] = float(state["margin"])
        vs = state.get("val_split")
        self.val_split = None if vs is None else (int(vs[0]), int(vs[1]))
        self.swaps = [int(v) for v in state.get("swaps", (0, 0))]
        self.pending = {key: [tuple(path) for path in paths] for key, paths in state.get("pending", {}).items()}
        for paths in self.pending.values():
            for path in paths:
                self.tree.walk(path, lambda node: setattr(node, "virtual", node.virtual + 1))
        for r in self.records:
            self.tree.amaf(r.idx, r.value)
        pt = state.get("prior_trials")  # the priors the run started with (none: a cold start)
        self.prior_trials = None if pt is None else (np.array(pt[0], dtype=int).reshape(-1, self.n_dec),
                                                     np.array(pt[1], dtype=float), np.array(pt[2], dtype=float))
        self._fit()

