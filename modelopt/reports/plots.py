"""The report's figures as PNG bytes: Pareto front, best-so-far against budget, per-layer map,
and a sweep's best-so-far per strategy.

matplotlib is imported here only, when a figure is drawn, and through its object API with the
Agg canvas: pyplot and the caller's backend (a notebook's) are never touched.
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from modelopt.evaluation.metrics import Metrics
from modelopt.objective import Objective, pareto_front
from modelopt.reports.layer_map import LayerMap
from modelopt.run.journal import Record
from modelopt.run.run_folder import RunFolder

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["curve_png", "layer_map_png", "pareto_png", "progress_png", "sweep_progress_png"]

DPI = 110
C_FEASIBLE, C_INFEASIBLE, C_FAILED = "#2f6fb3", "#9aa3ad", "#d1242f"
C_FRONT, C_TEST, C_BEST, C_FLOOR = "#0b3d6e", "#e36209", "#f2b705", "#6e7781"
STRATEGY_COLORS = ("#2f6fb3", "#e36209", "#2da44e", "#8250df", "#d1242f", "#6e7781", "#bf8700", "#1b7c83")


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


def _target_axis(run: RunFolder) -> tuple[str, float, str]:
    """Label, divisor and unit of the objective's target for the x axis."""
    target = run.objective.target.value
    if target == "size":
        return "size (KiB, packed)", 1024.0, "KiB"
    return f"{target} (G per sample)", 1e9, "G"


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=12, color="#57606a")


@dataclass(frozen=True)
class _ParetoAxes:
    """Where a trial lands: x its target value (in the axis unit), y its val retention, clipped at `lo`."""

    obj: Objective
    div: float
    lo: float

    def xs(self, ms: Sequence[Metrics]) -> list[float]:
        return [self.obj.value(m) / self.div for m in ms]

    def ys(self, ms: Sequence[Metrics]) -> list[float]:
        return [max(m.retention, self.lo) for m in ms]


def pareto_png(run: RunFolder) -> bytes:
    """Val retention against the target (size) for every trial, the front, its test re-scores, the floor."""
    obj = run.objective
    label, div, _ = _target_axis(run)
    fig = _figure(9.0, 5.4)
    ax = fig.add_subplot()
    measured = [(r, r.metrics) for r in run.records if r.metrics is not None]
    failed = [r for r in run.records if r.metrics is None]
    ax.set_xlabel(label)
    ax.set_ylabel("val retention (top-1 / float top-1)")
    ax.grid(True, alpha=0.3)
    if not measured:
        _note(ax, f"no trial measured yet ({len(failed)} failed)" if failed else "no trials yet")
        return _png(fig)
    front = pareto_front(measured, lambda rm: rm[1], obj)
    tests = {r.plan_key: run.test_by_key[r.plan_key] for r, _ in front if r.plan_key in run.test_by_key}
    floor = obj.min_retention
    anchors = [m.retention for _, m in front if m.retention >= floor - 0.1]
    anchors += [t.retention for t in tests.values()] + [floor, 1.0]
    hi = max(max(m.retention for _, m in measured), 1.0) + 0.005
    axes = _ParetoAxes(obj, div, lo=min(min(anchors) - 0.01, floor - 0.02))
    _draw_trials(ax, axes, [m for _, m in measured])
    _draw_failed(ax, axes, run, failed)
    _draw_front(ax, axes, front, tests)
    ax.axhline(floor, color=C_FLOOR, ls="--", lw=1.1, label=f"floor {floor:.1%}")
    best = run.best
    if best is not None and best.metrics is not None:
        ax.scatter(axes.xs([best.metrics]), [best.metrics.retention], s=220, marker="*", color=C_BEST,
                   edgecolor="black", lw=0.8, zorder=5,
                   label=f"best: {run.reduction(best.metrics):.2f}× (trial {best.number})")
    ax.set_ylim(axes.lo - 0.003, hi)
    ax.yaxis.set_major_formatter(_percent())
    values = [obj.value(m) for _, m in measured]
    if max(values) > 3 * min(values):  # a wide range of sizes reads better on a log axis
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain())
        ax.xaxis.set_minor_formatter(_plain(minor=True))
    ax.legend(loc="lower right", fontsize=8.5, framealpha=0.92)
    ax.set_title("Val retention against size, every trial", fontsize=11)
    return _png(fig)


def curve_png(run: RunFolder) -> bytes:
    """The certified curve: each floor's point at its reduction with its test retention and interval, the floors
    as dashed lines, the uniform plans' test re-scores, and the val front (search-time estimates) behind them."""
    obj = run.objective
    summary = run.summary
    fig = _figure(9.0, 5.0)
    ax = fig.add_subplot()
    ax.set_xlabel(f"{obj.target.value} reduction (float / plan), log")
    ax.set_ylabel("retention (top-1 / float top-1)")
    ax.grid(True, alpha=0.3)
    points = [] if summary is None else [p for p in summary.curve if p.plan is not None and p.plan.test is not None]
    if summary is None or not points:
        _note(ax, "no certified curve (a run with --floors certifies one)")
        return _png(fig)
    measured = [(r, r.metrics) for r in run.records if r.metrics is not None and r.metrics.stopped is None]
    front = pareto_front(measured, lambda rm: rm[1], obj)
    if front:
        ax.step([obj.reduction(m) for _, m in front], [m.retention for _, m in front], where="pre", color=C_FRONT,
                lw=1.0, alpha=0.5, label="val front (search-time estimates)")
    for i, p in enumerate(summary.curve):
        ax.axhline(p.floor, color=C_FLOOR, ls="--", lw=0.9, alpha=0.8, label="floors" if i == 0 else None)
    xs, ys, lo, hi = [], [], [], []
    floors_of: dict[str, list[float]] = {}  # one plan may be the point of several floors: one star, one label
    for p in points:
        assert p.plan is not None
        floors_of.setdefault(p.plan.plan_key, []).append(p.floor)
    for p in points:
        assert p.plan is not None and p.plan.test is not None
        if p.floor != floors_of[p.plan.plan_key][0]:
            continue
        t = p.plan.test
        xs.append(t.reduction if t.reduction is not None else obj.reduction(t.metrics))
        ys.append(t.metrics.retention)
        interval = t.interval or (t.metrics.retention, t.metrics.retention)
        lo.append(t.metrics.retention - interval[0])
        hi.append(interval[1] - t.metrics.retention)
        floors = ", ".join(f"{f:.1%}" for f in floors_of[p.plan.plan_key])
        ax.annotate(f"{floors}: {xs[-1]:.2f}×", (xs[-1], ys[-1]), textcoords="offset points", xytext=(6, 6),
                    fontsize=8)
    ax.errorbar(xs, ys, yerr=[lo, hi], fmt="*", ms=12, color=C_BEST, mec="black", ecolor=C_TEST, capsize=4,
                zorder=5, label="certified points, test retention and interval")
    anchors = [a for a in summary.anchors if a.test is not None]
    if anchors:
        ax.scatter([obj.reduction(a.test.metrics) for a in anchors if a.test is not None],
                   [a.test.metrics.retention for a in anchors if a.test is not None], marker="s", s=30,
                   color=C_INFEASIBLE, edgecolor="black", lw=0.5, zorder=4, label="uniform plans, test")
        for a in anchors:
            if a.test is not None:
                ax.annotate(a.name or "?", (obj.reduction(a.test.metrics), a.test.metrics.retention),
                            textcoords="offset points", xytext=(4, -10), fontsize=7, color="#57606a")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(_plain())
    ax.xaxis.set_minor_formatter(_plain(minor=True))
    ax.yaxis.set_major_formatter(_percent())
    low = min([*(y - d for y, d in zip(ys, lo, strict=True)), *(p.floor for p in summary.curve)]) - 0.01
    high = max([*(y + d for y, d in zip(ys, hi, strict=True)), 1.0]) + 0.005
    ax.set_ylim(low, high)
    ax.legend(loc="lower left", fontsize=8.5, framealpha=0.92)
    ax.set_title("Certified curve: every point holds at once", fontsize=11)
    return _png(fig)


