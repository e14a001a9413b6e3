"""The Python API's own refusals (the CLI's are in tests/cli)."""

from __future__ import annotations

import pytest

import modelopt
from modelopt.errors import ConfigError


def test_evaluate_with_a_run_names_each_setting_it_refuses(tmp_path):
    """evaluate(run=..., rounding=[...]) said "leave out settings" and named an `evaluate --run` flag: the line names
    each argument given, as the caller spelled it."""
    with pytest.raises(ConfigError) as info:
        modelopt.evaluate(run=tmp_path, rounding=["gptq"], bits=[4], resize=32)
    message = str(info.value)
    assert f"evaluate(run='{tmp_path}') scores the run's plans" in message and "--run" not in message
    assert "leave out resize, bits, rounding, or pass the plan" in message and "settings," not in message
