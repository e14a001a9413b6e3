"""The benchmarks' study code (benchmarks/exit_simulate.py, ...) is imported as the scripts import each other: from
their folder."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _threads import one_torch_thread

BENCHMARKS = str(Path(__file__).resolve().parents[2] / "benchmarks")
if BENCHMARKS not in sys.path:
    sys.path.append(BENCHMARKS)  # after everything else: a script's name never shadows an installed module


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield
