"""The report of one run folder: summary, Pareto front, best-so-far, the best plan layer by layer, top plans.

Built from the run folder's files alone (run.json, trials.jsonl, summary.json when the run has
finished, layers.json when present), so it can be rebuilt any time, also while the run goes on.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path

from modelopt._version import __version__
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.errors import LoadError
from modelopt.evaluation.metrics import Metrics
from modelopt.model.layers import Layer
from modelopt.objective import pareto_front
from modelopt.reports import plots
from modelopt.reports.document import (
    Block,
    Figure,
    Heading,
    Paragraph,
    ReportPaths,
    Table,
    write_document,
)
from modelopt.reports.layer_map import layer_map, plan_mix
from modelopt.run.journal import Record
from modelopt.run.layout import BEST_PLAN, CONFIG, SUMMARY
from modelopt.run.reported import Scores
from modelopt.run.run_folder import RunFolder, read_run

__all__ = ["ReportPaths", "run_blocks", "write_report"]

TOP_PLANS = 10
MAX_FRONT_ROWS = 24
MAX_FAILED_ROWS = 10


def _fx(v: float | None) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2f}×"


def _fpct(v: float | None) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2%}"


def _kib(n: float | None) -> str:
    return "–" if n is None else f"{n / 1024:,.1f} KiB"


def _bounded(x: Scores) -> str:
    """Retention and its bounds at the run's confidence, as its record holds them: "99.10% [98.2%, 99.9%]"."""
    interval = x.interval
    return _fpct(x.metrics.retention) if interval is None else f"{_fpct(x.metrics.retention)} " \
        f"[{interval[0]:.1%}, {interval[1]:.1%}]"


def _what(run: RunFolder) -> str:
    t = run.objective.target.value
    return "compression" if t == "size" else f"{t} reduction"


def _trial_counts(run: RunFolder) -> str:
    failed = sum(not r.ok for r in run.records)
    feasible = sum(r.metrics is not None and run.objective.feasible(r.metrics) for r in run.records)
    return f"{len(run.records)} ({failed} failed, {feasible} feasible)"


def _summary_table(run: RunFolder) -> Table:
    return Table(("", "value"), (*_settings_rows(run), *_float_rows(run), *_best_rows(run)), "ll")


def _settings_rows(run: RunFolder) -> list[tuple[str, str]]:
    """What was run: model, data, strategy, objective, budget and trials."""
    cfg = run.config
    weights = f" (weights `{Path(cfg['weights']).name}`)" if cfg.get("weights") else ""
    rows: list[tuple[str, str]] = [
        ("model", f"`{cfg.get('model', '?')}`{weights}"),
        ("data", f"`{cfg.get('data', '?')}` (split seed {cfg.get('data_seed', 0)})"),
        ("strategy", f"`{cfg.get('strategy', '?')}`, seed {cfg.get('seed', 0)}"),
        ("objective", f"minimise {run.objective.target.value} with retention ≥ {run.objective.min_retention:.2%}"
                      + (f" at confidence {run.objective.confidence:g} (a one-sided bound on the drop)"
                         if run.objective.confidence > 0 else " (point estimates)")),
        ("budget used", f"{run.spent:.4g} of {run.budget:g} full val evaluations" if run.budget < math.inf
         else f"{run.spent:.4g} full val evaluations (timed, no budget)"),
        ("trials", _trial_counts(run)),
    ]
    n_stopped = sum(getattr(r.metrics, "stopped", None) is not None for r in run.records)
    if n_stopped:
        note = "scored on part of val only (multi-fidelity): never feasible, never on the front"
        rows.append(("stopped early", f"{n_stopped} trials {note}"))
    return rows


def _float_rows(run: RunFolder) -> list[tuple[str, str]]:
    """The float model's top-1 on each split and its size."""
    rows = []
    m0 = next((r.metrics for r in run.records if r.metrics is not None), None)
    if run.summary is not None:
        base = run.summary.baseline
        rows.append(("float top-1", ", ".join(f"{base[k].accuracy:.2%} {k} ({base[k].n_samples} images)"
                                              for k in (Split.TEST, Split.CONFIRM, Split.VAL) if k in base)))
    elif m0 is not None:
        rows.append(("float top-1", f"{m0.baseline_accuracy:.2%} val ({m0.n_samples} images); test: when the run ends"))
    return [*rows, ("float size", _kib(run.float_size_bytes))]


