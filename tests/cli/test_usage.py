"""Usage errors typer answers itself (a value of the wrong type, an unknown or missing option) are one line naming
the value given and where help is, with exit code 2, from the command line's entry point."""

from __future__ import annotations

import sys

import pytest

from modelopt.cli.app import main


def _main(monkeypatch, capsys, *argv: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["modelopt", *argv])
    with pytest.raises(SystemExit) as done:
        main()
    return int(done.value.code or 0), capsys.readouterr().err


@pytest.mark.parametrize("argv,needles", [
    (("optimize", "--budget", "abc"), ("'--budget'", "valid number", "got 'abc'", "see 'modelopt optimize --help'")),
    (("optimize", "--seed=1.5"), ("'--seed'", "valid integer", "got '1.5'")),
    (("list", "--what", "models"), ("No such option: --what", "see 'modelopt list --help'")),
    (("dashboard", "some_run"), ("Missing option '--storage'", "see 'modelopt dashboard --help'")),
    (("export",), ("Missing argument 'run_dir'",)),
])
def test_a_usage_error_is_one_line_naming_the_value(monkeypatch, capsys, argv, needles):
    code, err = _main(monkeypatch, capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert all(n in lines[0] for n in needles), lines[0]
    assert "╭" not in err and "Usage:" not in err  # not typer's framed box


def test_help_and_a_good_command_still_exit_0(monkeypatch, capsys):
    code, _ = _main(monkeypatch, capsys, "--help")
    assert code == 0
    code, _ = _main(monkeypatch, capsys, "list")
    assert code == 0
