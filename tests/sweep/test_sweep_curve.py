"""Strategies compared on their certified curves: the area under a curve, and the sweep table's section."""

from __future__ import annotations

import math
import shutil

import pytest

from modelopt.run.reported import CurvePoint, PlanEntry, Scores
from modelopt.sweep.curve import curve_area, curve_lines


def _point(floor: float, compression: float | None) -> CurvePoint:
    if compression is None:
        return CurvePoint(floor)
    from modelopt.evaluation.metrics import Metrics

    m = Metrics(split="test", n_samples=100, accuracy=0.9, baseline_accuracy=0.9, retention=1.0, agreement=1.0,
                size_bytes=round(1000 / compression), float_size_bytes=1000, compression=compression, bitops=1, macs=1,
                eval_seconds=0.0)
    return CurvePoint(floor, PlanEntry(1, "k", {}, test=Scores(m, reduction=compression)))


def test_the_area_is_log_compression_integrated_over_the_floors():
    assert curve_area([_point(0.99, 4.0), _point(0.98, 4.0)]) == pytest.approx(0.01 * math.log(4.0))
    # a floor with no point counts as the float model: half the trapezoid
    assert curve_area([_point(0.99, None), _point(0.98, 4.0)]) == pytest.approx(0.005 * math.log(4.0))
    better = curve_area([_point(0.99, 4.0), _point(0.98, 8.0), _point(0.97, 12.0)])
    assert better > curve_area([_point(0.99, 4.0), _point(0.98, 6.0), _point(0.97, 12.0)])


@pytest.mark.slow
def test_a_sweep_table_compares_strategies_on_their_curves(tmp_path, small_curve_run, small_run):
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(small_curve_run, a)
    shutil.copytree(small_run, b)
    lines = curve_lines({"mcts": [a], "random": [b]})  # a one-floor run has no curve: left out
    text = "\n".join(lines)
    assert "**Certified curves**" in text and "| mcts | 1 |" in text and "| random |" not in text
    assert "95.0%: median ×" in text and "85.0%: median ×" in text
    assert curve_lines({"random": [b]}) == []
