"""Ctrl-C in a cell of a sweep: the cell certifies what it has, the sweep stops (it went on to the next cell), and the
stopped cell is partial, so the next run of the sweep resumes its search (it counted as done with its search cut)."""

from __future__ import annotations

import pytest

from modelopt.run import interrupt
from modelopt.run.summary import read_summary
from modelopt.sweep import load_sweep, run_sweep
from tests.sweep._cell_reports import cells_without_reports

SWEEP = """name: t
out: results
models:
  - name: resnet20
    model: cifar10_resnet20
strategies: [random]
budgets: [3]
seeds: [0, 1]
device: cpu
reconstruct: false
bits: [8]
granularity: [per_channel]
compressors: [quantize]
min_retention: 0.9
latency: none
"""


def test_ctrl_c_in_a_cell_stops_the_sweep_and_the_cell_resumes(tmp_path, monkeypatch, small_workload):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP)
    enter = interrupt.StopRequest.__enter__

    def pressed(self):  # Ctrl-C as the search starts: the first press asks the search to stop after its trial
        entered = enter(self)
        self.requested = True
        return entered

    monkeypatch.setattr(interrupt.StopRequest, "__enter__", pressed)
    with cells_without_reports(), pytest.raises(KeyboardInterrupt):
        run_sweep(path, progress=False, workloads={"resnet20": small_workload})
    sweep = load_sweep(path)
    first = sweep.cell_dir("resnet20", "random", 0)
    stopped = read_summary(first)
    assert stopped is not None and stopped.stopped and stopped.budget_used < 3  # certified, its search cut short
    assert [c.status for c in sweep.cells()] == ["partial", "todo"]  # the sweep stopped with the cell

    monkeypatch.setattr(interrupt.StopRequest, "__enter__", enter)
    with cells_without_reports():
        result = run_sweep(path, progress=False, workloads={"resnet20": small_workload})
    assert [(c.strategy, c.seed) for c in result.ran] == [("random", 0), ("random", 1)]
    resumed = read_summary(first)
    assert resumed is not None and not resumed.stopped and resumed.budget_used >= 3 - 1e-9
    assert [c.status for c in load_sweep(path).cells()] == ["done", "done"]
