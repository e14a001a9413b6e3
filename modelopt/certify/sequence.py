"""Which finalists confirmation tests, and in what order: a fixed sequence planned on val alone.

Fixed-sequence testing (Maurer, Hothorn & Lehmacher 1995; Westfall & Krishen 2001) tests claims one
after another, each at the full level, and stops at the first that fails. Whatever the order, as
long as it is fixed before the confirm images are looked at, the chance of confirming any plan that
is in truth under the floor stays within 1 - confidence: the first such plan in the order is
confirmed only if its own test errs. So the order may be chosen freely from val, and choosing it
well is what turns evidence into compression:

- a plan's *chance to pass* on confirm is predicted from its val counts (`pass_chance`): its net loss
  on confirm is normal around the val estimate (shifted by `SELECTION_SHIFT` val standard errors for
  a plan the search selected, since the best of many is partly the luckiest; anchors are pre-specified
  and carry no such bias), with the variance of both samples, against the largest net loss the
  confirm split can certify at that disagreement;
- the anchors likely to pass (`ANCHOR_PASS`: INT8 and, where it holds, INT4) but the most compressed one
  form a sequence of their own, least compressed first, with a quarter of the error rate (`GATE_SHARE`):
  the no-search answers are claimed whatever the search's plans do;
- the search's plans and the most compressed anchor form the second, with the rest of the error rate:
  `plan_sequence` picks, from the least to the most compressed, the subsequence that maximises the
  expected reduction reported (one failure ends a sequence, so a long chain of small steps costs more
  than it buys);
- `confirm_chains` runs both, and a sequence whose every claim held hands its share to the other (when
  the likely anchors hold, the search's plans are then tested at the full level; measured:
  docs/certification.md#measured).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from modelopt.confidence import PairedCounts, clears
from modelopt.objective import SELECTION_SHIFT

__all__ = ["ANCHOR_PASS", "GATE_SHARE", "PRIMARY_SHARE", "SELECTION_SHIFT", "Candidate", "Claim", "LossShare",
           "confirm_chains", "confirm_floors", "pass_chance", "plan_sequence"]

# SELECTION_SHIFT (modelopt.objective): val errors a search's pick is assumed lucky by; it changes the
# order and so the power, never the guarantee, which holds for any order.
# Anchors at least this likely to pass (but the most compressed) are tested in a sequence of their own.
ANCHOR_PASS = 0.5
# That sequence's share of the error rate: small, since likely anchors pass with room, and the search's plans
# need the rest, which clear the floor by less (measured: docs/certification.md#measured).
GATE_SHARE = 0.25
# A curve's share of the error rate for the reported plan's floor (`confirm_floors`): half, so that the plan a one-floor
# run would report is not lost to the other floors' claims (measured: docs/certification.md, a certified curve).
PRIMARY_SHARE = 0.5
MAX_STRENGTH = 1e4  # changed answers: a pool no plan departs from measurably


@dataclass(frozen=True)
class Candidate:
    """A finalist as the planner sees it: how much it reduces the target, how likely it is to be
    confirmed, and whether it must be tested (a likely anchor)."""

    reduction: float
    chance: float
    forced: bool = False


@dataclass(frozen=True)
class LossShare:
    """How often an answer a plan changes is one it breaks, pooled over a run's plans, and how strongly each
    plan's own share is drawn to the pool (empirical Bayes, a beta-binomial fitted by moments).

    A plan's net loss is its disagreement times (2 x share - 1). The disagreement of a plan is measured well
    on a few thousand images (tens of changed answers); which of them happened to be broken rather than fixed
    is where its val luck lies, and what the best of many plans on val has most of (measured:
    docs/certification.md#measured). Shrinking each plan's share toward the pool takes that luck
    out before the chance to pass is predicted, where a fixed shift of one val error left it in.

    Attributes:
        mean: the pooled share of changed answers that were broken.
        strength: how many changed answers the pool counts as, beside a plan's own (large: plans differ
            little in their share; small: a plan's own counts speak).
    """

    mean: float
    strength: float

    @classmethod
    def fit(cls, counts: Sequence[PairedCounts]) -> LossShare | None:
        """The pooled share and its strength from plans scored on the same images; None with too few."""
        rows = [(c.lost, c.lost + c.gained) for c in counts if c.lost + c.gained > 0]
        if len(rows) < 3:
            return None
        lost, changed = sum(r[0] for r in rows), sum(r[1] for r in rows)
        p = lost / changed
        if not 0.0 < p < 1.0:
            return None
        # Method of moments: the spread of the plans' own shares beyond what their counts alone would give.
        excess = sum((lo / d - p) ** 2 - p * (1 - p) / d for lo, d in rows) / len(rows)
        strength = p * (1 - p) / excess - 1.0 if excess > 0 else MAX_STRENGTH
        return cls(p, float(min(max(strength, 0.0), MAX_STRENGTH)))

    def shrunk(self, c: PairedCounts) -> PairedCounts:
        """`c` with its changed answers split at the plan's shrunk share (same images, same disagreement)."""
        changed = c.lost + c.gained
        share = (c.lost + self.strength * self.mean) / (changed + self.strength)
        lost = round(share * changed)
        return PairedCounts(c.n, c.base_right, lost, changed - lost)


def _largest_net(n: int, base_right: int, disagree: int, confidence: float, floor: float) -> float:
    """The largest net loss (lost - gained) / n the bound still certifies on `n` images when `disagree`
    of them change their answer; -inf when none does."""
    def passes(k: int) -> bool:
        lost, gained = (disagree + k) // 2, (disagree - k) // 2
        return clears(PairedCounts(n, base_right, lost, gained).retention_lower(confidence), floor)

    lo, hi = -disagree, disagree  # net k runs over -D..D in steps of 2 (lost + gained = D)
    if not passes(lo):
        return -math.inf
    if passes(hi):  # even all D broken passes: the net may grow past D (with D), up to L lost and none fixed
        lo, hi = disagree, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok = clears(PairedCounts(n, base_right, mid, 0).retention_lower(confidence), floor)
            lo, hi = (mid, hi) if ok else (lo, mid)
        return lo / n
    while hi - lo > 2:  # the bound falls as the net loss grows: bisect on the grid of the parity of D
        mid = lo + ((hi - lo) // 4) * 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return (hi if passes(hi) else lo) / n


def pass_chance(val: PairedCounts, n: int, base_right: int, confidence: float, floor: float,
                shift: float = SELECTION_SHIFT) -> float:
    """The predicted chance that a plan with `val` counts is confirmed on a split of `n` images the float
    model gets `base_right` of.

    Example:
        >>> round(pass_chance(PairedCounts(2000, 1620, 20, 25), 3000, 2430, 0.95, 0.99, shift=0.0), 2)
        0.89
    """
    if val.n <= 0 or n <= 0:
        return 0.0
    d = max((val.lost + val.gained) / val.n, 0.5 / val.n)  # disagreement rate (never quite zero)
    mu = (val.lost - val.gained) / val.n + shift * math.sqrt(d / val.n)
    allowed = _largest_net(n, base_right, round(d * n), confidence, floor)
    if allowed == -math.inf:
        return 0.0
    sd = math.sqrt(d / n + d / val.n)
    return NormalDist().cdf((allowed + 0.5 / n - mu) / sd)


def plan_sequence(candidates: Sequence[Candidate], start: float = 1.0, max_len: int | None = None) -> list[int]:
    """The indices to test, in order: from the least to the most reducing, the subsequence whose
    expected reported reduction (the last confirmed before the first failure; `start` when none is) is
    the largest, with every forced candidate in it; at most `max_len` of them (a timed run's claims:
    forced candidates then go in as far as there is room).

    Example:
        >>> plan_sequence([Candidate(3.8, 1.0), Candidate(5.0, 0.5), Candidate(7.6, 0.95, True), Candidate(9.0, 0.2)])
        [0, 2, 3]
    """
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i].reduction, -candidates[i].chance))
    items = [candidates[i] for i in order]
    m = len(items)
    cap = m if max_len is None else max(min(max_len, m), 0)
    forced = [m] * (m + 1)  # forced[p]: the first forced item at or after p (m: none), which cannot be skipped
    for p in range(m - 1, -1, -1):
        forced[p] = p if items[p].forced else forced[p + 1]

    def best_after(i: int, later: Sequence[float] | None) -> tuple[float, int | None]:
        """Item i confirmed (the start: i = m): the expected reduction reported, continuing optimally with
        `later` (each item's value once confirmed; None: no claim left), and the item tested next (None: stop)."""
        here = items[i].reduction if i < m else start
        if later is None:
            return here, None
        first = i + 1 if i < m else 0
        stop = forced[first] + 1 if forced[first] < m else m
        best, pick = (-math.inf, None) if forced[first] < m else (here, None)
        for j in range(first, stop):
            v = items[j].chance * later[j] + (1.0 - items[j].chance) * here
            if v > best + 1e-12:
                best, pick = v, j
        return best, pick

    # value[k][i]: the expected reduction reported once item i (or the start, i = m) has been confirmed, with k
    # more claims allowed; nxt[k][i]: the item tested next. With claims for every item (no cap) one level is
    # enough: along any path the claims left never run short, so each level holds the same values and picks.
    levels = range(cap + 1) if cap < m else [m]
    value: dict[int, list[float]] = {}
    nxt: dict[int, list[int | None]] = {}
    for k in levels:
        value[k], nxt[k] = [0.0] * (m + 1), [None] * (m + 1)
        for i in [*range(m - 1, -1, -1), m]:
            later = None if k == 0 else value[k] if cap >= m else value[k - 1]
            value[k][i], nxt[k][i] = best_after(i, later)
    out, at, k = [], nxt[cap][m], cap
    while at is not None:
        out.append(order[at])
        k = k if cap >= m else k - 1
        at = nxt[k][at]
    return out


