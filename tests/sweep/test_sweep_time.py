"""A sweep file's `time`: each cell's wall time, checked where the file is read (issue 60)."""

from __future__ import annotations

import pytest
from _one_cell import one_cell_sweep

from modelopt.errors import ConfigError
from modelopt.sweep import load_sweep


def test_a_sweep_gives_each_cell_its_time(tmp_path):
    assert load_sweep(one_cell_sweep(tmp_path, "time", "2m")).settings["time"] == "2m"


def test_a_bad_time_names_the_line_and_the_forms(tmp_path):
    with pytest.raises(ConfigError, match=r"line 10, key 'time': time 'soon' is not a duration.*90s, 2m"):
        load_sweep(one_cell_sweep(tmp_path, "time", "soon"))
