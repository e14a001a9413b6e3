"""A resumed run's strategy and bookkeeping, from the state its last process left beside the journal.

The runner writes the state after each trial (`Runner._record`): the strategy's own state, the plans in flight,
what one-time preparations the run paid and how long it has taken of its time budget. `saved_state` reads the
state that matches the journal; `restore_strategy` tells the strategy the trials the state does not cover.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelopt.evaluation.trial import Trial
from modelopt.run.layout import STATE, STATE_NEXT
from modelopt.search import Strategy

__all__ = ["restore_strategy"]


def restore_strategy(run_dir: Path, strategy: Strategy, trials: Sequence[Trial]) -> dict[str, Any]:
    """Loads into `strategy` the saved state that matches `trials` (the journal) and tells it the trials after that
    state; returns the state (empty when none matched: every trial is told)."""
    told, found = 0, {}
    # The next state first: a kill after a trial's journal line left it for exactly that trial.
    for name, fits in ((STATE_NEXT, len(trials).__eq__), (STATE, len(trials).__ge__)):
        path = run_dir / name
        state = json.loads(path.read_text()) if path.exists() else None
        if state is not None and fits(state.get("n_trials", 0)):
            strategy.load_state_dict(state["strategy"])
            told, found = state["n_trials"], state
            break
    for trial in trials[told:]:
        strategy.tell(trial)
    return found
