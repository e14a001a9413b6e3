"""Every committed sweep table states what its runs reported: at a run's own budget, each seed's plan and test
figures in table_seeds.csv are its summary.json's (where the run folders are committed beside the table)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SWEEPS = sorted(p.parent for p in EXPERIMENTS.glob("*/table_seeds.csv") if (p.parent / "runs").is_dir())


@pytest.mark.parametrize("sweep", SWEEPS, ids=[p.name for p in SWEEPS])
def test_each_cell_at_its_runs_budget_is_the_runs_report(sweep: Path) -> None:
    with open(sweep / "table_seeds.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    checked = 0
    for row in rows:
        run = sweep / "runs" / row["model"] / row["strategy"] / f"seed{row['seed']}"
        if not (run / "summary.json").is_file():
            continue
        summary = json.loads((run / "summary.json").read_text())
        if float(row["budget"]) < float(summary["budget"]):
            continue  # a what-if at a smaller budget
        best = summary["best"]
        where = f"{sweep.name}: {row['model']} {row['strategy']} seed {row['seed']}"
        assert row["best_trial"] == ("" if best is None else str(best["trial"])), where
        if best is not None:
            assert float(row["test_retention"]) == pytest.approx(best["test"]["retention"], abs=1e-12), where
            assert float(row["test_compression"]) == pytest.approx(best["test"]["compression"], rel=1e-12), where
        checked += 1
    assert checked, f"{sweep.name}: no cell at its runs' budget"


def test_committed_tables_name_no_absolute_path() -> None:
    for table in EXPERIMENTS.glob("*/table.md"):
        text = table.read_text()
        assert "`/" not in text, f"{table}: an absolute path; paths in committed files are relative to the repository"
