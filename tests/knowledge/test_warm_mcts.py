"""MCTS's warm-start hook on a synthetic space with known sensitivities (no model): the prior trials
move only the loss model, cost nothing, and travel with the saved state."""

from __future__ import annotations

import numpy as np

from modelopt.compressors import Quantize
from modelopt.model.layers import Layer, LayerKind
from modelopt.objective import Objective
from modelopt.plan.space import SearchSpace
from modelopt.search import MCTS
from modelopt.testing.strategies import make_trial, synthetic_metrics

RNG = np.random.default_rng(3)
LAYERS = [Layer(f"l{i}", LayerKind.CONV, (32, 32, 3, 3), 1000, False) for i in range(10)]
SPACE = SearchSpace(LAYERS, [Quantize(bits=(8, 4, 2), granularity=("per_channel",), rounding=("nearest",),
                                      norm_images=0)])
SENS = RNG.choice([0.1, 3.0], size=len(LAYERS))  # half the layers fragile, half not: what a store would know
NOISE = {32: 0.0, 8: 0.00003, 4: 0.01, 2: 0.15}
OBJ = Objective("size", 0.99)


def score(plan):
    noise = sum(s * NOISE[32 if c is None else c.bits] for (_, c), s in zip(plan.choices, SENS, strict=True))
    size = sum(SPACE.compressors["quantize"].weight_bytes(SPACE.layers[n.split("/")[0]], c) for n, c in plan.choices)
    return 1.0 - noise**2, size


def true_loss() -> np.ndarray:
    return np.array([[s * NOISE[32 if c is None else c.bits] for c in d.choices]
                     for d, s in zip(SPACE.decisions, SENS, strict=True)])


def prior_trials(strategy: MCTS):
    """One pseudo-trial per (layer, compressing choice), at the true loss relative to the cold kappa."""
    none = [d.choices.index(None) for d in SPACE.decisions]
    rows, rel = [], []
    for i, d in enumerate(SPACE.decisions):
        for j, c in enumerate(d.choices):
            if c is not None:
                rows.append([j if k == i else none[k] for k in range(len(none))])
                rel.append(true_loss()[i, j] / strategy.model.kappa)
    return np.array(rows), np.array(rel), np.full(len(rows), 2.0)


def drive(strategy: MCTS, start: int, n: int) -> list[str]:
    keys = []
    for number in range(start, start + n):
        (plan,) = strategy.ask()
        strategy.tell(make_trial(number, plan, synthetic_metrics(plan, SPACE, score), OBJ, strategy))
        keys.append(plan.key)
    return keys


def warm(seed: int = 0) -> MCTS:
    strategy = MCTS(SPACE, OBJ, seed=seed)
    strategy.use_prior_trials(*prior_trials(strategy))
    return strategy


def test_prior_trials_teach_the_loss_model_and_nothing_else():
    cold, hot = MCTS(SPACE, OBJ, seed=0), warm()
    truth = true_loss()[:, 1:].ravel()  # the compressing choices (choice 0 is None)
    err = [float(np.abs(s.model.deltas(None)[:, 1:4].ravel() - truth).sum()) for s in (cold, hot)]
    assert err[1] < 0.5 * err[0]  # before any trial, the warm model already knows which layers are fragile
    for s in (cold, hot):  # no trial, no budget, no tree statistics, nothing seen
        assert s.records == [] and s.seen == {} and list(s.tree) == [()] and s.tree[()].n == 0
        assert all(a.sum() == 0 for a in s.tree.amaf_n)
    assert "prior_trials" not in cold.state_dict() and "prior_trials" in hot.state_dict()


def test_warm_search_finds_more_at_a_small_budget():
    # Four trials: a cold MCTS (untried choices at the lowest value) reaches the warm one's best by about six.
    def best(strategy: MCTS) -> float:
        found = 0.0
        for number in range(4):
            (plan,) = strategy.ask()
            m = synthetic_metrics(plan, SPACE, score)
            strategy.tell(make_trial(number, plan, m, OBJ, strategy))
            found = max(found, m.compression if m.retention >= 0.99 else 0.0)
        return found

    cold = [best(MCTS(SPACE, OBJ, seed=s)) for s in range(5)]
    hot = [best(warm(s)) for s in range(5)]
    assert np.median(hot) > np.median(cold)


def test_a_restored_warm_search_asks_what_the_uninterrupted_one_asks():
    whole = warm()
    expected = drive(whole, 0, 10)
    first = warm()
    head = drive(first, 0, 4)
    state = first.state_dict()
    resumed = MCTS(SPACE, OBJ, seed=0)  # a fresh process: the priors come from the state, not the store
    resumed.load_state_dict(state)
    assert head + drive(resumed, 4, 6) == expected
