"""The uniform anchors every run scores first, and a reported best never below a confirmed anchor."""

from __future__ import annotations

import json

import pytest

import modelopt
from modelopt.compressors import Quantize
from modelopt.plan.space import SearchSpace

pytestmark = pytest.mark.slow


def test_anchors_are_int8_int4_int3_per_channel_with_gptq(small_workload) -> None:
    space = SearchSpace(small_workload.layers, [Quantize(bits=(8, 4, 3), granularity=("per_channel", "group"),
                                                         rounding=("gptq", "nearest"), norm_images=0)])
    anchors = space.anchors()
    assert len(anchors) == 3
    for plan, bits in zip(anchors, (8, 4, 3), strict=True):
        choices = [plan.get(d.name) for d in space.decisions]
        assert all(c is not None and c.bits == bits for c in choices)
        assert all(c.granularity.value == "per_channel" for c in choices)  # fewer bytes than group-wise
    assert all(c.rounding.value == "gptq" for c in (anchors[1].get(d.name) for d in space.decisions))
    # Only what the menu offers: no INT3 anchor without INT3.
    assert len(SearchSpace(small_workload.layers, [Quantize(bits=(8, 4), rounding=("nearest",),
                                                            norm_images=0)]).anchors()) == 2


def test_hedges_widen_int4_s_most_sensitive_layers_toward_int8(small_workload) -> None:
    from modelopt.evaluation.evaluator import Evaluator
    from modelopt.evaluation.priors import measure_errors

    space = SearchSpace(small_workload.layers, [Quantize(bits=(8, 4), rounding=("gptq",), norm_images=0)])
    measure_errors(Evaluator(small_workload, space))
    int8, int4 = space.anchors()
    hedges = space.hedges(int4)
    assert len(hedges) == 2

    def size(plan) -> int:
        return sum(space.features[d.name][d.choices.index(plan.get(d.name))].bytes for d in space.decisions)

    # Between INT4 and INT8, the more compressed first, each past its share of the gap and the second a superset.
    assert size(int4) < size(hedges[0]) < size(hedges[1]) < size(int8)
    assert size(hedges[0]) >= size(int4) + 0.15 * (size(int8) - size(int4))
    wide = [{d.name for d in space.decisions if p.get(d.name).bits == 8} for p in hedges]
    assert wide[0] < wide[1]

    def gain(name: str) -> float:  # output error saved per byte by widening the layer
        d = space.decision(name)
        f4, f8 = (space.features[name][d.choices.index(p.get(name))] for p in (int4, int8))
        return (f4.error - f8.error) / (f8.bytes - f4.bytes)

    assert min(gain(n) for n in wide[0]) >= max(gain(n) for n in {d.name for d in space.decisions} - wide[0])


def test_a_run_scores_the_anchors_first_and_reports_no_less_than_a_confirmed_one(tmp_path, fewer_workload) -> None:
    # 400 images, per channel, rounded to nearest, no latency timing: which anchors a run scores first, and the order
    # confirmation tests them in, do not depend on how codes are rounded or scaled (the first test checks the anchors'
    # menu), at a third of the cost. The five anchors cost 9 units here: a budget of 10 leaves one plan of the search.
    result = modelopt.optimize(fewer_workload, strategy="random", budget=10, min_retention=0.9, seed=0,
                               out=tmp_path / "run", progress=False, compressors=["quantize"], bits=[8, 4, 3],
                               granularity=["per_channel"], rounding=["nearest"], latency=None, report=False,
                               reconstruct=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    names = [a["name"] for a in summary["anchors"]]
    assert names[:3] == ["INT8", "INT4", "INT3"]
    assert len(names) == 5 and all(n.startswith("INT4, ") and n.endswith(" INT8") for n in names[3:]), names
    assert [a["trial"] for a in summary["anchors"]] == [0, 1, 2, 3, 4]  # scored before the strategy asked
    assert len(result.trials) > 5  # and the strategy did ask
    assert all(a["test"] is not None and a["test"]["split"] == "test" for a in summary["anchors"])
    confirmed = {f["plan_key"] for f in summary["confirmation"]["finalists"] if f["confirmed"]}
    held = [a["val"]["compression"] for a in summary["anchors"] if a["plan_key"] in confirmed]
    assert held, "the 80 confirm images confirm at least the INT8 anchor at a 90 % floor"
    assert result.best is not None and result.best.metrics.compression >= max(held) - 1e-9
    # INT8, the hedges and INT4, likely to pass, lead the sequence from the least compressed: no plan the search
    # picked is tested before them, and a failing INT4 falls back to a hedge, not to INT8.
    order = [f["plan_key"] for f in summary["confirmation"]["finalists"]]
    keys = [a["plan_key"] for a in summary["anchors"]]
    assert order[:4] == [keys[0], keys[4], keys[3], keys[1]]
