"""The sweep report from a copy of a real small sweep's folders (built once per session): curves per
strategy, table.md inside."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from modelopt.errors import LoadError
from modelopt.reports import write_sweep_report
from modelopt.run.run_folder import read_run

# Both tests read the session fixture small_sweep (a finished 4-cell sweep, ~45 s to make): one test process
# (xdist_group) makes it once for them and tests/sweep/test_table.py.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("small_sweep")]


def _copy_sweep(sweep: Path, tmp_path: Path, strategies=("random", "mcts"), seeds=(0, 1)) -> Path:
    """The sweep's tables and, per cell, its settings and journal only: runs not finished."""
    out = tmp_path / "sweep"
    out.mkdir()
    for name in ("sweep.json", "table.md"):
        shutil.copy(sweep / name, out)
    for strategy in strategies:
        for k in seeds:
            src = sweep / "runs" / "resnet20" / strategy / f"seed{k}"
            dst = out / "runs" / "resnet20" / strategy / f"seed{k}"
            dst.mkdir(parents=True)
            for name in ("run.json", "trials.jsonl"):
                shutil.copy(src / name, dst)
    return out


def test_sweep_report_has_a_curve_per_model_and_the_table(tmp_path, small_sweep):
    out = _copy_sweep(small_sweep, tmp_path)
    paths = write_sweep_report(out)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    assert [p.name for p in paths.images] == ["sweep_resnet20.png"]
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 1
    # The final-best table: the median over the two seeds of each strategy's best val compression.
    mine = md.split("## The sweep table")[0]
    rows = {line.split("|")[1].strip(): line for line in mine.splitlines() if line.startswith(("| random", "| mcts"))}
    assert set(rows) == {"random", "mcts"}
    bests = [read_run(out / "runs" / "resnet20" / "mcts" / f"seed{k}", with_layers=False).best for k in (0, 1)]
    median = statistics.median(b.metrics.compression for b in bests)
    budget = max(json.loads((out / "sweep.json").read_text())["budgets"])
    cells = rows["mcts"].split("|")
    assert [c.strip() for c in cells[1:4]] == ["mcts", "2", "0"]  # 2 seeds, none finished
    # Spent: the budget, overshot by at most the last trial (a full val pass and one-time preparation).
    assert budget <= float(cells[4]) <= budget + 2.5
    assert cells[5].strip() == f"{median:.2f}×"
    # table.md is included, its headings nested under the report's section.
    assert "### Sweep `small`" in md and "<h3>Sweep <code>small</code></h3>" in html
    assert "Budget needed to reach random" in html and "<table>" in html


def test_a_seed_not_started_is_left_out_and_an_empty_folder_refused(tmp_path, small_sweep):
    out = _copy_sweep(small_sweep, tmp_path, strategies=("mcts",), seeds=(0,))
    md = write_sweep_report(out).markdown.read_text()
    assert "| mcts | 1 |" in md
    with pytest.raises(LoadError, match="holds no sweep run folders"):
        write_sweep_report(tmp_path / "empty")