def _draw_trials(ax: Axes, axes: _ParetoAxes, measured: Sequence[Metrics]) -> None:
    """Feasible, below the floor, below the axis (drawn at its edge), and stopped early (an estimate)."""
    lo, obj = axes.lo, axes.obj
    # Multi-fidelity: a plan stopped on part of val has only an estimate of its retention.
    stopped = [m for m in measured if m.stopped is not None]
    full = [m for m in measured if m.stopped is None]
    feas = [m for m in full if obj.feasible(m)]
    infeas_in = [m for m in full if not obj.feasible(m) and m.retention >= lo]
    below = [m for m in full if m.retention < lo]
    ax.scatter(axes.xs(feas), axes.ys(feas), s=16, color=C_FEASIBLE, alpha=0.55, lw=0, label=f"feasible ({len(feas)})")
    if stopped:
        ax.scatter(axes.xs(stopped), axes.ys(stopped), s=18, facecolor="none", edgecolor=C_INFEASIBLE, lw=0.8,
                   alpha=0.8, label=f"stopped early on part of val ({len(stopped)}; estimate)")
    if infeas_in or below:
        ax.scatter(axes.xs(infeas_in), axes.ys(infeas_in), s=16, color=C_INFEASIBLE, alpha=0.6, lw=0,
                   label=f"below the floor ({len(infeas_in) + len(below)})")
    if below:
        ax.scatter(axes.xs(below), [lo] * len(below), s=22, marker="v", color=C_INFEASIBLE, alpha=0.8, lw=0,
                   label=f"{len(below)} below {lo:.0%}, drawn at the edge", clip_on=False)


def _draw_failed(ax: Axes, axes: _ParetoAxes, run: RunFolder, failed: Sequence[Record]) -> None:
    """Failed trials as red crosses at the bottom edge, where their size is known and size is the target."""
    if not failed:
        return
    placed = [s for s in (run.size_bytes(r) for r in failed) if s is not None]
    where = "drawn at the bottom edge" if placed else "no size known"
    if placed and axes.obj.target.value == "size":
        ax.scatter([s / axes.div for s in placed], [axes.lo] * len(placed), s=40, marker="x", color=C_FAILED, lw=1.5,
                   clip_on=False, zorder=4, label=f"failed ({len(failed)}, {where})")
    else:
        ax.scatter([], [], s=40, marker="x", color=C_FAILED, label=f"failed ({len(failed)}, not plotted)")


def _draw_front(ax: Axes, axes: _ParetoAxes, front: Sequence[tuple[Record, Metrics]],
                tests: Mapping[str, Metrics]) -> None:
    """The val Pareto front as a step line, and each front plan's test re-score joined to it."""
    fx, fy = axes.xs([m for _, m in front]), axes.ys([m for _, m in front])
    ax.step(fx, fy, where="post", color=C_FRONT, lw=1.4, alpha=0.9, label=f"Pareto front on val ({len(front)})")
    ax.scatter(fx, fy, s=24, facecolor="none", edgecolor=C_FRONT, lw=1.2, zorder=3)
    if not tests:
        return
    for (r, _), x, y in zip(front, fx, fy, strict=True):
        t = tests.get(r.plan_key)
        if t is not None:
            ax.plot([x, x], [y, axes.ys([t])[0]], color=C_TEST, lw=0.8, ls=":", alpha=0.9)
    ax.scatter(axes.xs(list(tests.values())), axes.ys(list(tests.values())), s=34, marker="D", color=C_TEST, zorder=4,
               label=f"front re-scored on test ({len(tests)})")


