from __future__ import annotations

import json

import pytest

from modelopt.errors import LoadError
from modelopt.run.journal import Journal, write_json_atomic


def test_append_and_read(tmp_path):
    j = Journal(tmp_path / "t.jsonl")
    assert not j.exists() and j.read() == []
    for i in range(3):
        j.append({"number": i})
    assert [r["number"] for r in j.read()] == [0, 1, 2]


def test_a_torn_last_line_is_dropped_and_truncated(tmp_path):
    path = tmp_path / "t.jsonl"
    j = Journal(path)
    j.append({"number": 0})
    with open(path, "a") as f:
        f.write('{"number": 1, "pla')  # killed mid-write
    assert [r["number"] for r in j.read()] == [0]
    j.append({"number": 1})
    assert [r["number"] for r in j.read()] == [0, 1]


def test_corruption_in_the_middle_is_an_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"number": 0}\nnot json\n{"number": 2}\n')
    with pytest.raises(LoadError, match="damaged at line 2"):
        Journal(path).read()


def test_nan_is_refused_not_written(tmp_path):
    j = Journal(tmp_path / "t.jsonl")
    with pytest.raises(ValueError):
        j.append({"x": float("nan")})


def test_atomic_json(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"a": 1})
    write_json_atomic(tmp_path / "s.json", {"a": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 2}
    assert not list(tmp_path.glob("*.tmp"))
