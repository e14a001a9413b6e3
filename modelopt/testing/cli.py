"""Assertions for CLI tests: a user error is one line on stderr, no traceback, exit code 2."""

from __future__ import annotations

from typing import Any


def assert_one_line_error(result: Any, *needles: str) -> None:
    """`result` is a typer/click `CliRunner` result; each needle must appear in the one line."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    # A run that started first says what its evidence can certify (`modelopt.certify.evidence`): not an error.
    lines = [line for line in result.stderr.strip().splitlines() if line.strip() and not line.startswith("evidence at")]
    assert len(lines) == 1, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
