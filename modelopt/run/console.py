"""Where a run's progress goes: stderr, as wide as a log line needs when stderr is not a terminal."""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["LOG_WIDTH", "progress_console"]

# Columns of a progress line written to a file or a pipe: rich assumes 80 there and cut the line itself
# ("mcts s… 100.3/100 evals, 78 t… ela…"); a log keeps it whole.
LOG_WIDTH = 200


def progress_console() -> Console:
    """A console on stderr: the terminal's width, else `LOG_WIDTH` (COLUMNS, when set, still decides)."""
    if sys.stderr.isatty() or os.environ.get("COLUMNS"):
        return Console(stderr=True)
    return Console(stderr=True, width=LOG_WIDTH)
