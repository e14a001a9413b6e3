"""A run with several floors (`floors=`): its certified curve in summary.json, the result, the report and export."""

from __future__ import annotations

import json
import shutil

import pytest

from modelopt.errors import ConfigError
from modelopt.reports import write_report
from modelopt.run.export import export, resolve
from modelopt.run.summary import read_summary

pytestmark = pytest.mark.slow  # reads the session fixture small_curve_run (a finished run, ~40 s)


def test_a_curve_run_reports_a_point_per_floor_and_exports_one(tmp_path, small_curve_run):
    saved = json.loads((small_curve_run / "summary.json").read_text())
    assert [p["floor"] for p in saved["curve"]] == [0.95, 0.9, 0.85]  # --min-retention is one of the floors
    assert saved["objective"]["floors"] == [0.95, 0.9, 0.85]
    curve = read_summary(small_curve_run).curve
    points = [p for p in curve if p.plan is not None]
    assert points, "the small run certifies something on its ~170 confirm images"
    if saved["best"] is not None:  # the reported plan is the point at min_retention
        assert curve[1].plan is not None and curve[1].plan.trial == saved["best"]["trial"]
    sizes = [p.plan.test.metrics.size_bytes for p in points if p.plan is not None and p.plan.test is not None]
    assert sizes == sorted(sizes, reverse=True)  # a lower floor's point is no larger
    low = points[-1]
    assert low.plan is not None
    src = resolve(small_curve_run, f"floor:{low.floor:g}")
    assert src.realised.plan.key == low.plan.plan_key
    assert export(small_curve_run, plan=f"floor:{low.floor:g}", out=tmp_path / "low.pt").is_file()
    with pytest.raises(ConfigError, match=r"certified no plan at floor 0\.8; its floors: floor:0\.95"):
        resolve(small_curve_run, "floor:0.8")
    run = tmp_path / "run"
    shutil.copytree(small_curve_run, run, ignore=shutil.ignore_patterns("report*"))
    assert "## Certified curve" in write_report(run).markdown.read_text()
