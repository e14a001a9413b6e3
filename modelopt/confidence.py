"""How sure a retention figure is: paired confidence bounds on a plan's accuracy drop.

A plan and the float model answer the same images, so their accuracies are paired. On n
scored images, count those only the float model gets right (`lost`) and those only the plan
gets right (`gained`); every other image moves neither accuracy. The drop in accuracy is

    delta = P(lost) - P(gained),   estimated by (lost - gained) / n,

and all of its uncertainty lives in those two counts: a plan that agrees with the float
model on every image has no uncertainty about its drop at all, while one that disagrees on
forty images of four hundred can hide a two-point drop behind a zero point estimate.

The one-sided upper bound is Tango's score bound for a difference of paired proportions
(Tango 1998, the interval McNemar's test inverts), with a continuity correction of half an
image. The plain score bound's miss rate drifts a little above its nominal level for small
counts; with the correction it stays at or below nominal over the sizes, drops and disagreement
simulated (measured: docs/certification.md#measured; `tests/test_confidence.py` re-checks it).

Retention is accuracy / float accuracy on the same images, so a bound on the drop is a
bound on retention: retention >= 1 - drop_upper / float_accuracy.

A rate of one kind of answer (the share of images a plan changes, the share of the float model's right
answers it breaks) has exact one-sided binomial bounds (Clopper-Pearson, `binom_upper` and `binom_lower`):
multi-fidelity scoring stops a plan with them (`modelopt.evaluation.fidelity`) and confirmation bounds the
agreement of a plan scored without labels (`modelopt.certify.confirm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

from modelopt.errors import TOO_LARGE, ConfigError

__all__ = ["DEFAULT_CONFIDENCE", "FLOOR_SLACK", "PairedCounts", "binom_lower", "binom_upper", "check_confidence",
           "clears", "drop_lower", "drop_upper", "most_changed"]

DEFAULT_CONFIDENCE = 0.95
_CONTINUITY = 0.5  # half an image: keeps the score bound's miss rate at or under nominal


def check_confidence(confidence: float) -> float:
    """`confidence` as a float in [0, 1): 0 means point estimates (no bound)."""
    try:  # a bool or a string would pass float() (True is 1, "0.9" is 0.9): neither is a confidence
        if isinstance(confidence, (bool, str)):
            raise TypeError
        c = float(confidence)
    except (TypeError, ValueError):
        raise ConfigError(f"confidence must be a number in [0, 1) like 0.95; got {confidence!r}") from None
    except OverflowError:  # `beyond_float`
        raise ConfigError(f"confidence must be in [0, 1) like 0.95; got {TOO_LARGE}") from None
    if not 0.0 <= c < 1.0 or math.isnan(c):
        raise ConfigError(f"confidence must be in [0, 1) (0.95: a 95 % one-sided bound; 0: point estimates); "
                          f"got {confidence!r}")
    return c


@dataclass(frozen=True)
class PairedCounts:
    """What a plan and the float model got right on the same `n` images.

    Attributes:
        n: images scored.
        base_right: images the float model gets right.
        lost: images only the float model gets right.
        gained: images only the plan gets right.
    """

    n: int
    base_right: int
    lost: int
    gained: int

    @property
    def plan_right(self) -> int:
        return self.base_right - self.lost + self.gained

    @property
    def retention(self) -> float:
        return self.plan_right / self.base_right if self.base_right else math.nan

    def retention_bounds(self, confidence: float) -> tuple[float, float]:
        """One-sided (lower, upper) retention bounds, each at `confidence` (0: the point estimate)."""
        if self.base_right == 0:
            return math.nan, math.nan
        if confidence <= 0.0:
            return self.retention, self.retention
        acc = self.base_right / self.n
        return (1.0 - drop_upper(self.lost, self.gained, self.n, confidence) / acc,
                1.0 - drop_lower(self.lost, self.gained, self.n, confidence) / acc)

    def retention_lower(self, confidence: float) -> float:
        """Retention that holds with probability `confidence` on unseen images like these."""
        return self.retention_bounds(confidence)[0]

    def scaled(self, n: int) -> PairedCounts:
        """These rates on `n` images (each count scaled and rounded): what the same plan would show on a
        split of that size, if its rates held there."""
        if self.n <= 0 or n == self.n:
            return self
        f = n / self.n
        return PairedCounts(n, round(self.base_right * f), round(self.lost * f), round(self.gained * f))


def _score(lost: int, gained: int, n: int, delta: float, continuity: float) -> float:
    """Tango's score statistic for H0: P(lost) - P(gained) = delta (continuity-corrected toward H0)."""
    a = 2.0 * n
    b = -lost - gained + (2.0 * n - lost + gained) * delta
    c = -gained * delta * (1.0 - delta)
    p_gain = (-b + math.sqrt(max(b * b - 4.0 * a * c, 0.0))) / (2.0 * a)  # restricted MLE of P(gained)
    var = n * (2.0 * p_gain + delta * (1.0 - delta))
    num = lost - gained + continuity - n * delta
    if var <= 0.0:
        return math.inf if num > 0 else -math.inf
    return num / math.sqrt(var)


