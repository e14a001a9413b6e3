"""A certified curve (`confirm_floors`): every point holds at once, with probability >= the confidence.

Synthetic runs, no model: plans with known true retention (spread across the floors), scored on val images and on
fresh confirm images drawn from their true rates, the sequences planned on val at each floor as the runner plans
them (`pass_chance`, `plan_sequence`), then confirmed jointly. A run errs when any point it certifies (the smallest
plan held at a floor or above) is in truth under that floor.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelopt.certify.sequence import Candidate, LossShare, confirm_floors, pass_chance, plan_sequence
from modelopt.confidence import PairedCounts

CONF = 0.95
FLOORS = (0.995, 0.99, 0.98, 0.97)


def _draw(rng: np.random.Generator, n: int, acc: float, p_lost: float, p_gain: float) -> PairedCounts:
    """Counts of a plan with these true rates on n fresh images (float accuracy `acc`)."""
    base_right = int(rng.binomial(n, acc))
    lost = int(rng.binomial(base_right, min(p_lost / acc, 1.0)))
    gained = int(rng.binomial(n - base_right, min(p_gain / (1 - acc), 1.0)))
    return PairedCounts(n, base_right, lost, gained)


def _run(rng: np.random.Generator, floors: tuple[float, ...], joint: bool) -> tuple[bool, int]:
    """One synthetic run: (whether any certified point is false, how many floors got a point)."""
    acc, n_val, n_conf, k = 0.81, 2000, 3000, 16
    reduction = np.sort(rng.uniform(4.0, 16.0, k))
    true_ret = np.clip(1.002 - (reduction - 4.0) / 12.0 * 0.04 + rng.normal(0, 0.003, k), 0.94, 1.0)
    swaps = rng.uniform(0.02, 0.08, k)
    drop = (1 - true_ret) * acc
    gain = np.maximum((swaps - drop) / 2, 1e-4)
    truth = list(zip(gain + drop, gain, strict=True))
    vals = [_draw(rng, n_val, acc, *t) for t in truth]
    share = LossShare.fit(vals)
    assert share is not None
    planned = []
    for f in floors:
        chance = {i: pass_chance(share.shrunk(v), n_conf, round(acc * n_conf), CONF, f, shift=0.0)
                  for i, v in enumerate(vals)}
        order = plan_sequence([Candidate(float(reduction[i]), chance[i]) for i in range(k)])
        planned.append((f, [[], order], chance))
    drawn: dict[int, PairedCounts] = {}

    def passes(i: object, floor: float, level: float) -> bool:
        assert isinstance(i, int)
        if i not in drawn:
            drawn[i] = _draw(rng, n_conf, acc, *truth[i])
        return drawn[i].retention_lower(1 - level) >= floor

    if joint:
        verdicts = confirm_floors(planned, passes, 1 - CONF, primary=0.99)  # as a run weights them
    else:  # the naive curve: each floor at the full error rate, as k separate runs would claim it
        verdicts = [v for one in planned for v in confirm_floors([one], passes, 1 - CONF)]
    wrong, points = False, 0
    for f in floors:
        held = [int(c.item) for c, ok in verdicts if ok and c.floor >= f]  # type: ignore[call-overload]
        if not held:
            continue
        points += 1
        best = max(held, key=lambda i: reduction[i])
        wrong |= bool(true_ret[best] < f)
    return wrong, points


def _rate(runs: int, seed: int, joint: bool) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    results = [_run(rng, FLOORS, joint) for _ in range(runs)]
    return sum(w for w, _ in results) / runs, sum(p for _, p in results) / runs


@pytest.mark.slow
def test_every_point_of_a_curve_holds_at_once_with_the_runs_confidence() -> None:
    runs = 400
    rate, points = _rate(runs, seed=0, joint=True)
    # 400 runs: a rate of 5 % would show as at most about 8.3 % (three standard errors).
    assert rate <= (1 - CONF) + 3 * math.sqrt(0.05 * 0.95 / runs), rate
    assert points > 1.5  # most runs certify points at two floors or more: the test is not vacuous
    naive, _ = _rate(runs, seed=0, joint=False)
    assert naive > rate  # each floor at the full error rate errs more often: the split is what keeps the promise


def test_a_plan_held_at_a_higher_floor_is_the_point_of_the_lower_ones() -> None:
    verdicts = confirm_floors([(0.99, [[], ["a"]], {}), (0.98, [[], ["b"]], {})],
                              lambda item, floor, level: item == "a", 0.05)
    held = {(c.item, c.floor): ok for c, ok in verdicts}
    assert held == {("a", 0.99): True, ("b", 0.98): False}


def test_one_floor_is_the_one_floor_procedure() -> None:
    """With one floor the shares are the gate's and the search's, as a run without --floors tests them."""
    levels: list[float] = []

    def passes(item: object, floor: float, level: float) -> bool:
        levels.append(level)
        return True

    confirm_floors([(0.99, [["int8"], ["p1"]], {})], passes, 0.05)
    assert levels == pytest.approx([0.0125, 0.05])  # the gate at a quarter; once it held, the search at the whole
