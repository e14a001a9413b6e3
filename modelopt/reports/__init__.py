"""Reports of runs and sweeps: Markdown (PNGs beside it) and one self-contained HTML page.

`report(path)` picks by what the folder holds: a run folder (run.json) gets `write_report`,
a sweep folder (runs/<model>/<strategy>/seed<k>/) gets `write_sweep_report`.
"""

from __future__ import annotations

from pathlib import Path

from modelopt.errors import LoadError
from modelopt.reports.document import ReportPaths
from modelopt.reports.run_report import write_report
from modelopt.reports.sweep_report import is_sweep_folder, write_sweep_report
from modelopt.run.lock import check_started
from modelopt.run.run_folder import is_run_folder

__all__ = ["ReportPaths", "report", "write_report", "write_sweep_report"]


def report(path: str | Path) -> ReportPaths:
    """Writes `report.md` and `report.html` into a run folder or a sweep folder.

    Args:
        path: a run folder (holds run.json) or a sweep's results folder (holds runs/).

    Returns:
        The paths written.

    Raises:
        LoadError: the folder is neither.

    Example:
        >>> modelopt.report("runs/r20").html
        PosixPath('runs/r20/report.html')
    """
    folder = Path(path)
    if is_run_folder(folder):
        return write_report(folder)
    if is_sweep_folder(folder):
        return write_sweep_report(folder)
    check_started(folder)  # a run still loading there has no run.json yet: busy, not "neither"
    what = ("does not exist" if not folder.exists()
            else "is neither a run folder (no run.json) nor a sweep folder (no runs/)")
    raise LoadError(f"{str(folder)!r} {what}; pass a folder written by `modelopt optimize` or `modelopt sweep`")
