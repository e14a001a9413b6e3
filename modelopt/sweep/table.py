"""The sweep table: computed from a sweep's run folders alone, each chosen plan re-scored on test.

`make_table(out)` reads `<out>/sweep.json` and the journals under `<out>/runs/`, takes for
each budget the best feasible plan within that cumulative cost (any-time strategies allow
reading smaller budgets from the largest run), re-scores those plans on the test split, and
writes `table.md`, `table.csv` and `table_seeds.csv`. Nothing in the table is written by hand.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelopt._files import write_atomic
from modelopt.certify.certificate import certify
from modelopt.confidence import clears
from modelopt.config.build import load_workload, make_evaluator
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Metrics
from modelopt.model.workload import Workload
from modelopt.objective import Objective, best_of
from modelopt.plan.plan import Plan
from modelopt.run.journal import Record, read_records
from modelopt.run.layout import CONFIG, JOURNAL, RUNS, SEEDS_CSV, TABLE_CSV, TABLE_MD
from modelopt.run.summary import read_summary
from modelopt.run.sweep_folder import sweep_layout
from modelopt.sweep.anchors import anchor_lines
from modelopt.sweep.file import EPS

__all__ = ["make_table"]


# ---- the table ------------------------------------------------------------------------------
@dataclass
class _Seed:
    """One cell read back: its best-so-far trace and the plans the table needs."""

    seed: int
    config: RunConfig
    objective: Objective
    trace: list[tuple[float, Record | None]]  # (cumulative cost, best feasible record so far)
    covered: float  # the largest budget this cell's trace answers for
    records: list[tuple[float, Record]]  # (cumulative cost, record) of every journal line
    run_dir: Path
    # What the run itself reported (summary.json): (its best's trial number or None, that plan's test metrics or
    # None); None when the run wrote no summary. At the run's own budget the table states this, replaying nothing.
    reported: tuple[int | None, Metrics | None] | None = None
    budget: float = math.inf  # the run's own budget (summary.json)

    def own(self, budget: float) -> bool:
        """Whether `budget` is the run's own (or more): the table then states what the run reported."""
        return self.reported is not None and budget >= self.budget - EPS

    def records_within(self, budget: float) -> list[Record]:
        return [rec for cost, rec in self.records if cost <= budget + EPS]

    def best_within(self, budget: float) -> Record | None:
        best = None
        for cost, rec in self.trace:
            if cost > budget + EPS:
                break
            best = rec
        return best

    def reaches(self, target: float, limit: float) -> float:
        """The cumulative cost at which the best-so-far reduction first reaches `target` (inf: never)."""
        for cost, rec in self.trace:
            if cost > limit + EPS:
                break
            if rec is not None and _reduction(self.objective, rec) >= target * (1 - 1e-12):
                return cost
        return math.inf


def _reduction(obj: Objective, rec: Record) -> float:
    return obj.reward(rec.scored)


def _read_cell(run_dir: Path, seed: int) -> _Seed | None:
    if not (run_dir / CONFIG).is_file():
        return None
    config, summary = RunConfig.read(run_dir), read_summary(run_dir)
    obj = dataclasses.replace(config.make_objective(), claim_images=None if summary is None else
                              summary.objective.claim_images)  # the search's bound as the run took it
    trace: list[tuple[float, Record | None]] = []
    records: list[tuple[float, Record]] = []
    cum, best = 0.0, None
    for rec in read_records(run_dir / JOURNAL):
        cum += rec.cost
        records.append((cum, rec))
        if rec.ok:
            # The runner's rule (best_of): the best so far stays unless this one beats it.
            best = best_of([r for r in (best, rec) if r is not None], lambda r: r.scored, obj)
        trace.append((cum, best))
    # A run that stopped early (nothing new to propose) covers its whole budget.
    covered = max(cum, summary.budget if summary else 0.0)
    reported: tuple[int | None, Metrics | None] | None = None
    if summary is not None:
        entry = summary.best
        reported = (None, None) if entry is None else (entry.trial, None if entry.test is None else entry.test.metrics)
    return _Seed(seed, config, obj, trace, covered, records, run_dir, reported,
                 summary.budget if summary is not None else math.inf)


