"""Waiting on a run in a child process: until its journal holds a number of trials (to signal or kill it there)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

__all__ = ["START_DEADLINE", "wait_for_trials"]

# Long enough for a loaded 2-core machine (load 6-12 made a 120 s deadline fail): the wait ends on the event itself,
# the journal's n-th line; the deadline only keeps a broken run from hanging the suite.
START_DEADLINE = 900.0


def wait_for_trials(run: Path, n: int, proc: subprocess.Popen, deadline: float = START_DEADLINE) -> None:
    """Returns once `run`'s journal holds `n` lines; AssertionError when `proc` ends first (with its stderr) or
    `deadline` seconds pass."""
    journal, t0 = run / "trials.jsonl", time.time()
    while not (journal.exists() and journal.read_bytes().count(b"\n") >= n):
        assert proc.poll() is None, proc.communicate()[1]
        assert time.time() < t0 + deadline, (
            f"waited {deadline:.0f} s for line {n} of {journal} (the run's trial {n - 1}): the run did not "
            f"get that far; machine load {os.getloadavg()}")
        time.sleep(0.02)
