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
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelopt._files import write_atomic
from modelopt.certify.certificate import certify
from modelopt.config.build import load_workload, make_evaluator
from modelopt.config.run_config import RunConfig
from modelopt.data.split import Split
from modelopt.errors import ConfigError
from modelopt.evaluation.evaluator import Evaluator, Metrics
from modelopt.model.workload import Workload
from modelopt.plan.plan import Plan
from modelopt.run.journal import Record
from modelopt.run.layout import RUNS, SEEDS_CSV, TABLE_CSV, TABLE_MD
from modelopt.run.reported import Scores
from modelopt.run.sweep_folder import sweep_layout
from modelopt.sweep.cells import EPS
from modelopt.sweep.seed_trace import SeedTrace, read_seed, reduction
from modelopt.sweep.table_md import md_header, md_model

__all__ = ["make_table"]


# ---- the table ------------------------------------------------------------------------------
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
        return ev.evaluate(plan, split=Split.TEST)

    def reported(self, model: str, cell: SeedTrace, budget: float) -> Record | None:
        """What the run reported, at its own budget (its summary.json); below it, what the run stopped at `budget`
        would report (`modelopt.certify.certificate.certify`), or its val best without confirm."""
        if cell.own(budget):
            entry = cell.reported()
            return None if entry is None else next(r for _, r in cell.records if r.number == entry.trial)
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
    sections: list[str] = [md_header(saved, out)]
    for model in models:
        cells = _read_cells(out, model, strategies[model], seeds)
        if not cells:
            continue
        bs = budgets if budgets is not None else sorted({c.covered for cs in cells.values() for c in cs})
        model_rows = _model_rows(model, cells, bs, scorer, seed_rows)
        rows.extend(model_rows)
        wl = scorer.evaluator(model, next(iter(cells.values()))[0].config).workload
        sections.append(md_model(model, cells, bs, model_rows, wl, out))
    markdown = "\n\n".join(sections) + "\n"
    write_atomic(out / TABLE_MD, markdown)
    _write_csv(out / TABLE_CSV, rows)
    _write_csv(out / SEEDS_CSV, seed_rows)
    return rows


def _read_cells(out: Path, model: str, strategies: Sequence[str], seeds: Sequence[int] | None
                ) -> dict[str, list[SeedTrace]]:
    """The model's cells read back, by strategy (`seeds`: the sweep's; None: every seed folder found); a strategy
    none of whose cells has started is left out."""
    cells: dict[str, list[SeedTrace]] = {}
    for strategy in strategies:
        sdir = out / RUNS / model / strategy
        found = sorted(int(p.name[4:]) for p in sdir.glob("seed*") if p.name[4:].isdigit())
        ks = seeds if seeds is not None else found
        cells[strategy] = [c for k in ks if (c := read_seed(sdir / f"seed{k}", k)) is not None]
    return {s: c for s, c in cells.items() if c}


# Each seed's figures at a budget, in the order the table reports them (mean, std and median of each).
_FIGURES = ("held_compression", "val_reduction", "val_compression", "val_retention", "test_compression",
            "test_retention")


@dataclass(frozen=True)
class _SeedAt:
    """One seed of a strategy at one budget: the plan it reports there and that plan's test figures (at the run's
    own budget its record in summary.json, below it the what-if plan's, re-scored), the one record the per-seed rows
    and the per-strategy rows both select from."""

    seed: SeedTrace
    rec: Record | None  # the plan reported at this budget (None: no feasible plan)
    test: Scores  # its test figures (the float model's when none)

    @classmethod
    def at(cls, model: str, c: SeedTrace, b: float, scorer: _Scorer) -> _SeedAt:
        rec = scorer.reported(model, c, b)
        entry = c.reported() if c.own(b) and rec is not None else None
        if entry is not None and entry.test is not None:
            return cls(c, rec, entry.test)
        return cls(c, rec, Scores.of(scorer.test(model, c.config, rec), c.objective))

    @property
    def held(self) -> bool:
        """Whether its test retention holds the floor (the record's word)."""
        return bool(self.test.held)

    def figures(self) -> dict[str, float]:
        rec, test = self.rec, self.test.metrics
        return {
            # What the seed delivers: its reported plan's compression when the plan holds the floor on test, else
            # nothing (1.00x): a claim that breaks on unseen images compresses nothing.
            "held_compression": test.compression if self.held else 1.0,
            "val_reduction": 1.0 if rec is None else reduction(self.seed.objective, rec),
            "val_compression": 1.0 if rec is None else rec.scored.compression,
            "val_retention": 1.0 if rec is None else rec.scored.retention,
            "test_compression": test.compression,
            "test_retention": test.retention,
        }

    def row(self, model: str, strategy: str, b: float, target: float, top: float) -> dict[str, Any]:
        rec, test = self.rec, self.test.metrics
        return {"model": model, "strategy": strategy, "budget": _num(b), "seed": self.seed.seed,
                "best_trial": None if rec is None else rec.number, "plan_key": None if rec is None else rec.plan_key,
                **self.figures(), "test_accuracy": test.accuracy, "size_bytes": test.size_bytes,
                "budget_to_random_best": self.seed.reaches(target, top) if not math.isnan(target) else math.nan}