def _stats(values: Sequence[float]) -> tuple[float, float, float]:
    if not values:
        return math.nan, math.nan, math.nan
    std = statistics.stdev(values) if len(values) > 1 else math.nan
    return statistics.fmean(values), std, statistics.median(values)


class _Scorer:
    """One workload per model and one evaluator per search space: re-scores chosen plans on test."""

    def __init__(self, workloads: Mapping[str, Workload], device: str) -> None:
        self.workloads = dict(workloads)
        self.device = device
        self.evaluators: dict[tuple[str, str], Evaluator] = {}

    def evaluator(self, model: str, config: RunConfig) -> Evaluator:
        key = (model, json.dumps(config.to_json()["compressors"], sort_keys=True))
        if key not in self.evaluators:
            if model not in self.workloads:
                self.workloads[model] = load_workload(dataclasses.replace(config, device=self.device))
            self.evaluators[key] = make_evaluator(config, self.workloads[model])
        return self.evaluators[key]

    def test(self, model: str, config: RunConfig, rec: Record | None) -> Metrics:
        ev = self.evaluator(model, config)
        plan: Plan = ev.space.plan() if rec is None else ev.space.plan_from_flat(rec.plan)
        return ev.scorer.evaluate(plan, split=Split.TEST)

    def reported(self, model: str, cell: _Seed, budget: float) -> Record | None:
        """What the run reported, at its own budget (its summary.json); below it, what the run stopped at `budget`
        would report (`modelopt.certify.certificate.certify`), or its val best without confirm."""
        if cell.own(budget) and cell.reported is not None:
            number = cell.reported[0]
            return None if number is None else next(r for _, r in cell.records if r.number == number)
        ev = self.evaluator(model, cell.config)
        trials = [r.trial(ev.space) for r in cell.records_within(budget)]
        best = certify(ev, cell.objective, trials, test=False).best  # as the run would choose, test unseen
        return None if best is None else next(r for r in cell.records_within(budget) if r.number == best.number)


def make_table(
    out_dir: str | Path, *, workloads: Mapping[str, Workload] | None = None, device: str = "auto"
) -> list[dict[str, Any]]:
    """Rebuilds `table.md`, `table.csv` and `table_seeds.csv` from the run folders under `out_dir/runs`.

    For each model, strategy and budget b, over seeds: the best feasible plan within cumulative
    trial cost <= b, read from the journal (a seed with none counts as the float model), its
    val compression and, re-scored on the test split, its test compression and retention; the
    budget each strategy needed to reach the median best of `random` at the largest budget; and
    each strategy's lead over each other one in median val reduction.

    Args:
        out_dir: the sweep's results folder (the one holding runs/ and sweep.json).
        workloads: already built workloads by model folder name (others are built from run.json).
        device: where test re-scoring runs.

    Returns:
        One dict per model × strategy × budget: the rows of table.csv.

    Example:
        >>> rows = make_table("experiments/mcts_vs_baselines")
        >>> rows[0]["val_compression_median"]
    """
    out = Path(out_dir)
    models, strategies, seeds, budgets, saved = sweep_layout(out)
    if not models:
        raise ConfigError(f"{str(out)!r} holds no sweep run folders (expected {RUNS}/<model>/<strategy>/seed<k>/)")
    scorer = _Scorer(workloads or {}, device)
    rows: list[dict[str, Any]] = []
    seed_rows: list[dict[str, Any]] = []
    sections: list[str] = [_md_header(saved, out)]
    for model in models:
        cells: dict[str, list[_Seed]] = {}
        for strategy in strategies[model]:
            sdir = out / RUNS / model / strategy
            found = sorted(int(p.name[4:]) for p in sdir.glob("seed*") if p.name[4:].isdigit())
            ks = seeds if seeds is not None else found
            cells[strategy] = [c for k in ks if (c := _read_cell(sdir / f"seed{k}", k)) is not None]
        cells = {s: c for s, c in cells.items() if c}
        if not cells:
            continue
        bs = budgets if budgets is not None else sorted({c.covered for cs in cells.values() for c in cs})
        model_rows = _model_rows(model, cells, bs, scorer, seed_rows)
        rows.extend(model_rows)
        sections.append(_md_model(model, cells, bs, model_rows, scorer, out))
    markdown = "\n\n".join(sections) + "\n"
    write_atomic(out / TABLE_MD, markdown)
    _write_csv(out / TABLE_CSV, rows)
    _write_csv(out / SEEDS_CSV, seed_rows)
    return rows


