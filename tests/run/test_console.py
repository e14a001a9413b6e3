"""A run's progress written to a file keeps its whole line (rich assumed 80 columns and cut it)."""

from __future__ import annotations

import io

from rich.progress import BarColumn, Progress, TextColumn

from modelopt.run.console import LOG_WIDTH, progress_console


def test_progress_to_a_log_file_is_not_cut_at_80_columns(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = progress_console()  # pytest's stderr is no terminal
    assert console.width == LOG_WIDTH
    console.file = io.StringIO()
    line = "78 trials, best 12.18x size at 99.63% retention (trial 48)"
    with Progress(TextColumn("[bold]mcts search"), BarColumn(), TextColumn(line), console=console) as bar:
        bar.add_task("x", total=1)
    assert line in console.file.getvalue()


def test_columns_still_decide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert progress_console().width == 100
