"""A timed run (`time=`): the search stops for the end to fit, the run still certifies, a resumed run goes on."""

from __future__ import annotations

import json

import pytest

import modelopt
from modelopt.run.clock import RunClock

# 8 or 4 bits per channel, rounded to nearest: four anchors, each cheap to prepare and score.
SMALL = dict(progress=False, report=False, compressors=["quantize"], bits=[8, 4], granularity=["per_channel"],
             min_retention=0.9, reconstruct=False, rounding=["nearest"], latency=None)


def test_the_clock_of_a_resumed_run_goes_on_under_the_same_time_and_starts_afresh_under_another():
    clock = RunClock(100.0)
    assert clock.resumed(100.0, 30.0).left() == pytest.approx(70.0, abs=1.0)
    assert clock.resumed(60.0, 30.0).left() == pytest.approx(100.0, abs=1.0)  # another time: in full
    assert RunClock().resumed(100.0, 30.0).left() == float("inf")


@pytest.mark.slow
def test_a_run_out_of_time_stops_after_the_anchors_and_still_certifies_a_plan(tmp_path, fewer_workload):
    result = modelopt.optimize(fewer_workload, time=1, out=tmp_path / "r", **SMALL)
    keys = [t.plan.key for t in result.trials]
    assert set(keys) == {t.plan.key for t in result.certificate.anchors}  # the anchors only: no time to search
    assert result.best is not None and result.summary.best is not None and result.summary.best.confirmed
    saved = json.loads((tmp_path / "r" / "run.json").read_text())
    assert saved["time"] == 1.0 and saved["budget"] is None  # a time alone leaves the budget open
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["budget"] is None

    # Resumed with more time, the same run goes on searching (the four anchors cost under 9 units, the first paying the
    # one-time preparations: a budget of 12 leaves room for more trials).
    more = modelopt.optimize(fewer_workload, time=600, budget=12, out=tmp_path / "r", resume=True, **SMALL)
    assert len(more.trials) > len(keys) and [t.plan.key for t in more.trials][: len(keys)] == keys
