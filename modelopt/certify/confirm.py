"""Confirmation: the images that select a plan are not the images that vouch for it.

The search scores hundreds of plans on val and keeps the best; near the floor the winner is
partly the plan whose val images were kindest (the winner's curse). So before any claim the
finalists (the plans of the Pareto fronts, the search's best, and the uniform anchors every run
scores) are re-scored on the confirm split, which the search never saw, and a plan is *confirmed* when
its retention bound there clears the floor.

Finalists are tested in two fixed sequences planned on val alone (`modelopt.certify.sequence`): the anchors
likely to pass (INT8, INT4 where it holds), and, from the least to the most compressed, the subsequence of
the search's plans and the most compressed anchor with the largest expected reported compression given
each plan's predicted chance to pass. Each sequence stops at its first failure; the two share the error rate, and a
sequence whose every claim held hands its share to the other (`confirm_chains`). That keeps the chance
of confirming any plan that is in truth below the floor within 1 - confidence without a correction for
the number of finalists, and the reported best is the smallest plan confirmed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from modelopt.certify.evidence import certifiable_retention
from modelopt.certify.sequence import (
    ANCHOR_PASS,
    SELECTION_SHIFT,
    Candidate,
    LossShare,
    confirm_floors,
    pass_chance,
    plan_sequence,
)
from modelopt.confidence import PairedCounts, binom_upper, clears
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.fitted import Fitted
from modelopt.evaluation.metrics import Metrics
from modelopt.evaluation.trial import Trial
from modelopt.objective import Objective, best_of, pareto_front
from modelopt.plan.plan import Plan

__all__ = ["Confirmation", "Finalists", "confirm_plans", "finalists"]

T = TypeVar("T")
MAX_RESCORED = 16  # Pareto plans re-scored on confirm and test (spread along the front)
# A timed run's gate: its most compressed likely anchors (INT4 and the hedge below it; INT8 and the rest are rarely
# the answer, and each claim is a pass over the confirm split, 5-6 s on the default run).
TIMED_GATE = 2


@dataclass(frozen=True)
class Finalists:
    """The search's own pick on val, its Pareto front (by the val retention bound, at most
    `MAX_RESCORED` plans spread along it), the plans among them that go to confirmation, and the
    anchors (uniform plans, `SearchSpace.anchors`) among the trials."""

    search_best: Trial | None
    front: tuple[Trial, ...]
    candidates: tuple[Trial, ...]
    anchors: tuple[Trial, ...] = ()


def _spread(items: list[T], k: int) -> list[T]:
    """At most k items spread evenly along the list (its ends kept)."""
    if len(items) <= k:
        return items
    return [items[i] for i in sorted({round(i * (len(items) - 1) / (k - 1)) for i in range(k)})]


def finalists(trials: list[Trial], objective: Objective, anchors: Sequence[str] = ()) -> Finalists:
    """What a finished search hands to confirmation: its best, and the plans of two fronts.

    The retention front (size against the val retention bound) holds the plans val rates best; the
    agreement front (size against the val agreement bound, the share of images whose prediction the
    plan keeps) holds those that change fewest predictions. A plan whose val retention rests on
    gains (images it fixes that the float model got wrong) offsetting losses is often lucky on a few
    hundred images; one that changes few predictions carries over to new images, so both go on.
    """
    ok = [t for t in trials if t.ok]
    best = best_of(ok, _scored, objective)
    front = _spread(pareto_front(ok, _scored, objective), MAX_RESCORED)
    agree = _spread(pareto_front(ok, lambda t: _as_agreement(_scored(t), objective.confidence),
                                 Objective(objective.target, 0.0, 0.0)), MAX_RESCORED)
    # Every plan of either front goes on, val-feasible or not: whether one is worth testing is its predicted
    # chance to pass on confirm (`modelopt.certify.sequence.pass_chance`), which the sequence weighs; a val bound
    # judged at the confirm split's size and one val error lucky leaves out plans that pass there half the time.
    scored = [t for t in ([best] if best else []) + front + agree
              if t.metrics is not None and t.metrics.stopped is None]
    keys = set(anchors)
    anchor_trials = tuple(t for t in ok if t.plan.key in keys)
    return Finalists(best, tuple(front), tuple(dict.fromkeys(scored)), anchor_trials)


def _as_agreement(m: Metrics, confidence: float) -> Metrics:
    """`m` with its retention replaced by a lower bound on its agreement (for the agreement front)."""
    changed = round((1.0 - m.agreement) * m.n_samples)
    low = 1.0 - binom_upper(changed, m.n_samples, 1.0 - confidence) if confidence > 0 else m.agreement
    return dataclasses.replace(m, retention=low, base_right=None, lost=None, gained=None)


@dataclass(frozen=True)
class Confirmation:
    """What the confirm split said about the search's finalists.

    Attributes:
        split: the split that vouched (CONFIRM), or None when the data have none (the best
            plan is then the search's, unconfirmed).
        finalists: each finalist and its confirm metrics, in the order first tested.
        confirmed: how many finalists were confirmed (`verdicts`).
        best: the smallest confirmed plan (None when none was, or when there is no confirm split).
        ceiling: the retention bound a plan that agrees with the float model on every confirm
            image would get: below the floor, the split is too small to confirm anything, and
            nothing was re-scored (the run then reports its best as certified on val only).
    """

    split: str | None
    finalists: tuple[tuple[Trial, Metrics], ...]
    confirmed: int
    best: Trial | None
    ceiling: float | None
    floor: float = 0.0
    chances: tuple[float, ...] = ()  # each tested finalist's predicted chance to pass, from val
    verdicts: tuple[bool, ...] = ()  # each tested finalist's: confirmed or not
    # Each tested finalist's confirm metrics as the search composed it, before it was reconstructed and confirmed:
    # the best's only, when it was reconstructed here (None: another finalist, or not reconstructed; a finalist's
    # `finalists` metrics are the composed plan's own when it was not reconstructed).
    composed: tuple[Metrics | None, ...] = ()
    # The reconstruction each tested finalist ran with, by plan key (absent: it ran as composed): every later
    # score, deployment and export of that plan runs it so (`realise`).
    fitted: dict[str, Fitted] = dataclasses.field(default_factory=dict)
    # Every claim tested, in order: (plan key, floor, held). A one-floor run's are its finalists' verdicts; a
    # curve's (`Objective.floors`) test each floor's own sequences, and the per-plan fields above then say
    # whether the plan holds at the reported floor (a claim held at a higher floor holds there too).
    claims: tuple[tuple[str, float, bool], ...] = ()
    # The smallest plan certified at each floor of the curve, highest floor first (None: none was, or the confirm
    # split is too small to certify that floor); one point, the best's, for a one-floor run.
    curve: tuple[tuple[float, Trial | None], ...] = ()

    def held_at(self, floor: float) -> set[str]:
        """The plans certified at `floor`: a claim of theirs held at it or at a higher floor."""
        return {key for key, f, ok in self.claims if ok and f >= floor}

    def realise(self, evaluator: Evaluator, plan: Plan) -> Realised:
        """`plan` as it was confirmed: with the reconstruction it ran with here, else as composed."""
        return evaluator.realise(plan, self.fitted.get(plan.key))

    @property
    def usable(self) -> bool:
        """Whether the confirm split exists and is large enough to confirm a plan at the floor."""
        return self.split is not None and self.ceiling is not None and clears(self.ceiling, self.floor)


def confirm_plans(evaluator: Evaluator, objective: Objective, finalists: list[Trial],
                  anchors: Sequence[Trial] = (), population: Sequence[Trial] = (),
                  refit: Callable[[Plan], Fitted | None] | None = None, max_claims: int | None = None
                  ) -> Confirmation:
    """Re-scores finalists on the confirm split and confirms them in two fixed sequences planned on val.

    Args:
        evaluator: scores plans (its workload must hold a confirm split, else nothing is re-scored).
        objective: the floor, the confidence, and the target that orders the finalists.
        finalists: plans the search found (any order; duplicates by plan key are dropped).
        anchors: the uniform plans the run scored (`SearchSpace.anchors`), pre-specified and so not
            discounted for selection; those likely to pass are always tested.
        population: every trial of the run; with three or more scored on all of val, each finalist's share
            of broken answers is shrunk toward theirs (`LossShare`) before its chance to pass is predicted,
            in place of a fixed selection shift.
        refit: the reconstruction a plan runs with (`modelopt.reconstruct.store.Refits`, fitting it when there is
            none), called on each finalist before it is confirmed: what is confirmed is what is then tested and
            exported (`Confirmation.fitted`). The confirmed best, when it runs reconstructed, is also scored on
            confirm as composed, for the record only (`Confirmation.composed`).
        max_claims: the most claims each floor's search sequence tests (a timed run's; at least one), whose gate
            then keeps its `TIMED_GATE` most compressed anchors. None: no limit.

    Example:
        >>> c = confirm_plans(ev, Objective("size", 0.99, 0.95), finalists, anchors)
        >>> c.best.number if c.best else None
    """
    if Split.CONFIRM not in evaluator.workload.splits:
        return Confirmation(None, (), 0, None, None, objective.min_retention)
    ceiling = certifiable_retention(evaluator.workload, Split.CONFIRM, objective.confidence)
    if not clears(ceiling, objective.min_retention):
        return Confirmation(Split.CONFIRM, (), 0, None, ceiling, objective.min_retention)
    floors = [f for f in objective.curve if clears(ceiling, f)]  # a floor the split cannot certify is not tested
    primary = objective.min_retention
    planned, by_key = _plan_floors(evaluator, objective, floors, finalists, anchors, population, max_claims)
    scored: dict[str, Metrics] = {}  # by plan key: a plan is scored (and refitted) once, whatever its floors
    fitted: dict[str, Fitted] = {}  # plan key -> the reconstruction it was confirmed with
    # The likely anchors' sequence (the gate) is the fallback the search's plans must beat: its plans are confirmed
    # as composed, and only a plan that can become the answer in the search's sequence is refitted (a refit cost
    # 12-13 s on the default run, two of them for the gate's INT8 and INT4).
    refitted = {key for _, chains, _ in planned for key in chains[-1]}

    def passes(key: Hashable, floor: float, level: float) -> bool:
        assert isinstance(key, str)
        if key not in scored:
            scored[key] = _on_confirm(evaluator, by_key[key].plan, refit if key in refitted else None, fitted)
        return _clears(objective.at(floor), scored[key], level)

    verdicts = confirm_floors(planned, passes, 1.0 - objective.confidence if objective.confidence > 0 else 1.0,
                              primary=objective.min_retention)
    record = tuple((str(c.item), c.floor, ok) for c, ok in verdicts)
    tested = list({key: by_key[key] for key, _, _ in record}.values())  # each plan once, in the order first tested
    chance: dict[str, float] = {}
    for c, _ in verdicts:  # its chance at the reported floor, else at the first floor it was tested at
        if str(c.item) not in chance or c.floor == primary:
            chance[str(c.item)] = c.chance

    def held_at(floor: float) -> set[str]:  # a claim held at a floor holds at every lower one
        return {key for key, f, ok in record if ok and f >= floor}

    def best_at(floor: float) -> Trial | None:
        held = held_at(floor)
        return min((t for t in tested if t.plan.key in held),
                   key=lambda t: (objective.value(_scored(t)), -objective.retention_lower(_scored(t))), default=None)

    held_primary = held_at(primary)
    best = best_at(primary)
    composed = _best_as_composed(evaluator, tested, fitted, best)
    return Confirmation(Split.CONFIRM, tuple((t, scored[t.plan.key]) for t in tested), len(held_primary), best,
                        ceiling, primary, tuple(chance[t.plan.key] for t in tested),
                        tuple(t.plan.key in held_primary for t in tested), composed, fitted, record,
                        tuple((f, best_at(f) if f in floors else None) for f in objective.curve))


Planned = tuple[float, Sequence[Sequence[Hashable]], Mapping[Hashable, float]]  # a floor, its chains, the chances


def _plan_floors(evaluator: Evaluator, objective: Objective, floors: Sequence[float], finalists: list[Trial],
                 anchors: Sequence[Trial], population: Sequence[Trial], max_claims: int | None
                 ) -> tuple[list[Planned], dict[str, Trial]]:
    """Each floor's two sequences (in `floors`' order), planned on val at that floor, and the trials they name.

    A timed curve's search sequences share the claims the time affords: each distinct plan is refitted and scored
    once whatever its floors, so the cap is on distinct plans over all floors. The reported floor's are planned
    first, then the lower floors' (where a new plan gains most), then the higher ones' (the gate's anchors give a
    point there)."""
    by_key: dict[str, Trial] = {}
    at: dict[float, Planned] = {}
    left, chosen, primary = max_claims, set[str](), objective.min_retention
    for f in sorted(floors, key=lambda f: (f != primary, f > primary, abs(f - primary))):
        candidates, chains = _planned(evaluator, objective.at(f), finalists, anchors, population, max_claims,
                                      curve=len(floors) > 1)
        if left is not None and len(floors) > 1:
            chains[-1] = _within(chains[-1], chosen, left)
            left -= len({t.plan.key for t in chains[-1]} - chosen)
            chosen |= {t.plan.key for t in chains[-1]}
        by_key.update((t.plan.key, t) for chain in chains for t in chain)
        at[f] = (f, [[t.plan.key for t in chain] for chain in chains], {key: c.chance for key, c in candidates.items()})
    return [at[f] for f in floors], by_key


def _planned(evaluator: Evaluator, objective: Objective, finalists: list[Trial], anchors: Sequence[Trial],
             population: Sequence[Trial], max_claims: int | None = None, curve: bool = False
             ) -> tuple[dict[str, Candidate], list[list[Trial]]]:
    """Each finalist as the sequence planner sees it (by plan key), and the two fixed sequences, from val alone."""
    data = evaluator.workload.split(Split.CONFIRM)
    n, base_right = len(data), int(data.base_correct.sum())
    anchor_keys = {t.plan.key for t in anchors}
    pool = [t for t in [*anchors, *finalists] if t.metrics is not None and t.metrics.stopped is None]
    unique = list({t.plan.key: t for t in pool}.values())
    share = LossShare.fit([c for t in population if (c := _full_val(t)) is not None])
    candidates = {t.plan.key: _candidate(t, t.plan.key in anchor_keys, objective, n, base_right, share)
                  for t in unique}
    return candidates, _chains(unique, candidates, anchor_keys, max_claims, curve)


def _within(chain: list[Trial], chosen: set[str], left: int) -> list[Trial]:
    """`chain` up to the claim that would bring a plan beyond the `left` new ones (those not in `chosen`; at least
    one plan in all): a truncated fixed sequence is still one, planned on val alone."""
    out: list[Trial] = []
    new: set[str] = set()
    for t in chain:
        if t.plan.key not in chosen and t.plan.key not in new:
            if len(new) >= left and (out or chosen):
                break
            new.add(t.plan.key)
        out.append(t)
    return out


def _on_confirm(evaluator: Evaluator, plan: Plan, refit: Callable[[Plan], Fitted | None] | None,
                fitted: dict[str, Fitted]) -> Metrics:
    """`plan` scored on confirm, with the reconstruction `refit` gives it (kept in `fitted`), else as composed."""
    own = None if refit is None else refit(plan)
    if own is not None:
        fitted[plan.key] = own
    return evaluator.evaluate(evaluator.realise(plan, own), split=Split.CONFIRM)


def _clears(objective: Objective, m: Metrics, level: float) -> bool:
    """Whether confirm metrics `m` clear the floor at error rate `level` (point estimates without a confidence)."""
    if objective.confidence <= 0:
        return objective.meets_floor(m)
    counts = m.counts()
    return counts is not None and clears(counts.retention_lower(1.0 - level), objective.min_retention)


def _best_as_composed(evaluator: Evaluator, tested: list[Trial], fitted: dict[str, Fitted], best: Trial | None
                      ) -> tuple[Metrics | None, ...]:
    """Per tested finalist, None but for the confirmed best when it ran reconstructed (`fitted`, by plan key): its
    confirm metrics as the search composed it. For the record only (one confirm pass; every finalist's was a fifth
    of the default run)."""
    if best is None or best.plan.key not in fitted:
        return (None,) * len(tested)
    composed = evaluator.evaluate(best.plan, split=Split.CONFIRM)
    return tuple(composed if t is best else None for t in tested)


def _chains(trials: list[Trial], candidates: dict[str, Candidate], anchors: set[str], max_claims: int | None = None,
            curve: bool = False) -> list[list[Trial]]:
    """The two fixed sequences, both from val alone: the anchors likely to pass (`ANCHOR_PASS`) but the most
    compressed, least compressed first; and, planned by `plan_sequence`, the search's plans and the most
    compressed anchor, from the least to the most compressed, planned on what the first sequence is
    expected to secure (`modelopt.certify.sequence.confirm_chains` shares the error rate). A timed run's gate keeps
    its most compressed likely anchors; a curve's (`curve`) its least compressed one too, first: at a floor above the
    reported one the most compressed are the likeliest to fail, and the floor is then left with no point (a composed
    plan's confirm pass, scored once for every floor)."""
    by_reduction = sorted((t for t in trials if t.plan.key in anchors), key=lambda t: candidates[t.plan.key].reduction)
    gate = kept = [t for t in by_reduction[:-1] if candidates[t.plan.key].forced]
    if max_claims is not None:  # a timed run: the gate's most compressed plans, the search's sequence as afforded
        keep = TIMED_GATE if max_claims > 1 else 1  # no time for more: the most compressed likely anchor alone
        kept = gate[len(gate) - min(len(gate), keep):]
        gate = (gate[:1] if curve and gate[:1] != kept[:1] else []) + kept
    secured, alive, last = 1.0, 1.0, 1.0  # the reduction the gate is expected to report
    for t in gate:
        c = candidates[t.plan.key]
        alive *= c.chance
        secured += alive * (c.reduction - last)
        last = c.reduction
    floor = min((candidates[t.plan.key].reduction for t in kept), default=1.0)  # the search's plans lie beyond
    rest = [t for t in trials if t not in gate and candidates[t.plan.key].reduction > floor]
    room = None if max_claims is None else max(max_claims, 1)
    return [gate, [rest[i] for i in plan_sequence([candidates[t.plan.key] for t in rest], start=secured,
                                                  max_len=room)]]


def _full_val(trial: Trial) -> PairedCounts | None:
    m = trial.metrics
    return m.counts() if trial.ok and m is not None and m.stopped is None and m.split == Split.VAL else None


def _candidate(trial: Trial, anchor: bool, objective: Objective, n: int, base_right: int,
               share: LossShare | None = None) -> Candidate:
    """`trial` as the sequence planner sees it: its reduction on val and its chance to pass on confirm."""
    m = _scored(trial)
    counts = m.counts()
    if counts is None:  # no paired counts (an old record): certain only if it agrees everywhere
        chance = 1.0 if m.agreement >= 1.0 else 0.5
    elif objective.confidence <= 0:  # point estimates: pass when the confirm retention is at the floor
        chance = 1.0 if objective.meets_floor(m) else 0.0
    else:
        if share is not None:  # the val luck in which changed answers were broken, taken out by pooling
            chance = pass_chance(share.shrunk(counts), n, base_right, objective.confidence, objective.min_retention,
                                 shift=0.0)
        else:
            chance = pass_chance(counts, n, base_right, objective.confidence, objective.min_retention,
                                 shift=0.0 if anchor else SELECTION_SHIFT)
    reduction = objective.reduction(m)
    return Candidate(reduction, chance, forced=anchor and chance >= ANCHOR_PASS)


def _scored(trial: Trial) -> Metrics:
    return trial.scored
