"""A sweep file's `time`: each cell's wall time, checked where the file is read (issue 60)."""

from __future__ import annotations

import pytest

from modelopt.errors import ConfigError
from modelopt.sweep import load_sweep

SWEEP = """name: s
out: {out}
models:
  - name: r20
    model: cifar10_resnet20
strategies: [random]
budgets: [2]
seeds: [0]
compressors: [quantize]
time: {time}
"""


def test_a_sweep_gives_each_cell_its_time(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP.format(out=tmp_path / "out", time="2m"))
    assert load_sweep(path).settings["time"] == "2m"


def test_a_bad_time_names_the_line_and_the_forms(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SWEEP.format(out=tmp_path / "out", time="soon"))
    with pytest.raises(ConfigError, match=r"line 10, key 'time': time 'soon' is not a duration.*90s, 2m"):
        load_sweep(path)