def confirm_chains(chains: Sequence[Sequence[int]], passes: Callable[[int, float], bool], alpha: float,
                   shares: Sequence[float] | None = None) -> dict[int, bool]:
    """Tests the claims of several fixed sequences, sharing the error rate `alpha` among them: each chain
    starts with its share (`shares`, equal by default; an empty chain's goes to the others), tests its
    claims in order at its share and stops at its first failure;
    a chain whose every claim held hands its share on to the chains still open, which then test their
    failed claim again at the larger share (the graphical procedure of Bretz et al. 2009: each chain a
    path, its last claim pointing to the other chains' first open ones). The chance of confirming any
    claim that is false stays within `alpha`, whatever the chains hold, as long as they are fixed before
    the confirm images are looked at. With one chain it is plain fixed-sequence testing.

    Two chains are what confirmation runs: the uniform anchors, and the search's plans. An anchor that
    fails no longer ends the search's sequence (it did with one chain, and every plan behind an anchor that
    often fails was lost when it failed; measured: docs/certification.md#measured).

    Args:
        chains: claim ids in test order, one list per chain (empty chains are dropped).
        passes: `passes(claim, level)`: whether the claim's confirm bound at confidence 1 - level clears the
            floor (called again for a claim retested at a larger level).
        alpha: 1 - confidence.

    Returns:
        {claim: confirmed} for every claim tested.

    Example:
        >>> confirm_chains([[0, 1], [2, 3]], lambda c, level: c != 1, 0.05)
        {0: True, 1: False, 2: True, 3: True}
    """
    weights = list(shares) if shares is not None else [1.0] * len(chains)
    kept = [(list(c), w) for c, w in zip(chains, weights, strict=True) if c]
    open_chains = [c for c, _ in kept]
    total = sum(w for _, w in kept)
    level = [alpha * w / total for _, w in kept] if kept else []
    pos = [0] * len(open_chains)
    verdict: dict[int, bool] = {}
    moved = True
    while moved:
        moved = False
        for c, chain in enumerate(open_chains):
            while pos[c] < len(chain) and level[c] > 0:
                ok = passes(chain[pos[c]], level[c])
                verdict[chain[pos[c]]] = ok
                if not ok:
                    break
                pos[c] += 1
            others = [o for o in range(len(open_chains)) if o != c and pos[o] < len(open_chains[o])]
            if pos[c] == len(chain) and level[c] > 0 and others:  # all held: its share goes to the open chains
                for o in others:
                    level[o] += level[c] / len(others)
                level[c] = 0.0
                moved = True
    return verdict


