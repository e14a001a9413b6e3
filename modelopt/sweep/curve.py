"""A sweep's strategies compared on their certified curves (runs with `floors`): the area under each run's curve,
and the point at each floor, per strategy over its seeds."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from modelopt.run.reported import CurvePoint
from modelopt.run.summary import read_summary

__all__ = ["curve_area", "curve_lines"]


def _reduction(point: CurvePoint) -> float:
    """The point's reduction on test (1.0: nothing certified at its floor, the float model)."""
    entry = point.plan
    x = None if entry is None else (entry.test or entry.headline)
    return 1.0 if x is None or x.reduction is None else max(float(x.reduction), 1.0)


def curve_area(curve: Sequence[CurvePoint]) -> float:
    """The area under a certified curve, natural-log reduction against the floor (trapezoids between adjacent floors,
    a floor with no point at reduction 1): larger is better, 0 for a curve of the float model alone.

    Example:
        >>> round(curve_area([CurvePoint(0.99), CurvePoint(0.98)]), 3)
        0.0
    """
    pts = sorted((p.floor, math.log(_reduction(p))) for p in curve)
    return sum((f2 - f1) * (y1 + y2) / 2 for (f1, y1), (f2, y2) in itertools.pairwise(pts))


def curve_lines(cells: Mapping[str, Sequence[Path]]) -> list[str]:
    """Markdown lines comparing strategies on their runs' certified curves; none when no run has one.

    Args:
        cells: each strategy's run folders (its seeds).
    """
    curves = {s: [c for c in (_curve(d) for d in dirs) if c] for s, dirs in cells.items()}
    curves = {s: cs for s, cs in curves.items() if cs}
    if not curves:
        return []
    floors = sorted({p.floor for cs in curves.values() for c in cs for p in c}, reverse=True)
    lines = ["", "**Certified curves** (runs with floors: every point of a run's curve holds at once). Area: under "
             "the curve of ln(compression on test) against the floor, a floor with no point at 1.00×; per floor, "
             "the median compression of the point certified there.", ""]
    header = ["strategy", "seeds", "area: median", "area: mean ± std", *(f"{f:.1%}: median ×" for f in floors)]
    body = []
    for strategy, cs in curves.items():
        areas = [curve_area(c) for c in cs]
        sd = statistics.stdev(areas) if len(areas) > 1 else math.nan
        per_floor = []
        for f in floors:
            xs = [_reduction(p) for c in cs for p in c if abs(p.floor - f) < 1e-9]
            per_floor.append(f"{statistics.median(xs):.2f}×" if xs else "–")
        mean = statistics.fmean(areas)
        body.append([strategy, str(len(cs)), f"{statistics.median(areas):.4f}",
                     f"{mean:.4f}" if math.isnan(sd) else f"{mean:.4f} ± {sd:.4f}", *per_floor])
    seps = ["---"] + ["---:"] * (len(header) - 1)
    return [*lines, "| " + " | ".join(header) + " |", "| " + " | ".join(seps) + " |",
            *("| " + " | ".join(r) + " |" for r in body)]


def _curve(run_dir: Path) -> tuple[CurvePoint, ...]:
    """The run's certified curve; none for a one-floor run (its one point is its reported plan, in the table above)."""
    summary = read_summary(run_dir)
    return () if summary is None or len(summary.curve) < 2 else summary.curve