def _percent() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _: f"{v:.0%}" if abs(v * 100 - round(v * 100)) < 1e-6 else f"{v:.1%}")


def _plain(minor: bool = False) -> Any:
    from matplotlib.ticker import FuncFormatter

    def fmt(v: float, _: Any) -> str:
        if v <= 0:
            return ""
        lead = v / 10 ** math.floor(math.log10(v))
        if minor and round(lead) not in (2, 3, 5):
            return ""  # a few minor labels keep a log axis readable without crowding
        return f"{v:,.0f}" if v >= 10 else f"{v:.2g}"

    return FuncFormatter(fmt)


def progress_png(run: RunFolder) -> bytes:
    """Best feasible reduction so far against the budget spent, with every feasible trial as a dot."""
    obj = run.objective
    what = "compression" if obj.target.value == "size" else f"{obj.target.value} reduction"
    fig = _figure(9.0, 4.2)
    ax = fig.add_subplot()
    ax.set_xlabel("budget spent (full val evaluations)")
    ax.set_ylabel(f"best feasible {what} (×)")
    ax.grid(True, alpha=0.3)
    trace = run.best_so_far()
    pts = [(c, b) for c, b in trace if b is not None]
    dots = [(cum, run.reduction(r.metrics)) for r, cum in zip(run.records, run.cum_costs, strict=True)
            if r.metrics is not None and obj.feasible(r.metrics)]
    if dots:
        ax.scatter([c for c, _ in dots], [v for _, v in dots], s=10, color=C_FEASIBLE, alpha=0.3, lw=0,
                   label="feasible trials")
    if pts:
        xs = [0.0, pts[0][0]] + [c for c, _ in pts]
        ys = [1.0, 1.0] + [b for _, b in pts]
        xs.append(max(run.spent, xs[-1]))
        ys.append(ys[-1])
        ax.step(xs, ys, where="post", color=C_FRONT, lw=2, label="best so far")
        ax.annotate(f"{ys[-1]:.2f}×", (xs[-1], ys[-1]), textcoords="offset points", xytext=(-2, 5), ha="right",
                    fontsize=9, fontweight="bold", color=C_FRONT)
    else:
        _note(ax, f"no feasible plan in {len(run.records)} trials" if run.records else "no trials yet")
    if run.budget and run.spent < run.budget - 1e-9 and run.budget < math.inf:
        ax.axvline(run.budget, color=C_FLOOR, ls="--", lw=1, label=f"budget {run.budget:g} (run in progress)")
    ax.set_xlim(0, max(run.budget if run.budget < math.inf else 0.0, run.spent, 1.0) * 1.02)
    if pts or dots:
        ax.legend(loc="lower right", fontsize=8.5)
    ax.set_title(f"Best-so-far feasible {what} against budget", fontsize=11)
    return _png(fig)


