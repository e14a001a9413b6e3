"""A timed run caps the claims confirmation tests (`plan_sequence(max_len=...)`)."""

from __future__ import annotations

import itertools

import pytest

from modelopt.certify.sequence import Candidate, plan_sequence

CANDIDATES = [Candidate(3.8, 1.0), Candidate(5.0, 0.5), Candidate(7.6, 0.95), Candidate(9.0, 0.2),
              Candidate(11.0, 0.6)]


def _expected(cands: list[Candidate], picked: list[int], start: float = 1.0) -> float:
    value, alive, last = start, 1.0, start
    for i in picked:
        alive *= cands[i].chance
        value += alive * (cands[i].reduction - last)
        last = cands[i].reduction
    return value


@pytest.mark.parametrize("cap", [0, 1, 2, 3])
def test_the_capped_sequence_is_the_best_of_its_length(cap):
    picked = plan_sequence(CANDIDATES, max_len=cap)
    assert len(picked) <= cap
    by_reduction = sorted(range(len(CANDIDATES)), key=lambda i: CANDIDATES[i].reduction)
    best = max(_expected(CANDIDATES, list(s)) for n in range(cap + 1) for s in itertools.combinations(by_reduction, n))
    assert _expected(CANDIDATES, picked) == pytest.approx(best)


def test_without_a_cap_the_plan_is_unchanged():
    assert plan_sequence(CANDIDATES) == plan_sequence(CANDIDATES, max_len=len(CANDIDATES))


def test_a_forced_candidate_goes_in_as_far_as_there_is_room():
    forced = [Candidate(3.8, 1.0), Candidate(5.0, 0.99, True), Candidate(9.0, 0.9)]
    assert 1 in plan_sequence(forced, max_len=1) and 1 in plan_sequence(forced, max_len=2)
