"""What the search minimises, under a floor on accuracy retention, and the Pareto front."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from modelopt.confidence import DEFAULT_CONFIDENCE, PairedCounts, check_confidence, clears
from modelopt.data.split import Split
from modelopt.errors import ConfigError, beyond_float
from modelopt.evaluation.metrics import Metrics
from modelopt.plan.plan import Plan
from modelopt.plan.space import SearchSpace

# Val standard errors (of a plan's net loss) by which a plan the search picked is assumed luckier on val
# than it is. The largest of k independent near-floor estimates sits about sqrt(2 ln k) errors high, but
# a search's plans share most of their layers, so the effective k is small; one error is a middle course,
# near what the default run's val-feasible plans lost on confirm (measured: docs/certification.md#measured).
SELECTION_SHIFT = 1.0


class Target(str, Enum):
    SIZE = "size"
    BITOPS = "bitops"
    MACS = "macs"
    LATENCY = "latency"  # measured per plan (modelopt.latency.plan), in ms

    @classmethod
    def parse(cls, value: object) -> Target:
        """The target named `value` (a Target or its name); ConfigError listing the valid names."""
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(t.value for t in cls)
            raise ConfigError(f"unknown objective {value!r}; valid: {valid}") from None


@dataclass(frozen=True)
class Objective:
    """Minimise `target` subject to retention >= `min_retention`, with confidence `confidence`.

    A plan meets the floor when a one-sided lower confidence bound on its retention (from the
    images where it and the float model disagree, `modelopt.confidence`) is at or above the
    floor; `confidence=0` uses the point estimate. The bound is on retention itself: images the plan
    fixes offset those it breaks (`count_gains=False` bounds the stricter share of the float model's
    right answers kept, the rule before images that did not select a plan confirmed it). The reward
    is the reduction factor on the target (float value / plan value) when the plan meets the floor,
    always >= 0 for a plan no larger than float; otherwise it scores retention_lower - min_retention - 1, below every
    plan that meets it.

    Example:
        >>> Objective("size", min_retention=0.99, confidence=0.95).reward(metrics)
    """

    target: Target = Target.SIZE
    min_retention: float = 0.99
    confidence: float = DEFAULT_CONFIDENCE
    # Whether images a plan fixes (the float model wrong, the plan right) offset images it breaks in
    # the bound that decides feasibility. On: retention counts them, so the bound must too (bounding
    # breaks only throws away half the evidence; measured: docs/certification.md#measured). The luck a search
    # harvests from gains on the images that select it is handled where it arises: confirmation on images that
    # did not (`modelopt.certify.confirm`).
    count_gains: bool = True
    # The size of the split claims are confirmed on (None: none). The search's bound on a val plan is
    # then taken at its val rates on that many images: it looks for plans that confirmation would certify
    # (the claim is made there, on images that did not select it), not for what val alone would certify.
    # A plan's own val rates are unbiased; the luck of the best of many (SELECTION_SHIFT) is priced where
    # plans are selected, in each finalist's chance to pass (`modelopt.certify.sequence.pass_chance`): shifting
    # every plan by it made the search judge a uniform INT4 that confirmation certifies infeasible on the
    # bundled default, and aim ever lower (measured: docs/certification.md#measured).
    claim_images: int | None = None
    # The floors of a certified curve (`--floors`): the run certifies its best plan at each, jointly
    # (`modelopt.certify.confirm`); the search works at the lowest (`search`), and `min_retention` is the floor
    # of the reported plan, one of them. Empty: one floor, `min_retention`.
    floors: tuple[float, ...] = ()

    @property
    def curve(self) -> tuple[float, ...]:
        """The floors certified, highest first (`(min_retention,)` for a one-floor run)."""
        return self.floors or (self.min_retention,)

    def at(self, floor: float) -> Objective:
        """This objective at one floor of its curve (a one-floor objective)."""
        return dataclasses.replace(self, min_retention=floor, floors=())

    @property
    def search(self) -> Objective:
        """What the search works towards: the lowest floor of the curve, so that plans for every floor are
        scored in full and reach the front (a plan under the search's floor stops early and is never a finalist)."""
        return self if not self.floors else self.at(min(self.floors))

    def anchors(self, space: SearchSpace) -> tuple[Plan, ...]:
        """The no-search answers every run scores beside its search, on the same images, and confirms first:
        the uniform plans (`SearchSpace.anchors`: INT8, INT4, INT3); for latency also the float model (a
        compressed plan slower than it is no answer) and uniform INT8 with quantized inputs where the menus
        offer it (integer kernels); otherwise also INT4 with its most sensitive layers at INT8
        (`SearchSpace.hedges`). A search that reports less than a confirmed anchor has failed."""
        plans = list(space.anchors())
        if self.target is Target.LATENCY and space.decisions:
            plans = [space.plan(), *plans, *space.anchors((8,), act_bits=8)]
        elif len(plans) > 1:  # the steps between INT4 and INT8: a failing INT4 falls back one step
            plans += space.hedges(plans[1])
        return tuple(dict.fromkeys(plans))

    def __post_init__(self) -> None:
        object.__setattr__(self, "target", Target.parse(self.target))
        if (not isinstance(self.min_retention, (int, float)) or isinstance(self.min_retention, bool)
                or not 0.0 <= self.min_retention <= 1.0):
            raise ConfigError(f"min_retention must be a fraction in [0, 1] like 0.99 (a compressed model cannot "
                              f"be certified above its float accuracy), got {self.min_retention!r}")
        object.__setattr__(self, "confidence", check_confidence(self.confidence))
        object.__setattr__(self, "floors", check_floors(self.floors))
        if self.floors and self.min_retention not in self.floors:
            raise ConfigError(f"min_retention {self.min_retention:g} is not one of the floors "
                              f"{', '.join(f'{f:g}' for f in self.floors)}: the reported plan is the curve's point "
                              "at min_retention; add it to the floors")
        if self.claim_images is not None and (not isinstance(self.claim_images, int) or self.claim_images < 1):
            raise ConfigError(f"claim_images must be a positive number of images or None, got {self.claim_images!r}")

    def value(self, m: Metrics) -> float:
        if self.target is Target.LATENCY:
            return math.inf if m.latency_ms is None else float(m.latency_ms)
        return float({Target.SIZE: m.size_bytes, Target.BITOPS: m.bitops, Target.MACS: m.macs}[self.target])

    def reference(self, m: Metrics) -> float:
        """The uncompressed model's value of the target."""
        ref = {Target.SIZE: m.float_size_bytes, Target.BITOPS: m.float_bitops or m.macs * 32 * 32,
               Target.MACS: m.float_macs or m.macs, Target.LATENCY: m.float_latency_ms or math.nan}
        return float(ref[self.target])

    def retention_lower(self, m: Metrics) -> float:
        """Retention that holds with probability `confidence` on images like the scored ones (the
        point estimate at confidence 0); without `count_gains`, gains do not offset losses."""
        c = m.counts()
        if c is None or self.confidence <= 0:
            return m.retention
        return self.bounded(c, search=m.split == Split.VAL).retention_lower(self.confidence)

    def bounded(self, c: PairedCounts, search: bool = True) -> PairedCounts:
        """The counts the bound is taken on: without `count_gains` gains do not count; a search's counts
        (`search`: scored on val), when the run confirms claims, at their rates on `claim_images` images."""
        if not self.count_gains:
            c = PairedCounts(c.n, c.base_right, c.lost, 0)
        if not (search and self.claim_images):
            return c
        return c.scaled(self.claim_images)

    def point_retention(self, m: Metrics) -> float:
        """What a strategy should model: under a confidence bound, 1 - lost / base_right (the share of
        the float model's right answers the plan keeps: breaks add up over layers, while which images
        a plan happens to fix is mostly noise); at confidence 0, plain retention (the point estimate
        the floor judges). `allowed_drop` says how much of that loss the floor allows."""
        c = m.counts()
        if c is None or c.base_right <= 0 or self.confidence <= 0:
            return m.retention
        return 1.0 - c.lost / c.base_right

    def allowed_drop(self, n: int, base_right: int, gain_ratio: float = 0.0) -> float:
        """The largest loss (1 - `point_retention`) still certified at the floor on a split of `n`
        images the float model gets `base_right` of, for a plan that fixes `gain_ratio` images for
        every one it breaks (counted only with `count_gains`). 1 - min_retention at confidence 0; 0
        when even a plan that breaks nothing is not certified.

        Example:
            >>> Objective("size", 0.99, 0.95).allowed_drop(2000, 1620, gain_ratio=0.8)
        """
        if self.confidence <= 0 or base_right <= 0:
            return 1.0 - self.min_retention
        ratio = max(gain_ratio, 0.0)
        lost = -1
        for k in range(base_right + 1):  # the bound falls as k grows: the last k that passes (as the search judges)
            c = PairedCounts(n, base_right, k, min(round(ratio * k), n - base_right))
            if not clears(self.bounded(c).retention_lower(self.confidence), self.min_retention):
                break
            lost = k
        return max(lost, 0) / base_right

    def meets_floor(self, m: Metrics) -> bool:
        """The retention bound at or above the floor, on whatever samples `m` was scored."""
        r = self.retention_lower(m)
        return not math.isnan(r) and clears(r, self.min_retention)

    def feasible(self, m: Metrics) -> bool:
        """Meets the floor on the whole split: a plan scored only on a subset never counts."""
        return m.stopped is None and self.meets_floor(m)

    def reduction(self, m: Metrics) -> float:
        """The reduction factor on the target: the uncompressed model's value over the plan's."""
        return self.reference(m) / max(self.value(m), 1e-12)

    def reward(self, m: Metrics) -> float:
        """What strategies maximise; for a plan scored on a subset, its estimate from that subset."""
        if self.meets_floor(m):
            return self.reduction(m)
        r = self.retention_lower(m)
        return (0.0 if math.isnan(r) else r) - self.min_retention - 1.0


def check_floors(floors: object) -> tuple[float, ...]:
    """The floors of a curve, highest first, each once; ConfigError naming a value that is no fraction in (0, 1].

    Example:
        >>> check_floors([0.97, 0.99, 0.98])
        (0.99, 0.98, 0.97)
    """
    if isinstance(floors, (int, float)) and not isinstance(floors, bool):
        floors = (floors,)
    if not isinstance(floors, (list, tuple)):
        raise ConfigError(f"floors must be a list of retention floors like 0.995,0.99,0.98, got {floors!r}")
    for f in floors:
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0.0 < f <= 1.0:
            shown = f"an integer of {int(math.log10(abs(f))) + 1} digits" if beyond_float(f) else repr(f)
            raise ConfigError(f"floor {shown} is not a retention floor: each must be a fraction in (0, 1] like 0.98")
    return tuple(sorted({float(f) for f in floors}, reverse=True))


T = TypeVar("T")


def pareto_front(items: Iterable[T], key: Callable[[T], Metrics], objective: Objective) -> list[T]:
    """Items not dominated in (higher retention bound, lower target value), by ascending target value.

    Retention is the objective's lower confidence bound (the point estimate at confidence 0).
    """
    # NaN retention is never on the front, and left in the sort it can misorder equal-size items.
    # Plans scored only on a subset (multi-fidelity) are left out: their retention is an estimate.
    items = list(items)
    lower = {id(it): objective.retention_lower(key(it)) for it in items if key(it).stopped is None}
    pts = sorted((it for it in items if id(it) in lower and not math.isnan(lower[id(it)])),
                 key=lambda it: (objective.value(key(it)), -lower[id(it)]))
    front: list[T] = []
    best_ret = -math.inf
    for it in pts:
        r = lower[id(it)]
        if r > best_ret:
            front.append(it)
            best_ret = r
    return front


def best_of(items: Sequence[T], key: Callable[[T], Metrics], objective: Objective) -> T | None:
    """The feasible item with the highest reward (ties: higher retention), or None."""
    feasible = [it for it in items if objective.feasible(key(it))]
    if not feasible:
        return None
    return max(feasible, key=lambda it: (objective.reward(key(it)), objective.retention_lower(key(it))))