def layer_map_png(lmap: LayerMap, title: str) -> bytes:
    """One row per layer: each column's setting as a coloured cell, then the layer's share of the size."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    n, ncol = len(lmap.rows), len(lmap.columns)
    sizes = lmap.has_sizes
    row_h = 0.24
    fig = _figure(9.0 if sizes else 6.0, max(2.5, 1.3 + row_h * n))
    grid = fig.add_gridspec(1, 2 if sizes else 1, width_ratios=[ncol * 1.05, 4.2] if sizes else [1])
    ax = fig.add_subplot(grid[0, 0])
    for j, col in enumerate(lmap.columns):
        cmap = colormaps[col.cmap]
        for i, row in enumerate(lmap.rows):
            cell = row.cells[j]
            rgba = None if cell.level is None else cmap(cell.level)
            ax.add_patch(Rectangle((j, i), 1, 1, facecolor="#f2f3f5" if rgba is None else rgba, edgecolor="white",
                                   lw=1.2))
            dark = rgba is not None and sum(rgba[:3]) / 3 < 0.5
            ax.text(j + 0.5, i + 0.5, cell.label, ha="center", va="center", fontsize=7.5,
                    color="white" if dark else "#1f2328")
    ax.set_xlim(0, ncol)
    ax.set_ylim(n, 0)
    ax.set_xticks([j + 0.5 for j in range(ncol)], [c.name for c in lmap.columns], fontsize=9)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(n)], [r.layer for r in lmap.rows], fontsize=7.5)
    ax.tick_params(length=0)
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    if sizes:
        bx = fig.add_subplot(grid[0, 1], sharey=ax)
        share = [100 * lmap.share(r) for r in lmap.rows]
        pshare = [100 * lmap.param_share(r) for r in lmap.rows]
        ys = [i + 0.5 for i in range(n)]
        bx.barh(ys, pshare, height=0.78, color="none", edgecolor="#9aa3ad", lw=0.8,
                label="share of the weights (float)")
        bx.barh(ys, share, height=0.5, color=C_FEASIBLE, alpha=0.85, label="share of the plan's size")
        for y, s in zip(ys, share, strict=True):
            bx.text(s, y, f" {s:.1f}%", va="center", fontsize=6.5, color="#1f2328")
        bx.set_xlabel("% of total", fontsize=9)
        bx.xaxis.set_label_position("top")
        bx.xaxis.tick_top()
        bx.tick_params(axis="y", length=0, labelleft=False)
        bx.tick_params(axis="x", labelsize=8)
        bx.set_xlim(0, max(pshare + share) * 1.25)
        bx.grid(True, axis="x", alpha=0.3)
        bx.legend(loc="upper right", fontsize=7.5)
    fig.suptitle(title, fontsize=11)
    return _png(fig)


def sweep_progress_png(
    model: str, curves: Mapping[str, Sequence[Sequence[tuple[float, float]]]], what: str, budgets: Sequence[float],
) -> bytes:
    """Per strategy: median over seeds of the best-so-far against budget, shaded from the worst seed to the best.

    `curves[strategy]` holds one trace per seed: (cumulative cost, best reduction so far, 1.0 when none).
    """
    fig = _figure(9.0, 4.6)
    ax = fig.add_subplot()
    top = max((t[-1][0] for traces in curves.values() for t in traces if t), default=1.0)
    grid = np.linspace(0.0, top, 400)
    for k, (strategy, traces) in enumerate(curves.items()):
        color = STRATEGY_COLORS[k % len(STRATEGY_COLORS)]
        rows = []
        for t in traces:
            if not t:
                continue
            costs = np.array([c for c, _ in t])
            vals = np.array([v for _, v in t])
            idx = np.searchsorted(costs, grid + 1e-9, side="right") - 1
            y = np.where(idx >= 0, vals[np.clip(idx, 0, None)], 1.0)
            y[grid > costs[-1] + 1e-9] = np.nan  # that seed has not run this far
            rows.append(y)
        if not rows:
            continue
        arr = np.vstack(rows)
        ok = ~np.all(np.isnan(arr), axis=0)
        med = np.full(grid.shape, np.nan)
        lo, hi = med.copy(), med.copy()
        med[ok] = np.nanmedian(arr[:, ok], axis=0)
        lo[ok], hi[ok] = np.nanmin(arr[:, ok], axis=0), np.nanmax(arr[:, ok], axis=0)
        ax.plot(grid, med, color=color, lw=2, label=f"{strategy} (median of {len(rows)})", drawstyle="steps-post")
        ax.fill_between(grid, lo, hi, color=color, alpha=0.09, step="post", lw=0)
    for b in budgets:
        ax.axvline(b, color=C_FLOOR, ls=":", lw=0.8)
    ax.set_xlim(0, top * 1.01)
    ax.set_xlabel("budget spent (full val evaluations)")
    ax.set_ylabel(f"best feasible {what} (×)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)
    ax.set_title(f"{model}: best-so-far per strategy (band: worst to best seed)", fontsize=11)
    return _png(fig)
