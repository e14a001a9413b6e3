"""A plan as it runs is a value: what a plan scores depends on its `Realised` record alone, never on what was scored,
refitted or exported before it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from modelopt.api import build_compressors
from modelopt.data.split import Split
from modelopt.evaluation.evaluator import Evaluator, Realised
from modelopt.evaluation.metrics import Metrics
from modelopt.plan.space import SearchSpace
from modelopt.reconstruct import reconstruct
from modelopt.reconstruct.store import checked

OPTIONS = {"prune": {"kind": ["unstructured", "structured"], "sparse_images": 64, "repair_images": 64},
           "quantize": {"bits": [8, 4, 3], "rounding": ["gptq"], "calib_images": 64}}
# Figures that depend on the history by design: wall time, and one-time preparations charged to the first plan
# that needs them.
HISTORY = {"eval_seconds", "prep_cost"}
# One test process runs this module's tests, so the refits and the reference scores are built once.
pytestmark = pytest.mark.xdist_group("realised")


def _evaluator(wl) -> Evaluator:
    return Evaluator(wl, SearchSpace(wl.layers, build_compressors(["prune", "quantize"], OPTIONS)))


def _plan(ev: Evaluator, bits: int, sparse_every: int):
    names = [x.name for x in ev.workload.layers]
    layers = {n: {"quantize": {"bits": 8 if n in (names[0], names[-1]) else bits, "rounding": "gptq"}} for n in names}
    for n in names[1:-1:sparse_every]:
        layers[n]["prune"] = {"sparsity": 0.5, "kind": "unstructured"}
    return ev.space.parse_plan({"layers": layers})


def _figures(m: Metrics) -> dict[str, object]:
    return {k: v for k, v in dataclasses.asdict(m).items() if k not in HISTORY}


def _scored(ev: Evaluator, target) -> tuple[dict[str, object], dict[str, object], torch.Tensor]:
    """Val and test figures and the test answers of `target`, each scored afresh (no cached result read)."""
    val, test = ev.evaluate(target, split=Split.VAL), ev.evaluate(target, split=Split.TEST)
    return _figures(val), _figures(test), ev.answers(target, Split.TEST)[0].clone()


def _same(a, b) -> None:
    assert a[0] == b[0] and a[1] == b[1]
    assert torch.equal(a[2], b[2])


# Session-scoped, not module-scoped: pytest-xdist interleaves modules, and a module fixture was built again each
# time this module's tests came back (tests/conftest.py).
@pytest.fixture(scope="session")
def refits(small_workload):
    """Two plans and each one's checked refit, fitted on an evaluator of their own."""
    ev = _evaluator(small_workload)
    a, b = _plan(ev, 3, 3), _plan(ev, 4, 4)
    return a, b, {p.key: checked(ev, p, reconstruct(ev, p, images=64)) for p in (a, b)}


@pytest.fixture(scope="session")
def alone(small_workload, refits):
    """Each record scored on an evaluator of its own: the reference both orders are held to."""
    a, b, fitted = refits
    out = {}
    for name, plan, fit in (("a", a, None), ("b", b, fitted[b.key]), ("a+fit", a, fitted[a.key])):
        ev = _evaluator(small_workload)
        out[name] = _scored(ev, ev.realise(plan, fit))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("order", ["a-first", "b-first"])
def test_a_plan_scores_the_same_whatever_was_refitted_and_scored_before_it(small_workload, refits, alone, order):
    a, b, fitted = refits
    ev = _evaluator(small_workload)
    steps = [("a", a, None), ("b", b, fitted[b.key]), ("a+fit", a, fitted[a.key]), ("a", a, None)]
    if order == "b-first":
        steps = [steps[1], steps[0], steps[2], steps[1]]
    for name, plan, fit in steps:
        ev.scorer._results.clear()  # scored afresh each time: the answer, not a cached one, is compared
        _same(_scored(ev, ev.realise(plan, fit)), alone[name])
    x = small_workload.split(Split.TEST).x[:64]  # the refit is another record: it runs other weights
    assert not torch.equal(ev.states.logits(ev.realise(a), x), ev.states.logits(ev.realise(a, fitted[a.key]), x))


def test_a_record_is_keyed_by_its_plan_and_refit(small_workload, refits):
    a, b, fitted = refits
    ev = _evaluator(small_workload)
    composed, refitted = ev.realise(a), ev.realise(a, fitted[a.key])
    assert composed.key == a.key and refitted.key.startswith(f"{a.key}+fitted:")
    assert ev.realise(a, fitted[a.key]).key == refitted.key  # the same refit, the same key
    assert ev.realise(refitted) is refitted
    assert isinstance(refitted, Realised) and refitted.fitted is fitted[a.key]
    changed = dataclasses.replace(fitted[a.key], weights={n: w * 1.01 for n, w in fitted[a.key].weights.items()})
    assert ev.realise(a, changed).key != refitted.key  # other weights: another record, never a stale cache entry
    with pytest.raises(ValueError, match="does not belong"):
        ev.realise(b, fitted[a.key])
    # The refitted weights run, stored where the refit has them; the rest are the composed plan's.
    for name, w in composed.weights.items():
        want = fitted[a.key].weights.get(name, w)
        assert torch.equal(refitted.weights[name], want)
        assert refitted.forms[name].weight.shape == composed.forms[name].weight.shape