@lru_cache(maxsize=65536)
def drop_upper(lost: int, gained: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """One-sided upper confidence bound on the accuracy drop P(lost) - P(gained).

    Args:
        lost: images only the float model gets right.
        gained: images only the plan gets right.
        n: images scored (all of them, agreeing ones included).
        confidence: e.g. 0.95; the bound is missed with probability at most 1 - confidence.

    Returns:
        The bound, in accuracy points as a fraction (0.01 = one point), at most 1.

    Example:
        >>> round(drop_upper(3, 1, 400), 4)  # 2 images net on 400: up to 1.29 points
        0.0129
    """
    if n <= 0:
        return 1.0
    z = NormalDist().inv_cdf(confidence)
    lo, hi = (lost - gained) / n, 1.0
    if _score(lost, gained, n, hi, _CONTINUITY) > -z:
        return 1.0
    for _ in range(60):  # bisection: the statistic falls as delta grows
        mid = (lo + hi) / 2
        if _score(lost, gained, n, mid, _CONTINUITY) > -z:
            lo = mid
        else:
            hi = mid
    return hi


def drop_lower(lost: int, gained: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """One-sided lower confidence bound on the accuracy drop (the upper bound with roles swapped)."""
    return -drop_upper(gained, lost, n, confidence)


# Retention figures are ratios of counts in floating point: a bound that equals the floor to rounding clears it.
FLOOR_SLACK = 1e-12


def clears(value: float, floor: float) -> bool:
    """Whether a retention (or its bound) `value` meets `floor`, to floating-point rounding: every comparison of
    a retention with the floor goes through here."""
    return value >= floor - FLOOR_SLACK


def most_changed(n: int, base_right: int, confidence: float, floor: float) -> float:
    """The largest share of `n` images a plan may change (as many fixed as broken) and still be certified
    at `floor`: what a split of that size can tell apart (0 when even a plan that changes nothing fails).

    Example:
        >>> round(most_changed(3000, 2430, 0.95, 0.99), 3)  # 3,000 images at 81 % float accuracy
        0.068
    """
    def passes(d: int) -> bool:
        return clears(PairedCounts(n, base_right, (d + 1) // 2, d // 2).retention_lower(confidence), floor)

    if n <= 0 or not passes(0):
        return 0.0
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return (hi if passes(hi) else lo) / n


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n is at most a few thousand)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    m = max(terms)
    return min(1.0, math.exp(m) * sum(math.exp(t - m) for t in terms))


@lru_cache(maxsize=65536)
def binom_upper(k: int, n: int, delta: float) -> float:
    """Clopper-Pearson one-sided upper bound: the largest p with P(X <= k | n, p) >= delta."""
    if n == 0 or k >= n:
        return 1.0
    lo, hi = k / n, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if _binom_cdf(k, n, mid) >= delta:
            lo = mid
        else:
            hi = mid
    return lo


def binom_lower(k: int, n: int, delta: float) -> float:
    """Clopper-Pearson one-sided lower bound: the smallest p with P(X >= k | n, p) >= delta."""
    if n == 0 or k <= 0:
        return 0.0
    return 1.0 - binom_upper(n - k, n, delta)