# Each seed's figures at a budget, in the order the table reports them (mean, std and median of each).
_FIGURES = ("held_compression", "val_reduction", "val_compression", "val_retention", "test_compression",
            "test_retention")


@dataclass(frozen=True)
class _SeedAt:
    """One seed of a strategy at one budget: the plan it reports there and that plan's figures, the one record the
    per-seed rows and the per-strategy rows both select from."""

    seed: _Seed
    rec: Record | None  # the plan reported at this budget (None: no feasible plan)
    test: Metrics  # its test figures (the float model's when none)
    held: bool  # its test retention holds the floor

    @classmethod
    def at(cls, model: str, c: _Seed, b: float, scorer: _Scorer) -> _SeedAt:
        rec = scorer.reported(model, c, b)
        reported_test = c.reported[1] if c.own(b) and c.reported is not None and rec is not None else None
        test = reported_test if reported_test is not None else scorer.test(model, c.config, rec)
        return cls(c, rec, test, clears(test.retention, c.objective.min_retention))

    def figures(self) -> dict[str, float]:
        rec, test = self.rec, self.test
        return {
            # What the seed delivers: its reported plan's compression when the plan holds the floor on test, else
            # nothing (1.00x): a claim that breaks on unseen images compresses nothing.
            "held_compression": test.compression if self.held else 1.0,
            "val_reduction": 1.0 if rec is None else _reduction(self.seed.objective, rec),
            "val_compression": 1.0 if rec is None else rec.scored.compression,
            "val_retention": 1.0 if rec is None else rec.scored.retention,
            "test_compression": test.compression,
            "test_retention": test.retention,
        }

    def row(self, model: str, strategy: str, b: float, target: float, top: float) -> dict[str, Any]:
        rec, test = self.rec, self.test
        return {"model": model, "strategy": strategy, "budget": _num(b), "seed": self.seed.seed,
                "best_trial": None if rec is None else rec.number, "plan_key": None if rec is None else rec.plan_key,
                **self.figures(), "test_accuracy": test.accuracy, "size_bytes": test.size_bytes,
                "budget_to_random_best": self.seed.reaches(target, top) if not math.isnan(target) else math.nan}


def _random_target(cells: Mapping[str, list[_Seed]], top: float) -> float:
    """The median reduction random search's seeds report at the top budget (nan without random search)."""
    at_top = [c.best_within(top) for c in cells.get("random", []) if c.covered >= top - EPS]
    if not at_top:
        return math.nan
    obj = cells["random"][0].objective
    return statistics.median([1.0 if r is None else _reduction(obj, r) for r in at_top])


def _model_rows(
    model: str, cells: Mapping[str, list[_Seed]], budgets: Sequence[float], scorer: _Scorer,
    seed_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    top = budgets[-1]
    target = _random_target(cells, top)
    rows = []
    for strategy, seeds in cells.items():
        per_seed = [c.reaches(target, top) for c in seeds if c.covered >= top - EPS] if not math.isnan(target) else []
        needed = statistics.median(per_seed) if per_seed else math.nan
        for b in budgets:
            at = [_SeedAt.at(model, c, b, scorer) for c in seeds if c.covered >= b - EPS]  # cells run that far
            seed_rows.extend(s.row(model, strategy, b, target, top) for s in at)
            row: dict[str, Any] = {"model": model, "model_source": seeds[0].config.model,
                                   "objective": seeds[0].objective.target.value, "strategy": strategy,
                                   "budget": _num(b), "n_seeds": len(at),
                                   "n_feasible": sum(s.rec is not None for s in at),
                                   "n_held": sum(s.rec is not None and s.held for s in at)}
            figures = [s.figures() for s in at]
            for k in _FIGURES:
                row[f"{k}_mean"], row[f"{k}_std"], row[f"{k}_median"] = _stats([f[k] for f in figures])
            row["random_best_target"] = target
            row["budget_to_random_best"] = "never" if needed == math.inf else needed
            rows.append(row)
    # Strategies are compared on what holds on test (docs/sweeps.md: held x), not on their val estimates.
    medians = {(r["strategy"], r["budget"]): r["held_compression_median"] for r in rows}
    for row in rows:
        for other in cells:
            mine, theirs = medians[(row["strategy"], row["budget"])], medians[(other, row["budget"])]
            row[f"lead_vs_{other}_pct"] = math.nan if other == row["strategy"] else (mine / theirs - 1.0) * 100.0
    return rows


def _num(b: float) -> int | float:
    return int(b) if float(b).is_integer() else b


def _write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    fields: list[str] = []
    for row in rows:
        fields.extend(k for k in row if k not in fields)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _csv_value(row.get(k)) for k in fields})
    write_atomic(path, buf.getvalue())