def _best_rows(run: RunFolder) -> list[tuple[str, str]]:
    """The reported plan: how it was certified, its figures on each split, beside the uniform plans and the search's
    own pick; each figure selected from the plan's record (summary.json's, or its journal line's while the run
    goes on)."""
    best = run.best
    val = None if best is None else run.figures(best)
    if best is None or val is None:
        return [("best plan", "none above the floor" + ("" if run.done else " yet"))]
    entry = run.entries.get(best.plan_key)
    test, conf = (None, None) if entry is None else (entry.test, entry.confirm)
    shown = _scored_on(((f"{Split.TEST} (held out)", Split.TEST, test), (Split.CONFIRM, Split.CONFIRM, conf),
                        ("val (search-time estimate)", Split.VAL, val)))
    return [
        ("best plan", f"trial {best.number} (key `{best.plan_key}`), {_status(run)}: {plan_mix(best.plan)}"),
        (f"best {_what(run)}", f"{_fx((test or val).reduction)}"),
        ("best size", _size_text((test or val).metrics)),
        ("best retention", "; ".join(f"{_bounded(x)} {long}" for long, _, x in shown)),
        ("best agreement", ", ".join(f"{_fpct(x.metrics.agreement)} {short}" for _, short, x in shown)),
        *_beside_rows(run, best),
    ]


def _scored_on(named: Sequence[tuple[str, str, Scores | None]]) -> list[tuple[str, str, Scores]]:
    """(long name, short name, figures) of the splits the plan was scored on."""
    return [(long, short, x) for long, short, x in named if x is not None]


def _status(run: RunFolder) -> str:
    if run.confirmed:
        return "confirmed on the confirm split"
    return "certified on val only (not confirmed)" if run.done else "so far, on val"


def _beside_rows(run: RunFolder, best: Record) -> list[tuple[str, str]]:
    """The uniform plans' test figures and the search's own pick, where it is not the reported plan."""
    s, rows = run.summary, []
    if s is not None and s.anchors:
        rows.append(("beside the uniform plans", "; ".join(
            f"{a.name or 'trial ' + str(a.trial)} {_fx(a.test.reduction)} ({_fpct(a.test.metrics.retention)} test)"
            for a in s.anchors if a.test is not None)))
    sb = None if s is None else s.search_best
    if sb is not None and sb.plan_key != best.plan_key and sb.val is not None:
        rows.append(("search's own pick", f"trial {sb.trial}, {_fx(sb.val.reduction)} at {_bounded(sb.val)} val: "
                                          "not confirmed"))
    return rows


def _front_table(run: RunFolder, front: Sequence[tuple[Record, Metrics]]) -> Table:
    if len(front) > MAX_FRONT_ROWS:  # spread along the front, as the runner picks the plans it re-scores
        idx = sorted({round(i * (len(front) - 1) / (MAX_FRONT_ROWS - 1)) for i in range(MAX_FRONT_ROWS)})
        front = [front[i] for i in idx]
    rows = []
    for r, m in front:
        test, conf, val = run.test_scores.get(r.plan_key), run.confirm_scores.get(r.plan_key), run.figures(r)
        assert val is not None  # a front trial was scored
        rows.append((str(r.number), _kib(m.size_bytes), _fx(val.reduction),
                     "–" if test is None else _bounded(test), "–" if conf is None else _bounded(conf),
                     _bounded(val), "yes" if run.objective.feasible(m) else "no", plan_mix(r.plan)))
    return Table(("trial", "size", _what(run), "test retention", "confirm retention", "val retention (search)",
                  "feasible on val", "plan"), tuple(rows), "rrrrrrll")


_VERDICT = {None: "not tested", True: "yes", False: "no"}  # a plan's confirmation, as the anchor table says it


def _curve_table(run: RunFolder) -> Table:
    """Per floor: the certified plan, its reduction and test retention, the uniform plans certified there."""
    assert run.summary is not None
    rows = []
    for p in run.summary.curve:
        e = p.plan
        x = None if e is None else (e.test or e.headline)
        rows.append((f"{p.floor:.1%}", "–" if e is None else str(e.trial),
                     "nothing certified" if x is None else _fx(x.reduction), "–" if x is None else _bounded(x),
                     ", ".join(p.uniform) or "none"))
    return Table(("floor", "trial", _what(run), "test retention", "uniform plans certified there"), tuple(rows),
                 "rrrrl")


