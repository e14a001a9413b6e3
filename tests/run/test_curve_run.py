"""A run with several floors (`floors=`): its certified curve in the result, summary.json, the report and export."""

from __future__ import annotations

import json

import pytest

import modelopt
from modelopt.errors import ConfigError
from modelopt.run.export import export, resolve


@pytest.mark.slow
def test_a_curve_run_reports_a_point_per_floor_and_exports_one(tmp_path, small_workload):
    out = tmp_path / "run"
    result = modelopt.optimize(small_workload, budget=6, out=out, progress=False, seed=0, min_retention=0.9,
                               floors=[0.95, 0.85], reconstruct=False, compressors=["quantize"])
    assert [p.floor for p in result.curve] == [0.95, 0.9, 0.85]  # --min-retention is one of the floors
    saved = json.loads((out / "summary.json").read_text())
    assert [p["floor"] for p in saved["curve"]] == [0.95, 0.9, 0.85]
    assert saved["objective"]["floors"] == [0.95, 0.9, 0.85]
    points = [p for p in result.curve if p.plan is not None]
    assert points, "the small run certifies something on its ~170 confirm images"
    middle = result.curve[1]
    if result.best is not None:
        assert middle.plan is not None and middle.plan.trial == result.best.number  # the reported plan is 0.9's
    sizes = [p.plan.test.metrics.size_bytes for p in points if p.plan is not None and p.plan.test is not None]
    assert sizes == sorted(sizes, reverse=True)
    low = points[-1]
    assert low.plan is not None
    src = resolve(out, f"floor:{low.floor:g}")
    assert src.realised.plan.key == low.plan.plan_key
    path = export(out, plan=f"floor:{low.floor:g}", out=tmp_path / "low.pt")
    assert path.is_file()
    with pytest.raises(ConfigError, match="certified no plan at floor 0.8; its floors: floor:0.95"):
        resolve(out, "floor:0.8")
    assert "Certified curve" in (out / "report.md").read_text()