def _csv_value(v: Any) -> Any:
    if isinstance(v, float):
        return "" if math.isnan(v) else "never" if v == math.inf else repr(v)
    return "" if v is None else v


# ---- Markdown -------------------------------------------------------------------------------


def _fx(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2f}×"


def _fpct(v: float) -> str:
    return "–" if v is None or math.isnan(v) else f"{v:.2%}"


def _fb(v: Any) -> str:
    if isinstance(v, str):
        return v
    return "–" if v is None or math.isnan(v) else f"{v:g}"


def _pm(mean: float, std: float, fmt: Callable[[float], str]) -> str:
    if math.isnan(mean):
        return "–"
    return fmt(mean) if math.isnan(std) else f"{fmt(mean)} ± {fmt(std)}"


def _md_header(saved: Mapping[str, Any], out: Path) -> str:
    name = saved.get("name", out.name)
    lines = [f"# Sweep `{name}`", ""]
    if saved:
        # version 1 of sweep.json kept the quantizer's menu at the top level
        settings = saved.get("settings") or {k: saved[k] for k in ("bits", "granularity", "rounding") if k in saved}
        menu = "; ".join(f"{k} {', '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in settings.items())
        lines.append(
            f"Minimise **{saved['objective']}** with retention ≥ {saved['min_retention']:g} at confidence "
            f"{saved.get('confidence', 0.95):g}; compressor settings: {menu}. Budgets (full val "
            f"evaluations): {', '.join(f'{b:g}' for b in saved['budgets'])}; seeds: "
            f"{', '.join(map(str, saved['seeds']))}."
        )
        lines.append("")
    lines.append(
        "Every cell ran once at the largest budget. At that budget each seed's value is what its run reported "
        "(its summary.json: the plan and its test figures). At a smaller budget b it is a what-if: the plan that "
        "run would report had it stopped at b: among the trials whose cumulative cost is ≤ b (read from the run's "
        "journal), "
        "the finalists (the plans of the val fronts and the uniform anchors) are confirmed on the confirm split as "
        "the run does it (two fixed sequences planned on val, sharing the error rate) and the smallest confirmed "
        "is reported. That plan is then re-scored "
        "on the held-out test split. **Held ×** is its compression when its test retention meets the floor, else "
        "1.00× (a claim that breaks on unseen images delivers nothing); strategies are ranked on it. A seed that "
        "reports no plan counts as the float model (1.00×, 100% retention). Val columns are search-time estimates. "
        "± is the sample standard deviation over seeds. Generated by `modelopt.sweep.make_table` from the run "
        "folders; do not edit by hand."
    )
    return "\n".join(lines)


def _shown(path: str, out: Path) -> str:
    """`path` as a committed table shows it: relative to the repository holding the table (the folder above it with
    a .git), where it is a file; as given otherwise (a named source, or no repository)."""
    p = Path(path)
    if not p.exists():
        return path
    here = out.resolve()
    root = next((d for d in (here, *here.parents) if (d / ".git").exists()), None)
    return path if root is None else os.path.relpath(p.resolve(), root)


def _md_table(header: Sequence[str], align: str, body: Sequence[Sequence[str]]) -> list[str]:
    seps = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(seps) + " |",
            *("| " + " | ".join(r) + " |" for r in body)]


