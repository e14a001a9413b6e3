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
                                                         rounding=("gptq", "nearest"))])
    anchors = space.anchors()
    assert len(anchors) == 3
    for plan, bits in zip(anchors, (8, 4, 3), strict=True):
        choices = [plan.get(d.name) for d in space.decisions]
        assert all(c is not None and c.bits == bits for c in choices)
        assert all(c.granularity.value == "per_channel" for c in choices)  # fewer bytes than group-wise
    assert all(c.rounding.value == "gptq" for c in (anchors[1].get(d.name) for d in space.decisions))
    # Only what the menu offers: no INT3 anchor without INT3.
    assert len(SearchSpace(small_workload.layers, [Quantize(bits=(8, 4))]).anchors()) == 2


def test_a_run_scores_the_anchors_first_and_reports_no_less_than_a_confirmed_one(tmp_path, small_workload) -> None:
    result = modelopt.optimize(small_workload, strategy="random", budget=8, min_retention=0.9, seed=0,
                               out=tmp_path / "run", progress=False, compressors=["quantize"], bits=[8, 4, 3],
                               report=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    names = [a["name"] for a in summary["anchors"]]
    assert names == ["INT8", "INT4", "INT3"]
    assert [a["trial"] for a in summary["anchors"]] == [0, 1, 2]  # scored before the strategy asked
    assert all(a["test"] is not None and a["test"]["split"] == "test" for a in summary["anchors"])
    confirmed = {f["plan_key"] for f in summary["confirmation"]["finalists"] if f["confirmed"]}
    held = [a["val"]["compression"] for a in summary["anchors"] if a["plan_key"] in confirmed]
    assert held, "the small data confirm at least the INT8 anchor at a 90 % floor"
    assert result.best is not None and result.best.metrics.compression >= max(held) - 1e-9
    # INT8 and INT4, likely to pass, lead the sequence: no plan the search picked is tested before them.
    order = [f["plan_key"] for f in summary["confirmation"]["finalists"]]
    assert order[:2] == [a["plan_key"] for a in summary["anchors"][:2]]
