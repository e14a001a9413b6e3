"""Sweep cells without their run reports: in this process, and in the Ray workers that run cells (as their setup
hook, `off`). A sweep file has no key that turns a cell's report off (`optimize(report=False)`), and the tests that
use this read journals and tables; each cell's report (the run report, tested in tests/reports: three matplotlib
figures) cost 1-1.5 s of CPU, and a Ray worker's first one ~2 s more to import and set up matplotlib."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

from modelopt.sweep import cell_run


def off() -> None:
    """From now on every cell this process runs calls `optimize(..., report=False)`."""
    if not isinstance(cell_run.optimize, functools.partial):
        cell_run.optimize = functools.partial(cell_run.optimize, report=False)


@contextlib.contextmanager
def cells_without_reports() -> Iterator[None]:
    """As `off`, until the block ends."""
    real = cell_run.optimize
    off()
    try:
        yield
    finally:
        cell_run.optimize = real