def _md_model(
    model: str, cells: Mapping[str, list[_Seed]], budgets: Sequence[float], rows: Sequence[Mapping[str, Any]],
    scorer: _Scorer, out: Path,
) -> str:
    first = next(iter(cells.values()))[0]
    cfg = first.config
    ev = scorer.evaluator(model, cfg)
    wl = ev.workload
    target = first.objective.target.value
    weights = f" with weights `{Path(cfg.weights).name}`" if cfg.weights else ""
    lines = [
        f"## {model}", "",
        f"`{cfg.model}`{weights} on `{_shown(cfg.data, out)}`: float top-1 "
        f"{wl.baseline_accuracy(Split.VAL):.2%} on val ({len(wl.split(Split.VAL))} images), "
        f"{wl.baseline_accuracy(Split.TEST):.2%} on test ({len(wl.split(Split.TEST))} images); "
        f"float size {wl.float_size_bytes / 1024:,.1f} KiB. × is compression: float size / plan size.", "",
    ]
    red = target != "size"  # for size the objective's reduction is the compression itself
    lines += _md_results(rows, target if red else None)
    if "random" in cells and not math.isnan(rows[0]["random_best_target"]):
        lines += _md_budget_needed(cells, rows, budgets[-1], "compression" if not red else f"{target} reduction")
    if len(cells) > 1:
        lines += _md_leads(rows, list(cells))
    return "\n".join(lines + anchor_lines([c.run_dir for cs in cells.values() for c in cs]))


def _md_results(rows: Sequence[Mapping[str, Any]], reduction: str | None) -> list[str]:
    """The per-strategy, per-budget table (`reduction`: the objective's target when it is not size)."""
    header = ["strategy", "budget", "seeds (reported, held on test)", "held ×: median", "held ×: mean ± std",
              "test retention: median", "test retention: mean ± std", "test ×: median", "val ×: median (search-time)"]
    if reduction:
        header.append(f"val {reduction} reduction: median")
    body = []
    for r in rows:
        line = [r["strategy"], _fb(r["budget"]), f"{r['n_seeds']} ({r['n_feasible']}, {r['n_held']})",
                _fx(r["held_compression_median"]), _pm(r["held_compression_mean"], r["held_compression_std"], _fx),
                _fpct(r["test_retention_median"]), _pm(r["test_retention_mean"], r["test_retention_std"], _fpct),
                _fx(r["test_compression_median"]), _fx(r["val_compression_median"])]
        if reduction:
            line.append(_fx(r["val_reduction_median"]))
        body.append(line)
    return _md_table(header, "l" + "r" * (len(header) - 1), body)


def _md_budget_needed(cells: Mapping[str, list[_Seed]], rows: Sequence[Mapping[str, Any]], top: float,
                      what: str) -> list[str]:
    """The budget at which each strategy first reaches random search's best."""
    lines = ["", f"**Budget needed to reach random's best**: the median over random's seeds of the best val "
             f"{what} at budget {top:g} is {_fx(rows[0]['random_best_target'])}; the budget (cumulative cost) at "
             "which each strategy's best-so-far first reaches it, median over seeds.", ""]
    body = []
    for strategy, seeds in cells.items():
        r = next(r for r in rows if r["strategy"] == strategy)
        per_seed = [c.reaches(r["random_best_target"], top) for c in seeds if c.covered >= top - EPS]
        body.append([strategy, _fb(r["budget_to_random_best"]),
                     ", ".join("never" if v == math.inf else f"{v:g}" for v in per_seed)])
    return lines + _md_table(["strategy", "budget needed (median)", "per seed"], "lrl", body)


def _md_leads(rows: Sequence[Mapping[str, Any]], others: Sequence[str]) -> list[str]:
    """Each strategy's lead in median held compression over each other, per budget."""
    lines = ["", "**Lead in median held compression** (what holds on test; row over column, %: median ratio "
             "− 1, × 100).", ""]
    body = [[r["strategy"], _fb(r["budget"])] + [
        "–" if o == r["strategy"] or math.isnan(r[f"lead_vs_{o}_pct"]) else f"{r[f'lead_vs_{o}_pct']:+.1f}%"
        for o in others] for r in rows]
    return lines + _md_table(["strategy", "budget", *(f"vs {o}" for o in others)], "lr" + "r" * len(others), body)

