"""One record per reported plan: the CLI's table, the run report and the sweep tables select the same figures from
it (a real small sweep's run folders, built once per session), and the record reads back as summary.json saved it."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from rich.console import Console

from modelopt.cli.display import best_table
from modelopt.reports.document import Table
from modelopt.reports.run_report import run_blocks
from modelopt.run.layout import SEEDS_CSV, SUMMARY, TABLE_MD
from modelopt.run.reported import Scores
from modelopt.run.run_folder import read_run
from modelopt.run.summary import RunSummary, read_summary

# small_sweep (a finished 4-cell sweep) is made once by the test process of this group (tests/reports, tests/sweep).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("small_sweep")]


def _cli_text(summary: RunSummary) -> str:
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(best_table(summary))
    return console.export_text()


def _report_table(run_dir, header: tuple[str, ...]) -> Table:
    return next(b for b in run_blocks(read_run(run_dir)) if isinstance(b, Table) and b.header[:len(header)] == header)


def test_the_cli_the_report_and_the_sweep_table_state_the_records_figures(small_sweep):
    run_dir = small_sweep / "runs" / "resnet20" / "mcts" / "seed0"
    summary = read_summary(run_dir)
    assert summary is not None and summary.best is not None and summary.best.test is not None
    best, test = summary.best, summary.best.test
    assert test.interval is not None and test.reduction is not None  # bounds apart at confidence 0.95
    retention, (lo, hi) = f"{test.metrics.retention:.2%}", test.interval
    interval, compression = f"[{lo:.1%}, {hi:.1%}]", f"{test.reduction:.2f}"

    cli = _cli_text(summary)
    assert f"Best plan (trial {best.trial} of {summary.n_trials})" in cli
    row = next(line for line in cli.splitlines() if "test (held out)" in line)
    assert retention in row and interval in row and f"{compression}x" in row, row

    rows = dict(_report_table(run_dir, ("", "value")).rows)
    assert rows["best plan"].startswith(f"trial {best.trial} (key `{best.plan_key}`)")
    assert rows["best retention"].startswith(f"{retention} {interval} test (held out)")
    assert rows["best compression"] == f"{compression}×"

    with open(small_sweep / SEEDS_CSV, newline="") as f:
        seed_row = next(r for r in csv.DictReader(f) if (r["strategy"], r["seed"]) == ("mcts", "0")
                        and float(r["budget"]) >= summary.budget)
    assert int(seed_row["best_trial"]) == best.trial and seed_row["plan_key"] == best.plan_key
    assert float(seed_row["test_retention"]) == test.metrics.retention
    assert float(seed_row["test_compression"]) == test.metrics.compression
    assert float(seed_row["held_compression"]) == (test.metrics.compression if test.held else 1.0)


def test_the_report_and_the_sweep_table_state_the_anchors_records(small_sweep):
    """The uniform plans table.md shows (from one run's summary) are the ones that run's report shows."""
    md = (small_sweep / TABLE_MD).read_text()
    found = re.search(r"from `(seed\d+)` of `([^`]+)`", md)
    assert found is not None, "table.md shows no uniform plans"
    run_dir = small_sweep / "runs" / "resnet20" / found.group(2) / found.group(1)
    summary = read_summary(run_dir)
    assert summary is not None and summary.anchors
    report = {row[0]: row for row in _report_table(run_dir, ("uniform plan",)).rows}
    for a in summary.anchors:
        assert a.test is not None and a.test.interval is not None and a.val is not None
        lo, hi = a.test.interval
        line = next(x for x in md.splitlines() if x.startswith(f"| uniform {a.name} |"))
        assert f"| {a.val.metrics.compression:.2f}× |" in line
        assert f"{100 * a.test.metrics.retention:.2f} % [{100 * lo:.2f} %, {100 * hi:.2f} %]" in line
        shown = report[a.name]
        assert shown[2] == f"{a.test.reduction:.2f}×"
        assert shown[3] == f"{a.test.metrics.retention:.2%} [{lo:.1%}, {hi:.1%}]"


def test_a_record_reads_back_as_summary_json_saved_it(small_sweep):
    """Byte for byte: the record adds figures on reading (reduction, held), never a key to the file."""
    for path in sorted(small_sweep.glob(f"runs/*/*/seed*/{SUMMARY}")):
        doc = json.loads(path.read_text())
        summary = RunSummary.from_json(doc)
        assert json.dumps(summary.to_json()) == json.dumps(doc), path
        for entry in (summary.best, *summary.anchors, *summary.pareto):
            for x in (entry.test, entry.val) if entry is not None else ():
                assert x is not None
                again = Scores.of(x.metrics, summary.objective)
                assert (x.reduction, x.held) == (again.reduction, again.held)
                assert (x.retention_lower, x.retention_upper) == (again.retention_lower, again.retention_upper)
