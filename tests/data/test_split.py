"""The split names: one enum that reads and writes as the plain names, and written nowhere else in the code."""

from __future__ import annotations

import ast
import json
import pickle
from pathlib import Path

import pytest

from modelopt.data.split import Split

PACKAGE = Path(__file__).resolve().parents[2] / "modelopt"
# Strings that are a split's name and nothing else in this code base ("test" and "all" also name other things:
# a version label, ONNX Runtime's optimisation level, export modes).
ONLY_SPLITS = {Split.CALIB.value, Split.VAL.value, Split.CONFIRM.value}


def test_a_member_is_its_name_in_every_use() -> None:
    assert Split("confirm") is Split.CONFIRM and Split.VAL == "val"
    assert {"val": 1}[Split.VAL] == 1 and {Split.TEST: 2}["test"] == 2  # the same hash as the string
    assert f"{Split.TEST} / {Split.CALIB!s}" == "test / calib"
    assert json.dumps({Split.VAL: [Split.CONFIRM]}) == '{"val": ["confirm"]}'
    assert pickle.loads(pickle.dumps(Split.ALL)) is Split.ALL  # a worker process gets the member back
    with pytest.raises(ValueError):
        Split("validation")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a split)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def test_the_split_names_are_written_only_in_the_enum() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "split.py" and path.parent.name == "data":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = _docstrings(tree)
        found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and node.value in ONLY_SPLITS and id(node) not in docs]
    assert not found, "split names written outside modelopt/data/split.py (use Split):\n" + "\n".join(found)
