"""Multi-fidelity scoring: stop a plan on a subset once it is below the floor beyond doubt.

The float model's predictions on the whole val split are known before the search starts,
so the float model's number of correct answers B is exact. Only the plan's correct count
A on the images not yet scored is unknown. Over those images, the plan can only lose
answers the float model got right, or gain answers it got wrong:

    A_rest = B_rest - losses + gains

After scoring a (random, the split is shuffled) subset, the loss rate among images the
float model gets right has an exact binomial (Clopper-Pearson) lower bound, and the gain
rate among those it gets wrong an upper bound. Together they bound the plan's final
correct count from above; when even that bound misses the floor (A < floor x B) the
plan is infeasible beyond doubt, at confidence 1 - delta, and the rest of the split is
never scored. Sampling without replacement only tightens the binomial bounds, so they
stay conservative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from modelopt.confidence import PairedCounts, binom_lower, binom_upper
from modelopt.errors import ConfigError

DEFAULT_STAGES = (0.25, 0.5)
DEFAULT_DELTA = 0.01


@dataclass(frozen=True)
class Fidelity:
    """When to stop early: the val fractions after which to test, and the error allowed.

    Args:
        stages: increasing fractions of the val split (each in (0, 1)) after which the
            bound is checked; the split's remainder is scored only if every check passes.
        delta: probability, per check, of stopping a plan that is in fact feasible.
        dominated: also stop, after the first stage, a plan that cannot beat the best
            feasible plan found so far whatever its accuracy (its target value is known
            before scoring); its subset retention still informs the search.

    Example:
        >>> Fidelity().stages
        (0.25, 0.5)
    """

    stages: tuple[float, ...] = DEFAULT_STAGES
    delta: float = DEFAULT_DELTA
    dominated: bool = False

    def __post_init__(self) -> None:
        if any(not 0.0 < s < 1.0 for s in self.stages) or list(self.stages) != sorted(set(self.stages)):
            raise ConfigError(f"fidelity stages must be increasing fractions in (0, 1), got {list(self.stages)}")
        if not 0.0 < self.delta < 0.5:
            raise ConfigError(f"fidelity delta must be in (0, 0.5), got {self.delta}")

    def to_dict(self) -> dict[str, object]:
        return {"stages": list(self.stages), "delta": self.delta, "dominated": self.dominated}

    def cuts(self, n: int) -> list[int]:
        """Sample counts at which to check, for a split of n samples (always ending at n)."""
        return [*sorted({max(1, round(s * n)) for s in self.stages} - {n}), n]


def max_correct(plan_correct: int, base_right: int, lost: int, base_wrong: int, gained: int,
                base_right_rest: int, base_wrong_rest: int, delta: float) -> float:
    """Upper confidence bound (level 1 - delta) on the plan's correct answers over the whole split.

    Args:
        plan_correct: the plan's correct answers on the scored samples.
        base_right: scored samples the float model got right; `lost` of them the plan got wrong.
        base_wrong: scored samples the float model got wrong; `gained` of them the plan got right.
        base_right_rest: samples not yet scored that the float model gets right.
        base_wrong_rest: samples not yet scored that the float model gets wrong.
        delta: total error probability, split between the two rate bounds.
    """
    loss_lo = binom_lower(lost, base_right, delta / 2)
    gain_hi = binom_upper(gained, base_wrong, delta / 2)
    return plan_correct + base_right_rest * (1.0 - loss_lo) + base_wrong_rest * gain_hi


def best_case(stage: PairedCounts, base_right_rest: int, base_wrong_rest: int, delta: float) -> PairedCounts:
    """The paired counts over the whole split in the best case, at level 1 - delta, for the rest.

    The images scored so far keep their losses; on the rest the plan loses nothing more and
    gains on the float model's wrong answers at the Clopper-Pearson upper bound of its gain
    rate so far. A plan whose retention bound misses the floor even with these counts will,
    with probability at least 1 - delta, not be certified feasible on the whole split.
    """
    gain_hi = binom_upper(stage.gained, stage.n - stage.base_right, delta)
    gains = math.floor(base_wrong_rest * gain_hi)
    return PairedCounts(stage.n + base_right_rest + base_wrong_rest, stage.base_right + base_right_rest,
                        stage.lost, stage.gained + gains)