def _anchor_table(run: RunFolder) -> Table | None:
    """The uniform plans the run scored on the same images (INT8, INT4, INT3, and INT4 with its most sensitive layers
    at INT8), what a search must beat; confirmed or not as confirmation found."""
    s = run.summary
    if s is None or not s.anchors:
        return None
    verdicts = {f.plan_key: f.confirmed for f in s.confirmation.finalists}
    rows = []
    for a in s.anchors:
        if a.headline is None:
            continue
        rows.append((a.name or "?", str(a.trial), _fx(a.headline.reduction),
                     *("–" if x is None else _bounded(x) for x in (a.test, a.confirm, a.val)),
                     _VERDICT[verdicts.get(a.plan_key)]))
    return Table(("uniform plan", "trial", _what(run), "test retention", "confirm retention",
                  "val retention (search)", "confirmed"), tuple(rows), "lrrrrrl")


def _top_table(run: RunFolder) -> Table | None:
    obj = run.objective
    feas = [(r, r.metrics) for r in run.records if r.metrics is not None and obj.feasible(r.metrics)]
    if not feas:
        return None
    feas.sort(key=lambda rm: (-obj.reward(rm[1]), -rm[1].retention, rm[0].number))
    rows = []
    for rank, (r, m) in enumerate(feas[:TOP_PLANS], 1):
        test, val = run.test_scores.get(r.plan_key), run.figures(r)
        assert val is not None  # a feasible trial was scored
        rows.append((str(rank), str(r.number), _fx(val.reduction), _kib(m.size_bytes),
                     "–" if test is None else _fpct(test.metrics.retention), _bounded(val), _fpct(m.agreement),
                     plan_mix(r.plan)))
    return Table(("#", "trial", _what(run), "size", "test retention", "val retention (search)", "val agreement",
                  "plan"), tuple(rows), "rrrrrrrl")


def _size_text(m: Metrics) -> str:
    """The bytes the file stores (the headline), those the weights take once decoded, and the float model's."""
    decoded = f", {_kib(m.decoded_bytes)} once decoded (int8 / INT4 containers)" if m.decoded_bytes else ""
    return f"{_kib(m.size_bytes)} in the file{decoded} (float {_kib(m.float_size_bytes)})"


def _layer_blocks(run: RunFolder, best: Record) -> list[Block]:
    lmap = layer_map(run, best)
    val = run.figures(best)
    assert val is not None
    title = f"Trial {best.number}: {_fx(val.reduction)} at {_fpct(val.metrics.retention)} val retention"
    blocks: list[Block] = [Figure("layers", plots.layer_map_png(lmap, title),
                                  "The best plan layer by layer: each compressor's setting per layer"
                                  + (", and each layer's share of the plan's packed size (bar) beside its share of "
                                     "the float weights (outline)." if lmap.has_sizes else
                                     " (no layer table in the run folder: sizes unknown).")),]
    header = ("layer", *(c.name for c in lmap.columns), "weights", "bytes", "bits / weight", "share of size")
    rows = tuple(
        (f"`{row.layer}`", *(c.label for c in row.cells), "–" if row.params is None else f"{row.params:,}",
         "–" if row.plan_bytes is None else f"{row.plan_bytes:,}", "–" if row.bits is None else f"{row.bits:.2f}",
         _fpct(lmap.share(row)))
        for row in lmap.rows)
    blocks.append(Table(header, rows, "l" + "l" * len(lmap.columns) + "rrrr"))
    if (run.path / BEST_PLAN).is_file():
        blocks.append(Paragraph(f"The plan file: `{BEST_PLAN}` in the run folder "
                                f"(`modelopt evaluate --plan {BEST_PLAN} --split test` re-scores it)."))
    return blocks


