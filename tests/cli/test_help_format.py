from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from modelopt.cli.app import app
from modelopt.cli.help_format import RICH_MIN_WIDTH

COMMANDS = ["optimize", "evaluate", "export", "report", "list", "sweep", "dashboard"]


def _help(command: str, columns: int) -> str:
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": str(columns), "TERMINAL_WIDTH": ""})
    assert result.exit_code == 0, result.output
    return result.output


def _squashed(text: str) -> str:
    return re.sub(r"\s+", "", text)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_keeps_every_option_name_and_help_text_whole(command):
    text = _help(command, 80)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= 80
    click_command = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    words = set(text.split())
    for param in click_command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                assert name in words or f"{name}," in words, (command, name)
        if getattr(param, "help", None):
            assert _squashed(param.help) in _squashed(text), (command, param.name)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_from_the_rich_width_up_cuts_nothing(command):
    text = _help(command, RICH_MIN_WIDTH)
    assert "╭" in text  # the rich layout, not the plain one
    assert "…" not in text
