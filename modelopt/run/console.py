"""Where a run's progress goes: stderr, as wide as a log line needs when stderr is not a terminal."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["LOG_WIDTH", "progress_console", "search_progress"]

# Columns of a progress line written to a file or a pipe: rich assumes 80 there and cut the line itself
# ("mcts s… 100.3/100 evals, 78 t… ela…"); a log keeps it whole.
LOG_WIDTH = 200


def progress_console() -> Console:
    """A console on stderr: the terminal's width, else `LOG_WIDTH` (COLUMNS, when set, still decides)."""
    if sys.stderr.isatty() or os.environ.get("COLUMNS"):
        return Console(stderr=True)
    return Console(stderr=True, width=LOG_WIDTH)


def search_progress(console: Console, enabled: bool, *, timed: bool, bounded: bool) -> Progress:
    """The search's progress line: budget spent (full val evaluations, which multi-fidelity makes differ from
    trials), and under a time budget the run's time left (`task.fields['left']`) in place of rich's estimate."""
    spent = "{task.completed:.1f}/{task.total:g} evals" if bounded else "{task.completed:.1f} evals"
    columns = [TextColumn("[bold]{task.description}"), BarColumn(),
               TextColumn(spent + ", {task.fields[trials]} trials"), TimeElapsedColumn(), TextColumn("elapsed,")]
    if timed:
        columns.append(TextColumn("{task.fields[left]} left"))
    else:
        columns += [TimeRemainingColumn(), TextColumn("left")]
    columns.append(TextColumn("{task.fields[best]}"))
    return Progress(*columns, console=console, disable=not enabled, transient=False)