def run_blocks(run: RunFolder) -> list[Block]:
    """The report's content, independent of its format."""
    cfg = run.config
    obj = run.objective
    blocks: list[Block] = [Heading(f"modelopt run: {cfg.get('model', '?')}, {cfg.get('strategy', '?')}, "
                                   f"seed {cfg.get('seed', 0)}", 1)]
    if run.done:
        blocks.append(Paragraph(f"Run folder `{run.path}`: finished. Val numbers are what the search saw; test numbers "
                                "re-score the best plan and the Pareto plans on held-out images it never saw."))
    else:
        blocks.append(Paragraph(f"Run folder `{run.path}`: **in progress or stopped** (no {SUMMARY} yet): "
                                f"{len(run.records)} trials, {run.spent:.4g} of {run.budget:g} budget spent. Test "
                                "re-scores appear when the run finishes; rebuild with `modelopt report`."))
    blocks += [Heading("Summary"), _summary_table(run)]
    if run.summary is not None and len(run.summary.curve) > 1:  # a curve run's answer, before how it was found
        blocks += [Heading("Certified curve"),
                   Figure("curve", plots.curve_png(run),
                          f"The smallest plan certified at each floor (every point holds at once at confidence "
                          f"{obj.confidence:g}), at its test retention with its interval, beside the uniform plans on "
                          "test and the val front the search saw."),
                   _curve_table(run)]

    measured = [(r, r.metrics) for r in run.records if r.metrics is not None]
    blocks += [Heading("Pareto front"), Figure("pareto", plots.pareto_png(run),
               f"Every trial's val retention against its {obj.target.value}. Blue: above the floor; grey: below it; "
               "hollow grey: stopped early on part of val; red ×: failed. The line is the val Pareto front; orange "
               "diamonds re-score front plans on test; the star is the best plan.")]
    front = pareto_front(measured, lambda rm: rm[1], obj)
    if front:
        blocks.append(_front_table(run, front))
    anchors = _anchor_table(run)
    if anchors is not None:
        blocks += [Paragraph("Beside the uniform plans every run scores on the same images (the answers without a "
                             "search):"), anchors]

    blocks += [Heading(f"Best-so-far {_what(run)} against budget"),
               Figure("progress", plots.progress_png(run),
                      f"The best feasible {_what(run)} found within each amount of budget (1.00× = float until "
                      "the first feasible plan).")]

    blocks.append(Heading("Best plan, layer by layer"))
    if run.best is None:
        blocks.append(Paragraph(f"No plan kept val retention ≥ {obj.min_retention:.2%} in {len(run.records)} trials"
                                + ("." if run.done else " so far.")))
    else:
        blocks += _layer_blocks(run, run.best)

    top = _top_table(run)
    if top is not None:
        blocks += [Heading(f"Top {len(top.rows)} plans on val"), top]
    failed = [r for r in run.records if not r.ok]
    if failed:
        blocks.append(Heading(f"Failed trials ({len(failed)})"))
        blocks.append(Table(("trial", "error"), tuple(
            (str(r.number), (r.error or "?")[:140]) for r in failed[:MAX_FAILED_ROWS]), "rl"))
    blocks.append(Paragraph(f"Generated by modelopt {__version__} from the run folder's files "
                            "(`modelopt report RUN_DIR` rebuilds it)."))
    return blocks


def write_report(run_dir: str | Path, *, layers: Sequence[Layer] | None = None) -> ReportPaths:
    """Writes `report.md` (PNGs in `report_files/`) and a self-contained `report.html` into a run folder.

    Args:
        run_dir: a run folder (finished, in progress, or stopped).
        layers: the model's layers, when the caller has them (else read from the folder).

    Returns:
        The paths written.

    Raises:
        LoadError: `run_dir` is not a run folder.

    Example:
        >>> paths = write_report("runs/r20")
        >>> paths.html
        PosixPath('runs/r20/report.html')
    """
    run = read_run(run_dir, layers=layers)
    if run.run_config is None:  # every other verb refuses these settings: the report says what it is based on
        try:
            RunConfig.from_json(run.config, str(run.path / CONFIG))
        except LoadError as exc:
            warnings.warn(f"{exc}; the report is based on the journal and summary.json alone (no layer sizes)",
                          UserWarning, stacklevel=2)
    cfg = run.config
    title = f"modelopt: {cfg.get('model')} {cfg.get('strategy')} seed {cfg.get('seed')}"
    return write_document(run.path, run_blocks(run), title)