def _random_target(cells: Mapping[str, list[SeedTrace]], top: float) -> float:
    """The median reduction random search's seeds report at the top budget (nan without random search)."""
    at_top = [c.best_within(top) for c in cells.get("random", []) if c.covered >= top - EPS]
    if not at_top:
        return math.nan
    obj = cells["random"][0].objective
    return statistics.median([1.0 if r is None else reduction(obj, r) for r in at_top])


def _model_rows(
    model: str, cells: Mapping[str, list[SeedTrace]], budgets: Sequence[float], scorer: _Scorer,
    seed_rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The model's rows of table.csv (one per strategy and budget; `seed_rows` gets one per seed as well)."""
    top = budgets[-1]
    target = _random_target(cells, top)
    rows = []
    for strategy, seeds in cells.items():
        needed = _budget_needed(seeds, target, top)
        for b in budgets:
            at = [_SeedAt.at(model, c, b, scorer) for c in seeds if c.covered >= b - EPS]  # cells run that far
            seed_rows.extend(s.row(model, strategy, b, target, top) for s in at)
            rows.append({**_strategy_row(model, strategy, seeds[0], b, at), "random_best_target": target,
                         "budget_to_random_best": "never" if needed == math.inf else needed})
    _add_leads(rows, list(cells))
    return rows


def _budget_needed(seeds: Sequence[SeedTrace], target: float, top: float) -> float:
    """The median over seeds of the budget at which a strategy's best-so-far first reaches `target` (nan: none)."""
    if math.isnan(target):
        return math.nan
    per_seed = [c.reaches(target, top) for c in seeds if c.covered >= top - EPS]
    return statistics.median(per_seed) if per_seed else math.nan


def _strategy_row(model: str, strategy: str, first: SeedTrace, b: float, at: Sequence[_SeedAt]) -> dict[str, Any]:
    """One strategy at one budget: how many seeds report a plan and hold the floor, each figure's mean, std and
    median over the seeds."""
    row: dict[str, Any] = {"model": model, "model_source": first.config.model,
                           "objective": first.objective.target.value, "strategy": strategy, "budget": _num(b),
                           "n_seeds": len(at), "n_feasible": sum(s.rec is not None for s in at),
                           "n_held": sum(s.rec is not None and s.held for s in at)}
    figures = [s.figures() for s in at]
    for k in _FIGURES:
        row[f"{k}_mean"], row[f"{k}_std"], row[f"{k}_median"] = _stats([f[k] for f in figures])
    return row


def _add_leads(rows: list[dict[str, Any]], strategies: Sequence[str]) -> None:
    """Each row's lead over each other strategy at its budget, in median held compression."""
    # Strategies are compared on what holds on test (docs/sweeps.md: held x), not on their val estimates.
    medians = {(r["strategy"], r["budget"]): r["held_compression_median"] for r in rows}
    for row in rows:
        for other in strategies:
            mine, theirs = medians[(row["strategy"], row["budget"])], medians[(other, row["budget"])]
            row[f"lead_vs_{other}_pct"] = math.nan if other == row["strategy"] else (mine / theirs - 1.0) * 100.0


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
