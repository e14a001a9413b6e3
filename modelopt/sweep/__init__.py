"""Sweeps: a grid of models x strategies x seeds run once each, and one table from their run folders.

`load_sweep` reads a sweep file (modelopt.sweep.file), `run_sweep` runs its unfinished cells
(modelopt.sweep.run), `make_table` rebuilds the table from the run folders alone (modelopt.sweep.table).
"""

from modelopt.sweep.file import Cell, Sweep, SweepModel, cell_status, load_sweep
from modelopt.sweep.run import SweepResult, run_sweep
from modelopt.sweep.table import make_table

__all__ = ["Cell", "Sweep", "SweepModel", "SweepResult", "cell_status", "load_sweep", "make_table", "run_sweep"]
