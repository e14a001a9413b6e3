"""What a sweep's results folder holds (`modelopt.sweep` writes it): its models, strategies, seeds
and budgets, from sweep.json when present, else from the run folders under runs/. Read-only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from modelopt.run.journal import read_json
from modelopt.run.layout import CONFIG, RUNS, SWEEP_JSON

__all__ = ["is_sweep_folder", "sweep_layout"]

Layout = tuple[list[str], dict[str, list[str]], list[int] | None, list[float] | None, dict[str, Any]]


def is_sweep_folder(path: str | Path) -> bool:
    """A folder holding runs/ (and not itself a run folder)."""
    return (Path(path) / RUNS).is_dir() and not (Path(path) / CONFIG).is_file()


def sweep_layout(out: str | Path) -> Layout:
    """(models, strategies per model, seeds, budgets, the saved sweep.json): seeds and budgets are
    None without sweep.json (the run folders alone do not say them)."""
    out = Path(out)
    saved = read_json(out / SWEEP_JSON) or {}
    runs = out / RUNS
    found = ({m.name: sorted(s.name for s in m.iterdir() if s.is_dir()) for m in sorted(runs.iterdir()) if m.is_dir()}
             if runs.is_dir() else {})
    if saved:
        models = [m["name"] for m in saved["models"] if m["name"] in found]
        strategies = {m: [s for s in saved["strategies"] if s in found[m]] for m in models}
        return models, strategies, list(saved["seeds"]), [float(b) for b in saved["budgets"]], saved
    return list(found), found, None, None, saved