@dataclass(frozen=True)
class Claim:
    """One claim a curve's confirmation tests: `item` (a plan) keeps at least `floor` of the float model's accuracy;
    `chance`: its chance to pass there, predicted from val (the planner's, for the record)."""

    item: Hashable
    floor: float
    chance: float = math.nan


def confirm_floors(planned: Sequence[tuple[float, Sequence[Sequence[Hashable]], Mapping[Hashable, float]]],
                   passes: Callable[[Hashable, float, float], bool], alpha: float,
                   shares: Sequence[float] = (GATE_SHARE, 1.0 - GATE_SHARE),
                   primary: float | None = None) -> list[tuple[Claim, bool]]:
    """Tests a curve's claims so that every claim confirmed holds at once with probability >= 1 - `alpha`.

    Each floor brings its own fixed sequences, planned on val at that floor (`planned`: (floor, its chains of items,
    each item's chance to pass there)). The floors share the error rate: `primary` (the reported plan's floor)
    `PRIMARY_SHARE` of it, the others the rest equally (all equally without one); each floor's chains by `shares`
    within it (the anchors' gate, the search's plans). A chain whose claims all held hands its share to the chains
    still open, at any floor (`confirm_chains`: the graphical procedure of Bretz et al. 2009, whose family-wise
    error is within `alpha` for any graph fixed before the confirm images are looked at). A claim held at a floor
    holds at every lower one, so a claim implied by one already held passes without being tested (a false one
    would make the claim that implies it false too: it adds no error). With one floor this is the one-floor run's
    procedure, unchanged.

    Args:
        passes: `passes(item, floor, level)`: whether the item's confirm bound at confidence 1 - level clears floor.

    Returns:
        (claim, held) for each claim tested, in the order first tested.

    Example:
        >>> confirm_floors([(0.99, [["a"], ["b"]], {}), (0.98, [[], ["c"]], {})], lambda i, f, lv: i != "b", 0.05)
        [(Claim(item='a', floor=0.99, chance=nan), True), (Claim(item='b', floor=0.99, chance=nan), False), \
(Claim(item='c', floor=0.98, chance=nan), True)]
    """
    floors = [f for f, _, _ in planned]
    if primary in floors and len(floors) > 1:
        weight = {f: PRIMARY_SHARE if f == primary else (1.0 - PRIMARY_SHARE) / (len(floors) - 1) for f in floors}
    else:
        weight = dict.fromkeys(floors, 1.0 / max(len(floors), 1))
    claims: list[Claim] = []
    chains: list[list[int]] = []
    weights: list[float] = []
    for floor, floor_chains, chance in planned:
        for j, chain in enumerate(floor_chains):
            chains.append([len(claims) + i for i in range(len(chain))])
            claims.extend(Claim(item, floor, chance.get(item, math.nan)) for item in chain)
            weights.append(shares[min(j, len(shares) - 1)] * weight[floor])
    held: dict[Hashable, float] = {}  # item -> the highest floor a claim of it held at

    def tested(i: int, level: float) -> bool:
        c = claims[i]
        ok = (c.item in held and held[c.item] >= c.floor) or passes(c.item, c.floor, level)
        if ok:
            held[c.item] = max(held.get(c.item, -math.inf), c.floor)
        return ok

    verdict = confirm_chains(chains, tested, alpha, weights)
    return [(claims[i], ok) for i, ok in verdict.items()]
