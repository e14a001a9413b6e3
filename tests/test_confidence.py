"""The paired retention bound: coverage by simulation, monotonicity, and the point-estimate mode; the binomial
bounds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modelopt.confidence import PairedCounts, binom_lower, binom_upper, check_confidence, drop_lower, drop_upper
from modelopt.errors import ConfigError

# (n, P(lost), P(gained)): small and large splits, drops of 0-2 points, disagreement of 0.2-18 %.
SETTINGS = [(n, pl, pg) for n in (60, 200, 423, 2000)
            for pl, pg in ((0.005, 0.0), (0.01, 0.005), (0.02, 0.01), (0.03, 0.02), (0.05, 0.04), (0.1, 0.08),
                           (0.03, 0.03), (0.002, 0.002))]


@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_the_bounds_miss_rate_stays_within_one_minus_confidence(confidence: float) -> None:
    """Synthetic plans with a known drop: the upper bound falls below the true drop at most
    1 - confidence of the time (plus 3 standard errors of the simulation)."""
    rng = np.random.default_rng(0)
    trials = 1500
    worst = 0.0
    for n, pl, pg in SETTINGS:
        draws = rng.multinomial(n, [pl, pg, 1 - pl - pg], size=trials)
        miss = sum(drop_upper(int(b), int(c), n, confidence) < pl - pg for b, c, _ in draws) / trials
        worst = max(worst, miss)
        slack = 3 * math.sqrt((1 - confidence) * confidence / trials)
        assert miss <= 1 - confidence + slack, (n, pl, pg, miss)
    assert worst > (1 - confidence) / 4  # not vacuous: the bound is tight enough to be missed sometimes


def test_the_lower_bound_covers_too() -> None:
    rng = np.random.default_rng(1)
    n, pl, pg = 400, 0.03, 0.02
    draws = rng.multinomial(n, [pl, pg, 1 - pl - pg], size=2000)
    miss = sum(drop_lower(int(b), int(c), n, 0.95) > pl - pg for b, c, _ in draws) / 2000
    assert miss <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 2000)


def test_more_losses_or_fewer_images_give_a_looser_bound() -> None:
    assert drop_upper(4, 1, 400) > drop_upper(3, 1, 400) > drop_upper(3, 2, 400)
    assert drop_upper(3, 1, 200) > drop_upper(6, 2, 400) > drop_upper(30, 10, 4000)
    assert drop_upper(3, 1, 400, 0.99) > drop_upper(3, 1, 400, 0.95) > drop_upper(3, 1, 400, 0.9)
    assert drop_upper(3, 1, 400) > (3 - 1) / 400 > drop_lower(3, 1, 400)


def test_a_plan_that_agrees_everywhere_still_has_an_honest_bound() -> None:
    """Zero disagreement on n images does not prove zero drop: about 3.6 / n at 95 %."""
    assert 3.0 / 423 < drop_upper(0, 0, 423) < 4.0 / 423
    assert drop_upper(0, 0, 0) == 1.0


def test_retention_bounds_of_counts() -> None:
    c = PairedCounts(n=400, base_right=360, lost=6, gained=2)
    lo, hi = c.retention_bounds(0.95)
    assert c.retention == pytest.approx(356 / 360)
    assert lo < c.retention < hi
    assert c.retention_bounds(0.0) == (c.retention, c.retention)
    assert c.retention_lower(0.95) == lo
    assert all(math.isnan(r) for r in PairedCounts(10, 0, 0, 0).retention_bounds(0.95))  # no float-right image


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5, float("nan"), "high", 10**400])  # 10**400: no float holds it
def test_bad_confidence_is_one_clear_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="confidence"):
        check_confidence(bad)  # type: ignore[arg-type]


def test_upper_bound_with_no_successes_has_the_closed_form():
    # P(X = 0) = (1 - p)^n = delta  =>  p = 1 - delta^(1/n)
    for n in (5, 50, 400):
        assert binom_upper(0, n, 0.05) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-6)


def test_bounds_bracket_the_estimate_and_tighten_with_n():
    lo, hi = binom_lower(10, 100, 0.01), binom_upper(10, 100, 0.01)
    assert lo < 0.10 < hi
    lo2, hi2 = binom_lower(100, 1000, 0.01), binom_upper(100, 1000, 0.01)
    assert lo < lo2 < 0.10 < hi2 < hi
    assert binom_lower(0, 100, 0.01) == 0.0 and binom_upper(100, 100, 0.01) == 1.0


def test_upper_bound_covers_the_true_rate_at_the_stated_level():
    rng = np.random.default_rng(0)
    p, n, delta = 0.08, 120, 0.05
    ks = rng.binomial(n, p, size=2000)
    misses = np.mean([binom_upper(int(k), n, delta) < p for k in ks])
    assert misses <= delta  # Clopper-Pearson is conservative
    assert misses > 0.005  # ... but not vacuous


def test_a_bound_equal_to_the_floor_to_rounding_clears_it():
    from modelopt.confidence import FLOOR_SLACK, clears

    assert clears(0.99, 0.99) and clears(0.99 - FLOOR_SLACK / 2, 0.99) and clears(1.0, 0.99)
    assert not clears(0.99 - 2 * FLOOR_SLACK, 0.99) and not clears(float("nan"), 0.99)
